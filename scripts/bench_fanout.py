#!/usr/bin/env python3
"""`run --file` fan-out: the same JSONL job over two `localgen serve` endpoints with --parallel N each,
against one endpoint with --parallel 2N (the same total in flight). The threads are split so that both
set-ups use the same cores: two servers with T/2 threads each, or one with T. Reports wall time and
aggregate tok/s, and checks that the greedy answers are the same both ways. (issue: beyond one machine)

All three servers are started first (an idle server takes no CPU); after one warm-up job each way, the two
set-ups run alternately, each going first every other round, for --reps rounds (at least 3), and each row
is the median of its rounds (with the fastest and slowest beside it).

usage: scripts/bench_fanout.py [--model smollm2:135m] [--lines 32] [--tokens 48] [--parallel 4] [--threads 2]
                               [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import harness


@contextmanager
def serve(model: str, parallel: int, threads: int, env: dict[str, str]) -> Iterator[str]:
    """A `localgen serve` with `parallel` slots and `threads` threads; yields its URL."""
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    with harness.server([sys.executable, "-m", "localgen", "serve", "-m", model, "--port", str(port), "-np",
                         str(parallel), "-t", str(threads), "--threads-batch", str(threads), "--ctx", "1024"],
                        url + "/health", env=env, name="localgen serve"):
        yield url


def job(urls: list[str], parallel: int, path: Path, env: dict[str, str]) -> tuple[float, list[dict[str, Any]]]:
    args = [sys.executable, "-m", "localgen", "run", "--file", str(path), "--json", "-np", str(parallel)]
    for u in urls:
        args += ["--endpoint", u]
    secs, r = harness.timed(lambda: subprocess.run(args, env=env, capture_output=True, text=True, check=True))
    return secs, [json.loads(x) for x in r.stdout.splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--lines", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="timed rounds of each set-up (at least 3)")
    a = ap.parse_args()
    if a.reps < 3:
        ap.error("--reps must be at least 3 (medians of 3 or more)")
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALGEN_HOME": home}
        path = Path(home) / "in.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"Write two sentences about the number {i}.",
                                            "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True}) + "\n"
                                for i in range(1, a.lines + 1)))
        with ExitStack() as running:
            url = running.enter_context(serve(a.model, 2 * a.parallel, a.threads, env))
            pair = [running.enter_context(serve(a.model, a.parallel, max(1, a.threads // 2), env)) for _ in range(2)]
            setups = {"one": ([url], 2 * a.parallel), "two": (pair, a.parallel)}
            for urls, parallel in setups.values():  # warm-up
                job(urls, parallel, path, env)
            runs = harness.alternate({name: partial(job, *setup, path, env) for name, setup in setups.items()}, a.reps)
    times = {name: [secs for secs, _ in got] for name, got in runs.items()}
    answers = {name: [docs for _, docs in got] for name, got in runs.items()}
    print(f"{a.model}: {a.lines} lines x {a.tokens} tokens, greedy; medians of {a.reps} alternated rounds")
    for name in ("one", "two"):
        tokens = sum(d.get("completion_tokens", 0) for d in answers[name][0])
        secs = harness.median(times[name])
        label = (f"1 endpoint, --parallel {2 * a.parallel}, {a.threads} threads" if name == "one" else
                 f"2 endpoints, --parallel {a.parallel} each, {max(1, a.threads // 2)} thread(s) each")
        print(f"{label}: {tokens} tokens in {secs:.2f} s (min {min(times[name]):.2f}, max {max(times[name]):.2f}) "
              f"= {tokens / secs:.1f} tok/s")
    one, two = harness.median(times["one"]), harness.median(times["two"])
    print(f"ratio (2 endpoints / 1, tok/s): {harness.ratio(one, two)}")
    texts = {tuple(d["text"] for d in docs) for name in answers for docs in answers[name]}
    print(f"answers identical (every round, both set-ups): {len(texts) == 1}")


if __name__ == "__main__":
    main()
