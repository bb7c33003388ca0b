#!/usr/bin/env python3
"""The Batch API's pace on short requests: N /v1/embeddings requests of one text each, sent by one client one
after another (the openai client, against a running `localgen serve`), against the same N lines as one batch
(POST /v1/files, /v1/batches, polled until it ends): requests a second each way, medians of alternating rounds.

A batch's lines go to the server's own app one after another (serve/batchrun.py: each waits until the one
before reaches its model's worker), `--batch-lines` at most in flight; a batch of short requests should run
about as fast as a client sending them one by one, not at a pace the runner's polling sets.

usage: scripts/bench_batch_api.py [--model smollm2:135m] [--requests 300] [--reps 3] [--batch-lines 2]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parent.parent


def one_by_one(url: str, model: str, n: int) -> float:
    """Seconds for `n` requests sent one after another."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    t0 = time.perf_counter()
    for i in range(n):
        client.embeddings.create(model=model, input=f"the cat {i}")
    return time.perf_counter() - t0


def as_a_batch(url: str, model: str, n: int) -> float:
    """Seconds from the batch's creation to its end (its input uploaded before), every line answered 200."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    lines = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"model": model, "input": f"the cat {i}"}}) + "\n" for i in range(n))
    upload = client.files.create(file=("in.jsonl", io.BytesIO(lines.encode())), purpose="batch")
    t0 = time.perf_counter()
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.05)
        batch = client.batches.retrieve(batch.id)
    took = time.perf_counter() - t0
    counts = batch.request_counts
    if batch.status != "completed" or counts is None or counts.completed != n:
        raise SystemExit(f"the batch ended {batch.status}: {counts}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-lines", type=int, default=2)
    a = ap.parse_args()
    name = Path(a.model).name if a.model.endswith(".gguf") else a.model  # a file is served by its name
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALGEN_HOME": home}
        cmd = [sys.executable, "-m", "localgen", "serve", "-m", a.model, "--port", str(port), "-np", "1",
               "--batch-lines", str(a.batch_lines)]
        with harness.server(cmd, f"{url}/health", env=env, cwd=ROOT, name="localgen serve"):
            one_by_one(url, name, 16)  # the embeddings context made, both paths warm
            as_a_batch(url, name, 16)
            t = harness.alternate({"client": partial(one_by_one, url, name, a.requests),
                                   "batch": partial(as_a_batch, url, name, a.requests)}, a.reps)
    n = a.requests
    for key, label in (("client", "one client, one request after another"), ("batch", "one batch of them")):
        s = harness.median(t[key])
        print(f"  {label:40} {s:7.2f} s  {n / s:7.1f} requests/s")
    print(f"  the batch's pace: {harness.ratio(harness.median(t['client']), harness.median(t['batch']))} the "
          f"client's ({n} /v1/embeddings requests of {name}, --batch-lines {a.batch_lines})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
