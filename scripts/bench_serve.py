#!/usr/bin/env python3
"""Serving under load: N concurrent streaming clients, each sending R requests one after another (prompts of
W words, M tokens each), against `localgen serve`, llama.cpp's llama-server, or llama-cpp-python's server.
Reports aggregate generation rate (completion tokens from each stream's usage / wall time of the whole load),
time to first token and inter-token latency p50/p99 as the clients see them (the timer starts before the
POST, TTFT is the first chunk with text, ITL the gaps after it, as vLLM's benchmark client measures).

With --against PATH/llama-server, both servers run side by side and the rounds alternate (localgen,
llama-server, localgen, ...) for every client count and temperature; medians and ratios are printed. Every
row is the median of --rounds rounds, at least 3.
--system-words N gives every request the same N-word system prompt (a shared prefix: 8 clients × ~1,000
tokens shows what reusing it across slots saves; --localgen-args=--no-share-prefix recomputes it).
--conversation makes each client's requests the turns of one chat, and --slots N gives the servers fewer
slots than clients: conversations then take each other's slots, and a server that keeps the slots it gives
up in host memory (localgen's and llama-server's --cache-ram; --localgen-args="--cache-ram 0" turns it off)
evaluates only each turn's new tokens ("prompt cached": the share of prompt tokens the server took from a
cache, from its `timings`).
--whole sends requests that do not stream: instead of TTFT and ITL it reports each request's time (p50) and
the server's own decoding time per token (the median of its `timings`' predicted_ms / predicted_n), which
leaves out the hand-over of every token to the HTTP side.
After each setting, a line tells what localgen's decoding steps did in its rounds (from its /metrics): how many a
round, how many evaluated prompts beside the streams decoding, their mean tokens and their time.

usage: scripts/bench_serve.py [--model gemma3:270m] [--clients 1,8,32] [--temperatures 0,0.8]
                              [--requests 2] [--words 48] [--tokens 64] [--threads 2] [--rounds 3]
                              [--against /tmp/lsrv/bin/llama-server] [--system-words 0]
                              [--target localgen|llama-server|llama-cpp-python] [--localgen-args "..."]
                              [--conversation] [--slots N] [--whole] [--copy]
--copy asks each request to copy back a list (prompt lookup's case: serve --lookup against llama-server's
--spec-type ngram-simple).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any

import harness
import httpx

WORDS = ["river", "mountain", "city", "forest", "history", "science", "music", "garden", "ocean", "planet",
         "window", "letter", "bridge", "market", "silver", "engine", "winter", "forest", "signal", "theory"]


def command(target: str, path: str, port: int, a: argparse.Namespace, clients: int) -> list[str]:
    """The command line that starts `target` on `path` with the script's settings (a.slots or one slot a client)."""
    slots = a.slots or clients
    if target == "localgen":
        # the file llama-server reads, not the name: a name would make this server (its LOCALGEN_HOME a fresh
        # directory) assemble an embedded model anew, and a file just written decoded with a stall every
        # ~0.5 s on this machine (either server: ITL p99 1.4x), which made the comparison unfair
        return [sys.executable, "-m", "localgen", "serve", "-m", path,
                "--port", str(port), "-np", str(slots),
                "-t", str(a.threads), "-c", str(a.ctx), *shlex.split(a.localgen_args)]
    if target == "llama-server":
        return [a.llama_server, "-m", path, "--port", str(port), "-np", str(slots), "-t", str(a.threads),
                "-c", str(a.ctx * slots), "-fa", "on", "--no-webui", *shlex.split(a.llama_args)]
    return [sys.executable, "-m", "llama_cpp.server", "--model", path, "--port", str(port), "--n_threads",
            str(a.threads), "--n_ctx", str(a.ctx), "--flash_attn", "true", "--interrupt_requests", "false"]


@contextmanager
def start(target: str, path: str, a: argparse.Namespace, env: dict[str, str], clients: int) -> Iterator[str]:
    """`target` started and answering (its /v1/models: llama-cpp-python's server has no /health); yields its
    base URL and stops it on the way out."""
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    with harness.server(command(target, path, port, a, clients), url + "/v1/models", timeout=300, env=env,
                        name=target):
        yield url


