"""llama_batch: made and freed here; the engine fills its rows (token, pos, n_seq_id, seq_id, logits)."""

from __future__ import annotations

from typing import Any

from localgen.native.lib import lib


def new(capacity: int, embd: int = 0, n_seq_max: int = 1) -> Any:
    """A llama_batch of up to `capacity` rows (embd 0: tokens), each with up to `n_seq_max` sequence ids."""
    return lib().llama_batch_init(capacity, embd, n_seq_max)


def free(batch: Any) -> None:
    """Free a batch made by `new`."""
    lib().llama_batch_free(batch)


def of_tokens(tokens: list[int]) -> tuple[Any, Any]:
    """llama_batch_get_one over `tokens` (positions after what the context holds, sequence 0), and the token
    array it points at, to keep while the batch is used."""
    lc = lib()
    arr = (lc.llama_token * len(tokens))(*tokens)
    return lc.llama_batch_get_one(arr, len(tokens)), arr
