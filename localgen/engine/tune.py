"""`localgen tune`'s measurements: for one load (repacking) and one context (flash attention), the prompt and
decode rates at depth 0 and at a depth of real use, for each thread count and physical batch size, the way
llama-bench measures (random tokens, no sampling, synchronized). With several streams, decoding is one step of
one token per stream, as serve's scheduler runs them."""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from localgen.errors import LocalgenError
from localgen.native import context, logs
from localgen.native.batch import Batch
from localgen.types import LoadParams, ModelRef

PROMPT = 512  # the exchange by default: a 512-token prompt...
ANSWER = 256  # ...and a 256-token answer (tune --prompt, --answer)
UBATCH = 512  # llama.cpp's physical batch, and the largest tried


@dataclass(frozen=True)
class Point:
    """One measurement: `seconds` for `what` ("pp" for the prompt, "tg" for one decoding step) at `depth`,
    with these threads (batch threads for prompts and multi-stream steps) and physical batch."""

    what: str
    depth: int
    threads: int
    ubatch: int
    seconds: float


def check_generates(model: ModelRef) -> None:
    """Refuse, from the header alone, a model that only embeds or scores (attention not causal: BERT and kin;
    a T5 encoder), before any size is weighed against its window; Probe checks the loaded model too."""
    if model.summary.encoder_only:
        raise _not_generating(model)


def _not_generating(model: ModelRef) -> LocalgenError:
    return LocalgenError(f"{model.name} does not generate (an embedding or reranking model): tune measures "
                         "generation", hint="tune a model that chats or completes text")


