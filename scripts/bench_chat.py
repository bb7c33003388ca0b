#!/usr/bin/env python3
"""Chat benchmark (issue: chat): time to first token per turn over a 10-turn conversation, with the KV
cache reused across turns (what `localgen chat` does) and, for contrast, with the cache cleared before
every turn (the whole history re-evaluated).

usage: scripts/bench_chat.py [--model smollm2:135m] [--turns 10] [--answer 48]
"""

from __future__ import annotations

import argparse
from pathlib import Path

QUESTIONS = [
    "Tell me about rivers.", "Which is the longest river?", "What about lakes?", "How do glaciers form?",
    "What is a delta?", "Why are oceans salty?", "What is an estuary?", "How deep is the sea?",
    "What are tides?", "Summarize our conversation.", "Anything else?", "Thanks!",
]


def run(model: str, turns: int, answer: int, reuse: bool) -> list[tuple[int, int, float]]:
    from localgen.chat.runner import ChatRunner
    from localgen.chat.session import ChatSession
    from localgen.engine.llama import Engine
    from localgen.engine.local import LocalBackend
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams, SamplingParams

    engine = Engine(resolve(model), LoadParams(n_ctx=4096))
    runner = ChatRunner(ChatSession(name="bench", model=model), LocalBackend(engine),
                        SamplingParams(temperature=0.0, max_tokens=answer))
    runner.session.save = lambda: Path()  # type: ignore[method-assign]
    rows = []
    for i in range(turns):
        if not reuse:
            engine.clear()
        gen, _ = runner.start(QUESTIONS[i % len(QUESTIONS)])
        list(gen)
        runner.finish(gen)
        s = gen.stats
        rows.append((s.prompt_tokens, s.cached_tokens, s.ttft_s or 0.0))
    engine.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--answer", type=int, default=48)
    a = ap.parse_args()
    reuse = run(a.model, a.turns, a.answer, True)
    fresh = run(a.model, a.turns, a.answer, False)
    print(f"{a.model}, {a.answer}-token answers, greedy")
    print("turn  prompt  cached  ttft(reuse)  ttft(no reuse)")
    for i, (r, f) in enumerate(zip(reuse, fresh, strict=False), 1):
        print(f"{i:4}  {r[0]:6}  {r[1]:6}  {r[2] * 1000:8.0f} ms  {f[2] * 1000:10.0f} ms")
    print(f"turn {a.turns} / turn 1 time to first token: {reuse[-1][2] / reuse[0][2]:.2f}x with reuse, "
          f"{fresh[-1][2] / fresh[0][2]:.2f}x without")


if __name__ == "__main__":
    main()
