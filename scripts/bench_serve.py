#!/usr/bin/env python3
"""Serving under load: N concurrent streaming clients, each sending R requests one after another (prompts of
W words, M tokens each), against `localgen serve`, llama.cpp's llama-server, or llama-cpp-python's server.
Reports aggregate generation rate (tokens / wall time of the whole load) and time to first token and
inter-token latency p50/p99 as the clients see them. (issue: localgen serve)

usage: scripts/bench_serve.py [--model gemma3:270m] [--clients 8] [--requests 2] [--words 48] [--tokens 64]
                              [--threads 2] [--target localgen|llama-server|llama-cpp-python]
                              [--llama-server /tmp/llama-bench-build/bin/llama-server]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

WORDS = ["river", "mountain", "city", "forest", "history", "science", "music", "garden", "ocean", "planet",
         "window", "letter", "bridge", "market", "silver", "engine", "winter", "forest", "signal", "theory"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(target: str, model: str, path: str, port: int, a: argparse.Namespace, env: dict[str, str]) -> Any:
    if target == "localgen":
        cmd = [sys.executable, "-m", "localgen", "serve", "-m", model, "--port", str(port), "-np", str(a.clients),
               "-t", str(a.threads), "-c", str(a.ctx)]
    elif target == "llama-server":
        cmd = [a.llama_server, "-m", path, "--port", str(port), "-np", str(a.clients), "-t", str(a.threads),
               "-c", str(a.ctx * a.clients), "-fa", "on", "--no-webui"]
    else:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", path, "--port", str(port), "--n_threads",
               str(a.threads), "--n_ctx", str(a.ctx), "--flash_attn", "true", "--interrupt_requests", "false"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{target} did not start")


def client(url: str, model: str, prompts: list[str], tokens: int, raw: bool, out: list[dict[str, Any]]) -> None:
    import httpx

    for prompt in prompts:
        body: dict[str, Any] = {"model": model, "max_tokens": tokens, "stream": True, "temperature": 0.8,
                                "seed": random.getrandbits(31)}
        if raw:
            body.update(prompt=prompt, ignore_eos=True)
            endpoint = "/v1/completions"
        else:
            body.update(messages=[{"role": "user", "content": prompt}], ignore_eos=True)
            endpoint = "/v1/chat/completions"
        t0 = time.perf_counter()
        stamps: list[float] = []
        with httpx.stream("POST", url + endpoint, json=body, timeout=600) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                choice = (doc.get("choices") or [{}])[0]
                piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                if piece:
                    stamps.append(time.perf_counter())
        out.append({"t0": t0, "stamps": stamps})


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p * (len(xs) - 1)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3:270m")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--words", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--target", default="localgen", choices=["localgen", "llama-server", "llama-cpp-python"])
    ap.add_argument("--llama-server", default="/tmp/llama-bench-build/bin/llama-server")
    a = ap.parse_args()
    from localgen.models.resolve import resolve

    ref = resolve(a.model)
    raw = not ref.summary.chat_template  # a base model: plain completions, run to the token count
    rng = random.Random(7)
    prompts = [[" ".join(rng.choice(WORDS) for _ in range(a.words)) for _ in range(a.requests)]
               for _ in range(a.clients)]
    port = free_port()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALGEN_HOME": home}
        proc = start(a.target, ref.name, ref.path, port, a, env)
        try:
            url = f"http://127.0.0.1:{port}"
            client(url, ref.name, ["warm up"], 4, raw, [])
            results: list[dict[str, Any]] = []
            threads = [threading.Thread(target=client, args=(url, ref.name, p, a.tokens, raw, results))
                       for p in prompts]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    n = sum(len(r["stamps"]) for r in results)
    ttft = [r["stamps"][0] - r["t0"] for r in results if r["stamps"]]
    itl = [b - a_ for r in results for a_, b in zip(r["stamps"], r["stamps"][1:], strict=False)]
    print(f"{a.target}, {ref.name}: {a.clients} clients x {a.requests} requests, {a.words}-word prompts, "
          f"{a.tokens} tokens, {a.threads} threads")
    print(f"  aggregate {n / wall:7.1f} tok/s ({n} streamed pieces in {wall:.2f} s)")
    print(f"  TTFT p50 {pct(ttft, 0.5):.2f} s  p99 {pct(ttft, 0.99):.2f} s")
    print(f"  ITL  p50 {pct(itl, 0.5) * 1000:.0f} ms  p99 {pct(itl, 0.99) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