class Probe:
    """One model load and one context with `streams` sequences, driven directly."""

    def __init__(self, model: ModelRef, repack: bool, flash_attn: bool, n_ctx_seq: int, streams: int,
                 cpu_only: bool, seed: int = 1234, prompt: int = PROMPT,
                 placement: tuple[tuple[str, str], ...] = (), check: Callable[[], None] = lambda: None) -> None:
        """`placement`: the (pattern, buffer type) pairs the model loads with (-ot, --cpu-moe, --n-cpu-moe).
        `check` raises once the tune is to stop (Ctrl-C): asked before each decode, and inside the untimed
        decodes that fill the context (through llama.cpp's abort callback, which costs the timed ones nothing)."""
        self.check = check
        from localgen.engine.llama import Engine
        from localgen.types import KV_CACHE_TYPES

        self.engine = Engine(model, LoadParams(n_ctx=256, repack=repack, flash_attn=flash_attn, n_threads=1,
                                               n_threads_batch=1, n_ubatch=UBATCH, n_batch=UBATCH,
                                               override_tensor=placement), cpu_only=cpu_only)
        if self.engine.encoder_only:
            self.engine.close()
            raise _not_generating(model)
        self.engine.release_context()
        self.streams = streams
        self.n_ctx_seq = -(-n_ctx_seq // 256) * 256
        n_ctx = self.n_ctx_seq * streams
        self.ctx = context.new(
            self.engine.model_ptr, n_ctx=n_ctx, n_batch=max(UBATCH, streams), n_ubatch=max(UBATCH, streams),
            n_seq_max=streams,
            kv_unified=False,  # each stream its own cells, as serve keeps them on a CPU
            flash_attn_type=int(flash_attn), type_k=KV_CACHE_TYPES["f16"], type_v=KV_CACHE_TYPES["f16"])
        if not self.ctx:
            self.engine.close()
            raise LocalgenError(f"llama.cpp could not create a {n_ctx}-token context to tune in",
                                hint="tune with a smaller --depth or fewer --parallel streams")
        self.mem = context.memory(self.ctx)
        self.batch = Batch(max(UBATCH, streams))
        self.prompt_tokens = prompt
        self.n_vocab = self.engine.n_vocab
        self.rng = random.Random(seed)
        self.depth = 0

    def close(self) -> None:
        context.drop(self)
        self.engine.close()

    def _decode(self, rows: list[tuple[int, int]], threads: int, threads_batch: int) -> None:
        """Decode (position, sequence) rows of random tokens."""
        b = self.batch
        context.set_threads(self.ctx, threads, threads_batch)
        b.n_tokens = 0
        for i, (pos, seq) in enumerate(rows):
            b.add(self.rng.randrange(self.n_vocab), pos, seq, i == len(rows) - 1)
        self.check()  # a Ctrl-C acts before the next decode, not after the measurement
        rc = context.decode(self.ctx, b)
        logs.raise_deferred()
        if rc == 2:  # stopped by the abort callback (fill): check raises
            self.check()
        if rc != 0:
            raise LocalgenError(f"llama_decode failed ({rc}) while tuning", hint="try a smaller --depth")
        context.synchronize(self.ctx)
        logs.raise_deferred()

    def _stopping(self) -> bool:
        """Whether check would raise (asked by llama.cpp between the operations of a decode)."""
        try:
            self.check()
        except Exception:  # whatever check raises to stop the tune
            return True
        return False

    @contextlib.contextmanager
    def _stoppable(self) -> Iterator[None]:
        """A Ctrl-C stops a decode made inside where it is: llama.cpp's abort callback, asked once per operation of
        the graph, a cost lost beside a prompt's own work. Not around the decoding steps: a step is a token, soon
        over, and there the same cost would weigh on what is timed."""
        abort = context.set_abort(self.ctx, self._stopping)
        try:
            yield
        finally:
            context.set_abort(self.ctx, None)
            del abort

    def fill(self, depth: int, threads: int) -> None:
        """Make every stream hold `depth` tokens (stream 0 evaluated, the others copies of it); untimed, so a
        Ctrl-C stops a decode of it where it is."""
        context.clear(self.mem, True)
        with self._stoppable():
            for start in range(0, depth, UBATCH):
                self._decode([(p, 0) for p in range(start, min(depth, start + UBATCH))], threads, threads)
        for s in range(1, self.streams):
            context.seq_cp(self.mem, 0, s, -1, -1)
        self.depth = depth

    def _back(self) -> None:
        for s in range(self.streams):
            context.seq_rm(self.mem, s, self.depth, -1)

    def prompt(self, threads: int, ubatch: int) -> float:
        """Seconds to evaluate the prompt's tokens after the depth in stream 0, `ubatch` tokens a call; a Ctrl-C
        stops a decode of it where it is (a figure cut short is never kept: check raises)."""
        with self._stoppable():
            t0 = time.perf_counter()
            for start in range(0, self.prompt_tokens, ubatch):
                n = min(ubatch, self.prompt_tokens - start)
                self._decode([(self.depth + start + i, 0) for i in range(n)], threads, threads)
            took = time.perf_counter() - t0
        self._back()
        return took

    def step(self, threads: int, n: int) -> float:
        """Median seconds of one decoding step (a token for each stream), over `n` steps after the depth."""
        times = []
        for k in range(n):
            t0 = time.perf_counter()
            self._decode([(self.depth + k, s) for s in range(self.streams)], threads, threads)
            times.append(time.perf_counter() - t0)
        self._back()
        return statistics.median(times)


@dataclass(frozen=True)
class Job:
    """A measurement to make: "pp" (the prompt, `ubatch` tokens a call) or "tg" (decoding steps) at `depth`."""

    what: str
    depth: int
    threads: int
    ubatch: int = UBATCH


PRUNE = 1.25  # a thread count this much slower than the best at depth 0 is not measured deeper


def _lost(out: list[Point], job: Job) -> bool:
    """Whether `job`'s thread count already lost clearly at the shallowest depth (same kind, same batch)."""
    if not out:
        return False
    first = min(p.depth for p in out)
    peers = [p for p in out if p.depth == first and p.what == job.what and (job.what == "tg" or p.ubatch == job.ubatch)]
    mine = [p.seconds for p in peers if p.threads == job.threads]
    return bool(mine) and job.depth > first and mine[0] > PRUNE * min(p.seconds for p in peers)


def measure(probe: Probe, jobs: list[Job], steps: int, on_point: Callable[[Point | None], Any]) -> list[Point]:
    """Each job in turn (the context filled again when the depth changes); `on_point` sees each result, and
    None for a job skipped because its thread count lost by more than PRUNE at depth 0."""
    out: list[Point] = []
    warm = max(j.threads for j in jobs)
    probe.fill(32, warm)  # the compute graph's first allocation is not measured
    probe.prompt(warm, UBATCH)
    probe.depth = -1
    for job in sorted(jobs, key=lambda j: j.depth):
        if _lost(out, job):
            on_point(None)
            continue
        if probe.depth != job.depth:
            probe.fill(job.depth, warm)
        secs = probe.prompt(job.threads, job.ubatch) if job.what == "pp" else probe.step(job.threads, steps)
        out.append(Point(job.what, job.depth, job.threads, job.ubatch if job.what == "pp" else 0, secs))
        on_point(out[-1])
    return out


def exchange(points: list[Point], depths: tuple[int, ...], threads: int, threads_batch: int, ubatch: int,
             streams: int = 1, answer: int = ANSWER) -> float | None:
    """One exchange (the prompt in, `answer` tokens out, per stream) at each depth, summed; None if not all
    measured.
    With one stream, prompts use the batch threads and decoding the generation threads, as llama.cpp does;
    with several, a step is a batch too."""
    total = 0.0
    for d in depths:
        pp = [p.seconds for p in points if p.what == "pp" and p.depth == d and p.threads == threads_batch
              and p.ubatch == ubatch]
        tg_threads = threads if streams == 1 else threads_batch
        tg = [p.seconds for p in points if p.what == "tg" and p.depth == d and p.threads == tg_threads]
        if not pp or not tg:
            return None
        total += pp[0] * streams + answer * tg[0]
    return total

