#!/usr/bin/env python3
"""Chat benchmark (issue: chat): time to first token per turn over a 10-turn conversation, with the KV
cache reused across turns (what `localgen chat` does) and, for contrast, with the cache cleared before
every turn (the whole history re-evaluated).

The model is loaded once; the whole conversation is held --samples times (at least 3) in each mode, the two
modes alternating (each goes first every other time), the cache emptied before each conversation. Answers
are greedy, so every sample of a turn has the same prompt; each turn's figure is the median of its samples.

usage: scripts/bench_chat.py [--model smollm2:135m] [--turns 10] [--answer 48] [--samples 3]
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any

import harness

QUESTIONS = [
    "Tell me about rivers.", "Which is the longest river?", "What about lakes?", "How do glaciers form?",
    "What is a delta?", "Why are oceans salty?", "What is an estuary?", "How deep is the sea?",
    "What are tides?", "Summarize our conversation.", "Anything else?", "Thanks!",
]


def conversation(engine: Any, model: str, turns: int, answer: int, reuse: bool) -> list[tuple[int, int, float]]:
    """One conversation from an empty cache: (prompt tokens, cached tokens, time to first token) per turn."""
    from localgen.chat.runner import ChatRunner
    from localgen.chat.session import ChatSession
    from localgen.engine.local import LocalBackend
    from localgen.tools.loop import Turn
    from localgen.types import SamplingParams

    engine.kv.clear()
    runner = ChatRunner(ChatSession(name="bench", model=model), LocalBackend(engine),
                        SamplingParams(temperature=0.0, max_tokens=answer))
    runner.session.save = lambda: Path()  # type: ignore[method-assign]
    rows = []
    for i in range(turns):
        if not reuse:
            engine.kv.clear()
        runner.start(QUESTIONS[i % len(QUESTIONS)])
        turn = Turn()
        runner.reply(lambda event: None, lambda call: False, turn)  # no tools: nothing to approve
        runner.record(turn)
        s = runner.last_stats
        assert s is not None
        rows.append((s.prompt_tokens, s.cached_tokens, s.ttft_s or 0.0))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--answer", type=int, default=48)
    ap.add_argument("--samples", type=int, default=3, help="conversations per mode; each turn's median (3 or more)")
    a = ap.parse_args()
    if a.samples < 3:
        ap.error("--samples must be at least 3 (medians of 3 or more)")
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    engine = Engine(resolve(a.model), LoadParams(n_ctx=4096))
    try:  # the two modes alternate, each going first every other time
        samples = harness.alternate({reuse: partial(conversation, engine, a.model, a.turns, a.answer, reuse)
                                     for reuse in (True, False)}, a.samples)
    finally:
        engine.close()
    for reuse, runs in samples.items():  # greedy: the same prompts every time, or the medians mix turns
        if any([r[:2] for r in run] != [r[:2] for r in runs[0]] for run in runs):
            raise SystemExit(f"the {'reused' if reuse else 'cleared'} conversations differ between samples")

    def ttft(reuse: bool, turn: int) -> float:
        return harness.median(run[turn][2] for run in samples[reuse])

    reused = samples[True][0]
    print(f"{a.model}, {a.answer}-token answers, greedy, medians of {a.samples} conversations per mode")
    print("turn  prompt  cached  ttft(reuse)  ttft(no reuse)")
    for i in range(a.turns):
        print(f"{i + 1:4}  {reused[i][0]:6}  {reused[i][1]:6}  {ttft(True, i) * 1000:8.0f} ms  "
              f"{ttft(False, i) * 1000:10.0f} ms")
    last = a.turns - 1
    print(f"turn {a.turns} / turn 1 time to first token: {harness.ratio(ttft(True, last), ttft(True, 0))} with reuse, "
          f"{harness.ratio(ttft(False, last), ttft(False, 0))} without")


if __name__ == "__main__":
    main()
