#!/usr/bin/env python3
"""Benchmarks for `localgen run` (issue: foundation).

1. Decode rate of localgen's generation path against a bare llama-cpp-python greedy `generate()` loop that
   detokenizes each token: same model file, threads, context, batch, flash attention, prompt tokens and
   sampler. Runs alternate (A, B, A, B, ...) so drift hits both; the median of each is reported.
   Decode rate = (generated tokens - 1) / (time of last token - time of first token), measured the same way
   for both.
2. Start-up: wall time of `localgen --help` and `localgen --version` (median of N runs).

usage: scripts/bench_run.py [--model NAME_OR_PATH] [--tokens 256] [--reps 5] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import harness

PROMPT = "Write a long, detailed essay about the history of the printing press."


def bare_loop(path: str, tokens: list[int], n: int, threads: int, n_ctx: int) -> float:
    import llama_cpp

    from localgen.native import logs

    logs.install(llama_cpp)  # same quiet logging as localgen, so the comparison is only the loop
    llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                          n_ubatch=512, flash_attn=True, n_gpu_layers=0, seed=1, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    count, t_first, t_last = 0, 0.0, 0.0
    for tok in llm.generate(tokens, temp=0.0):
        now = time.perf_counter()
        if count == 0:
            t_first = now
        t_last = now
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            break
        llm.detokenize([tok])
        count += 1
        if count >= n:
            break
    llm.close()
    return (count - 1) / (t_last - t_first)


def localgen_path(model: str, n: int, threads: int, n_ctx: int) -> tuple[float, list[int], str]:
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.native.prompt import Prompt
    from localgen.types import LoadParams, SamplingParams

    ref = resolve(model)
    engine = Engine(ref, LoadParams(n_ctx=n_ctx, n_threads=threads, n_gpu_layers=0))
    if ref.summary.chat_template:
        tokens = engine.chat_tokens([{"role": "user", "content": PROMPT}])
    else:  # a base model (gemma3:270m): the prompt as a plain completion
        tokens = engine.raw_tokens(PROMPT)
    gen = engine.generate(Prompt.text(tokens), SamplingParams(temperature=0.0, max_tokens=n))
    count, first_count, t_first, t_last = 0, 0, 0.0, 0.0
    for chunk in gen:
        now = time.perf_counter()
        if count == 0:
            t_first, first_count = now, chunk.n_tokens
        t_last = now
        count = chunk.n_tokens
    engine.close()
    # a chunk can carry several tokens (held-back UTF-8): count the tokens between first and last chunk
    return (count - first_count) / (t_last - t_first), tokens, ref.path


def startup(args: list[str], reps: int) -> float:
    """The median wall time of `localgen ARGS` (the installed entry point)."""
    exe = Path(sys.executable).with_name("localgen")
    return harness.median(harness.run_timed([str(exe), *args]) for _ in range(reps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=2048)
    a = ap.parse_args()
    from localgen import hardware

    threads = a.threads or hardware.usable_cores()
    ours, bare = [], []
    for rep in range(a.reps):  # alternated; the bare loop gets the prompt tokens and file of the run before it
        rate, tokens, path = localgen_path(a.model, a.tokens, threads, a.ctx)
        ours.append(rate)
        bare.append(bare_loop(path, tokens, a.tokens, threads, a.ctx))
        print(f"rep {rep + 1}: localgen {ours[-1]:.1f} tok/s   bare generate() {bare[-1]:.1f} tok/s", flush=True)
    mo, mb = harness.median(ours), harness.median(bare)
    print(f"decode, {a.model}, {threads} threads, {a.tokens} tokens, greedy, median of {a.reps}:")
    print(f"  localgen run path   {mo:8.1f} tok/s")
    print(f"  bare generate loop  {mb:8.1f} tok/s")
    print(f"  ratio of medians    {mo / mb * 100:8.1f} %   (target >= 97 %)")
    paired = harness.paired_ratio(ours, bare)
    print(f"  median paired ratio {paired * 100:8.1f} %   (each rep's two runs back to back; robust to drift)")
    print(f"startup: localgen --help {startup(['--help'], 9) * 1000:.0f} ms, "
          f"--version {startup(['--version'], 9) * 1000:.0f} ms (median of 9; target --help < 300 ms)")


if __name__ == "__main__":
    main()
