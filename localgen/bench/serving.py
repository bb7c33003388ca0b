"""`localgen bench --endpoint URL`: a server measured from the client, the way `vllm bench serve` does it.
For each concurrency and request rate: N streamed chat requests of a given prompt length and answer
length, at most `concurrency` in flight, arriving as a Poisson process at `rate` per second (inf: all at
once). Reported: output tokens/s and requests/s over the whole sweep point, and time to first token,
inter-token gap and end-to-end latency at p50/p90/p99, all measured here. These are client-side figures
(network, server queueing and HTTP included), not llama-bench numbers."""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from localgen.errors import RemoteError
from localgen.types import GenerationRequest, SamplingParams

MAX_CONCURRENCY = 1024  # requests in flight, a thread each
MAX_TOKENS = 1 << 20  # -p and -n: a million tokens
MAX_TEXT = 1 << 26  # the words of a point's prompts, all made in memory before the first request is sent
MAX_PROMPTS = 100_000  # --num-prompts

WORDS = ("the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "as", "with", "his", "they",
         "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all", "were",
         "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do", "how", "their")


@dataclass
class Point:
    """One sweep point's raw measurements."""

    concurrency: int
    rate: float
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)  # as the server counted them (its usage or timings)
    gen_tokens: list[int] = field(default_factory=list)  # likewise, each answer's
    output_tokens: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    duration: float = 0.0


def prompt_text(words: int, rng: random.Random) -> str:
    """About `words` tokens of filler."""
    return " ".join(rng.choice(WORDS) for _ in range(max(1, words)))


def prompts(n: int, words: int, seed: int, same: bool = False) -> list[str]:
    """n prompts of about `words` words. Each begins with a nonce of its own, drawn afresh on every call, so
    no request shares more than the chat template's opening with any other of this run or an earlier one,
    and a server's prefix cache cannot make its time to first token look short. `same`: one fixed prompt
    for every request (seeded), to measure the server with its cache warm."""
    if same:
        return [prompt_text(words, random.Random(seed))] * n
    nonce = random.SystemRandom()
    rng = random.Random(seed)
    return [f"{nonce.getrandbits(32):08x} {prompt_text(words - 1, rng)}" for _ in range(n)]


MIN_RATE = 1 / 86400  # one request a day: a slower rate is no benchmark (and its waits overflow time.sleep)


