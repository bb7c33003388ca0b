"""The serving core's scheduler, over one ParallelContext (engine/batch.py): `add(job)`, `abort(job_id)`, and
`step()`, which does one bounded piece of work and returns what came of it (`Output`s). Nothing calls back:
whoever drives it (serve's worker, `run --file`, bench) decides when to step and what to do with the outputs.

A step is one generation round plus one slice of other work:
- generation: the batching policy (engine/batchmode.py) admits waiting requests to free slots and runs one
  round: `Throughput`, one llama_decode with a token of every decoding sequence and chunks of new prompts
  (an exact request runs beside it, a token a step, on the engine's own context); `Exact`, prompts
  evaluated alone and the decoding sequences in batch-invariant groups;
- tasks (embeddings, rerank: engine/embed.py's EmbedTask): the next slice of one of them, taken in turn, so
  a large request costs a running stream one slice per token, never the whole request.

A job is aborted at the start of the next step (a sequence freed with what it has, a task dropped between
slices), so nothing computes for an absent client for longer than one step."""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from localgen.backend import Completion
from localgen.engine import sampling
from localgen.engine.batchseq import Request, Seq, Solo, accept, completion, is_exact, refuse
from localgen.engine.sequence import SequenceDecoder
from localgen.errors import Cancelled

if TYPE_CHECKING:
    from localgen.engine.batch import ParallelContext

# a task's tokens per slice while sequences are decoding: each slice is one step's work beside their tokens,
# so it bounds their longest gap (~0.2 s of embeddings for SmolLM2 on 2 cores); with nothing decoding a
# slice takes what its window holds
SLICE_TOKENS = 512


@dataclass(frozen=True)
class Piece:
    """Text a generation job decided in this step."""

    id: int
    text: str


@dataclass(frozen=True)
class Finished:
    """A generation job ended: finished, stopped, cut at its limit, cancelled, or refused (then
    `completion.error` says why, a typed error: errors.py)."""

    id: int
    completion: Completion


@dataclass(frozen=True)
class Result:
    """A task ended: its value, or the error that stopped it (Cancelled when aborted)."""

    id: int
    value: Any = None
    error: BaseException | None = None


Output = Piece | Finished | Result


class Task(Protocol):
    """Work other than generation, cut into bounded slices."""

    id: int

    def step(self, budget: int | None) -> bool:
        """Do one slice of at most `budget` tokens (None: as many as it takes at once, but still bounded);
        True once the whole task is done (its `value` is then the result)."""
        ...

    @property
    def value(self) -> Any: ...


