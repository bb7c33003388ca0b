"""Runs a benchmark plan: one model load per configuration, a warm-up, then each test -r times.

Per llama-bench: random tokens of the exact length, end-of-generation ignored, the KV cache cleared
before each repetition (and filled to the depth, untimed). Beyond it: load time, time to first token,
inter-token latency percentiles, peak RSS (and GPU memory used, where there is a GPU), the end-to-end
test through the real `run` path, and each generation rate as a share of the memory-bandwidth limit.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from localgen.bench.sweep import LoadConfig, Plan, Rates, Test
from localgen.types import LoadParams, SamplingParams

E2E_PROMPT = "Write a detailed essay about the history of the printing press."


@dataclasses.dataclass(frozen=True)
class Result:
    """One configuration × test: samples and the derived numbers."""

    config: LoadConfig
    test: Test
    model: dict[str, Any]
    samples_ns: list[int]
    samples_ts: list[float]
    load_s: float
    ttft_ms: float | None
    itl_ms: dict[str, float]
    peak_rss: int | None
    peak_gpu: int | None
    limit_ts: float | None
    test_time: str
    batching: str | None = None  # -npl tests: the scheduler's mode, "exact" or "throughput"
    kv_unified: bool | None = None  # -npl tests: the sequences' KV cells were one pool (else a stream each)
    repetitions: int = 0  # the repetitions run (an e2e one whose answer had no token is run, with no sample)
    planned: int = 0  # the repetitions asked (-r): more than `repetitions` where the run was stopped in this test

    @property
    def avg_ts(self) -> float:
        """Mean tokens per second."""
        return statistics.fmean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        """Sample standard deviation of tokens per second (0 for one sample)."""
        return statistics.stdev(self.samples_ts) if len(self.samples_ts) > 1 else 0.0


class Progress:
    """Callbacks for a progress display; the default does nothing. A display may raise from `loading`, `loaded`,
    `estimate` or `step` to stop the run there: between two measurements, never inside a model load or a context's
    freeing."""

    def begin(self, total: int) -> None:
        """`total` measurements (configurations × tests × repetitions)."""

    def loading(self, description: str) -> None:
        """A configuration's model is about to load."""

    def loaded(self, name: str, path: str, values: dict[str, Any], origins: dict[str, str]) -> None:
        """It loaded: its load settings' `values`, and where each came from (flag, tuning record, rule)."""

    def warning(self, text: str) -> None:
        """Something the user should know before a load (an -ot pattern that moves nothing): once each."""

    def estimate(self, seconds: float) -> None:
        """About how long the whole plan takes, from a first quick measurement (once, before the first test)."""

    def step(self, description: str) -> None:
        """One repetition done."""

    def end(self) -> None:
        """All done."""


def _reset_peak_rss() -> bool:
    """Start the peak resident set size again; False where it cannot be (macOS's ru_maxrss never goes down)."""
    try:  # Linux: writing 5 resets the peak resident set size (VmHWM)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _peak_rss() -> int | None:
    from localgen import hardware

    peak_hwm = hardware.proc_kib_field("/proc/self/status", "VmHWM")
    if peak_hwm is not None:
        return peak_hwm
    import sys

    try:
        import resource
    except ImportError:  # no resource module (Windows): the peak is not measured
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _gpu_used() -> int | None:
    from localgen import hardware

    g = hardware.gpus()
    if not g or g[0].unified:
        return None
    known = [x.total - x.free for x in g if x.total is not None and x.free is not None]
    return sum(known) if len(known) == len(g) else None  # a GPU nvidia-smi says [N/A] for: not known


def _percentiles(times: list[float]) -> dict[str, float]:
    if not times:
        return {}
    ms = sorted(t * 1000 for t in times)

    def q(p: float) -> float:
        i = min(len(ms) - 1, max(0, round(p * (len(ms) - 1))))
        return round(ms[i], 3)

    return {"p50": q(0.50), "p90": q(0.90), "p99": q(0.99)}


