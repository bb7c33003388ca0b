#!/usr/bin/env python3
"""Many-prompts benchmark (issue: past one stream): `run --file` on the same prompts one at a time
(--parallel 1), batched with exactness kept (--exact) and batched freely (--no-exact). Reports aggregate
tok/s (medians over --reps, alternating) and sequences per decode call, and checks that the exact batched
answers equal the one-at-a-time answers.

usage: scripts/bench_batch.py [--model smollm2:135m] [--parallel 8] [--prompts 64] [-n 64] [--reps 3] [--raw]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from functools import partial

import harness

SUBJECTS = ["the Roman Empire", "photosynthesis", "reversing a list in Python", "the largest cities in Japan",
            "baking bread", "the Moon landing", "the French Revolution", "installing a package with pip"]


def once(model: str, path: str, n: int, parallel: int, extra: list[str], raw: bool) -> tuple[float, float, str]:
    args = [sys.executable, "-m", "localgen", "run", "-m", model, "--file", path, "-n", str(n), "--temperature", "0",
            "--parallel", str(parallel), "--ctx", "512", "--stats", *(["--raw"] if raw else []), *extra]
    r = subprocess.run(args, capture_output=True, text=True, check=True)
    m = re.search(r"([0-9.]+) tok/s aggregate .* ([0-9.]+) sequences per decode call", r.stderr)
    if not m:
        raise SystemExit(f"unexpected --stats line: {r.stderr.strip()}")
    return float(m.group(1)), float(m.group(2)), r.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--raw", action="store_true", help="plain completion (for base models such as gemma3:270m)")
    a = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        for i in range(a.prompts):
            f.write(f"Write two sentences about {SUBJECTS[i % len(SUBJECTS)]} (note {i}).\n")
    # --exact named: the default is throughput batching wherever exactness costs more (engine/batchmode.py)
    modes = {"one at a time": (1, []), "--exact": (a.parallel, ["--exact"]),
             "--no-exact": (a.parallel, ["--no-exact"])}
    runs = harness.alternate({name: partial(once, a.model, f.name, a.n, par, extra, a.raw)
                              for name, (par, extra) in modes.items()}, a.reps, flip=False)
    rates = {name: [tps for tps, _, _ in got] for name, got in runs.items()}
    per_call = {name: got[-1][1] for name, got in runs.items()}  # the last round's
    texts = {name: got[-1][2] for name, got in runs.items()}
    print(f"{a.model}: {a.prompts} prompts x {a.n} tokens, --parallel {a.parallel}, median of {a.reps}")
    base = harness.median(rates["one at a time"])
    for name in modes:
        med = harness.median(rates[name])
        print(f"  {name:14} {med:7.1f} tok/s  {harness.ratio(med, base, '4.2f')}  "
              f"{per_call[name]:.1f} sequences per call")
    same = texts["--exact"] == texts["one at a time"]
    alone = texts["one at a time"].splitlines()
    differ = sum(x != y for x, y in zip(texts["--no-exact"].splitlines(), alone, strict=False))
    print(f"  exact answers identical to one at a time: {same}; --no-exact answers that differ: {differ}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
