"""Benchmark primitives on a loaded Engine, the way llama-bench measures: random token ids, decoded with
llama_batch_get_one in n_batch slices (prompt processing) or one at a time (generation), synchronized,
with no sampling and no end-of-generation check."""

from __future__ import annotations

import ctypes
import random
import time
from typing import TYPE_CHECKING

from localgen.engine import logs
from localgen.errors import LocalgenError

if TYPE_CHECKING:
    from localgen.engine.llama import Engine


class BenchContext:
    """Drives one Engine's context directly. After use, the Engine's own prefix cache is invalidated."""

    def __init__(self, engine: Engine, seed: int = 1234) -> None:
        self.engine = engine
        self.lc = engine.lib
        self.ctx = engine.ctx
        self.n_batch = engine.params.n_batch
        self.n_vocab = engine.n_vocab
        self.rng = random.Random(seed)

    def clear(self) -> None:
        """Empty the KV cache (and the Engine's record of what it holds)."""
        self.engine.clear()

    def _decode(self, tokens: list[int]) -> None:
        arr = (self.lc.llama_token * len(tokens))(*tokens)
        batch = self.lc.llama_batch_get_one(arr, len(tokens))
        rc = self.lc.llama_decode(self.ctx, batch)
        if rc != 0:
            raise LocalgenError(f"llama_decode failed ({rc}) during the benchmark", hint="try a smaller size or --ctx")
        logs.raise_deferred()

    def tokens(self, n: int) -> list[int]:
        """n random token ids."""
        return [self.rng.randrange(self.n_vocab) for _ in range(n)]

    def prompt(self, n: int) -> float:
        """Process n random tokens in n_batch slices; seconds taken."""
        toks = self.tokens(n)
        t0 = time.perf_counter()
        for i in range(0, n, self.n_batch):
            self._decode(toks[i:i + self.n_batch])
        self.lc.llama_synchronize(self.ctx)
        return time.perf_counter() - t0

    def generate(self, n: int) -> list[float]:
        """Decode n tokens one at a time; the seconds each took."""
        times = []
        tok = self.rng.randrange(self.n_vocab)
        for _ in range(n):
            t0 = time.perf_counter()
            self._decode([tok])
            self.lc.llama_synchronize(self.ctx)
            times.append(time.perf_counter() - t0)
            tok = self.rng.randrange(self.n_vocab)
        return times


def model_desc(engine: Engine) -> str:
    """llama.cpp's description of the model, e.g. "llama 135M Q4_1" (llama-bench's model_type)."""
    lc = engine.lib
    buf = ctypes.create_string_buffer(256)
    lc.llama_model_desc(engine.model_ptr, buf, len(buf))
    return buf.value.decode("utf-8", errors="replace")


def model_size(engine: Engine) -> tuple[int, int]:
    """(bytes of weights, parameters), as llama.cpp counts them."""
    lc = engine.lib
    return int(lc.llama_model_size(engine.model_ptr)), int(lc.llama_model_n_params(engine.model_ptr))
