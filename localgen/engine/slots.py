"""The slots of a ParallelContext: the tokens each slot's KV cells hold, and where a new request's prompt
starts from (the batch schedulers in engine/batch.py decide when). The longest of three prefixes wins: the
free slot's own cells (a conversation continued), another slot's cells (a shared system prompt: shared in
one pool, a copy of the stream cut back between streams), or a slot state saved in host memory
(engine/hostcache.py) before its slot went to another request. Of each, only what gives bit for bit the rows a
fresh evaluation of the new prompt gives (engine/tokens.py, reusable_prefix): never a generated token."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from localgen.engine.hostcache import MIN_TOKENS, Entry, HostCache
from localgen.engine.tokens import common_prefix, safe_prefix, starts_with
from localgen.native import context
from localgen.native.prompt import Prompt


class Slots:
    """Per slot: `held`, the tokens its cells hold (for reuse), and `prompt_len`, its last request's prompt
    length. `shared` counts prompt tokens taken from another slot's cells; `host` is the host-memory cache
    (None when off). `reusable(n, evaluated, length)`: how many of `n` common tokens to keep, of a prefix whose
    first `evaluated` tokens were evaluated as a prompt, for a prompt of `length` (reusable_prefix)."""

    def __init__(self, ctx: Any, share: bool, one_pool: bool, cache_ram: int,
                 reusable: Callable[[int, int, int], int] = lambda n, p, m: min(n, p, m - 1)) -> None:
        self.ctx = ctx
        self.share = share  # a prompt may start from another slot's cells (the throughput scheduler)
        self.one_pool = one_pool  # one pool of cells (sharing is a cell copy), else a stream per slot
        self.held: dict[int, list[int]] = {}
        self.prompt_len: dict[int, int] = {}
        self.shared = 0
        self.host = HostCache(cache_ram) if cache_ram else None
        self.host_error: BaseException | None = None  # why the host cache was turned off (_host_failed)
        self.reusable = reusable

    def reset(self) -> None:
        """Forget what every slot holds (their cells were cleared) and every saved state."""
        self.held.clear()
        self.prompt_len.clear()
        if self.host is not None:
            self.host.clear()

    def pick(self, free: list[int], tokens: list[int], continuation_only: bool) -> tuple[int, int]:
        """Take from the heap `free` the slot whose cached tokens share the longest prefix with `tokens`, and
        say how many to keep (at least the last prompt token is evaluated again, for its logits; `reusable`).
        `continuation_only`: reuse a slot only to continue its conversation, never for a shared prefix alone."""
        best, keep, continued = free[0], 0, False
        for slot in free:
            held = self.held.get(slot, [])
            n = common_prefix(held, tokens)
            continues = bool(held) and n >= self.prompt_len.get(slot, 0)  # this slot's conversation, grown
            if continuation_only and not continues:
                n = 0  # another conversation that shares a prefix (a system prompt): start afresh
            n = self.reusable(n, self._evaluated(slot), len(tokens))
            if n > keep or (n == keep and slot < best):
                best, keep, continued = slot, n, continues
        empty = [slot for slot in free if not self.held.get(slot)]
        if not continued and keep and empty:
            # only a shared beginning (a template's header, a system prompt): an empty slot takes it, the
            # beginning copied from another slot where sharing is on (fill), so that the conversation that slot
            # holds keeps its place for its next turn instead of being evicted for a few tokens
            best, keep = min(empty), 0
        free.remove(best)
        heapq.heapify(free)
        return best, keep

    def fill(self, slot: int, prompt: Prompt, keep: int, reuse: bool, share: bool,
             continuation_only: bool) -> int:
        """Start `slot` on `prompt`, keeping `keep` of its own cells; with `reuse`, from the longest prefix of
        its tokens that another slot (with `share`) or a saved state holds, if longer, saving first what the
        slot loses. Returns how many prompt tokens its cells now hold (the rest are to be evaluated)."""
        mem = context.memory(self.ctx)
        tokens = prompt.tokens
        keep = safe_prefix(prompt, keep)  # an image is evaluated whole or not at all
        src, n = self._best_source(tokens, slot) if share and self.share else (-1, 0)
        n = safe_prefix(prompt, n)
        entry, m, whole = None, 0, False
        if reuse and self.host is not None:
            try:
                entry, m = self.host.best(tokens)
                if entry is not None and continuation_only and m < entry.prompt_len:
                    m = 0
                if entry is not None:
                    m = safe_prefix(prompt, self.reusable(m, min(entry.prompt_len, len(entry.tokens)), len(tokens)))
                    whole = starts_with(tokens, entry.tokens[:entry.prompt_len])  # the slot will hold all it reuses
                loading = entry if m > max(keep, n) else None
                stays = loading is not None and self.host.stays(loading, m, whole)
                self._spill(slot, keep if max(n, m) <= keep else 0, loading, stays)
            except Exception as e:  # a fault of the prompt cache: this request misses it (host_failed)
                self._host_failed(e)
                entry, m = None, 0
        if self.host is not None and entry is not None and m > max(keep, n):
            context.seq_rm(mem, slot, -1, -1)
            try:
                keep = m if self.host.load(self.ctx, slot, entry, m, whole) else 0
            except Exception as e:  # as above; the slot starts empty
                context.seq_rm(mem, slot, -1, -1)
                self._host_failed(e)
                keep = 0
        elif n > keep:
            context.seq_rm(mem, slot, -1, -1)
            if self.one_pool:
                context.seq_cp(mem, src, slot, 0, n)
            else:  # between streams llama.cpp copies only a whole one: copy, drop the rest
                context.seq_cp(mem, src, slot, -1, -1)  # its cost: docs/benchmarks.md, Costs noted in the code
            self.shared += n
            keep = n
        context.seq_rm(mem, slot, keep, -1)
        self.held[slot] = list(tokens[:keep])
        self.prompt_len[slot] = len(tokens)
        return keep

    def keep(self, store: Any, key: str, identity: str) -> int:
        """Write to the prefix store (engine/prefixstore.py) what the host cache holds and what each slot
        holds (64 tokens or more, not stored yet, not a prefix of another slot's), copied straight from the
        slot: serve's prompt cache kept across unloads and restarts. The bytes written and kept (nothing without a
        host cache, which is where they come back to)."""
        if self.host is None:
            return 0
        import numpy

        entries: list[tuple[list[int], int, Any, int]] = [(e.tokens, e.prompt_len, e.data, e.size)
                                                          for e in self.host.entries]
        for slot, held in list(self.held.items()):
            if len(held) < MIN_TOKENS or store.has(key, held):
                continue
            if any(other != slot and len(h) > len(held) and starts_with(h, held) for other, h in self.held.items()):
                continue
            size = context.seq_state_size(self.ctx, slot)
            if size <= 0:
                continue
            data = numpy.empty(size, dtype=numpy.uint8)
            if context.seq_state_get(self.ctx, slot, data) == size:
                entries.append((list(held), self.prompt_len.get(slot, len(held)), data, size))
        return int(store.write(key, identity, entries))

    def restore(self, store: Any, key: str, identity: str) -> int:
        """The prefixes stored for this model read back into the host cache, within its limit (a request with
        one of them then copies it into its slot instead of evaluating it); how many."""
        if self.host is None:
            return 0
        room = self.host.limit - self.host.bytes if self.host.limit > 0 else None
        return self.host.take(store.load(key, identity, room))

    def _spill(self, slot: int, kept: int, loading: Entry | None, stays: bool = True) -> None:
        """Save to host memory what `slot` holds before it keeps only `kept` of it, unless that loses little or
        another slot holds it all; never by pushing out `loading`, the entry about to be loaded into it (counted
        against the room only where it `stays` in the cache once loaded)."""
        held = self.held.get(slot)
        if self.host is None or not held or len(held) - kept < MIN_TOKENS:
            return
        if any(other != slot and starts_with(h, held) for other, h in self.held.items()):
            return
        self.host.save(self.ctx, slot, held, self.prompt_len.get(slot, len(held)), pinned=loading, pinned_stays=stays)

    def _host_failed(self, error: BaseException) -> None:
        """Turn a failing prompt cache in host memory off for good: the request at hand and those after it go on
        without it (serve's worker says so once in its log, with the traceback; engine/batch.py's stop_drafting
        does as much for a draft model)."""
        self.host = None
        self.host_error = error

    def _best_source(self, tokens: list[int], slot: int) -> tuple[int, int]:
        """The slot other than `slot` whose evaluated tokens share the longest prefix with `tokens`, and how
        many of them can be shared (the last prompt token is always evaluated, for its logits; `reusable`)."""
        best, n = -1, 0
        for other, held in self.held.items():
            if other != slot:
                k = self.reusable(common_prefix(held, tokens), self._evaluated(other), len(tokens))
                if k > n:
                    best, n = other, k
        return best, n

    def _evaluated(self, slot: int) -> int:
        """How many of the tokens a slot holds were evaluated as its prompt (the rest it generated)."""
        return min(self.prompt_len.get(slot, 0), len(self.held.get(slot, ())))
