#!/usr/bin/env python3
"""Embedding throughput: N short texts through `localgen embed --file` against llama.cpp's llama-embedding
(built from the same vendored llama.cpp) on the same texts, model, pooling, threads and window, alternating
runs; wall time of each command (load included, as a user pays it) and texts per second.

usage: scripts/bench_embed.py --llama-embedding PATH [--model smollm2:135m] [--texts 1000] [--reps 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["river", "mountain", "city", "forest", "history", "science", "music", "garden", "ocean", "planet",
         "engine", "market", "language", "window", "bridge", "winter", "summer", "paper", "light", "stone"]


def texts(n: int) -> list[str]:
    rng = random.Random(7)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) + "." for _ in range(n)]


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--llama-embedding", required=True)
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from localgen.models.resolve import resolve

    path = str(resolve(a.model).path)
    items = texts(a.texts)
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "texts.txt"
        f.write_text("\n".join(items) + "\n")
        sep = "<#sep#>"
        ours = [sys.executable, "-m", "localgen", "embed", "-m", a.model, "--file", str(f), "--pooling", "mean",
                "--threads", str(a.threads), "--ctx", "2048"]
        theirs = [a.llama_embedding, "-m", path, "-p", sep.join(items), "--embd-separator", sep, "--pooling", "mean",
                  "-c", "2048", "-b", "2048", "-ub", "2048", "-t", str(a.threads), "--embd-output-format", "json",
                  "--no-warmup"]
        timed(ours)  # warm the page cache for both
        t_ours, t_theirs = [], []
        for _ in range(a.reps):
            t_ours.append(timed(ours))
            t_theirs.append(timed(theirs))
    mo, mt = statistics.median(t_ours), statistics.median(t_theirs)
    print(f"{a.model}: {a.texts} texts of 6-14 words, mean pooling, --threads {a.threads}, medians of {a.reps}")
    print(f"  localgen embed --file   {mo:6.2f} s  {a.texts / mo:7.1f} texts/s")
    print(f"  llama-embedding         {mt:6.2f} s  {a.texts / mt:7.1f} texts/s")
    print(f"  ratio (llama-embedding time / ours) {mt / mo:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
