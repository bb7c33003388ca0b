#!/usr/bin/env python3
"""`run --file` fan-out: the same JSONL job over two `localgen serve` endpoints with --parallel N each,
against one endpoint with --parallel 2N (the same total in flight). The threads are split so that both
set-ups use the same cores: two servers with T/2 threads each, or one with T. Reports wall time and
aggregate tok/s, and checks that the greedy answers are the same both ways. (issue: beyond one machine)

usage: scripts/bench_fanout.py [--model smollm2:135m] [--lines 32] [--tokens 48] [--parallel 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(model: str, parallel: int, threads: int, env: dict[str, str]) -> tuple[Any, str]:
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "localgen", "serve", "-m", model, "--port", str(port), "-np",
                             str(parallel), "-t", str(threads), "--threads-batch", str(threads), "--ctx", "1024"],
                            env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


def job(urls: list[str], parallel: int, path: Path, env: dict[str, str]) -> tuple[float, list[dict[str, Any]]]:
    args = [sys.executable, "-m", "localgen", "run", "--file", str(path), "--json", "-np", str(parallel)]
    for u in urls:
        args += ["--endpoint", u]
    t0 = time.perf_counter()
    r = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, [json.loads(x) for x in r.stdout.splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--lines", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALGEN_HOME": home}
        path = Path(home) / "in.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"Write two sentences about the number {i}.",
                                            "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True}) + "\n"
                                for i in range(1, a.lines + 1)))
        results = {}
        one, url = serve(a.model, 2 * a.parallel, a.threads, env)
        try:
            job([url], 2 * a.parallel, path, env)  # warm-up
            results["one"] = job([url], 2 * a.parallel, path, env)
        finally:
            one.terminate()
            one.wait(30)
        pair = [serve(a.model, a.parallel, max(1, a.threads // 2), env) for _ in range(2)]
        try:
            urls = [u for _, u in pair]
            job(urls, a.parallel, path, env)
            results["two"] = job(urls, a.parallel, path, env)
        finally:
            for p, _ in pair:
                p.terminate()
                p.wait(30)
    for name, (secs, docs) in results.items():
        tokens = sum(d.get("completion_tokens", 0) for d in docs)
        label = (f"1 endpoint, --parallel {2 * a.parallel}, {a.threads} threads" if name == "one" else
                 f"2 endpoints, --parallel {a.parallel} each, {max(1, a.threads // 2)} thread(s) each")
        print(f"{label}: {a.lines} lines, {tokens} tokens in {secs:.2f} s = {tokens / secs:.1f} tok/s")
    same = [d["text"] for d in results["one"][1]] == [d["text"] for d in results["two"][1]]
    print(f"answers identical: {same}")


if __name__ == "__main__":
    main()
