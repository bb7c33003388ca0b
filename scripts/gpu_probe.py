#!/usr/bin/env python3
"""Where do `localgen bench` and `bench -npl` lose to llama.cpp's own tools? (issue #59: on an H200, bench ran at
0.96× llama-bench, a MoE's prefill at 0.91×, -npl 32's prefill at 0.94× llama-batched-bench, and about 2.2 ms of
every 512-token prompt call was lost whatever the model.)

One process, one model, everything measured in alternation (median of --reps rounds), on the same llama.cpp
libraries:
- llama-bench and llama-batched-bench themselves (where --tools holds them);
- `localgen bench`'s own loop (engine/bench.py, BenchContext) on an Engine loaded as `bench` loads it;
- the same two ctypes calls per step written bare, on that Engine's context; on a context made with llama-bench's
  settings over the Engine's model; and on a model and context loaded with llama.cpp's default parameters, as
  llama-bench loads them: which of the Python loop, the context's settings and the model's load costs the time;
- each of those with the log callback replaced by a C function that does nothing: on a GPU llama.cpp logs a debug
  line on every decode, each a call into Python;
- the context's settings one at a time (the Engine's window and perf counters against llama-bench's), on contexts
  made new over the Engine's model and on the Engine's own, used one;
- -npl N's prefill of a burst of N prompts through the throughput scheduler, with the old rule (one ubatch per step)
  and the new (a whole n_batch per step while nothing decodes), and bare decode calls of 2048 rows;
- the scheduler's Python time per step while N sequences decode at temperature 0.8 (everything outside
  llama_decode and its synchronization): the part of a decoding step a GPU cannot shorten.

The single-stream rows are medians of --reps rounds; the -npl rows of --reps // 2 (at least one).

Prints a Markdown report; `--json FILE` keeps the figures.

usage: scripts/gpu_probe.py MODEL [--tools DIR] [-t 16] [--npl 32] [--reps 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any


def tool_rates(run: Callable[..., dict[str, float]], exe: str, *args: Any) -> dict[str, float]:
    """One of bench_vs_llama_bench's runs of a llama.cpp tool (its rates by test); none where the tool is not there
    (a CPU machine without llama.cpp's tools) or fails."""
    if not os.path.exists(exe):
        return {}
    try:
        return run(exe, *args)
    except subprocess.CalledProcessError:
        return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tools", default="", help="the folder of llama-bench and llama-batched-bench")
    ap.add_argument("-t", type=int, default=16, help="threads")
    ap.add_argument("--npl", type=int, default=32, help="sequences of the -npl and decoding-step measures")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not 0 < a.p <= 2048 or a.n <= 0 or a.npl < 1 or a.reps < 1:
        ap.error("-p is 1 to 2048 (a prompt is one call's rows), -n, --npl and --reps at least 1")
    p, n, npl = a.p, a.n, a.npl
    out: dict[str, Any] = {"model": os.path.basename(a.model), "threads": a.t}
    t0 = time.monotonic()
    from bench_vs_llama_bench import batched_bench, llama_bench  # scripts/ is first on the path

    lb = tool_rates(llama_bench, os.path.join(a.tools, "llama-bench"), a.model, p, n, a.t, a.reps)
    out["llama-bench"] = {"pp": lb[f"pp{p}"], "tg": lb[f"tg{n}"]} if lb else {}
    bb = tool_rates(batched_bench, os.path.join(a.tools, "llama-batched-bench"), a.model, p, n, a.t, [npl], False)
    out["llama-batched-bench"] = {"pp": bb[f"pp{p} x{npl}"], "tg": bb[f"tg{n} x{npl}"]} if bb else {}

    from localgen.engine.batch import ParallelContext
    from localgen.engine.batchseq import Request
    from localgen.engine.bench import BenchContext, bench_parallel
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.native import context, logs
    from localgen.native.lib import lib
    from localgen.native.prompt import Prompt
    from localgen.types import LoadParams, SamplingParams

    lc = lib()
    # as `bench` loads it (bench/runner.py): a window for the tests, the asked batch sizes, every layer offloaded
    eng = Engine(resolve(a.model), LoadParams(n_ctx=p + n + 64, n_threads=a.t, n_threads_batch=a.t, n_batch=2048,
                                              n_ubatch=512, flash_attn=True, n_gpu_layers=99))
    out["offloaded"] = bool(eng.offloaded)
    bc = BenchContext(eng)
    n_vocab = eng.n_vocab
    rng = random.Random(1)

    def raw_pp(ctx: Any) -> float:
        arr = (lc.llama_token * p)(*[rng.randrange(n_vocab) for _ in range(p)])
        s = time.perf_counter()
        lc.llama_decode(ctx, lc.llama_batch_get_one(arr, p))
        lc.llama_synchronize(ctx)
        return time.perf_counter() - s

    def raw_tg(ctx: Any) -> float:
        one = (lc.llama_token * 1)()
        s = time.perf_counter()
        for _ in range(n):
            one[0] = rng.randrange(n_vocab)
            lc.llama_decode(ctx, lc.llama_batch_get_one(one, 1))
            lc.llama_synchronize(ctx)
        return time.perf_counter() - s

    # llama-bench's context: llama.cpp's defaults, a window of each test's own length
    def bench_ctx(model: Any, size: int, **more: Any) -> Any:
        return context.new(model, n_ctx=size, n_batch=2048, n_ubatch=512, n_threads=a.t, n_threads_batch=a.t,
                           flash_attn_type=1, **more)

    mp = lc.llama_model_default_params()
    mp.n_gpu_layers = 99
    plain = lc.llama_model_load_from_file(a.model.encode(), mp)
    contexts = {"engine": (eng.ctx, eng.ctx), "bench ctx": (bench_ctx(eng.model_ptr, p), bench_ctx(eng.model_ptr, n)),
                "default load": (bench_ctx(plain, p), bench_ctx(plain, n))}
    noop = ctypes.cast(ctypes.CDLL(None).getpid, lc.llama_log_callback)  # a C function: ignores what it is given
    ours = logs._callback
    Variant = tuple[str, Callable[[Any], float], Callable[[Any], float], Any]
    def ours_pp(_ctx: Any) -> float:
        return bc.prompt(p)

    def ours_tg(_ctx: Any) -> float:
        return sum(bc.generate(n))

    variants: dict[str, Variant] = {
        "localgen bench's loop": ("engine", ours_pp, ours_tg, ours),
        "bare calls, the Engine's context": ("engine", raw_pp, raw_tg, ours),
        "bare calls, llama-bench's context over the Engine's model": ("bench ctx", raw_pp, raw_tg, ours),
        "bare calls, model and context loaded with llama.cpp's defaults": ("default load", raw_pp, raw_tg, ours),
        "localgen bench's loop, C log callback": ("engine", ours_pp, ours_tg, noop),
        "bare calls, llama.cpp's defaults, C log callback": ("default load", raw_pp, raw_tg, noop),
    }
    calls = [0]

    @lc.llama_log_callback  # type: ignore[misc]
    def counting(level: int, text: bytes, user: Any) -> None:
        calls[0] += 1

    lc.llama_log_set(counting, None)
    bc.clear()
    raw_tg(eng.ctx)
    out["log lines per decode (1 token)"] = calls[0] / n
    calls[0] = 0
    bc.clear()
    raw_pp(eng.ctx)
    out[f"log lines per decode ({p} tokens)"] = calls[0]
    lc.llama_log_set(ours, None)

    def clear(ctx: Any) -> None:
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)

    rates: dict[str, dict[str, list[float]]] = {k: {"pp": [], "tg": []} for k in variants}
    for rep in range(a.reps + 1):  # the first round warms up
        for name, (where, pp, tg, log) in variants.items():
            lc.llama_log_set(log, None)
            try:
                c_pp, c_tg = contexts[where]
                clear(c_pp)
                r_pp = p / pp(c_pp)
                clear(c_tg)
                r_tg = n / tg(c_tg)
            finally:
                lc.llama_log_set(ours, None)
            if rep:
                rates[name]["pp"].append(r_pp)
                rates[name]["tg"].append(r_tg)
    out["variants"] = {k: {x: statistics.median(v) for x, v in d.items()} for k, d in rates.items()}

    # the context's settings one at a time, bare calls over the Engine's model: the Engine's window and perf counters
    # (no_perf false, for its statistics) against llama-bench's (the test's own length, no_perf true)
    eng_ctx = p + n + 64
    made = {f"the Engine's context (n_ctx {eng_ctx}, perf counters on), as used": eng.ctx}
    for size, counters in ((eng_ctx, True), (eng_ctx, False), (p, True), (p, False), (4096, False)):
        made[f"a new context, n_ctx {size}, perf counters {'on' if counters else 'off'}"] = bench_ctx(
            eng.model_ptr, size, no_perf=not counters)
    by_setting: dict[str, dict[str, list[float]]] = {k: {"pp": [], "tg": []} for k in made}
    for rep in range(a.reps + 1):
        for name, c in made.items():
            clear(c)
            r_pp = p / raw_pp(c)
            clear(c)
            r_tg = n / raw_tg(c)
            if rep:
                by_setting[name]["pp"].append(r_pp)
                by_setting[name]["tg"].append(r_tg)
    out["settings"] = {k: {x: statistics.median(v) for x, v in d.items()} for k, d in by_setting.items()}
    for c in made.values():
        if c is not eng.ctx:
            context.free(c)
    for where in ("bench ctx", "default load"):
        for c in contexts[where]:
            context.free(c)
    lc.llama_model_free(plain)

    # -npl: a burst of prompts through the throughput scheduler, as `bench -npl` sends it
    pc = ParallelContext(eng, npl, p + n + 16, pooled=True)
    step, nb = pc.step_tokens, pc.n_batch
    bench_parallel(pc, 16, 1, rng)

    def bare_burst() -> float:
        pc.clear()
        pc.slots.reset()
        per = max(1, nb // p)  # whole prompts per call (-p up to n_batch)
        rows = [[rng.randrange(n_vocab) for _ in range(p)] for _ in range(npl)]
        s = time.perf_counter()
        for first in range(0, npl, per):
            pc.batch.n_tokens = 0
            for seq in range(first, min(npl, first + per)):
                for pos, tok in enumerate(rows[seq]):
                    pc.add(tok, pos, seq, pos == p - 1)
            if context.decode(pc.ctx, pc.batch) != 0:
                raise SystemExit("gpu_probe: llama_decode failed in the bare burst")
        context.synchronize(pc.ctx)
        return time.perf_counter() - s

    burst: dict[str, list[float]] = {"one ubatch per step (the old rule)": [], "n_batch per step (the rule now)": [],
                                     f"bare decode calls of {nb} rows": []}
    tgs: list[float] = []
    for _ in range(max(1, a.reps // 2)):
        pc.n_batch = step  # the old rule took one ubatch per step even with nothing decoding
        pp_s, _ = bench_parallel(pc, p, 1, rng, False)
        burst["one ubatch per step (the old rule)"].append(npl * p / pp_s)
        pc.n_batch = nb
        pp_s, tg_s = bench_parallel(pc, p, n, rng, False)
        burst["n_batch per step (the rule now)"].append(npl * p / pp_s)
        tgs.append(npl * n / tg_s)
        burst[f"bare decode calls of {nb} rows"].append(npl * p / bare_burst())
    out["npl"] = npl
    out["npl step_tokens"] = step
    out["npl pp"] = {k: statistics.median(v) for k, v in burst.items()}
    out["npl tg"] = statistics.median(tgs)

    # the scheduler's Python per decoding step: npl requests at temperature 0.8, everything outside llama_decode
    spent = [0.0, 0]
    decode = context.decode

    def timed(ctx: Any, batch: Any) -> int:
        s = time.perf_counter()
        rc = decode(ctx, batch)
        context.synchronize(ctx)  # on a GPU llama_decode returns before its last ubatch is done
        spent[0] += time.perf_counter() - s
        spent[1] += 1
        return rc

    prompts = [list(eng.raw_tokens(f"Story {i}: once upon a time")) for i in range(npl)]
    reqs = [Request(i, Prompt.text(toks), SamplingParams(temperature=0.8, max_tokens=64, ignore_eos=True, seed=i))
            for i, toks in enumerate(prompts)]
    pc.clear()
    pc.slots.reset()
    context.decode = timed
    try:
        s = time.perf_counter()
        pc.run(iter(reqs), lambda c: None)
        wall = time.perf_counter() - s
    finally:
        context.decode = decode
    out["step"] = {"steps": spent[1], "ms in llama_decode per step": spent[0] / spent[1] * 1000,
                   "ms of Python per step": (wall - spent[0]) / spent[1] * 1000}
    pc.close()
    eng.close()
    out["seconds"] = time.monotonic() - t0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    print(report(out, p, n))


def report(out: dict[str, Any], p: int, n: int) -> str:
    """The figures as Markdown: each variant's rates and their ratio to llama-bench's."""
    lb = out["llama-bench"]

    def ratio(x: float, ref: float | None) -> str:
        return f"{x / ref:.3f}×" if ref else "–"

    lines = [f"{out['model']}, {out['threads']} threads, offloaded: {out['offloaded']}; log lines per decode: "
             f"{out['log lines per decode (1 token)']:.1f} (1 token), {out[f'log lines per decode ({p} tokens)']} "
             f"({p} tokens)", "", f"| loop | pp{p} t/s | of llama-bench | tg{n} t/s | of llama-bench |",
             "| --- | --- | --- | --- | --- |"]
    if lb:
        lines.append(f"| llama-bench | {lb['pp']:.1f} | 1 | {lb['tg']:.1f} | 1 |")
    for name, r in out["variants"].items():
        lines.append(f"| {name} | {r['pp']:.1f} | {ratio(r['pp'], lb.get('pp'))} | {r['tg']:.1f} | "
                     f"{ratio(r['tg'], lb.get('tg'))} |")
    lines += ["", "The context's settings one at a time (bare calls over the Engine's model):", "",
              f"| context | pp{p} t/s | of llama-bench | tg{n} t/s | of llama-bench |",
              "| --- | --- | --- | --- | --- |"]
    for name, r in out["settings"].items():
        lines.append(f"| {name} | {r['pp']:.1f} | {ratio(r['pp'], lb.get('pp'))} | {r['tg']:.1f} | "
                     f"{ratio(r['tg'], lb.get('tg'))} |")
    bb = out["llama-batched-bench"]
    lines += ["", f"-npl {out['npl']} (the scheduler's step on this machine: {out['npl step_tokens']} tokens):", "",
              f"| prefill of the burst | pp{p} x{out['npl']} t/s | of llama-batched-bench |", "| --- | --- | --- |"]
    if bb:
        lines.append(f"| llama-batched-bench | {bb['pp']:.1f} | 1 |")
    for name, r in out["npl pp"].items():
        lines.append(f"| {name} | {r:.1f} | {ratio(r, bb.get('pp'))} |")
    lines.append(f"\ntg{n} x{out['npl']}: {out['npl tg']:.1f} t/s" + (f", {ratio(out['npl tg'], bb['tg'])} of "
                                                                       "llama-batched-bench" if bb else ""))
    st = out["step"]
    lines.append(f"\n{out['npl']} sequences decoding at temperature 0.8: {st['steps']} steps, "
                 f"{st['ms in llama_decode per step']:.2f} ms in llama_decode and {st['ms of Python per step']:.2f} "
                 f"ms of Python per step")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