class Scheduler:
    """The batch state (free slots, running sequences, waiting requests, tasks) and the policy that runs it."""

    def __init__(self, pc: ParallelContext, exact: bool | None = None, reuse: bool = False,
                 interleave: bool = False, serial_exact: bool = False) -> None:
        """`exact`: which requests must come out as they would alone (None: the greedy ones); `reuse`: a slot
        keeps its last sequence's cells for a request that starts with those tokens; `interleave` (exact
        policy, a server): while sequences run, at most one new prompt is evaluated a step; `serial_exact`
        (exact policy, layers on a GPU): exact sequences run one after another (engine/batch.py's notes)."""
        self.pc = pc
        self.exact = exact
        self.reuse = reuse
        self.free = list(range(pc.n_parallel))  # a heap: the lowest free slot first, to keep slots consecutive
        self.active: dict[int, Seq] = {}  # slot -> its sequence
        self.tasks: list[Task] = []
        self.out: list[Output] = []
        self._aborted: set[int] = set()
        self.policy: _Policy = _Throughput(self) if pc.pooled else _Exact(self, interleave, serial_exact)

    # ---- the API -------------------------------------------------------------------------------------

    def add(self, job: Request | Task) -> None:
        """Queue a generation request (it starts when the policy admits it) or a task (sliced from the next
        step on). A job's id must be unique among the jobs the scheduler holds."""
        if isinstance(job, Request):
            self.policy.add(job)
        else:
            self.tasks.append(job)

    def abort(self, job_id: int) -> None:
        """End a job at the start of the next step: a Finished with what it generated (finish reason
        "cancelled"), or a Result with a Cancelled error."""
        self._aborted.add(job_id)

    def abort_all(self) -> None:
        """Abort every job held."""
        self._aborted.update(self.ids())

    def ids(self) -> set[int]:
        """The ids of the jobs held (waiting, running, tasks)."""
        return {s.req.index for s in self.active.values()} | self.policy.waiting_ids() | {t.id for t in self.tasks}

    @property
    def idle(self) -> bool:
        """Whether no job waits or runs."""
        return not self.active and not self.tasks and self.policy.idle

    @property
    def room(self) -> int:
        """How many more generation requests the next step would start (free slots less those waiting)."""
        return len(self.free) - self.policy.waiting

    def step(self) -> list[Output]:
        """Apply aborts, run one generation round and one task slice; what came of them, in order (a job's
        Pieces before its Finished)."""
        if self._aborted:
            self._apply_aborts()
        self.policy.step()
        for seq in self.active.values():
            self._flush(seq)
        if self.tasks:
            self._slice()
        out, self.out = self.out, []
        return out

    def close(self) -> None:
        """Drop every job without outputs and free what they hold (after a fault, or when the model goes)."""
        for seq in list(self.active.values()):
            self.pc.lc.llama_sampler_free(seq.sampler.ptr)
        self.active.clear()
        self.policy.close()
        for task in self.tasks:
            _close(task)
        self.tasks.clear()
        self.free = list(range(self.pc.n_parallel))

    # ---- aborts and tasks ------------------------------------------------------------------------------

    def _apply_aborts(self) -> None:
        ids, self._aborted = self._aborted, set()
        for seq in [s for s in self.active.values() if s.req.index in ids]:
            self.finish(seq)
        self.policy.abort(ids)
        for task in [t for t in self.tasks if t.id in ids]:
            self.tasks.remove(task)
            _close(task)
            self.out.append(Result(task.id, error=Cancelled("cancelled")))

    def _slice(self) -> None:
        """One slice of the first task, which then goes to the back (tasks take turns)."""
        task = self.tasks.pop(0)
        try:
            done = task.step(SLICE_TOKENS if self.active or not self.policy.idle else None)
        except Exception as e:  # a typed error for the client, or a fault the driver logs
            _close(task)
            self.out.append(Result(task.id, error=e))
            return
        if done:
            _close(task)
            self.out.append(Result(task.id, task.value))
        else:
            self.tasks.append(task)

    # ---- sequences (both policies) ---------------------------------------------------------------------

    def done(self, c: Completion) -> None:
        self.out.append(Finished(c.index, c))

    def _flush(self, seq: Seq) -> None:
        if seq.text:
            self.out.append(Piece(seq.req.index, "".join(seq.text)))
            seq.text.clear()

    def start(self, req: Request, continuation_only: bool = False) -> Seq | None:
        """Give a request a slot (with `reuse`, the free one that holds most of its prompt; in a pooled context,
        cells shared from any slot that holds more), its prompt still to be evaluated from `filled`. None when
        it was answered at once (nothing to generate, or a prompt that does not fit)."""
        pc = self.pc
        if req.sampling.max_tokens == 0 or len(req.tokens) >= pc.n_ctx_seq:
            refuse(req, self.done, pc.n_ctx_seq)
            return None
        if self.reuse:
            slot, keep = pc.slots.pick(self.free, req.tokens, continuation_only)
        else:
            slot, keep = heapq.heappop(self.free), 0
        keep = pc.slots.fill(slot, req.tokens, keep, self.reuse, self.reuse and pc.pooled, continuation_only)
        eng = pc.engine
        dec = SequenceDecoder.for_request(eng.piece, eng.is_eog, req.sampling, len(req.tokens), pc.n_ctx_seq)
        seq = Seq(req, slot, pc.sampler(req.sampling, req.seed, req.tokens), time.perf_counter(), dec,
                  cached=keep, filled=keep)
        self.active[slot] = seq
        return seq

    def sample(self, seq: Seq, row: int) -> None:
        """Sample the sequence's next token from a batch row; finish it if that ended it."""
        pc = self.pc
        tok = sampling.pick(pc.lc, pc.ctx, seq.sampler, row, pc.n_vocab, top_k=pc.pooled)
        accept(seq, tok, lambda: pc.logits(row), pc.engine.piece)
        dec = seq.dec
        if dec.reason != "eos" and len(dec.tokens) > 1:
            pc.slots.held[seq.slot].append(dec.tokens[-2])  # fed at the step that sampled this one
        if dec.reason is None:
            seq.pending = tok
        else:
            self.finish(seq)

    def finish(self, seq: Seq) -> None:
        """Hand on a sequence that ended (or, not ended yet, is cancelled) and free its slot."""
        c = completion(seq)
        self._flush(seq)
        self.done(c)
        self.pc.lc.llama_sampler_free(seq.sampler.ptr)
        del self.active[seq.slot]
        heapq.heappush(self.free, seq.slot)


def _close(task: Any) -> None:
    close = getattr(task, "close", None)
    if close is not None:
        close()


class _Policy(Protocol):
    @property
    def waiting(self) -> int: ...

    def add(self, req: Request) -> None: ...

    def abort(self, ids: set[int]) -> None: ...

    def waiting_ids(self) -> set[int]: ...

    @property
    def idle(self) -> bool: ...

    def step(self) -> None: ...

    def close(self) -> None: ...


def _cancelled(req: Request) -> Completion:
    """The Completion of a request aborted before it started."""
    return Completion(req.index, "", "cancelled", len(req.tokens), 0, 0.0, 0.0, req.seed)


