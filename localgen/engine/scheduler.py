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
from typing import Any, Protocol

from localgen.backend import Completion
from localgen.engine.batchseq import Request, Seq, accept, completion, refuse, refused
from localgen.engine.budget import budget_for, feed, pick
from localgen.engine.policies import Exact, Policy, Throughput
from localgen.engine.sequence import SequenceDecoder
from localgen.errors import Cancelled
from localgen.native import sampler as chains

# a task's tokens per slice while sequences are decoding: each slice is one step's work beside their tokens,
# so it bounds their longest gap (a slice's time grows with its tokens: docs/benchmarks.md, Costs noted in
# the code); with nothing decoding a slice takes what its window holds
SLICE_TOKENS = 128


@dataclass(frozen=True)
class Piece:
    """Text a generation job decided in this step, and its prompt's tokens (all evaluated by now: text comes
    only from sampled tokens), of which `cached` a slot's cache already held; `made`: the tokens it has generated
    so far, `ttft_s` the time its first took (a job ended from outside, by a server's stop, is counted by these)."""

    id: int
    text: str
    prompt_tokens: int = 0
    cached: int = 0
    made: int = 0
    ttft_s: float | None = None


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

    def __init__(self, pc: Any, exact: bool | None = None, reuse: bool = False,
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
        self.policy: Policy = Throughput(self) if pc.pooled else Exact(self, interleave, serial_exact)

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
    def fresh(self) -> bool:
        """Whether it holds requests and none has begun (none in a slot or a solo lane, no task): its next step
        would be a burst's first."""
        return not self.active and not self.tasks and not self.policy.idle and not self.policy.running

    @property
    def queued(self) -> int:
        """How many generation requests it holds that have not begun: they wait for a slot."""
        return self.policy.queued

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
            self.flush(seq)
        if self.tasks:
            self._slice()
        out, self.out = self.out, []
        return out

    def close(self) -> None:
        """Drop every job without outputs and free what they hold (after a fault, or when the model goes)."""
        for seq in list(self.active.values()):
            chains.free(seq.sampler)
        self.active.clear()
        if self.pc.drafter is not None:
            self.pc.drafter.clear()
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

    def flush(self, seq: Seq) -> None:
        """Hand on the text a sequence decided since the last flush, as one Piece."""
        if seq.text:
            first = None if seq.first is None else seq.first - seq.started
            self.out.append(Piece(seq.req.index, "".join(seq.text), len(seq.req.tokens), seq.cached,
                                  len(seq.dec.tokens), first))
            seq.text.clear()

    def start(self, req: Request, continuation_only: bool = False) -> Seq | None:
        """Give a request a slot (with `reuse`, the free one that holds most of its prompt; in a pooled context,
        cells shared from any slot that holds more), its prompt still to be evaluated from `filled`. None when
        it was answered at once (nothing to generate, or a prompt that does not fit)."""
        pc = self.pc
        if refused(req, pc.n_ctx_seq):
            refuse(req, self.done, pc.n_ctx_seq)
            return None
        if self.reuse:
            slot, keep = pc.slots.pick(self.free, req.tokens, continuation_only)
        else:
            slot, keep = heapq.heappop(self.free), 0
        keep = pc.slots.fill(slot, req.prompt, keep, self.reuse, self.reuse and pc.pooled, continuation_only)
        eng = pc.engine
        dec = SequenceDecoder.for_request(eng.piece, eng.is_eog, req.sampling, len(req.tokens), pc.n_ctx_seq)
        seq = Seq(req, slot, pc.sampler(req.sampling, req.seed, req.tokens), time.perf_counter(), dec,
                  cached=keep, filled=keep, budget=budget_for(eng, req.sampling, req.tokens))
        self.active[slot] = seq
        return seq

    def sample(self, seq: Seq, row: int) -> None:
        """Sample the sequence's next token from a batch row; finish it if that ended it."""
        pc = self.pc
        tok = pick(seq.budget, seq.sampler, lambda: chains.pick(pc.ctx, seq.sampler, row, pc.n_vocab, top_k=pc.pooled),
                   chains.accept)
        accept(seq, tok, lambda: pc.logits(row), pc.engine.piece)
        feed(seq.budget, pc.engine, tok)
        dec = seq.dec
        if dec.reason != "eos" and len(dec.tokens) > 1:
            pc.slots.held[seq.slot].append(dec.tokens[-2])  # fed at the step that sampled this one
        if dec.reason is None:
            seq.pending = tok
        else:
            self.finish(seq)

    def verify(self, seq: Seq, rows: list[int]) -> None:
        """Sample the sequence's tokens from its rows: the first (its pending token's), then, while each sample
        equals the token drafted after it (Seq.drafts, fed at the next row), the next (engine/speculative.py's
        rule: for a deterministic draft the tokens follow the model's distribution). The cells of the drafts
        not kept are forgotten, a draft model's too."""
        drafts, seq.drafts = seq.drafts, []
        first = seq.next_pos  # the position of the token fed at rows[0]
        seq.drafted += len(drafts)  # counted now: a sequence that ends at one of these rows is handed on in it
        self.pc.drafted += len(drafts)
        used = 0  # rows whose fed token stays in the cells
        for i, row in enumerate(rows):
            self.sample(seq, row)
            used = i + 1
            ended = self.active.get(seq.slot) is not seq
            if not ended and seq.lookup is not None:
                seq.lookup.append(seq.dec.tokens[-1])
            if ended or i >= len(drafts) or seq.pending != drafts[i]:
                break
            seq.accepted += 1
            seq.probe_gap = 16
        if self.pc.drafter is not None:  # the draft model's cells past the kept tokens go too
            try:
                self.pc.drafter.kept(seq.slot, first + used)
            except Exception as e:  # a failing draft model: the requests go on without drafts
                self.pc.stop_drafting(e)
        if drafts:
            self.pc.accepted += used - 1
            if used < len(rows):
                from localgen.errors import LocalgenError
                from localgen.native import context

                if not context.seq_rm(context.memory(self.pc.ctx), seq.slot, first + used, -1):
                    raise LocalgenError("llama.cpp could not forget the drafts it did not keep",
                                        hint="serve this model without --lookup")

    def finish(self, seq: Seq) -> None:
        """Hand on a sequence that ended (or, not ended yet, is cancelled) and free its slot."""
        c = completion(seq)
        self.flush(seq)
        self.done(c)
        chains.free(seq.sampler)
        del self.active[seq.slot]
        heapq.heappush(self.free, seq.slot)
        # a draft model's sequence stays: the slot's next request (the same conversation, given the slot that holds
        # its prefix) keeps the prefix both share (engine/speculative.py, SlotDrafter)


def _close(task: Any) -> None:
    close = getattr(task, "close", None)
    if close is not None:
        close()
