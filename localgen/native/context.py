"""A llama.cpp context and its memory (the KV cache): made on a model, decoded into, its sequences copied and
dropped, its state saved and restored, its perf counters; freed."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localgen.errors import LocalgenError
from localgen.native import logs, lora
from localgen.native.batch import Batch
from localgen.native.lib import lib


def new(model: Any, **fields: Any) -> Any:
    """A context on `model`: llama.cpp's default llama_context_params with `fields` set (n_ctx=..., ...), and
    the model's LoRA adapters set on it; None where llama.cpp could not make it (its log says why)."""
    lc = lib()
    p = lc.llama_context_default_params()
    for name, value in fields.items():
        if not hasattr(p, name):
            raise TypeError(f"llama_context_params has no field {name!r}")
        setattr(p, name, value)
        if isinstance(value, int) and getattr(p, name) != value:
            # ctypes keeps a number's low bits past the field's type (2**32 cells, --ctx × --parallel, read as 0)
            raise LocalgenError(f"llama.cpp's context takes {name} up to {_top(p, name):,}, not {value:,}",
                                hint="lower --ctx or --parallel")
    # A Ctrl-C handled as llama.cpp returns the context would be raised before anyone holds it (its KV cache lost
    # to the process, which a chat outlives): it waits to the block's end, the context freed first.
    with logs.unbroken():
        ctx = lc.llama_init_from_model(model, p) or None
        if ctx is not None and (logs.pending() or not lora.applied(model, ctx)):  # LoRA: native/lora.py
            lc.llama_free(ctx)
            ctx = None
    return ctx


def _top(p: Any, name: str) -> int:
    """The largest value a ctypes integer field of `p` holds."""
    kind = dict(p._fields_)[name]
    bits = 8 * ctypes.sizeof(kind)
    return int(2 ** (bits - 1) - 1 if kind(-1).value < 0 else 2 ** bits - 1)


def free(ctx: Any) -> None:
    """Free a context and its KV cache (and forget its abort check's thunk)."""
    lib().llama_free(ctx)
    _thunks.pop(_key(ctx), None)


def drop(owner: Any) -> None:
    """Free `owner.ctx` and its batch (`owner.batch`, a native/batch.py Batch, where one was made) and clear
    `owner.ctx`, as one step a Ctrl-C cannot split (logs.unbroken): raised between the free and the clearing, it left
    the context to be freed again (SIGSEGV). Nothing where `owner.ctx` is cleared already."""
    with logs.unbroken():
        if owner.ctx:
            batch = getattr(owner, "batch", None)
            if batch is not None:
                batch.free()
            free(owner.ctx)
            owner.ctx = None


def n_ctx(ctx: Any) -> int:
    """The context's window in tokens, as llama.cpp made it."""
    return int(lib().llama_n_ctx(ctx))


def decode(ctx: Any, batch: Any) -> int:
    """llama_decode of a batch (a native/batch.py Batch, or what batch.of_tokens gives): 0 when done, else
    llama.cpp's code."""
    return int(lib().llama_decode(ctx, batch.raw if isinstance(batch, Batch) else batch))


def encode(ctx: Any, batch: Batch) -> int:
    """llama_encode of a batch (encoder models): 0 when done, else llama.cpp's code."""
    return int(lib().llama_encode(ctx, batch.raw))


def synchronize(ctx: Any) -> None:
    """Wait for the context's queued work."""
    lib().llama_synchronize(ctx)


def set_threads(ctx: Any, threads: int, threads_batch: int) -> None:
    """The threads a decode uses (one token; a batch)."""
    lib().llama_set_n_threads(ctx, threads, threads_batch)


@dataclass(frozen=True)
class Perf:
    """llama.cpp's perf counters of a context since their last reset (llama_perf_context_data)."""

    t_p_eval_ms: float  # prompt evaluation
    n_p_eval: int
    t_eval_ms: float  # one-token decodes
    n_eval: int


def perf(ctx: Any) -> Perf:
    """The context's perf counters."""
    d = lib().llama_perf_context(ctx)
    return Perf(float(d.t_p_eval_ms), int(d.n_p_eval), float(d.t_eval_ms), int(d.n_eval))


def reset_perf(ctx: Any) -> None:
    """Start the perf counters from zero."""
    lib().llama_perf_context_reset(ctx)


def logits(ctx: Any, rows: int, n_vocab: int) -> Any:
    """A numpy view (rows × n_vocab, float32) of every output row's logits of the last decode, in the batch's order
    (llama_get_logits); valid until the next decode."""
    import numpy as np


    ptr = lib().llama_get_logits(ctx)
    if not ptr:
        raise LocalgenError("llama.cpp has no logits for the last decode")
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(rows, n_vocab))


# ---- the memory (KV cache) ----------------------------------------------------------------------------


def memory(ctx: Any) -> Any:
    """The context's memory handle (owned by the context)."""
    return lib().llama_get_memory(ctx)


def seq_rm(mem: Any, seq: int, p0: int, p1: int) -> bool:
    """Drop positions [p0, p1) of a sequence (-1: every sequence; -1 ends: open); False where the memory
    cannot (a recurrent model's tail)."""
    return bool(lib().llama_memory_seq_rm(mem, seq, p0, p1))


