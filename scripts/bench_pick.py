#!/usr/bin/env python3
"""What choosing a token costs in place: one request at a time through the throughput scheduler (the engine
alone, no server), each sampling pick and each llama_decode call timed. A pick right after a decode costs
several times what the same pick costs repeated in a loop, since the decode has just streamed the weights
through the caches, so only this measures what serving pays. Prints, for each run, the mean pick, the
Python time a token outside llama_decode (pick included) and a one-token step's llama_decode.

usage: scripts/bench_pick.py [--model smollm2:135m] [--temperature 0.8] [--tokens 128] [--runs 3]
                             [--threads 2] [--no-ignore-eos]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localgen.engine.batch import ParallelContext
from localgen.engine.batchseq import Request
from localgen.engine.llama import Engine
from localgen.models.resolve import resolve
from localgen.native import sampler as sampling
from localgen.native.prompt import Prompt
from localgen.types import LoadParams, SamplingParams

PROMPT = "Tell me a long story about dragons, rivers and the mountains between them."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-ignore-eos", action="store_true", help="let end-of-generation tokens be drawn")
    a = ap.parse_args()

    engine = Engine(resolve(a.model), LoadParams(n_ctx=2048, n_threads=a.threads))
    pc = ParallelContext(engine, 1, 2048, pooled=True)
    pc.warm_up()
    clock = {"pick": 0.0, "picks": 0, "decode": 0.0, "steps": 0.0, "n_steps": 0}
    pick, decode = sampling.pick, pc.decode

    def timed_pick(*args: Any, **kwargs: Any) -> int:
        t = time.perf_counter()
        tok = pick(*args, **kwargs)
        clock["pick"] += time.perf_counter() - t
        clock["picks"] += 1
        return tok

    def timed_decode(n_seqs: int) -> None:
        t = time.perf_counter()
        decode(n_seqs)
        d = time.perf_counter() - t
        clock["decode"] += d
        if pc.batch.n_tokens == 1:  # a token's step (not the prompt's)
            clock["steps"] += d
            clock["n_steps"] += 1

    sampling.pick = timed_pick  # the scheduler calls it through the module
    pc.decode = timed_decode  # type: ignore[method-assign]
    tokens = list(engine.tokenize(PROMPT, True))
    s = SamplingParams(temperature=a.temperature, max_tokens=a.tokens, ignore_eos=not a.no_ignore_eos)
    picks, others, decodes = [], [], []
    print(f"{a.model}: temperature {a.temperature}, {a.tokens} tokens, {a.threads} threads, "
          f"shortcut {sampling.shortcut(s, engine.n_vocab)}")
    for run in range(a.runs + 1):  # the first run warms up and is not counted
        clock.update(pick=0.0, picks=0, decode=0.0, steps=0.0, n_steps=0)
        done: list[Any] = []
        t = time.perf_counter()
        pc.run(iter([Request(0, Prompt.text(list(tokens)), s, seed=run)]), done.append)
        wall = time.perf_counter() - t
        n = done[0].completion_tokens
        if run == 0:
            continue
        picks.append(clock["pick"] / clock["picks"] * 1e6)
        others.append((wall - clock["decode"]) / n * 1e6)
        decodes.append(clock["steps"] / clock["n_steps"] * 1e3)
        print(f"  run {run}: pick {picks[-1]:6.1f} µs   outside llama_decode {others[-1]:6.1f} µs a token   "
              f"llama_decode {decodes[-1]:6.2f} ms a step ({n} tokens)")
    print(f"  median: pick {statistics.median(picks):.1f} µs, outside llama_decode {statistics.median(others):.1f} µs"
          f" a token, llama_decode {statistics.median(decodes):.2f} ms a step")
    pc.close()
    engine.close()


if __name__ == "__main__":
    main()
