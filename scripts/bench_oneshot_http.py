#!/usr/bin/env python3
"""A one-shot against a running `localgen serve` (no model load in the client) against the in-process
one-shot: wall time of `localgen run -p "Name three primary colors." -n 64 --temperature 0`, alternating
runs, medians. (issue: localgen serve)

usage: scripts/bench_oneshot_http.py [--model smollm2:135m] [--runs 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import harness


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    lg = [sys.executable, "-m", "localgen"]
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [*lg, "serve", "-m", a.model, "--port", str(port), "-np", "1", "-t", str(a.threads)]
    with harness.server(serve, url + "/health", timeout=300, name="localgen serve"):
        args = [*lg, "run", "-p", "Name three primary colors.", "-n", "64", "--temperature", "0"]
        ways = {"in-process": [*args, "-m", a.model, "-t", str(a.threads)], "over HTTP": [*args, "--endpoint", url]}
        times = harness.alternate({kind: partial(harness.run_timed, cmd) for kind, cmd in ways.items()}, a.runs,
                                  flip=False)
    for kind, values in times.items():
        print(f"{kind:10}  median {harness.median(values):.3f} s  ({', '.join(f'{v:.3f}' for v in values)})")


if __name__ == "__main__":
    main()
