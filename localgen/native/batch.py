"""llama_batch: rows of (token, position, sequence, whether its logits are wanted) for one llama_decode."""

from __future__ import annotations

from typing import Any

from localgen.native import logs
from localgen.native.lib import lib


class Batch:
    """A llama_batch of up to `capacity` rows, one sequence id each (llama_batch_init); free it with `free`.
    `raw` is the struct llama_decode takes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw: Any = lib().llama_batch_init(capacity, 0, 1)

    @property
    def n_tokens(self) -> int:
        """The rows filled."""
        return int(self.raw.n_tokens)

    @n_tokens.setter
    def n_tokens(self, n: int) -> None:
        self.raw.n_tokens = n

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        """Append a row; its index."""
        b = self.raw
        i = b.n_tokens
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = 1 if logits else 0
        b.n_tokens = i + 1
        return int(i)

    def set_tokens(self, tokens: list[int], pos: int, seq: int, all_logits: bool) -> None:
        """The rows are `tokens` at positions from `pos` in `seq`: logits for every row, or only the last."""
        b = self.raw
        n = len(tokens)
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if (all_logits or i == n - 1) else 0
        b.n_tokens = n

    def token_view(self) -> Any:
        """A numpy int32 view of the rows' tokens (all `capacity` of them), to set many at once."""
        import ctypes

        import numpy as np

        return np.ctypeslib.as_array(ctypes.cast(self.raw.token, ctypes.POINTER(ctypes.c_int32)),
                                     shape=(self.capacity,))

    def seq(self, row: int) -> int:
        """A row's sequence id."""
        return int(self.raw.seq_id[row][0])

    def wants_logits(self, row: int) -> bool:
        """Whether a row's logits are computed."""
        return bool(self.raw.logits[row])

    def free(self) -> None:
        """Free the batch (once)."""
        with logs.unbroken():  # a Ctrl-C between the two would have it freed again
            if self.raw is not None:
                lib().llama_batch_free(self.raw)
                self.raw = None


def of_tokens(tokens: list[int]) -> tuple[Any, Any]:
    """llama_batch_get_one over `tokens` (positions after what the context holds, sequence 0), and the token
    array it points at, to keep while the batch is used."""
    lc = lib()
    arr = (lc.llama_token * len(tokens))(*tokens)
    return lc.llama_batch_get_one(arr, len(tokens)), arr