def seq_cp(mem: Any, src: int, dst: int, p0: int, p1: int) -> None:
    """Copy positions [p0, p1) of sequence `src` into `dst` (cells are shared, not copied)."""
    lib().llama_memory_seq_cp(mem, src, dst, p0, p1)


def clear(mem: Any, data: bool = True) -> None:
    """Empty the memory (with `data`, its buffers too)."""
    lib().llama_memory_clear(mem, data)


# ---- saved state --------------------------------------------------------------------------------------


def save_file(ctx: Any, path: str | os.PathLike[str], tokens: list[int]) -> bool:
    """Write the context's state and its tokens to a file; False where llama.cpp could not."""
    lc = lib()
    arr = (lc.llama_token * max(1, len(tokens)))(*tokens)
    return bool(lc.llama_state_save_file(ctx, os.fsencode(path), arr, len(tokens)))


def file_size(ctx: Any, n_tokens: int) -> int:
    """The bytes save_file would write for the context's state and `n_tokens` tokens, without writing them:
    llama.cpp's session header (magic, version, token count: three uint32), the tokens, then the state
    (llama_state_get_size counts it without copying it)."""
    return 12 + 4 * n_tokens + int(lib().llama_state_get_size(ctx))


def load_file(ctx: Any, path: str | os.PathLike[str], cap: int) -> list[int] | None:
    """Restore a saved state of up to `cap` tokens; its tokens, or None where it does not load (or an OSError)."""
    lc = lib()
    out = (lc.llama_token * cap)()
    count = ctypes.c_size_t(0)
    ok = bool(lc.llama_state_load_file(ctx, os.fsencode(path), out, cap, ctypes.byref(count)))
    n = int(count.value)
    if not ok or n == 0 or n > cap:
        return None
    return list(out[:n])


def seq_state_size(ctx: Any, seq: int) -> int:
    """The bytes of one sequence's state (llama_state_seq_get_size_ext)."""
    return int(lib().llama_state_seq_get_size_ext(ctx, seq, 0))


def seq_state_get(ctx: Any, seq: int, data: Any) -> int:
    """Copy one sequence's state into `data` (a numpy uint8 array of its size); the bytes written."""
    return int(lib().llama_state_seq_get_data_ext(ctx, _bytes(data), len(data), seq, 0))


def seq_state_set(ctx: Any, seq: int, data: Any, size: int) -> int:
    """Restore one sequence's state from the first `size` bytes of `data` (a numpy uint8 array); the bytes
    read (not `size`: it failed)."""
    return int(lib().llama_state_seq_set_data_ext(ctx, _bytes(data), size, seq, 0))


def _bytes(data: Any) -> Any:
    return data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


# ---- embeddings ---------------------------------------------------------------------------------------


def pooling_type(ctx: Any) -> int:
    """The context's pooling (llama_pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank)."""
    return int(lib().llama_pooling_type(ctx))


def embeddings_seq(ctx: Any, seq: int, n: int) -> list[float] | None:
    """The pooled output of sequence `seq` after the last decode, its first `n` floats; None where there is none."""
    ptr = lib().llama_get_embeddings_seq(ctx, seq)
    if not ptr:
        return None
    return [float(ptr[i]) for i in range(n)]


_thunks: dict[Any, Any] = {}  # each context's abort check as llama.cpp holds it, by the context's address


def _key(ctx: Any) -> Any:
    return getattr(ctx, "value", ctx)  # an address, whether ctypes gave an int or a c_void_p


def set_abort(ctx: Any, cancelled: Callable[[], bool] | None) -> Any:
    """Have llama.cpp ask `cancelled` between the operations of a computation and stop it when it says so, or when
    a Ctrl-C came meanwhile (None: never). Returns the ctypes thunk (None when cleared). The thunk stays referenced
    here for as long as the context holds it, whatever the caller keeps, and the setting and the keeping are one
    step a Ctrl-C cannot split (logs.unbroken): a press raised between the two freed a thunk llama.cpp went on to
    call. A press then, or one noted before, is not raised here, where the caller could not take the check off
    again: the check itself stops the computation it is set for. A call that returns 2 was stopped;
    logs.raise_deferred raises the Ctrl-C, if that was it."""
    lc = lib()
    if cancelled is None:
        with logs.unbroken():
            lc.llama_set_abort_callback(ctx, lc.ggml_abort_callback(0), None)
            _thunks.pop(_key(ctx), None)
        return None
    with logs.unbroken(raising=False):
        thunk = lc.ggml_abort_callback(logs.abort_check(cancelled))
        lc.llama_set_abort_callback(ctx, thunk, None)
        _thunks[_key(ctx)] = thunk
        return thunk


def stop_on_ctrl_c(ctx: Any, cancelled: Callable[[], bool] = bool) -> Any:
    """Have a Ctrl-C (or `cancelled` saying so) stop ctx's computations between two of their operations (a long
    decode stops at once, not when it ends), where the SIGINT handler in place is one of ours, which notes a
    Ctrl-C that lands inside a llama.cpp call (logs.defer_interrupt): Python's default handler would raise there,
    where ctypes drops the exception, and the Ctrl-C would be lost. Returns the thunk to keep referenced (None
    where none was set)."""
    import signal
    import threading

    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(handler) or \
            handler is signal.default_int_handler:
        return None
    return set_abort(ctx, cancelled)