def client(http: Any, url: str, model: str, prompts: list[str], tokens: int, raw: bool, temperature: float,
           system: str, out: list[dict[str, Any]], conversation: bool = False, whole: bool = False) -> None:
    """Send `prompts` one after another; with `conversation`, as the turns of one chat (each request carries
    the earlier turns and answers, as a chat client re-sends them)."""
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    for prompt in prompts:
        body: dict[str, Any] = {"model": model, "max_tokens": tokens, "stream": True, "temperature": temperature,
                                "seed": random.getrandbits(31), "ignore_eos": True,
                                "stream_options": {"include_usage": True}}
        if not conversation:
            history = [{"role": "system", "content": system}] if system else []
        history.append({"role": "user", "content": prompt})
        if raw:
            body.update(prompt="\n\n".join(m["content"] for m in history))
            endpoint = "/v1/completions"
        else:
            body.update(messages=list(history))
            endpoint = "/v1/chat/completions"
        t0 = time.perf_counter()
        stamps: list[float] = []
        pieces: list[str] = []
        used = prompt_n = cache_n = 0
        if whole:
            body.update(stream=False)
            del body["stream_options"]
            for attempt in range(3):
                try:
                    doc = http.post(url + endpoint, json=body).json()
                    break
                except (httpx.RemoteProtocolError, httpx.ConnectError) as e:
                    if attempt == 2:
                        raise
                    print(f"  (retried a request to {url}: {e})", file=sys.stderr)
            timings = doc.get("timings") or {}
            choice = doc["choices"][0]
            out.append({"t0": t0, "stamps": [], "t1": time.perf_counter(), "tokens": doc["usage"]["completion_tokens"],
                        "prompt_n": timings.get("prompt_n", 0), "cache_n": timings.get("cache_n", 0),
                        "ms_token": timings["predicted_ms"] / max(1, timings["predicted_n"])})
            history.append({"role": "assistant", "content": choice.get("text") or choice["message"]["content"]})
            continue
        for attempt in range(3):  # as the openai client retries (max_retries=2) a kept-alive connection that
            try:              # the server closed just as it was reused; the clock keeps running
                with http.stream("POST", url + endpoint, json=body) as r:
                    for line in r.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        doc = json.loads(line[6:])
                        if doc.get("usage"):
                            used = doc["usage"].get("completion_tokens", 0)
                        if doc.get("timings"):
                            prompt_n = doc["timings"].get("prompt_n", 0)
                            cache_n = doc["timings"].get("cache_n", 0)
                        choice = (doc.get("choices") or [{}])[0]
                        piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                        if piece:
                            stamps.append(time.perf_counter())
                            pieces.append(piece)
                break
            except (httpx.RemoteProtocolError, httpx.ConnectError) as e:
                if stamps or attempt == 2:
                    raise
                print(f"  (retried a request to {url}: {e})", file=sys.stderr)
        out.append({"t0": t0, "stamps": stamps, "tokens": used or len(stamps), "prompt_n": prompt_n,
                    "cache_n": cache_n})
        history.append({"role": "assistant", "content": "".join(pieces)})


def load(url: str, model: str, prompts: list[list[str]], tokens: int, raw: bool, temperature: float,
         system: str, conversation: bool = False, whole: bool = False) -> dict[str, float]:
    """One round: every client's requests; aggregate tok/s, TTFT p50 (s), ITL p99 (ms) (with `whole`: request
    time p50 (s) and the server's decoding ms per token instead)."""
    results: list[dict[str, Any]] = []
    # one HTTP client per simulated user, made before the clock starts and kept across its requests, as an
    # application keeps its `openai` client (a client made per request spends ~0.2 s here building its TLS
    # context, on the cores the server uses, inside every TTFT)
    sessions = [httpx.Client(timeout=600) for _ in prompts]
    threads = [threading.Thread(target=client,
                                args=(h, url, model, p, tokens, raw, temperature, system, results, conversation,
                                      whole))
               for h, p in zip(sessions, prompts, strict=True)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for h in sessions:
        h.close()
    n = sum(r["tokens"] for r in results)
    ttft = [r["stamps"][0] - r["t0"] for r in results if r["stamps"]]
    itl = [b - a_ for r in results for a_, b in zip(r["stamps"], r["stamps"][1:], strict=False)]
    evaluated = sum(r["prompt_n"] for r in results)
    cached = sum(r["cache_n"] for r in results)
    if whole:
        return {"tok_s": n / wall, "req": harness.percentile([r["t1"] - r["t0"] for r in results], 0.5),
                "ms_token": harness.median(r["ms_token"] for r in results),
                "cached": cached / max(1, cached + evaluated)}
    pct = harness.percentile
    return {"tok_s": n / wall, "ttft": pct(ttft, 0.5), "ttft99": pct(ttft, 0.99), "itl50": pct(itl, 0.5) * 1000,
            "itl99": pct(itl, 0.99) * 1000, "cached": cached / max(1, cached + evaluated)}


def load_next(rounds: Iterator[list[list[str]]], url: str, model: str, tokens: int, raw: bool, temperature: float,
              system: str, conversation: bool, whole: bool) -> dict[str, float]:
    """load() with the next round's prompts (each target has its own iterator over the same rounds)."""
    return load(url, model, next(rounds), tokens, raw, temperature, system, conversation, whole)


def step_counts(url: str) -> dict[tuple[str, float], float]:
    """localgen serve's step histograms now (its /metrics, every model's summed): by (sample name, bucket bound;
    0 for the count and the sum)."""
    from prometheus_client.parser import text_string_to_metric_families

    got: dict[tuple[str, float], float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=60).text):
        for s in family.samples:
            if s.name.startswith(("localgen_step_tokens", "localgen_step_seconds")):
                key = (s.name, float(s.labels.get("le", 0)))
                got[key] = got.get(key, 0.0) + s.value
    return got


