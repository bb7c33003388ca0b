#!/usr/bin/env python3
"""The first request after a start: a server is started R times (with --against, alternating with llama.cpp's
llama-server on the same file), left --settle seconds, then sent 3 streamed chat requests one after another,
each a different question (the chat template's prefix is shared). Prints each start's times to first token
and the medians of the first and of the later ones: what a server still had to load or compile when the first
request came shows as the gap between the two.

usage: scripts/bench_first_request.py [--model smollm2:135m] [--starts 4] [--settle 1.5] [--threads 2]
                                      [--against /tmp/lsrv/bin/llama-server]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from functools import partial
from typing import Any

import bench_serve  # its server start, for the same flags
import harness
import httpx

QUESTIONS = ["Tell me about rivers.", "Name three mountains.", "Why is the sky blue?"]


def ttfts(url: str) -> list[float]:
    """Time to the first chunk with text of each question, in seconds (bench_serve's client, a connection a
    question: llama-server sometimes drops a kept-alive one as it is reused)."""
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    out: list[dict[str, Any]] = []
    for q in QUESTIONS:
        with httpx.Client(timeout=120) as http:
            bench_serve.client(http, url, model, [q], 4, False, 0.0, "", out)
        if not out[-1]["stamps"]:
            raise SystemExit(f"{url}: no text in the answer to {q!r}")
    return [r["stamps"][0] - r["t0"] for r in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--starts", type=int, default=4)
    ap.add_argument("--settle", type=float, default=1.5, help="seconds between ready and the first request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--against", metavar="LLAMA_SERVER", type=harness.executable,
                    help="alternate starts with this llama-server")
    a = ap.parse_args()
    from localgen.models.resolve import resolve

    ref = resolve(a.model)
    if not ref.summary.chat_template:
        raise SystemExit(f"{ref.name} has no chat template: pick a chat model")
    # bench_serve.start's settings: 8 slots, 2,048 tokens each, no extra flags
    opts = argparse.Namespace(slots=8, threads=a.threads, ctx=2048, localgen_args="", llama_args="",
                              llama_server=a.against)
    targets = ["localgen", "llama-server"] if a.against else ["localgen"]
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALGEN_HOME": home}

        def first_requests(target: str) -> list[float]:
            with bench_serve.start(target, str(ref.path), opts, env, 8) as url:
                time.sleep(a.settle)
                return ttfts(url)

        def show(k: int, seen: dict[str, list[list[float]]]) -> None:
            for target in targets:
                print(f"start {k + 1} {target:12} TTFT " + " ".join(f"{t * 1000:.0f}" for t in seen[target][-1])
                      + " ms")

        seen = harness.alternate({t: partial(first_requests, t) for t in targets}, a.starts, flip=False,
                                 after=show)
    for target, runs in seen.items():
        first = harness.median(r[0] for r in runs) * 1000
        later = harness.median(t for r in runs for t in r[1:]) * 1000
        print(f"{target:12} first request {first:.0f} ms, later ones {later:.0f} ms (medians)")


if __name__ == "__main__":
    main()
