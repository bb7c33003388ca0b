#!/usr/bin/env python3
"""A one-shot against a running `localgen serve` (no model load in the client) against the in-process
one-shot: wall time of `localgen run -p "Name three primary colors." -n 64 --temperature 0`, alternating
runs, medians. (issue: localgen serve)

usage: scripts/bench_oneshot_http.py [--model smollm2:135m] [--runs 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time

import httpx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    lg = [sys.executable, "-m", "localgen"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([*lg, "serve", "-m", a.model, "--port", str(port), "-np", "1", "-t", str(a.threads)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        args = ["run", "-p", "Name three primary colors.", "-n", "64", "--temperature", "0"]
        times: dict[str, list[float]] = {"in-process": [], "over HTTP": []}
        for _ in range(a.runs):
            ways = (("in-process", ["-m", a.model, "-t", str(a.threads)]), ("over HTTP", ["--endpoint", url]))
            for kind, extra in ways:
                t0 = time.perf_counter()
                subprocess.run([*lg, *args, *extra], capture_output=True, check=True)
                times[kind].append(time.perf_counter() - t0)
    finally:
        server.terminate()
        server.wait(30)
    for kind, values in times.items():
        print(f"{kind:10}  median {statistics.median(values):.3f} s  ({', '.join(f'{v:.3f}' for v in values)})")


if __name__ == "__main__":
    main()
