"""The record of what an Engine's context's KV cache holds, and the only way it changes: evaluate a prompt
(reusing the prefix it holds), decode tokens after it, truncate, clear, save and load a state."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from localgen import paths
from localgen.engine.tokens import common_prefix, grid_pieces, reusable_prefix, safe_prefix
from localgen.errors import ContextOverflowError, LocalgenError
from localgen.native import context, logs
from localgen.native.batch import Batch
from localgen.native.prompt import Prompt


class KVCache:
    """What the single-sequence context holds: `held` says which tokens, and only the methods below change it.
    `ctx` returns the context (the Engine creates it again after release_context, which calls reset).
    `reuse_all` (--prefix-reuse all): keep every held token a prompt begins with but its last, answers too, and
    evaluate the rest in plain n_batch pieces, as llama.cpp does; faster, not bit for bit a fresh evaluation."""

    def __init__(self, ctx: Callable[[], Any], n_ctx: int, n_batch: int, n_ubatch: int = 0,
                 reuse_all: bool = False) -> None:
        self._ctx = ctx
        self.reuse_all = reuse_all
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.n_ubatch = min(n_ubatch or n_batch, n_batch)  # llama.cpp cuts each piece into ubatches of this
        self._batch = Batch(max(n_batch, 1))
        self._mem: Any = None  # the context's memory handle, asked for on first use
        self._held: list[int] = []
        self._evaluated = 0  # how many of the held tokens were evaluated as a prompt, in a fresh one's ubatches
        self._live = False  # logits of the last held token are available (row -1)
        self.encode_s = 0.0  # the media encoder's seconds in the last evaluate()

    def reset(self) -> None:
        """The context was freed: it holds nothing, and the next one has another memory handle."""
        self._held = []
        self._evaluated = 0
        self._live = False
        self._mem = None

    def close(self) -> None:
        """Free the batch (idempotent)."""
        self._batch.free()

    def _memory(self) -> Any:
        ctx = self._ctx()  # creates it again if released
        if self._mem is None:
            self._mem = context.memory(ctx)
        return self._mem

    @property
    def held(self) -> list[int]:
        """The tokens whose KV entries the cache holds, in position order (a copy)."""
        return list(self._held)

    @property
    def evaluated(self) -> int:
        """How many of the held tokens were evaluated as a prompt (the rest were generated after them)."""
        return self._evaluated

    def cached_prefix(self, prompt: Prompt, logits: bool = True) -> int:
        """How many leading tokens of the prompt evaluate() will reuse: only what gives, on a CPU, bit for bit
        what a fresh evaluation of the whole prompt gives (engine/tokens.py, reusable_prefix), so never a
        generated token and never the last (unless its logits are still live and it was evaluated as this
        prompt's last); a media span is reused whole or not at all, and with one the promise does not hold."""
        tokens = prompt.tokens
        n = common_prefix(self._held, tokens)
        if logits and n == len(tokens) == len(self._held) == self._evaluated and n > 0 and self._live:
            return n
        if self.reuse_all:  # the last token again for its logits, unless they are live
            if logits and n == len(tokens) and n > 0 and not (self._live and n == len(self._held)):
                n -= 1
        elif prompt.spans:  # media evaluate in batches of their own: no fresh grid to keep to, only the prompt
            n = min(n, self._evaluated, len(tokens) - 1 if logits else len(tokens))
        else:
            n = reusable_prefix(n, self._evaluated, len(tokens), self.n_ubatch, self.n_batch, logits)
        return safe_prefix(prompt, n)

    def truncate(self, n: int) -> None:
        """Forget every held token from position n on."""
        if n < len(self._held):
            self._drop_from(n)

    def _drop_from(self, n: int) -> None:
        """Forget position n on, in the memory also past the held tokens (a decode that stopped part-way leaves
        there the ubatches it had done)."""
        if not context.seq_rm(self._memory(), -1, n, -1):
            self.clear()  # recurrent models cannot drop a tail: start over
            return
        del self._held[n:]
        self._evaluated = min(self._evaluated, n)
        self._live = False

    def clear(self) -> None:
        """Empty the KV cache."""
        context.clear(self._memory(), True)
        self._held = []
        self._evaluated = 0
        self._live = False

    def evaluate(self, prompt: Prompt, logits: bool = True, cancelled: Callable[[], bool] = bool) -> int:
        """Make the cache hold exactly the prompt's tokens, evaluating only what it does not hold yet, in
        n_batch pieces (llama.cpp rounds a row differently in batches of other sizes, so the pieces are always
        cut the same way; after a reused prefix the first piece ends where a fresh evaluation's ubatch ends, so
        every row is computed as a fresh evaluation computes it), its media spans evaluating themselves
        between them. With `logits`, the last
        token's logits are live afterwards. Returns how many tokens were reused. A Ctrl-C stops the piece under
        way where it is (_piece), and so does `cancelled` saying so (or between two pieces): the pieces before it
        stay held, and `held` says how far it came; interrupted anywhere, the record stays true. Plain tokens (a
        prefix) come as Prompt.text(tokens)."""
        keep, pieces = self.evaluating(prompt, logits, cancelled)
        while not cancelled() and next(pieces, None) is not None:
            pass
        return keep

    def evaluating(self, prompt: Prompt, logits: bool = True,
                   cancelled: Callable[[], bool] = bool) -> tuple[int, Iterator[int]]:
        """`evaluate` a piece at a time: how many tokens are reused, and an iterator that evaluates the next
        piece (or media span) each time it is advanced, yielding how many tokens the cache then holds. It ends
        early where `cancelled` stopped a piece inside its decode (_piece); the pieces before it stay held."""
        n = len(prompt.tokens)
        if n > self.n_ctx:
            raise ContextOverflowError(f"{n:,} tokens do not fit the context window of {self.n_ctx:,}")
        keep = self.cached_prefix(prompt, logits)
        self.truncate(keep)
        self.encode_s = 0.0
        return keep, self._pieces(prompt, keep, cancelled)

    def _pieces(self, prompt: Prompt, keep: int, cancelled: Callable[[], bool]) -> Iterator[int]:
        # with images or audio: text in n_batch pieces up to each media span, which encodes and decodes itself;
        # the spans already held are not encoded again
        tokens, spans = prompt.tokens, prompt.spans
        pos = keep
        for start in sorted(spans):
            span = spans[start]
            if start + span.n_pos <= keep:
                continue
            for first, end in self._grid(pos, start):
                if not self._piece(tokens[first:end], cancelled):
                    return
                self._evaluated = len(self._held)
                yield len(self._held)
            ctx = self._ctx()
            try:  # not stopped inside: its encoder runs in a context of its own, which takes no abort callback
                self.encode_s += span.evaluate(ctx, start, 0, self.n_batch)
            except BaseException:  # failed, or a Ctrl-C raised after its decode: what the memory took of it goes
                self._drop_from(start)
                raise
            self._held.extend(tokens[start:start + span.n_pos])
            self._evaluated = len(self._held)
            self._live = False
            pos = start + span.n_pos
            yield len(self._held)
        for first, end in self._grid(pos, len(tokens)):
            if not self._piece(tokens[first:end], cancelled):
                return
            self._evaluated = len(self._held)
            yield len(self._held)

    def _piece(self, tokens: list[int], cancelled: Callable[[], bool]) -> bool:
        """Decode one piece of a prompt, stopped where it is (between two of llama.cpp's operations, on the CPU; a
        GPU's backend asks no abort callback) by a Ctrl-C, which is then raised, or by `cancelled` saying so: False.
        Only while the SIGINT handler is ours (context.stop_on_ctrl_c), and only for a piece: each token generated
        after the prompt would pay the callback's cost (once per operation) for nothing."""
        ctx = self._ctx()
        abort = context.stop_on_ctrl_c(ctx, cancelled)
        try:
            return self._decode(tokens, all_logits=False, cancelled=cancelled)
        finally:
            if abort is not None:
                context.set_abort(ctx, None)
                del abort  # referenced until llama.cpp no longer holds it

    def _grid(self, start: int, end: int) -> list[tuple[int, int]]:
        """The pieces that evaluate tokens [start, end): a fresh evaluation's ubatches (grid_pieces), or with
        reuse_all plain n_batch pieces from `start`."""
        if self.reuse_all:
            return [(a, min(a + self.n_batch, end)) for a in range(start, end, self.n_batch)]
        return grid_pieces(start, end, self.n_ubatch, self.n_batch)

    def decode(self, tokens: list[int], all_logits: bool = True) -> None:
        """Evaluate tokens after the held ones in one llama_decode (logits for every row, or the last)."""
        if len(self._held) + len(tokens) > self.n_ctx:
            raise ContextOverflowError(f"the context window of {self.n_ctx:,} tokens is full")
        self._decode(tokens, all_logits)

    def _decode(self, tokens: list[int], all_logits: bool, cancelled: Callable[[], bool] | None = None) -> bool:
        """One llama_decode after the held tokens; False where `cancelled` stopped it (an abort callback set by the
        caller). Whatever stops it, a failure, an abort or a Ctrl-C raised as llama.cpp returns, the ubatches it
        had done leave the memory, so that it holds exactly the held tokens."""
        n = len(tokens)
        if n > self.n_batch:
            raise LocalgenError(f"internal: a batch of {n} tokens exceeds n_batch {self.n_batch}")
        start = len(self._held)
        ctx = self._ctx()
        self._batch.set_tokens(tokens, start, 0, all_logits)
        self._live = False
        rc: int | None = None
        try:
            rc = context.decode(ctx, self._batch)
            if rc == 0:
                self._held.extend(tokens)
                self._live = True
        finally:
            if rc != 0:
                self._drop_from(start)
        logs.raise_deferred()
        if rc == 2 and cancelled is not None and cancelled():
            return False
        if rc != 0:
            raise LocalgenError(f"llama_decode failed ({rc})", hint="the context may be full; raise --ctx")
        return True

    def state_size(self) -> int:
        """The bytes save_state would write now (nothing is written)."""
        return context.file_size(self._ctx(), len(self._held))

    def save_state(self, path: Path) -> int:
        """Write the context's KV state and its tokens atomically; returns the file size."""
        tokens = self._held
        paths.private_dir(path.parent)  # a state holds the text of its prompt
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))  # llama.cpp keeps the mode
            if not context.save_file(self._ctx(), tmp, tokens):
                if paths.no_room(tmp.parent):  # looked at while the part written still fills the disk (llama.cpp
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))  # says no cause)
                raise OSError(f"llama.cpp could not write {path}")  # the file asked for, not this step's own
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
            paths.fsync_dir(path.parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return path.stat().st_size

    def load_state(self, path: Path, evaluated: int | None = None) -> list[int] | None:
        """Restore a saved state; returns its tokens, or None (the cache is then empty) if it does not load.
        `evaluated`: how many of its tokens were evaluated as a prompt (all when None)."""
        try:
            held = context.load_file(self._ctx(), path, self.n_ctx)
        except OSError:
            held = None
        if held is None:
            self.clear()
            return None
        self._held = held
        self._evaluated = len(held) if evaluated is None else min(evaluated, len(held))
        self._live = False  # the logits are not restored: evaluate() re-evaluates the last token
        return self.held


__all__ = ["KVCache"]
