#!/usr/bin/env python3
"""Models on demand (#43): one `localgen serve --max-models 1` asked for two models in turn, so each request
unloads the other. Per round: the time to load a model that was not loaded (Ollama's load_duration), the
whole request's time (the other model's eviction included), and the time to first token and prefill of a
request whose 2,000-token prefix the model had evaluated before it was unloaded, against the same request
while the model stayed loaded. Once with warm reloads (the prompt cache kept on disk across the reload, the
default) and once with --cache-disk 0. Medians over the rounds.

usage: scripts/bench_residency.py [--a smollm2:135m] [--b gemma3:270m] [--rounds 3] [--prefix 2000]
                                  [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import harness
import httpx

NS = 1e9


def generate(url: str, model: str, prompt: str, n: int = 4) -> dict[str, Any]:
    """A streamed /api/generate: its last line, with the time to the first piece of text and the whole time."""
    t0 = time.perf_counter()
    first = None
    last: dict[str, Any] = {}
    body = {"model": model, "prompt": prompt, "options": {"num_predict": n, "temperature": 0}}
    with httpx.stream("POST", url + "/api/generate", json=body, timeout=600) as r:
        for line in r.iter_lines():
            doc = json.loads(line)
            if "error" in doc:
                raise SystemExit(f"{model}: {doc['error']}")
            if doc.get("response") and first is None:
                first = time.perf_counter() - t0
            last = doc
    return {**last, "ttft": first or 0.0, "total": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default="smollm2:135m")
    ap.add_argument("--b", default="gemma3:270m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefix", type=int, default=2000, help="tokens (about) of the shared document")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    document = " ".join(f"Fact {i}: the river {i} flows north." for i in range(args.prefix // 12))
    ask = document + "\n\nWhich way does river 7 flow?"
    names = ("load a", "load b", "swap to a", "swap to b", "ttft warm", "prefill warm", "ttft after reload",
             "prefill after reload")
    rows: dict[str, dict[str, list[float]]] = {}
    for mode, flags in (("warm reload", ()), ("no warm reload", ("--cache-disk", "0"))):
        port = harness.free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "localgen", "serve", "--port", str(port), "--max-models", "1", "-np", "1",
               "--ctx", str(args.prefix + 1024), "-t", str(args.threads), "--quiet", *flags]
        got: dict[str, list[float]] = {k: [] for k in names}
        with harness.server(cmd, url + "/health", timeout=300, env=dict(os.environ)):
            generate(url, args.a, ask)  # the prefix evaluated once (and the first request's own costs paid)
            for _ in range(args.rounds):
                warm = generate(url, args.a, ask)  # still loaded: the prefix is in its slot
                b = generate(url, args.b, "Say hi.")  # a goes
                back = generate(url, args.a, ask)  # a again: loaded, its prefix found on disk or evaluated again
                got["load b"].append(b["load_duration"] / NS)
                got["swap to b"].append(b["total"])
                got["load a"].append(back["load_duration"] / NS)
                got["swap to a"].append(back["total"])
                got["ttft warm"].append(warm["ttft"])
                got["prefill warm"].append(warm["prompt_eval_duration"] / NS)
                got["ttft after reload"].append(back["ttft"])
                got["prefill after reload"].append(back["prompt_eval_duration"] / NS)
            evictions = httpx.get(url + "/health").json()["residency"]["evictions"]
        rows[mode] = got
        print(f"{mode}: {evictions} evictions", file=sys.stderr)
    print(f"{args.a} and {args.b} in turn under --max-models 1, {args.rounds} rounds, a {args.prefix}-token prefix; "
          "medians in seconds")
    print(f"  {'':22s} {'warm reload':>12s} {'no warm reload':>15s}")
    for k in names:
        warm, cold = harness.median(rows["warm reload"][k]), harness.median(rows["no warm reload"][k])
        print(f"  {k:22s} {warm:12.3f} {cold:15.3f}")

if __name__ == "__main__":
    main()
