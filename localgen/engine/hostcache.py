"""Prefixes kept in host memory when the slots need the room (serve's --cache-ram).

Before a slot is given to a request that would discard most of what it holds (another conversation, a
different system prompt), its KV state is copied out (llama_state_seq_get_data_ext); a later request that
starts with those tokens (the conversation coming back, more clients than slots) has it copied into its
slot instead of evaluating the prefix again. As llama-server's --cache-ram keeps them: the least recently
used entry goes first when the limit needs room, and an entry that the slot now holds whole is dropped
(the slot saves it again when it is reused)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localgen.engine.tokens import common_prefix, starts_with
from localgen.native import context

# fewer tokens than this are evaluated again rather than saved (a fraction of a second on a CPU)
MIN_TOKENS = 64


@dataclass(eq=False)  # an entry is itself (list.remove, `in`), never equal to another by its bytes
class Entry:
    """One saved slot: the tokens its KV cache held, the prompt length of the request that left them (the
    rest were generated), and the state bytes."""

    tokens: list[int]
    prompt_len: int
    data: Any
    size: int
    from_disk: bool = False  # read back from the prefix store (engine/prefixstore.py)


class HostCache:
    """Saved slot states under a byte limit (<= 0: no limit), least recently used first out."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.entries: list[Entry] = []  # least recently used first
        self.bytes = 0  # host memory the entries take
        self.saves = 0  # states copied out
        self.loads = 0  # states copied back into a slot
        self.loaded_tokens = 0  # prompt tokens those loads spared evaluating
        self.disk_loads = 0  # of those, states read back from disk (the prefix store)
        self.disk_loaded_tokens = 0
        self.refused = 0  # states llama.cpp would not place in a slot (dropped)

    def status(self) -> dict[str, int]:
        """Counters for /health."""
        return {"entries": len(self.entries), "tokens": sum(len(e.tokens) for e in self.entries),
                "bytes": self.bytes, "limit_bytes": self.limit, "saves": self.saves, "loads": self.loads,
                "loaded_tokens": self.loaded_tokens, "disk_loads": self.disk_loads,
                "disk_loaded_tokens": self.disk_loaded_tokens, "refused": self.refused}

    def clear(self) -> None:
        """Forget every entry."""
        self.entries.clear()
        self.bytes = 0

    def save(self, ctx: Any, seq: int, tokens: list[int], prompt_len: int, pinned: Entry | None = None,
             pinned_stays: bool = True) -> bool:
        """Copy sequence `seq`'s KV state (which holds `tokens`) out of the context; False when it is too short,
        already saved (a prefix of an entry), or larger than the limit. `pinned` (the entry about to be loaded)
        is never pushed out: False when the state does not fit beside it, where it stays once loaded
        (`pinned_stays`); one its load takes out makes room as it goes, so it is not counted."""
        if len(tokens) < MIN_TOKENS:
            return False
        if any(starts_with(e.tokens, tokens) for e in self.entries):
            return False
        size = context.seq_state_size(ctx, seq)
        kept = pinned.size if pinned is not None and pinned_stays and pinned in self.entries else 0
        if size <= 0 or (self.limit > 0 and size + kept > self.limit):
            return False
        # entries that this one contains are obsolete; then the least recently used go until it fits
        for e in [e for e in self.entries if len(e.tokens) < len(tokens) and starts_with(tokens, e.tokens)
                  and e is not pinned]:
            self.entries.remove(e)
            self.bytes -= e.size
        for e in list(self.entries):
            if self.limit <= 0 or self.bytes + size <= self.limit:
                break
            if e is not pinned:
                self.entries.remove(e)
                self.bytes -= e.size
        import numpy

        data = numpy.empty(size, dtype=numpy.uint8)  # not zeroed first: llama.cpp writes every byte
        written = context.seq_state_get(ctx, seq, data)
        if written != size:
            return False
        self.entries.append(Entry(list(tokens), prompt_len, data, size))
        self.bytes += size
        self.saves += 1
        return True

    def take(self, stored: list[Any]) -> int:
        """Prefixes read back from disk (engine/prefixstore.py's Stored, most recently used first) as entries,
        within the limit, those already held skipped; how many were taken."""
        room = self.limit - self.bytes if self.limit > 0 else None
        taken: list[Entry] = []
        for st in stored:
            if room is not None and st.size > room:
                continue
            if any(starts_with(e.tokens, st.tokens) for e in self.entries):
                continue
            taken.append(Entry(list(st.tokens), st.prompt_len, st.data, st.size, from_disk=True))
            room = None if room is None else room - st.size
        for e in reversed(taken):  # the most recently used last
            self.entries.append(e)
            self.bytes += e.size
        return len(taken)

    def best(self, tokens: list[int]) -> tuple[Entry | None, int]:
        """The entry that shares the longest prefix with `tokens` (worth loading: 64 tokens or more, and at
        least a quarter of the entry, since loading copies all of it), and that prefix's length."""
        best: Entry | None = None
        n = MIN_TOKENS - 1
        for e in self.entries:
            if len(e.tokens) > n and e.tokens[:n + 1] == tokens[:n + 1]:
                k = common_prefix(e.tokens, tokens)
                if k > n and 4 * k >= len(e.tokens):
                    best, n = e, k
        return (best, n) if best is not None else (None, 0)

    @staticmethod
    def stays(entry: Entry, used: int, whole: bool) -> bool:
        """Whether `entry` is kept once `load` has copied it with `used` of its tokens spared (`whole`: the slot
        will hold all its prompt once the new one is evaluated)."""
        return used < len(entry.tokens) and not whole

    def load(self, ctx: Any, seq: int, entry: Entry, used: int, whole: bool = False) -> bool:
        """Copy `entry` into sequence `seq` (which must be empty) and count `used` of its tokens as spared; the
        entry stays, most recently used, unless the slot now holds all of it, or, with `whole`, will hold all
        its prompt once the new one is evaluated (what it generated after is never reused). False when
        llama.cpp could not place it (the sequence is then left empty, and the entry, which would fail again,
        is dropped, or it is no longer held)."""
        if entry not in self.entries:
            return False
        n = context.seq_state_set(ctx, seq, entry.data, entry.size)
        if n != entry.size:
            context.seq_rm(context.memory(ctx), seq, -1, -1)
            self.entries.remove(entry)
            self.bytes -= entry.size
            self.refused += 1
            return False
        self.entries.remove(entry)
        if self.stays(entry, used, whole):
            self.entries.append(entry)
        else:
            self.bytes -= entry.size
        self.loads += 1
        self.loaded_tokens += used
        if entry.from_disk:
            self.disk_loads += 1
            self.disk_loaded_tokens += used
        return True