def run(plan: Plan, progress: Progress | None = None, bandwidth: float | None = None,
        open_model: Callable[[str], Any] | None = None, rpc: tuple[str, ...] = ()) -> Iterator[Result]:
    """Run the plan, yielding a Result per configuration and test as soon as it is measured."""
    from localgen.engine.bench import BenchContext, model_desc, model_size
    from localgen.engine.defaults import UBATCH
    from localgen.engine.llama import Engine
    from localgen.models.load import moved_bytes, unmatched_overrides
    from localgen.models.resolve import resolve

    progress = progress or Progress()
    progress.begin(plan.size * plan.repetitions)
    n_ctx = max(t.ctx_needed for t in plan.tests if t.n_parallel == 1) + 64 if any(
        t.n_parallel == 1 for t in plan.tests) else 512
    refs: dict[str, Any] = {}
    checked: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    probed = False
    for cfg in plan.configs:
        progress.loading(_describe(cfg))
        ref = refs.get(cfg.model) or (open_model(cfg.model) if open_model else resolve(cfg.model))
        refs[cfg.model] = ref
        if (ref.path, cfg.override_tensor) not in checked:  # a sweep's every -ot, once for each model
            checked.add((ref.path, cfg.override_tensor))
            for text in unmatched_overrides(ref, cfg.override_tensor):
                progress.warning(text)
        # a context that holds the micro-batch asked (or the rule's), so that llama.cpp does not cap it at a short
        # test's context: the value recorded is the one used, as asked
        params = _load_params(cfg, max(n_ctx, cfg.n_ubatch or UBATCH), plan.kv_unified, rpc)
        # a peak that cannot be reset would carry an earlier load's over: only the first load's rows give it then
        rss_measured = _reset_peak_rss() or cfg is plan.configs[0]
        engine = Engine(ref, params)
        try:
            moved_bytes(engine, ref.path)
            progress.loaded(ref.name, ref.path, vars(engine.params), engine.origins)
        except BaseException:  # stopped once it loaded (Ctrl-C during the load): before any measurement
            engine.close()
            raise
        # the settings the load chose where the sweep left them open (tuning record or rule), as measured; -ub as
        # asked, as llama-bench records it (llama.cpp caps the micro-batch at --batch-size, in both tools). One a
        # tuning record chose larger than this context is capped at it by the load's settings (engine/defaults.py)
        cfg = dataclasses.replace(cfg, n_threads=engine.params.n_threads,
                                  n_ubatch=cfg.n_ubatch or engine.params.n_ubatch, flash_attn=engine.flash_attn)
        try:
            size, n_params = model_size(engine)
            model = {"name": ref.name, "filename": os.path.abspath(ref.path), "type": model_desc(engine), "size": size,
                     "n_params": n_params, "moved": engine.load_report.moved}
            # the limit is host memory bandwidth over the weights a token reads (all of them, but of a mixture of
            # experts only the experts used): meaningless once layers are on a GPU
            limit = None
            if bandwidth and size and not engine.offloaded:
                from localgen.bench.bandwidth import bytes_per_token

                limit = bandwidth / bytes_per_token(ref.path, ref.summary)
            bench = BenchContext(engine)
            bench.clear()
            warm = time.perf_counter()
            bench.prompt(min(plan.tests[0].n_prompt or 16, cfg.n_batch))  # warm-up: caches, threads, kernels
            bench.generate(1)
            if not probed:
                room = min(cfg.n_batch, n_ctx - PROBE_GEN - 1)
                progress.estimate(plan.seconds(_probe(bench, room, engine.load_s + time.perf_counter() - warm)))
                probed = True
            for result in _tests(plan, engine, bench, cfg, model, progress, limit):
                yield result if rss_measured else dataclasses.replace(result, peak_rss=None)
        finally:
            engine.close()
    progress.end()


def _tests(plan: Plan, engine: Any, bench: Any, cfg: LoadConfig, model: dict[str, Any], progress: Progress,
           limit: float | None) -> Iterator[Result]:
    """Each of the plan's tests on one loaded configuration, a row as each is measured; one stopped (Ctrl-C,
    SIGTERM) or failed part-way is a row of the repetitions it measured, then the stop goes on."""
    for test in plan.tests:
        cut: list[Result] = []  # the repetitions measured before a stop inside this test, as one row
        try:
            if test.n_parallel > 1:
                result = _measure_parallel(engine, cfg, test, model, plan.repetitions, progress, plan.exact,
                                           cut=cut.append)
            else:
                result = _measure(engine, bench, cfg, test, model, plan.repetitions, progress, limit,
                                  cut=cut.append)
        except BaseException:
            if cut:
                yield cut[0]
            raise
        yield result


