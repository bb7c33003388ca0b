#!/usr/bin/env python3
"""Prompt-cache benchmark (issue: past one stream): time to first token for a question about a long
document (about 2,000 tokens), recomputing the prefix every time vs loading its saved KV state; with
--tools FILE, for a question with the tools of a --functions file instead (their schemas in the system
prompt are the prefix). Each run is a fresh `localgen run` process, as a user's would be; the figures are
medians.

usage: scripts/bench_prompt_cache.py [--model smollm2:135m] [--reps 3] [--tools tests/tool_functions.py]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
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


def ttft(model: str, prefix: list[str], question: str, cache: bool, env: dict[str, str],
         ) -> tuple[float, int, int, str]:
    args = [sys.executable, "-m", "localgen", "run", "-m", model, *prefix, "-p", question, "-n", "4",
            "--temperature", "0", "--json", "--ctx", "4096", "--prompt-cache" if cache else "--no-prompt-cache"]
    doc_json = json.loads(subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout)
    s = doc_json["stats"]
    return s["ttft_s"], s["prompt_tokens"], s["cached_tokens"], doc_json["prompt_cache"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tools", type=Path, help="a --functions file: its tools are the prefix, not a document")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "LOCALGEN_HOME": tmp}
        doc = Path(tmp) / "doc.txt"
        document(doc, 1500)
        prefix = ["--functions", str(a.tools), "--yes"] if a.tools else ["-f", str(doc)]
        about = "the weather in city" if a.tools else "what does the text say about the river?"
        questions = [f"Question {i}: {about}" for i in range(a.reps + 1)]
        cold = [ttft(a.model, prefix, q, False, env) for q in questions[: a.reps]]
        first = ttft(a.model, prefix, questions[-1], True, env)  # evaluates and saves the prefix
        warm = [ttft(a.model, prefix, q, True, env) for q in questions[: a.reps]]
        size = sum(p.stat().st_size for p in Path(tmp).rglob("*.state"))
    c, w = harness.median(x[0] for x in cold), harness.median(x[0] for x in warm)
    print(f"{a.model}: prompt {cold[0][1]} tokens, cached prefix {warm[0][2]} tokens, state file {size / 1e6:.0f} MB")
    print(f"  time to first token, prefix recomputed: {c * 1000:8.0f} ms (median of {a.reps})")
    print(f"  first run with the cache (evaluate + save): {first[0] * 1000:8.0f} ms ({first[3]})")
    print(f"  time to first token, prefix loaded:     {w * 1000:8.0f} ms (median of {a.reps}; {warm[0][3]})")
    print(f"  speed-up: {harness.ratio(c, w, '.1f')} (target >= 20x)")


if __name__ == "__main__":
    main()
