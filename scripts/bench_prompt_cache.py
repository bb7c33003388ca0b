#!/usr/bin/env python3
"""Prompt-cache benchmark (issue: past one stream): time to first token for a question about a long
document (about 2,000 tokens), recomputing the prefix every time vs loading its saved KV state; with
--tools FILE, for a question with the tools of a --functions file instead (their schemas in the system
prompt are the prefix). Each run is a fresh `localgen run` process, as a user's would be; the figures are
medians. Then what a hit spends checking the state file's SHA-256 before llama.cpp reads it (median of 5,
the file in the page cache, as after a recent run); --words makes the document, and so the state, larger.

usage: scripts/bench_prompt_cache.py [--model smollm2:135m] [--reps 3] [--words 1500] [--tools tests/tool_functions.py]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness


def document(path: Path, words: int) -> None:
    rng = random.Random(7)
    vocab = [
        "river", "valley", "farmer", "wheat", "barley", "bird", "oak", "bridge", "stone", "mill", "village",
        "market", "winter", "harvest", "boat", "fisher", "lantern", "road", "hill", "church", "bell", "garden",
    ]
    lines = [" ".join(rng.choice(vocab) for _ in range(14)) + "." for _ in range(words // 14)]
    path.write_text("\n".join(lines))


def ttft(model: str, prefix: list[str], question: str, cache: bool, env: dict[str, str], ctx: int,
         ) -> tuple[float, int, int, str]:
    args = [sys.executable, "-m", "localgen", "run", "-m", model, *prefix, "-p", question, "-n", "4",
            "--temperature", "0", "--json", "--ctx", str(ctx), "--prompt-cache" if cache else "--no-prompt-cache"]
    doc_json = json.loads(subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout)
    s = doc_json["stats"]
    return s["ttft_s"], s["prompt_tokens"], s["cached_tokens"], doc_json["prompt_cache"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--words", type=int, default=1500, help="the document's words (about 1.1 tokens each)")
    ap.add_argument("--tools", type=Path, help="a --functions file: its tools are the prefix, not a document")
    a = ap.parse_args()
    ctx = max(4096, int(a.words * 1.4) // 1024 * 1024 + 1024)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "LOCALGEN_HOME": tmp}
        doc = Path(tmp) / "doc.txt"
        document(doc, a.words)
        prefix = ["--functions", str(a.tools), "--yes"] if a.tools else ["-f", str(doc)]
        about = "the weather in city" if a.tools else "what does the text say about the river?"
        questions = [f"Question {i}: {about}" for i in range(a.reps + 1)]
        cold = [ttft(a.model, prefix, q, False, env, ctx) for q in questions[: a.reps]]
        first = ttft(a.model, prefix, questions[-1], True, env, ctx)  # evaluates and saves the prefix
        warm = [ttft(a.model, prefix, q, True, env, ctx) for q in questions[: a.reps]]
        [state] = Path(tmp).rglob("*.state")
        size = state.stat().st_size
        os.environ["LOCALGEN_HOME"] = tmp
        from localgen.engine.promptcache import intact

        checks = []
        for _ in range(5):
            t0 = time.perf_counter()
            if not intact(state):
                sys.exit(f"{state} does not match its SHA-256")
            checks.append(time.perf_counter() - t0)
    c, w = harness.median(x[0] for x in cold), harness.median(x[0] for x in warm)
    print(f"{a.model}: prompt {cold[0][1]} tokens, cached prefix {warm[0][2]} tokens, state file {size / 1e6:.0f} MB")
    print(f"  time to first token, prefix recomputed: {c * 1000:8.0f} ms (median of {a.reps})")
    print(f"  first run with the cache (evaluate + save): {first[0] * 1000:8.0f} ms ({first[3]})")
    print(f"  time to first token, prefix loaded:     {w * 1000:8.0f} ms (median of {a.reps}; {warm[0][3]})")
    print(f"  speed-up: {harness.ratio(c, w, '.1f')} (target >= 20x)")
    check = harness.median(checks)
    print(f"  checking the state's SHA-256 before loading it: {check * 1000:8.1f} ms "
          f"({size / check / 1e9:.2f} GB/s; {check / w:.1%} of the hit's time to first token)")


if __name__ == "__main__":
    main()