def _load_params(cfg: LoadConfig, n_ctx: int, kv_unified: bool | None, rpc: tuple[str, ...]) -> LoadParams:
    """The load settings of one configuration of the sweep, with a context of n_ctx."""
    return LoadParams(n_ctx=n_ctx, n_threads=cfg.n_threads, n_threads_batch=cfg.n_threads,
                      n_gpu_layers=cfg.n_gpu_layers, n_batch=cfg.n_batch, n_ubatch=cfg.n_ubatch,
                      flash_attn=cfg.flash_attn, cache_type_k=cfg.type_k, cache_type_v=cfg.type_v, rpc=rpc,
                      n_cpu_moe=cfg.n_cpu_moe or None, override_tensor=cfg.override_tensor, cpu_moe=cfg.cpu_moe,
                      kv_unified=kv_unified, main_gpu=cfg.main_gpu)


PROBE_PROMPT, PROBE_GEN = 64, 4


def _probe(bench: Any, room: int, load_s: float) -> Rates:
    """A first quick measurement, warm: a short prompt (of at most `room` tokens) and a few generated tokens,
    well under a second for most models here, to foresee the sweep's length."""
    bench.clear()
    n = max(1, min(PROBE_PROMPT, room))
    prompt_s = bench.prompt(n) / n
    gen_s = statistics.fmean(bench.generate(PROBE_GEN))
    bench.clear()
    return Rates(prompt_s=prompt_s, gen_s=gen_s, load_s=load_s)


def _describe(cfg: LoadConfig) -> str:
    """The configuration in a few words, for a progress display."""
    settings = [f"t={cfg.n_threads}" if cfg.n_threads else "", f"ngl={cfg.n_gpu_layers}",
                f"mg={cfg.main_gpu}" if cfg.main_gpu else "", f"b={cfg.n_batch}",
                f"ub={cfg.n_ubatch}" if cfg.n_ubatch else "",
                f"fa={int(cfg.flash_attn)}" if cfg.flash_attn is not None else "", f"ctk={cfg.type_k}",
                f"ctv={cfg.type_v}", f"ncmoe={cfg.n_cpu_moe}" if cfg.n_cpu_moe else "",
                f"ot={';'.join(f'{p}={b}' for p, b in cfg.override_tensor)}" if cfg.override_tensor else "",
                "cmoe" if cfg.cpu_moe else ""]
    return f"loading {cfg.model.rsplit('/', 1)[-1]} " + " ".join(x for x in settings if x)


