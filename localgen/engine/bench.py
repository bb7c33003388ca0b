"""Benchmark primitives on a loaded Engine, the way llama-bench measures: random token ids, decoded with
llama_batch_get_one in n_batch slices (prompt processing) or one at a time (generation), synchronized,
with no sampling and no end-of-generation check."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from localgen.errors import LocalgenError
from localgen.native import batch as native_batch
from localgen.native import context, logs
from localgen.native import model as native_model
from localgen.native.prompt import Prompt
from localgen.types import SamplingParams

if TYPE_CHECKING:
    from localgen.engine.batch import ParallelContext
    from localgen.engine.llama import Engine


class BenchContext:
    """Drives one Engine's context directly. After use, the Engine's own prefix cache is invalidated."""

    def __init__(self, engine: Engine, seed: int = 1234) -> None:
        self.engine = engine
        self.ctx = engine.ctx
        self.n_batch = engine.params.n_batch
        self.n_vocab = engine.n_vocab
        self.rng = random.Random(seed)

    def clear(self) -> None:
        """Empty the KV cache (and the Engine's record of what it holds)."""
        self.engine.kv.clear()

    def _decode(self, tokens: list[int]) -> None:
        batch, _keep = native_batch.of_tokens(tokens)
        rc = context.decode(self.ctx, batch)
        logs.raise_deferred()  # a Ctrl-C that stopped it (ret = 2, through the abort check) first
        if rc != 0:
            raise LocalgenError(f"llama_decode failed ({rc}) during the benchmark", hint="try a smaller size or --ctx")
        logs.raise_deferred()

    def tokens(self, n: int) -> list[int]:
        """n random token ids."""
        return [self.rng.randrange(self.n_vocab) for _ in range(n)]

    def prompt(self, n: int) -> float:
        """Process n random tokens in n_batch slices; seconds taken. A second Ctrl-C (bench's first only asks to
        stop after the repetition) stops a slice where it is, as tune's prompts stop: llama.cpp's abort check,
        asked once per operation of the decode, a cost lost beside a prompt's own work (not set around the
        generated tokens, each soon over, where it would weigh on what is timed)."""
        toks = self.tokens(n)
        abort = context.stop_on_ctrl_c(self.ctx)
        try:
            t0 = time.perf_counter()
            for i in range(0, n, self.n_batch):
                self._decode(toks[i:i + self.n_batch])
            context.synchronize(self.ctx)
            return time.perf_counter() - t0
        finally:
            if abort is not None:
                context.set_abort(self.ctx, None)
                del abort  # referenced until llama.cpp no longer holds it

    def generate(self, n: int) -> list[float]:
        """Decode n tokens one at a time; the seconds each took."""
        times = []
        tok = self.rng.randrange(self.n_vocab)
        for _ in range(n):
            t0 = time.perf_counter()
            self._decode([tok])
            context.synchronize(self.ctx)
            times.append(time.perf_counter() - t0)
            tok = self.rng.randrange(self.n_vocab)
        return times


def model_desc(engine: Engine) -> str:
    """llama.cpp's description of the model, e.g. "llama 135M Q4_1" (llama-bench's model_type), with the size
    word corrected when it is not the parameter count: llama.cpp guesses it from the layer count and vocabulary
    (32 layers and a 49,152-token vocabulary read "3B" whatever the width)."""
    return fix_size_word(native_model.desc(engine.model_ptr), native_model.n_params(engine.model_ptr))


def fix_size_word(desc: str, n_params: int) -> str:
    """`desc` with its size word ("3B", "135M") replaced by the parameter count when they differ by over 1.5×."""
    import re

    m = re.search(r"\b(\d+(?:\.\d+)?)([MB])\b", desc)
    if not m or n_params <= 0:
        return desc
    said = float(m.group(1)) * (1e9 if m.group(2) == "B" else 1e6)
    if 1 / 1.5 <= n_params / said <= 1.5:
        return desc
    word = f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{round(n_params / 1e6)}M"
    return desc[:m.start()] + word + desc[m.end():]


def model_size(engine: Engine) -> tuple[int, int]:
    """(bytes of weights, parameters), as llama.cpp counts them."""
    return native_model.size(engine.model_ptr), native_model.n_params(engine.model_ptr)


def bench_parallel(pc: ParallelContext, n_prompt: int, n_gen: int, rng: random.Random,
                   exact: bool | None = False) -> tuple[float, float]:
    """llama-batched-bench's measurement: every sequence gets n_prompt random tokens, evaluated as the batch
    scheduler evaluates a burst of new requests (`run`, each asking for one token), then n_gen steps decode
    one token per sequence together. Returns (prompt seconds, generation seconds)."""
    from localgen.engine.batchseq import Request

    n = pc.n_parallel
    pc.clear()
    pc.slots.reset()
    prompts = [[rng.randrange(pc.n_vocab) for _ in range(n_prompt)] for _ in range(n)]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    t0 = time.perf_counter()
    pc.run(iter([Request(i, Prompt.text(p), one) for i, p in enumerate(prompts)]), lambda c: None, exact=exact)
    context.synchronize(pc.ctx)
    t1 = time.perf_counter()
    for step in range(n_gen):
        pc.batch.n_tokens = 0
        for s in range(n):
            pc.add(rng.randrange(pc.n_vocab), n_prompt + step, s, True)
        if context.decode(pc.ctx, pc.batch) != 0:
            raise LocalgenError("llama_decode failed in the parallel benchmark", hint="lower --parallel")
    context.synchronize(pc.ctx)
    return t1 - t0, time.perf_counter() - t1