def counting_steps(case: Any, url: str, tally: dict[tuple[str, float], float]) -> Any:
    """`case` (one round, untimed here) with what localgen's steps did in it added to `tally`."""
    before = step_counts(url)
    result = case()
    for k, v in step_counts(url).items():
        tally[k] = tally.get(k, 0.0) + v - before.get(k, 0.0)
    return result


def describe_steps(tally: dict[tuple[str, float], float], rounds: int, clients: int) -> str:
    """localgen's steps in the rounds of one setting: how many a round, how many carried prompts beside the
    streams (more tokens than two a client), their mean tokens, and step time (mean; p99 as a bucket's bound)."""
    from localgen.serve.metrics import BUCKETS, STEP_BUCKETS

    n = tally.get(("localgen_step_tokens_count", 0.0), 0.0)
    if not n:
        return "no steps counted"
    over = next((b for b in STEP_BUCKETS if b >= 2 * clients), STEP_BUCKETS[-1])
    big = n - tally.get(("localgen_step_tokens_bucket", float(over)), 0.0)
    p99 = next((f"{b * 1000:g} ms" for b in BUCKETS if tally.get(("localgen_step_seconds_bucket", b), 0) >= 0.99 * n),
               f"over {BUCKETS[-1]:g} s")
    return (f"{n / rounds:.0f} a round, {big / rounds:.1f} of them over {over} tokens; "
            f"{tally.get(('localgen_step_tokens_sum', 0.0), 0.0) / n:.0f} tokens a step; step time mean "
            f"{tally.get(('localgen_step_seconds_sum', 0.0), 0.0) / n * 1000:.1f} ms, p99 <= {p99}")


def describe(m: dict[str, float], whole: bool) -> str:
    """One round's figures, or the medians of rounds, as printed."""
    if whole:
        return (f"{m['tok_s']:8.1f} tok/s  request p50 {m['req'] * 1000:6.0f} ms  "
                f"decoding {m['ms_token']:.3f} ms/token")
    return (f"{m['tok_s']:8.1f} tok/s  TTFT p50 {m['ttft'] * 1000:6.0f} ms p99 {m['ttft99'] * 1000:6.0f} ms  "
            f"ITL p50 {m['itl50']:5.0f} ms p99 {m['itl99']:5.0f} ms")