class _Throughput:
    """One llama_decode a step: the next token of every decoding sequence and, in the room left, chunks of
    the prompts being evaluated, oldest first. A request marked exact waits for the solo lane instead (one at
    a time, on the engine's own context: batchseq.Solo)."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s
        self.queue: list[Request] = []
        self.solo_queue: list[Request] = []
        self.solo: Solo | None = None

    @property
    def waiting(self) -> int:
        return len(self.queue)

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
            self.s._flush(self.solo.seq)

    def _solo_done(self, c: Completion) -> None:
        assert self.solo is not None
        self.s._flush(self.solo.seq)
        self.s.done(c)

    def _mixed_step(self) -> None:
        s = self.s
        pc, active = s.pc, s.active
        decoding = sum(1 for q in active.values() if q.pending is not None)
        room = min(pc.n_batch, max(pc.step_tokens, decoding + 1)) - decoding
        filling = sorted((q for q in active.values() if q.filled < len(q.req.tokens)), key=lambda q: q.started)
        for seq in filling:  # an image or clip next: encoded and decoded into the slot now, on its own
            end = pc.media(seq.req.tokens, seq.slot, seq.filled)
            pc.slots.held[seq.slot].extend(seq.req.tokens[seq.filled:end])
            seq.filled = end
        chunks: dict[int, int] = {}  # slot -> end of the prompt chunk it evaluates in this step (oldest first)
        for seq in filling:
            if room <= 0:
                break
            from localgen.engine.batch import next_span

            end = min(len(seq.req.tokens), seq.filled + room, next_span(seq.req.tokens, seq.filled))
            chunks[seq.slot] = end
            room -= end - seq.filled
        # rows in slot order, each slot's together: with a KV stream per slot llama.cpp cuts a batch into
        # ubatches of consecutive sequence ids (split_equal), so slots out of order (a prompt given the slot
        # that held its prefix) cut it into many small ubatches, each a pass over the weights (Gemma 3 270M,
        # 2 cores, 31 prompts in shuffled slots: a 12 % slower step)
        pc.batch.n_tokens = 0
        wants: list[tuple[Seq, int]] = []
        done: list[Seq] = []
        for slot in sorted(active):
            seq = active[slot]
            if seq.pending is not None:
                wants.append((seq, pc.add(seq.pending, seq.next_pos, slot, True)))
                seq.pending = None
            elif slot in chunks:
                tokens, start, end = seq.req.tokens, seq.filled, chunks[slot]
                row = -1
                for pos in range(start, end):
                    row = pc.add(tokens[pos], pos, slot, pos == len(tokens) - 1)
                pc.slots.held[slot].extend(tokens[start:end])
                seq.filled = end
                if end == len(tokens):
                    wants.append((seq, row))
                    done.append(seq)
        pc.decode(len(active))
        pc.steps += 1
        pc.rows += decoding
        now = time.perf_counter()
        for seq in done:
            seq.prefilled = now
        for seq, i in wants:
            s.sample(seq, i)


class _Exact:
    """Each new prompt evaluated alone, in the single-stream path's pieces; then one decoding round in the
    batch-invariant groups of ParallelContext.groups, so at temperature 0 each output is what the prompt
    gives alone."""

    def __init__(self, s: Scheduler, interleave: bool, serial_exact: bool) -> None:
        self.s = s
        self.interleave = interleave
        self.serial_exact = serial_exact
        self.queue: list[Request] = []

    @property
    def waiting(self) -> int:
        return len(self.queue)

    def add(self, req: Request) -> None:
        self.queue.append(req)

    def waiting_ids(self) -> set[int]:
        return {r.index for r in self.queue}

    def abort(self, ids: set[int]) -> None:
        for req in [r for r in self.queue if r.index in ids]:
            self.queue.remove(req)
            self.s.done(_cancelled(req))

    @property
    def idle(self) -> bool:
        return not self.queue

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
        if not s.active:
            return
        pc.rounds += 1
        for group in pc.groups([s.active[slot] for slot in sorted(s.active)], exact):
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

    def _admit(self, req: Request, continuation_only: bool) -> None:
        """Start a request in a free slot: its prompt evaluated at once, alone (from what the slot holds, with
        `reuse`). `continuation_only` (an exact request on a GPU, whose kernels round a prompt cut at another
        place differently): reuse a slot only to continue its conversation, never for a shared prefix alone."""
        s = self.s
        seq = s.start(req, continuation_only)
        if seq is None:
            return
        row = s.pc.prefill(req.tokens, seq.slot, seq.filled)
        s.pc.slots.held[seq.slot].extend(req.tokens[seq.filled:])
        seq.filled = len(req.tokens)
        seq.prefilled = time.perf_counter()
        s.sample(seq, row)