def _measure(engine: Any, bench: Any, cfg: LoadConfig, test: Test, model: dict[str, Any], reps: int,
             progress: Progress, limit: float | None, cut: Callable[[Result], None] | None = None) -> Result:
    """The test's `reps` repetitions as one row. Stopped part-way (the display's stop, a KeyboardInterrupt, an
    error), the repetitions measured before are handed to `cut` as a row of fewer, and the stop goes on."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    samples: list[float] = []
    ttfts: list[float] = []
    token_times: list[float] = []
    tokens = 0
    done = 0

    def row() -> Result:
        return Result(
            config=cfg, test=test, model=model, samples_ns=[int(s * 1e9) for s in samples],
            samples_ts=[tokens / s for s in samples], load_s=engine.load_s,
            ttft_ms=statistics.fmean(ttfts) * 1000 if ttfts else None, itl_ms=_percentiles(token_times),
            peak_rss=_peak_rss(), peak_gpu=_gpu_used(), limit_ts=limit if test.kind in ("tg", "e2e") else None,
            test_time=started, repetitions=done, planned=reps,
        )

    try:
        for rep in range(reps):
            bench.clear()
            if test.kind == "e2e":
                measured = _e2e(engine, test.n_gen, seed=rep + 1,
                                warn=progress.warning if rep == 0 else lambda _: None)  # once
                if measured is None:  # no token: the repetition has no rate; the others make the row
                    done = rep + 1
                    progress.step(f"{model['name']} {test.label} ({rep + 1}/{reps})")
                    continue
                seconds, ttft, itl, n = measured
                samples.append(seconds)
                ttfts.append(ttft)
                token_times += itl
                tokens = n
            else:
                if test.n_depth:
                    bench.prompt(test.n_depth)
                seconds = 0.0
                if test.n_prompt:
                    seconds += bench.prompt(test.n_prompt)
                if test.n_gen:
                    times = bench.generate(test.n_gen)
                    if test.kind == "pg":
                        ttfts.append(seconds + times[0])
                    seconds += sum(times)
                    token_times += times
                samples.append(seconds)
                tokens = test.n_prompt + test.n_gen
            done = rep + 1
            progress.step(f"{model['name']} {test.label} ({rep + 1}/{reps})")
    except BaseException:
        if samples and cut is not None:
            cut(row())
        raise
    if not samples:  # every repetition's answer ended before its first token (only e2e's can)
        from localgen.errors import LocalgenError

        raise LocalgenError(f"{test.label}: each answer ended before its first token, so it has no rate",
                            hint="--no-e2e skips it")
    return row()


def _measure_parallel(engine: Any, cfg: LoadConfig, test: Test, model: dict[str, Any], reps: int,
                      progress: Progress, exact: bool | None = None,
                      cut: Callable[[Result], None] | None = None) -> Result:
    """Aggregate rates over n_parallel sequences decoded together (llama-batched-bench's S_PP / S_TG), on the
    context `serve` makes here but for its KV cells: a stream per sequence unless --kv-unified, as
    llama-batched-bench keeps them (engine/batchmode.py, kv_pool). The prompts go through the batch scheduler
    that `serve` and `run --file` use (engine/batch.py); a tg test then decodes every sequence together (untimed
    prompts first, as that tool does). `exact`: --exact / --no-exact, else the mode `serve` would use. Stopped
    part-way, the repetitions measured before go to `cut` as a row of fewer, as _measure's."""
    import random

    from localgen.engine.batch import ParallelContext
    from localgen.engine.batchmode import batching_mode
    from localgen.engine.bench import bench_parallel

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    mode = batching_mode(engine, exact)  # the scheduler `serve` and `run --file` use here (the cells: kv_pool's)
    # llama-batched-bench's sequences: a stream each unless --kv-unified, as serve's and run --file's
    pc = ParallelContext(engine, test.n_parallel, test.n_prompt + test.n_gen + 16, pooled=mode.throughput)
    rng = random.Random(1234)
    samples: list[float] = []
    tokens = test.n_parallel * (test.n_gen or test.n_prompt)

    def row() -> Result:
        return Result(
            config=cfg, test=test, model=model, samples_ns=[int(s * 1e9) for s in samples],
            samples_ts=[tokens / s for s in samples], load_s=engine.load_s, ttft_ms=None, itl_ms={},
            peak_rss=_peak_rss(), peak_gpu=_gpu_used(), limit_ts=None, test_time=started, batching=mode.name,
            kv_unified=pc.one_pool, repetitions=len(samples), planned=reps,
        )

    try:
        bench_parallel(pc, min(test.n_prompt, 16) or 1, 1, rng)  # warm-up
        for rep in range(reps):
            t_pp, t_tg = bench_parallel(pc, test.n_prompt or 1, test.n_gen, rng, mode.exact)
            samples.append(t_pp if test.n_gen == 0 else t_tg)
            progress.step(f"{model['name']} {test.label} ({rep + 1}/{reps})")
    except BaseException:
        if samples and cut is not None:
            cut(row())
        raise
    finally:
        pc.close()
    return row()


def _e2e(engine: Any, n: int, seed: int,
         warn: Callable[[str], None]) -> tuple[float, float, list[float], int] | None:
    """The `run` path: chat template, tokenize, sample, detokenize. Returns (generation seconds, time to
    first token, inter-token times, tokens generated), the rate counting generated tokens only; None where the
    answer ended before its first token (a base model's sampled EOS), which has no rate. A chat template that
    fails is said (`warn`), and the prompt goes as plain text, as a base model's: the rows measured before it and
    this one are kept (it ended the whole run, its rows measured)."""
    from localgen.errors import TemplateError
    from localgen.native.prompt import Prompt

    tokens = None
    if engine.model.summary.chat_template:
        try:
            tokens = engine.chat_tokens([{"role": "user", "content": E2E_PROMPT}])
        except TemplateError as e:
            warn(f"{e.message}: e2e sends its prompt as plain text, as `run --raw` does")
    if tokens is None:  # a base model: the prompt as a plain completion, as `run --raw` sends it
        tokens = engine.raw_tokens(E2E_PROMPT)
    gen = engine.generate(Prompt.text(tokens), SamplingParams(seed=seed, max_tokens=n))
    t0 = time.perf_counter()
    stamps = []
    count = 0
    for chunk in gen:
        stamps.append((time.perf_counter(), chunk.n_tokens))
        count = chunk.n_tokens
    t_end = time.perf_counter()
    if not count:  # the answer ended before its first token: no rate to measure (it was a division by zero)
        return None
    first = stamps[0][0]
    gaps = [(b - a) / max(1, nb - na) for (a, na), (b, nb) in itertools.pairwise(stamps)]
    gen_s = max(t_end - first, 1e-9)
    return gen_s * count / max(1, count - 1), first - t0, gaps, max(count, 1)
