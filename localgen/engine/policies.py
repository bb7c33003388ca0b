"""The two batching policies of the Scheduler (engine/scheduler.py), chosen by engine/batchmode.py: each
admits waiting generation requests to free slots and runs one generation round a step. A policy is given
its Scheduler (typed Any: the scheduler imports this module, and the engine keeps no import circles)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from localgen.backend import Completion
from localgen.engine.batchseq import Request, Seq, Solo, is_exact, next_span
from localgen.errors import Cancelled


class Policy(Protocol):
    """How a scheduler admits and runs generation requests (its batch state lives in the Scheduler)."""

    @property
    def waiting(self) -> int: ...

    @property
    def queued(self) -> int:
        """The requests held that have not begun (in no slot, nor in the solo lane)."""
        ...

    def add(self, req: Request) -> None: ...

    def abort(self, ids: set[int]) -> None: ...

    def waiting_ids(self) -> set[int]: ...

    @property
    def idle(self) -> bool: ...

    @property
    def running(self) -> bool:
        """Whether it runs a request outside the scheduler's slots (the throughput policy's solo lane)."""
        ...

    def step(self) -> None: ...

    def close(self) -> None: ...


def _step_cost(pc: Any, n: int) -> Callable[[int], float]:
    """What a step of m rows costs with n sequences decoding: where each slot has a stream of its own cells, the
    drafts are a pass of their own over the weights (Throughput.drafts)."""
    if pc.one_pool or n == 1:
        return pc.costs.step  # type: ignore[no-any-return]
    return lambda m: float(pc.costs.step(n) + (pc.costs.step(m - n) if m > n else 0.0))


class _DraftWork:
    """A draft model's work in one step (serve --draft): a decode per drafted position with a row for each sequence
    drafting that deep, priced by its rows (`draft_rows` a ParallelContext's costs.draft_rows, measured at load),
    so a sequence pays for the rows it adds to those decodes; and the catch-up of sequences whose draft sequence
    is behind (a request's first draft: its prompt; a try after steps without drafts: the tokens since), at most
    `room` rows in the step for all (one not caught up by then goes on in the next steps, drafting once it is),
    priced as its share per step over the steps it serves (as many as the tokens it evaluates, at most those the
    request may still take)."""

    def __init__(self, draft_rows: Callable[[int], float], room: int) -> None:
        self.dc = draft_rows
        self.levels: list[int] = []  # the draft model's decodes in this step: the rows of each (a sequence each)
        self.room = room  # rows left for catching sequences up
        self.caught = 0  # rows of catch-up taken
        self.committed = 0.0  # what the work given so far costs, in one-row steps of the model

    def cost(self, step_cost: Callable[[int], float], base: int, drafting: bool, m: int, catch: float = 0.0) -> float:
        """What the model's step of m rows costs with the work given so far and, past `base` rows (the step's rows
        before this sequence), this sequence's drafts (with a draft model, `drafting`) and its catch-up's share."""
        k = m - base
        if k <= 0 or not drafting:
            return float(step_cost(m) + self.committed)
        dc = self.dc
        depth = (*self.levels, *[0] * k)[:k]  # the rows this sequence joins, and past them decodes of its own
        return float(step_cost(m) + self.committed + catch + sum(dc(r + 1) - dc(r) for r in depth))

    def share(self, lag: int, left: int) -> float:
        """A catch-up of `lag` tokens, priced per step it serves (`left`: the tokens the request may still take)."""
        return self.dc(lag) / max(1, min(lag, left))

    def take(self, lag: int, k: int) -> int:
        """A sequence's catch-up, as much of `lag` as room is left, and once caught up its k drafts, added to the
        step's work: the tokens it catches up in this step."""
        dc = self.dc
        part = min(lag, self.room)
        self.room -= part
        self.committed += dc(self.caught + part) - dc(self.caught)
        self.caught += part
        if part == lag:
            for j in range(k):
                if j == len(self.levels):
                    self.levels.append(0)
                self.committed += dc(self.levels[j] + 1) - dc(self.levels[j])
                self.levels[j] += 1
        return part


def _proposed(pc: Any, wanted: dict[int, tuple[Seq, int, bool]], allowed: dict[int, int]) -> dict[int, list[int]]:
    """The draft model's drafts for the sequences that want them (slot → (sequence, tokens, whether a try)), each
    catching up at most `allowed[slot]` first; a failing draft model turns drafting off (stop_drafting) and the
    requests go on without drafts."""
    try:
        out: dict[int, list[int]] = pc.drafter.propose(
            {slot: (seq.req.tokens + seq.dec.tokens, k) for slot, (seq, k, _) in wanted.items()}, allowed)
    except Exception as e:
        pc.stop_drafting(e)
        return {}
    for slot, (seq, _, trying) in wanted.items():
        if slot in out:
            _drafted(seq, trying)
    return out


def _drafted(seq: Seq, trying: bool) -> None:
    """A sequence drafts in this step: the count of steps without drafts starts again, and after a try the next
    comes twice as late, unless this one is kept (Scheduler.verify sets the gap back)."""
    seq.undrafted = 0
    if trying:
        seq.probe_gap = min(2 * seq.probe_gap, 1024)


def _cancelled(req: Request) -> Completion:
    """The Completion of a request aborted before it started."""
    return Completion(req.index, "", "cancelled", len(req.tokens), 0, 0.0, 0.0, req.seed)


class Throughput:
    """One llama_decode a step: the next token of every decoding sequence and, in the room left, chunks of
    the prompts being evaluated, oldest first. A request marked exact waits for the solo lane instead (one at
    a time, on the engine's own context: batchseq.Solo)."""

    def __init__(self, s: Any) -> None:
        self.s = s
        self.queue: list[Request] = []
        self.solo_queue: list[Request] = []
        self.solo: Solo | None = None

    @property
    def waiting(self) -> int:
        return len(self.queue)

    @property
    def queued(self) -> int:
        return len(self.queue) + len(self.solo_queue)

    def add(self, req: Request) -> None:
        (self.solo_queue if req.exact else self.queue).append(req)

    def waiting_ids(self) -> set[int]:
        ids = {r.index for r in self.queue + self.solo_queue}
        return ids | ({self.solo.seq.req.index} if self.solo is not None else set())

    def abort(self, ids: set[int]) -> None:
        for q in (self.queue, self.solo_queue):
            for req in [r for r in q if r.index in ids]:
                q.remove(req)
                self.s.done(_cancelled(req))
        if self.solo is not None and self.solo.seq.req.index in ids:
            self._solo_step(stop=True)

    @property
    def idle(self) -> bool:
        return not self.queue and not self.solo_queue and self.solo is None

    @property
    def running(self) -> bool:
        return self.solo is not None

    def step(self) -> None:
        s = self.s
        while s.free and self.queue:
            s.start(self.queue.pop(0))
        if self.solo is None and self.solo_queue:
            self.solo = Solo(s.pc.engine, self.solo_queue.pop(0), self._solo_done)
        if s.active:
            s.pc.rounds += 1
            self._mixed_step()
        if self.solo is not None:
            self._solo_step(stop=False)

    def close(self) -> None:
        if self.solo is not None:
            self.solo.close()
            self.solo = None
        self.queue.clear()
        self.solo_queue.clear()

    def _solo_step(self, stop: bool) -> None:
        assert self.solo is not None
        if self.solo.step(stop):
            self.solo = None
        elif self.solo.seq.text:
            self.s.flush(self.solo.seq)

    def _solo_done(self, c: Completion) -> None:
        assert self.solo is not None
        self.s.flush(self.solo.seq)
        self.s.done(c)

    def drafts(self, decoding: list[Seq], filling: bool) -> dict[int, list[int]]:
        """Tokens to draft after each decoding sequence's pending one in this step (slot → tokens), by prompt
        lookup (engine/speculative.py, NgramIndex), as many as make the step's tokens per unit of time largest
        (speculative.draft_length). The j-th drafted token is kept with probability about alpha**j, alpha the
        share of the sequence's drafts kept so far (leaning on every sequence's share while it has drafted few);
        a step of n rows costs what `calibrate` measured at load (ParallelContext.costs, engine/stepcosts.py), so
        drafts go where rows are cheap (a GPU, a step with few rows) and answers copy their prompts. Sequences are
        taken in turn, each after the drafts given before it. A sequence that drafts nothing tries one token after 16
        steps, then 32, 64, ... while its tries fail, so its share can recover. None for a prompt with media
        (its placeholders are not text).

        Where each slot has a stream of its own cells (a CPU's default), llama.cpp cuts a step into ubatches that
        take as many rows of every sequence, so with several sequences decoding their drafts are a pass of
        their own over the weights: priced as such (costs.step(n) + costs.step(drafts)). The drafts take at most
        the step's `step_tokens` beside the decoding rows, half of that while a prompt is being evaluated (the
        rest is its chunk's).

        With a draft model (serve --draft: ParallelContext.drafter, engine/speculative.py's SlotDrafter) the tokens
        are its greedy choices instead, proposed for every drafting sequence at once, its work priced too
        (_DraftWork). A try is made only where a kept draft would pay for what it costs the draft model."""
        import functools

        from localgen.engine.speculative import NgramIndex, draft_length

        pc = self.s.pc
        drafter = pc.drafter  # serve --draft: a draft model's greedy tokens instead of prompt lookup
        n = rows = len(decoding)
        tokens = float(rows)  # the step's expected tokens so far
        overall = (pc.accepted + 1) / (pc.drafted + 2)
        budget = max(0, pc.step_tokens - n) // (2 if filling else 1)  # rows the drafts may take in all
        step_cost = _step_cost(pc, n)
        work = _DraftWork(pc.costs.draft_rows, pc.step_tokens)
        wanted: dict[int, tuple[Seq, int, bool]] = {}  # slot → (its sequence, tokens to draft, whether a try)
        allowed: dict[int, int] = {}  # slot → tokens its draft sequence may catch up in this step
        out: dict[int, list[int]] = {}
        for seq in decoding:
            # room in the step, in the slot's window and under the request's limit, after the pending token
            room = min(pc.draft_max, budget - (rows - n), pc.n_ctx_seq - seq.next_pos - 2,
                       seq.dec.limit.tokens - len(seq.dec.tokens) - 1)
            if seq.req.prompt.spans or room <= 0:
                continue
            alpha = (seq.accepted + 4 * overall) / (seq.drafted + 4)

            cost = functools.partial(work.cost, step_cost, rows, drafter is not None)
            lag, priced = 0, cost
            if drafter is not None:
                if seq.undrafted + 1 < seq.probe_gap and draft_length(alpha, tokens, rows, cost, room) == 0:
                    # no draft pays even with its catch-up free, and no try is due: passed over without comparing
                    # its tokens with its draft sequence's (a pass over its whole context, every step)
                    seq.undrafted += 1
                    continue
                lag = drafter.lag(seq.slot, seq.req.tokens + seq.dec.tokens)
                left = seq.dec.limit.tokens - len(seq.dec.tokens)
                priced = functools.partial(cost, catch=work.share(lag, left))

            k = draft_length(alpha, tokens, rows, priced, room)
            trying = k == 0
            if trying:
                seq.undrafted += 1
                if seq.undrafted < seq.probe_gap:
                    continue
                if drafter is not None and draft_length(1.0, tokens, rows, priced, 1) == 0:
                    seq.undrafted = 0  # even kept, its draft would not pay for the draft model's work (its catch-up
                    continue  # too): asked again after another gap
                k = 1  # a try, to see whether its drafts are kept again
            if drafter is not None:  # proposed below, for every sequence at once: k tokens unless the text ends
                wanted[seq.slot] = (seq, k, trying)
                allowed[seq.slot] = part = work.take(lag, k)
                if part < lag:
                    continue  # not caught up in this step: no drafts yet
                proposed = [0] * k
            else:
                if seq.lookup is None:
                    seq.lookup = NgramIndex(seq.req.tokens + seq.dec.tokens)
                proposed = seq.lookup.propose(k)
                if proposed:
                    out[seq.slot] = proposed
                    _drafted(seq, trying)
            rows += len(proposed)
            tokens += sum(alpha ** j for j in range(1, len(proposed) + 1))
        return _proposed(pc, wanted, allowed) if wanted else out

    def _mixed_step(self) -> None:
        s = self.s
        pc, active = s.pc, s.active
        decoding_seqs = [q for q in active.values() if q.pending is not None]
        drafts = self.drafts(decoding_seqs, any(q.filled < len(q.req.tokens) for q in active.values())) \
            if pc.draft_max and decoding_seqs else {}
        decoding = len(decoding_seqs) + sum(len(d) for d in drafts.values())  # rows
        # one ubatch per step on a GPU keeps running streams from waiting on a burst of prompts; with none
        # decoding (and no exact request in the solo lane, which takes a token after each step) nobody waits, so a
        # burst takes up to a whole n_batch per step, a piece of each prompt (llama.cpp cuts it into ubatches), as
        # llama-batched-bench and llama-server take it: a step per ubatch paid Python's step between ubatches
        # (docs/benchmarks.md, On an H200)
        per_step = pc.step_tokens if decoding or self.solo is not None else pc.n_batch
        room = min(pc.n_batch, max(per_step, decoding + 1)) - decoding
        filling = sorted((q for q in active.values() if q.filled < len(q.req.tokens)), key=lambda q: q.started)
        for seq in filling:  # an image or clip next: encoded and decoded into the slot now, on its own
            end = pc.media(seq.req.prompt, seq.slot, seq.filled)
            pc.slots.held[seq.slot].extend(seq.req.tokens[seq.filled:end])
            seq.filled = end
        chunks: dict[int, int] = {}  # slot -> end of the prompt chunk it evaluates in this step (oldest first)
        for seq in filling:
            if room <= 0:
                break
            end = min(pc.piece_end(seq.filled, len(seq.req.tokens), pc.grid), seq.filled + room,
                      next_span(seq.req.prompt, seq.filled))  # a fresh evaluation's ubatches (piece_end)
            chunks[seq.slot] = end
            room -= end - seq.filled
        # a step that holds one prompt's chunk alone stops where it is once its client leaves (ParallelContext.decode:
        # an abort stops the whole decode, so never where other sequences' rows are in it)
        alone = active[next(iter(chunks))] if len(chunks) == 1 and not decoding_seqs else None
        begun = alone.filled if alone is not None else 0
        # rows in slot order, each slot's together: with a KV stream per slot llama.cpp cuts a batch into
        # ubatches of consecutive sequence ids (split_equal), so slots out of order (a prompt given the slot
        # that held its prefix) cut it into many small ubatches, each a pass over the weights, and the step is
        # slower (docs/benchmarks.md, Costs inside a step)
        pc.batch.n_tokens = 0
        wants: list[tuple[Seq, list[int]]] = []
        done: list[Seq] = []
        for slot in sorted(active):
            seq = active[slot]
            if seq.pending is not None:
                pos = seq.next_pos
                seq.drafts = drafts.get(slot, [])
                wants.append((seq, [pc.add(t, pos + j, slot, True) for j, t in enumerate([seq.pending, *seq.drafts])]))
                seq.pending = None
            elif slot in chunks:
                tokens, start, end = seq.req.tokens, seq.filled, chunks[slot]
                row = -1
                for pos in range(start, end):
                    row = pc.add(tokens[pos], pos, slot, pos == len(tokens) - 1)
                pc.slots.held[slot].extend(tokens[start:end])
                seq.filled = end
                if end == len(tokens):
                    wants.append((seq, [row]))
                    done.append(seq)
        if not pc.decode(len(active), alone.req.cancelled if alone is not None else None):
            assert alone is not None
            pc.forget(alone.slot, begun)  # its chunk is gone; what it held before stays
            alone.filled = begun
            s.finish(alone)
            return
        if decoding_seqs:  # a call that only evaluates prompts generates nothing: not a decode call of --stats
            pc.steps += 1
            pc.rows += len(decoding_seqs)
        now = time.perf_counter()
        for seq in done:
            seq.prefilled = now
        for seq, rows in wants:
            s.verify(seq, rows)


class Exact:
    """Each new prompt evaluated alone, in the single-stream path's pieces (with `interleave`, one piece a
    step, so a long prompt never holds up the running streams for more than one); then one decoding round in
    the batch-invariant groups of ParallelContext.groups, so at temperature 0 each output is what the prompt
    gives alone."""

    def __init__(self, s: Any, interleave: bool, serial_exact: bool) -> None:
        self.s = s
        self.interleave = interleave
        self.serial_exact = serial_exact
        self.queue: list[Request] = []
        self.filling: list[Seq] = []  # admitted, their prompts partly evaluated (oldest first)
        self._rows: dict[int, int] = {}  # slot -> the batch row of its last piece's last token

    @property
    def waiting(self) -> int:
        return len(self.queue)

    @property
    def queued(self) -> int:
        return len(self.queue)

    def add(self, req: Request) -> None:
        self.queue.append(req)

    def waiting_ids(self) -> set[int]:
        return {r.index for r in self.queue}

    def abort(self, ids: set[int]) -> None:
        for req in [r for r in self.queue if r.index in ids]:
            self.queue.remove(req)
            self.s.done(_cancelled(req))
        self.filling = [q for q in self.filling if q.req.index not in ids]  # the scheduler ends them

    @property
    def idle(self) -> bool:
        return not self.queue

    @property
    def running(self) -> bool:
        return False  # what it runs is in the scheduler's slots

    def step(self) -> None:
        s = self.s
        pc, exact = s.pc, s.exact
        admitted = 0
        while s.free and self.queue and not (self.interleave and s.active and admitted):
            req = self.queue[0]
            if self.serial_exact and is_exact(req, exact) and any(is_exact(q.req, exact) for q in s.active.values()):
                break  # held back until the exact sequence running ends
            self.queue.pop(0)
            self._admit(req, continuation_only=is_exact(req, exact) and pc.engine.offloaded)
            admitted += 1
        self.filling = [q for q in self.filling if s.active.get(q.slot) is q]
        if self.filling:
            self._fill(self.filling[0] if self.interleave else None)
        decoding = [s.active[slot] for slot in sorted(s.active) if s.active[slot].pending is not None]
        if not decoding:
            return
        pc.rounds += 1
        for group in pc.groups(decoding, exact):
            pc.batch.n_tokens = 0
            wants: list[tuple[Seq, int]] = []
            for seq in group:
                assert seq.pending is not None
                wants.append((seq, pc.add(seq.pending, seq.next_pos, seq.slot, True)))
                seq.pending = None
            pc.decode(len(wants))
            pc.steps += 1
            pc.rows += len(wants)
            for seq, i in wants:
                s.sample(seq, i)

    def close(self) -> None:
        self.queue.clear()
        self.filling.clear()

    def _admit(self, req: Request, continuation_only: bool) -> None:
        """Start a request in a free slot, its prompt to be evaluated from what the slot holds (with `reuse`).
        `continuation_only` (an exact request on a GPU, whose kernels round a prompt cut at another place
        differently): reuse a slot only to continue its conversation, never for a shared prefix alone."""
        seq = self.s.start(req, continuation_only)
        if seq is not None:
            self.filling.append(seq)
            self._rows[seq.slot] = -1

    def _fill(self, only: Seq | None) -> None:
        """One piece of `only`'s prompt, or every admitted prompt whole; a prompt evaluated to its end samples
        its first token."""
        s = self.s
        for seq in [only] if only is not None else list(self.filling):
            tokens, start = seq.req.tokens, seq.filled
            end, row = start, self._rows.get(seq.slot, -1)
            left = False
            try:
                while end < len(tokens):
                    end, row = s.pc.prefill_piece(seq.req.prompt, seq.slot, end, row, seq.req.cancelled)
                    if only is not None:
                        break
            except Cancelled:  # its client left inside a piece: that piece is gone, those before it are held
                left = True
            s.pc.slots.held[seq.slot].extend(tokens[start:end])
            seq.filled = end
            self._rows[seq.slot] = row
            if left:
                self.filling.remove(seq)
                self._rows.pop(seq.slot, None)
                s.finish(seq)
            elif end == len(tokens):
                self.filling.remove(seq)
                seq.prefilled = time.perf_counter()
                s.sample(seq, self._rows.pop(seq.slot))