def measure(client: Any, concurrency: int, rate: float, n: int, prompt_words: int, gen: int, seed: int,
            same_prompt: bool = False) -> Point:
    """Send n requests at most `concurrency` at a time, arriving at `rate` per second (MIN_RATE or more)."""
    from localgen.remote.client import RemoteGeneration

    if not rate >= MIN_RATE:
        raise ValueError(f"a request rate of {rate!r} a second is below one a day")
    rng = random.Random(seed)
    texts = prompts(n, prompt_words, seed, same_prompt)
    arrivals, t = [], 0.0
    for _ in range(n):
        arrivals.append(t)
        t += 0.0 if math.isinf(rate) else rng.expovariate(rate)
    point = Point(concurrency, rate)
    lock = threading.Lock()
    slots = threading.Semaphore(concurrency)
    sampling = SamplingParams(temperature=0.0, max_tokens=gen, ignore_eos=True)

    def one(i: int) -> None:
        try:
            request = GenerationRequest(messages=({"role": "user", "content": texts[i]},),
                                        sampling=SamplingParams(**{**sampling.__dict__, "seed": seed + i}))
            g = RemoteGeneration(client, request, time.perf_counter())
            for _ in g:
                pass
            s = g.stats
            assert s is not None
            with lock:
                if s.ttft_s is not None:
                    point.ttft.append(s.ttft_s)
                point.itl += [b - a for a, b in zip(g.arrivals, g.arrivals[1:], strict=False)]
                point.e2e.append(s.total_s)
                if g.counted:  # the server counted the tokens; otherwise no count is shown
                    point.prompt_tokens.append(s.prompt_tokens)
                    point.gen_tokens.append(s.completion_tokens)
                point.output_tokens += s.completion_tokens
        except RemoteError as e:
            with lock:
                point.failed += 1
                point.errors.append(e.message)
        finally:
            slots.release()

    threads = []
    t0 = time.perf_counter()
    for i in range(n):
        delay = arrivals[i] - (time.perf_counter() - t0)
        if delay > 0:
            time.sleep(delay)
        slots.acquire()
        th = threading.Thread(target=one, args=(i,), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        while th.is_alive():
            th.join(0.2)
    point.duration = time.perf_counter() - t0
    return point


def _q(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ms = sorted(v * 1000 for v in values)
    return round(ms[min(len(ms) - 1, max(0, round(p * (len(ms) - 1))))], 3)


def record(p: Point, url: str, model: str, gen: int, system: dict[str, Any], same_prompt: bool = False
           ) -> dict[str, Any]:
    """A sweep point as a history record: llama-bench's fields where they mean something, ours after."""
    done = len(p.e2e)
    tps = p.output_tokens / p.duration if p.duration else 0.0
    rate = "inf" if math.isinf(p.rate) else f"{p.rate:g}"
    return {
        "build_commit": system["build_commit"], "build_number": 0, "cpu_info": "", "gpu_info": "",
        "backends": "remote", "model_filename": f"{url} {model}", "model_type": model, "model_size": 0,
        "model_n_params": 0, "n_batch": None, "n_ubatch": None, "n_threads": None, "cpu_mask": None,
        "cpu_strict": None, "poll": None, "type_k": None, "type_v": None, "n_gpu_layers": None, "split_mode": None,
        "main_gpu": None, "no_kv_offload": None, "flash_attn": None, "tensor_split": None, "use_mmap": None,
        "embeddings": False,
        "n_prompt": round(statistics.fmean(p.prompt_tokens)) if p.prompt_tokens else 0, "n_gen": gen,
        "n_depth": 0, "test_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "avg_ns": int(p.duration * 1e9), "stddev_ns": 0, "avg_ts": round(tps, 6), "stddev_ts": 0.0,
        "test": f"serve c{p.concurrency} r{rate}", "n_parallel": p.concurrency, "model_name": model, "load_s": 0.0,
        "ttft_ms": _q(p.ttft, 0.5), "itl_p50_ms": _q(p.itl, 0.5), "itl_p90_ms": _q(p.itl, 0.9),
        "itl_p99_ms": _q(p.itl, 0.99), "peak_rss_bytes": None, "peak_gpu_bytes": None, "limit_ts": None,
        "limit_share": None, "localgen_version": system["localgen_version"],
        # client-side serving figures
        "client_side": True, "endpoint": url, "request_rate": rate, "requests": done, "failed": p.failed,
        "req_per_s": round(done / p.duration, 4) if p.duration else 0.0,
        "ttft_p90_ms": _q(p.ttft, 0.9), "ttft_p99_ms": _q(p.ttft, 0.99),
        "e2e_p50_ms": _q(p.e2e, 0.5), "e2e_p90_ms": _q(p.e2e, 0.9), "e2e_p99_ms": _q(p.e2e, 0.99),
        "first_error": p.errors[0] if p.errors else None, "same_prompt": same_prompt,
        # the server's token counts (a mean a request), None where it sent none: the table shows "-"
        "prompt_counted": round(statistics.fmean(p.prompt_tokens)) if p.prompt_tokens else None,
        "gen_counted": round(statistics.fmean(p.gen_tokens)) if p.gen_tokens else None,
    }


def run(client: Any, url: str, model: str, concurrencies: list[int], rates: list[float], num_prompts: int | None,
        prompt_words: int, gen: int, seed: int, system: dict[str, Any], same_prompt: bool = False
        ) -> Iterator[dict[str, Any]]:
    """The sweep, a record per point as it is measured (`same_prompt`: see prompts())."""
    for c in concurrencies:
        for r in rates:
            n = num_prompts or max(8, 2 * c)
            yield record(measure(client, c, r, n, prompt_words, gen, seed, same_prompt), url, model, gen, system,
                         same_prompt)


def seconds(points: list[tuple[int, float, int, int]], e2e_s: float, gen: int) -> float:
    """About how long sweep points (concurrency, rate, requests, answer tokens) take if each request takes
    e2e_s per `gen` tokens of answer, as the first point's did (a server that slows under load takes longer),
    or as long as their arrivals at `rate` take."""
    total = 0.0
    for c, rate, n, g in points:
        per = e2e_s * g / max(1, gen)
        total += max(math.ceil(n / c) * per, 0.0 if math.isinf(rate) else (n - 1) / rate + per)
    return total


def table(records: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells for serving records."""
    headers = ["endpoint", "model", "conc", "rate", "reqs", "prompt", "gen", "out tok/s", "req/s",
               "ttft p50/p90/p99 ms", "itl p50/p90/p99 ms", "e2e p50/p90/p99 ms"]

    def three(r: dict[str, Any], a: str, b: str, c: str) -> str:
        return "/".join(f"{r[k]:.1f}" if r[k] is not None else "-" for k in (a, b, c))

    def counted(r: dict[str, Any], key: str, old: str) -> str:  # an older record has no such key: its old figure
        return str(r[old]) if key not in r else "-" if r[key] is None else str(r[key])

    cells = [[r["endpoint"], r["model_name"], str(r["n_parallel"]), r["request_rate"],
              f"{r['requests']}" + (f" ({r['failed']} failed)" if r["failed"] else ""),
              counted(r, "prompt_counted", "n_prompt"), counted(r, "gen_counted", "n_gen"),
              f"{r['avg_ts']:.1f}", f"{r['req_per_s']:.2f}",
              three(r, "ttft_ms", "ttft_p90_ms", "ttft_p99_ms"), three(r, "itl_p50_ms", "itl_p90_ms", "itl_p99_ms"),
              three(r, "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms")] for r in records]
    return headers, cells


LABEL = "client-side figures (network, queueing and HTTP included; not llama-bench numbers)"


def markdown(records: list[dict[str, Any]]) -> str:
    """The serving table in Markdown, with the client-side label."""
    headers, cells = table(records)
    lines = [LABEL, "",
             "| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    return "\n".join(lines) + "\n"
