#!/usr/bin/env python3
"""Embedding throughput: N short texts, the same model, pooling (mean), threads and window everywhere,
alternating runs, medians.

- `localgen embed --file` against llama.cpp's llama-embedding (built from the same vendored llama.cpp):
  wall time of each command, the load included, as a user pays it;
- with --llama-server: one client sending batches of 64 to `/v1/embeddings` of llama-server
  (`--embeddings`) and of `localgen serve`, both already running: the time to embed all N.

usage: scripts/bench_embed.py --llama-embedding PATH [--llama-server PATH] [--model smollm2:135m]
                              [--texts 1000] [--reps 3]
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
    ap.add_argument("--llama-server", help="also compare /v1/embeddings of llama-server and localgen serve")
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
    if a.llama_server:
        servers(a, path, items)
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(cmd: list[str], url: str) -> subprocess.Popen[bytes]:
    import httpx

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{cmd[0]} did not come up")


def _client(url: str, model: str, items: list[str]) -> float:
    import httpx

    t0 = time.perf_counter()
    with httpx.Client(timeout=600) as c:
        for k in range(0, len(items), 64):
            r = c.post(f"{url}/v1/embeddings", json={"model": model, "input": items[k:k + 64]})
            r.raise_for_status()
            assert len(r.json()["data"]) == len(items[k:k + 64])
    return time.perf_counter() - t0


def servers(a: argparse.Namespace, path: str, items: list[str]) -> None:
    """One client, batches of 64, against each running server."""
    pl, pn = _free_port(), _free_port()
    llama = _start([a.llama_server, "-m", path, "--embeddings", "--pooling", "mean", "-c", "2048", "-b", "2048",
                    "-ub", "2048", "-t", str(a.threads), "--port", str(pl)], f"http://127.0.0.1:{pl}")
    ours = _start([sys.executable, "-m", "localgen", "serve", "-m", a.model, "--port", str(pn), "--threads",
                   str(a.threads)], f"http://127.0.0.1:{pn}")  # each server's own default slots
    try:
        _client(f"http://127.0.0.1:{pl}", a.model, items[:64])  # warm both
        _client(f"http://127.0.0.1:{pn}", a.model, items[:64])
        t_l, t_n = [], []
        for _ in range(a.reps):
            t_l.append(_client(f"http://127.0.0.1:{pl}", a.model, items))
            t_n.append(_client(f"http://127.0.0.1:{pn}", a.model, items))
    finally:
        for p in (llama, ours):
            p.terminate()
            p.wait(30)
    ml, mn = statistics.median(t_l), statistics.median(t_n)
    print("  one client, batches of 64, /v1/embeddings of a running server:")
    print(f"  localgen serve          {mn:6.2f} s  {len(items) / mn:7.1f} texts/s")
    print(f"  llama-server            {ml:6.2f} s  {len(items) / ml:7.1f} texts/s")
    print(f"  ratio (llama-server time / localgen serve) {ml / mn:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