def _copy(rng: random.Random, words: int) -> str:
    """A list of about `words` words to copy back (a task whose answer repeats its prompt)."""
    items = [f"Item {i}: the {rng.choice(WORDS)} box holds {rng.randrange(100)} apples for {rng.choice(WORDS)}."
             for i in range(max(1, words // 11))]
    return "\n".join(items) + "\n\nCopy the list above exactly."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3:270m")
    ap.add_argument("--clients", default="8", help="comma-separated client counts (each gets -np that many)")
    ap.add_argument("--temperatures", default="0.8", help="comma-separated")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--words", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512, help="context per slot")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds per setting; every figure is their median (3 or more)")
    ap.add_argument("--system-words", type=int, default=0)
    ap.add_argument("--conversation", action="store_true",
                    help="each client's requests are the turns of one chat (earlier turns re-sent)")
    ap.add_argument("--slots", type=int, default=0, help="-np for both servers (default: the client count)")
    ap.add_argument("--copy", action="store_true", help="prompts that ask to copy a list of about --words words "
                    "(where prompt lookup's drafts are strong: --localgen-args=--lookup, "
                    "--llama-args='--spec-type ngram-simple')")
    ap.add_argument("--whole", action="store_true", help="requests that do not stream: request time and the "
                    "server's decoding ms per token instead of TTFT and ITL")
    ap.add_argument("--each-round", action="store_true", help="also print every round's figures (the medians "
                    "hide how far closed-loop rounds swing)")
    ap.add_argument("--target", default="localgen", choices=["localgen", "llama-server", "llama-cpp-python"])
    ap.add_argument("--against", metavar="LLAMA_SERVER", help="alternate rounds with this llama-server")
    ap.add_argument("--llama-server", default="/tmp/lsrv/bin/llama-server")
    ap.add_argument("--localgen-args", default="")
    ap.add_argument("--llama-args", default="")
    a = ap.parse_args()
    if a.rounds < 3:  # a median of two is their mean: one swinging round moves it by half its swing
        ap.error("--rounds must be at least 3 (medians of 3 or more)")
    from localgen.models.resolve import resolve

    ref = resolve(a.model)
    raw = not ref.summary.chat_template  # a base model: plain completions, run to the token count
    targets = ["localgen", "llama-server"] if a.against else [a.target]
    if a.against:
        a.llama_server = a.against
    rng = random.Random(7)
    system = " ".join(rng.choice(WORDS) for _ in range(a.system_words))
    print(f"{ref.name}: {a.requests} {'turns of a chat' if a.conversation else 'requests'} per client, "
          f"{a.words}-word {'copy ' if a.copy else ''}prompts"
          + (f" after a shared {a.system_words}-word system prompt" if system else "")
          + f", {a.tokens} tokens, {a.threads} threads, {a.rounds} rounds"
          + (f", {a.slots} slots" if a.slots else "") + "; median of rounds")
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALGEN_HOME": home}
        for clients in [int(c) for c in a.clients.split(",")]:
            with ExitStack() as running:
                urls = {t: running.enter_context(start(t, ref.path, a, env, clients)) for t in targets}
                names: dict[str, str] = {}  # each server's id for the model
                for t, url in urls.items():
                    with httpx.Client(timeout=600) as http:
                        names[t] = http.get(url + "/v1/models").json()["data"][0]["id"]
                        client(http, url, names[t], ["warm up"], 4, raw, 0.0, "", [])
                for temp in [float(x) for x in a.temperatures.split(",")]:
                    # every round's prompts, the same for each target in that round
                    rounds = [[[_copy(rng, a.words) if a.copy else " ".join(rng.choice(WORDS) for _ in range(a.words))
                                for _ in range(a.requests)] for _ in range(clients)] for _ in range(a.rounds)]
                    cases = {t: partial(load_next, iter(rounds), urls[t], names[t], a.tokens, raw, temp, system,
                                        a.conversation, a.whole) for t in targets}
                    steps: dict[tuple[str, float], float] = {}  # localgen's steps in these rounds (/metrics)
                    if "localgen" in cases:
                        cases["localgen"] = partial(counting_steps, cases["localgen"], urls["localgen"], steps)

                    def each_round(r: int, got: dict[str, list[dict[str, float]]]) -> None:
                        for t in harness.order(targets, r):  # as they ran
                            print(f"      round {r + 1} {t:<13} {describe(got[t][-1], a.whole)}", flush=True)

                    got = harness.alternate(cases, a.rounds, after=each_round if a.each_round else None)
                    med = {t: {k: harness.median(x[k] for x in got[t]) for k in got[t][0]} for t in targets}
                    for t in targets:
                        print(f"  {clients:>3} clients, T={temp:<3} {t:<13} {describe(med[t], a.whole)}  "
                              f"prompt cached {med[t]['cached']:4.0%}")
                    if "localgen" in cases:
                        print(f"  {clients:>3} clients, T={temp:<3} localgen steps "
                              f"{describe_steps(steps, a.rounds, clients)}")
                    if a.against:
                        lg, ls = med["localgen"], med["llama-server"]
                        print(f"  {clients:>3} clients, T={temp:<3} ratio         "
                              f"{harness.ratio(lg['tok_s'], ls['tok_s'], '8.2f')}  "
                              + (f"request p50 {harness.ratio(lg['req'], ls['req'], '.3f')}  decoding ms/token "
                                 f"{harness.ratio(lg['ms_token'], ls['ms_token'], '.3f')}  "
                                 "(tok/s: higher is better; times: lower)"
                                 if a.whole else
                                 f"TTFT p50 {harness.ratio(lg['ttft'], ls['ttft'])}  "
                                 f"ITL p99 {harness.ratio(lg['itl99'], ls['itl99'])}"
                                 "  (tok/s: higher is better; latencies: lower)"))
                    sys.stdout.flush()


if __name__ == "__main__":
    main()
