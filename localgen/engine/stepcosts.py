"""What a decoding step costs by its rows, in one-row steps of the model: measured once a ParallelContext
(engine/batch.py) is warm (`measure`, its `calibrate`), and read between and past the sizes measured
(StepCosts). The throughput scheduler prices the drafts it may add to a step with it (engine/policies.py,
Throughput.drafts), a draft model's decodes (serve --draft) included; serve's /health shows it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from localgen.native import context
from localgen.native import vocab as native_vocab


class ParallelContext(Protocol):
    """What `measure` uses of engine/batch.py's ParallelContext (a protocol: batch.py imports this module, not the
    other way)."""

    n_parallel: int
    n_ctx_seq: int
    n_batch: int
    draft_max: int
    drafter: Any
    vocab: Any
    ctx: Any
    batch: Any

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int: ...

    def decode(self, n_seqs: int, cancelled: Callable[[], bool] | None = None) -> bool: ...

    def logits(self, row: int) -> Any: ...


@dataclass
class StepCosts:
    """A model's steps of n rows, and a draft model's decodes of n rows, priced in one-row steps of the model
    ((n, cost) pairs, n ascending; empty before `measure`)."""

    steps: list[tuple[int, float]] = field(default_factory=list)
    draft_steps: list[tuple[int, float]] = field(default_factory=list)
    draft_step: float = 0.0  # the draft model's one-row decode

    @property
    def row(self) -> float | None:
        """What the first drafted row costs, as a share of a one-row step (None before `measure`)."""
        return self.steps[1][1] - 1.0 if self.steps else None

    def step(self, n: int) -> float:
        """What a decoding step of n rows costs, in one-row steps (the measured sizes, in between the line
        between two, past the largest its last slope); 1 for any n before a measurement (rows taken as free)."""
        return _interpolate(self.steps, n) if self.steps else 1.0

    def draft_rows(self, n: int) -> float:
        """What a draft-model decode of n rows costs, in one-row steps of this model (the measured sizes, as
        `step`); before a measurement `draft_step` a row. 0 for no rows."""
        if n <= 0:
            return 0.0
        return _interpolate(self.draft_steps, n) if len(self.draft_steps) > 1 else self.draft_step * n


def measure(pc: ParallelContext, reps: int = 3) -> StepCosts:
    """Measure what a step of n rows costs against a step of one, for n from 1 to what drafting may ask (every
    slot decoding with `draft_max` drafts, up to 32 rows): a decode in sequence 0 with each row's check (its
    logits read, its greedy pick), each size once untimed (its compute graph) then `reps` times in turn, the
    fastest (what the hardware does; slower ones are other work on the machine). The cells are forgotten after.
    Call it while no sequence holds cells (after warm_up, before any request). Rows get cheaper in larger
    batches, so the sizes are measured, not a slope. With a draft model (`pc.drafter`), also its decodes of 1, 2,
    4, ... 64 rows (SlotDrafter.measure, the same way), against this model's one-row step (the two one-row
    decodes measured in turn so that both see the same load)."""
    import time

    import numpy

    top = max(2, min(pc.n_parallel * (pc.draft_max + 1), 32, pc.n_ctx_seq - 1, pc.n_batch))
    sizes = [n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if n < top] + [top]
    token = max(native_vocab.bos(pc.vocab), 0)
    mem = context.memory(pc.ctx)

    def step(n: int) -> float:
        pc.batch.n_tokens = 0
        for k in range(n):
            pc.add(token, k, 0, True)
        t0 = time.perf_counter()
        pc.decode(1)
        context.synchronize(pc.ctx)
        for row in range(n):
            int(numpy.argmax(pc.logits(row)))
        dt = time.perf_counter() - t0
        context.seq_rm(mem, 0, -1, -1)
        return dt

    times: dict[int, list[float]] = {n: [] for n in sizes}
    for n in sizes:
        step(n)
    for _ in range(reps):
        for n in sizes:
            times[n].append(step(n))
    pc.batch.n_tokens = 0
    context.clear(mem, True)
    t1 = min(times[1])
    out = StepCosts()
    last = 0.0
    for n in sizes:  # never cheaper for more rows (noise aside)
        last = max(last, min(times[n]) / t1 if t1 > 0 else float(n))
        out.steps.append((n, last))
    if pc.drafter is not None and t1 > 0:  # the draft model's decodes by rows, in those steps
        dsizes = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= pc.drafter.n_batch]
        by_rows = pc.drafter.measure(dsizes, reps)
        # its one-row decode against this model's, measured in turn (each the fastest of its own), so that both
        # see the same load: measured apart, a busy machine made the same model's ratio 0.3 or 8
        mine, theirs = [], []
        for _ in range(max(reps, 3)):
            mine.append(step(1))
            theirs.append(pc.drafter.measure([1], 1)[0][1])
        pc.batch.n_tokens = 0
        context.clear(mem, True)
        one = min(theirs) / min(mine)
        dlast = 0.0
        for n, t in by_rows:
            dlast = max(dlast, t / by_rows[0][1] * one)
            out.draft_steps.append((n, dlast))
        out.draft_step = out.draft_steps[0][1]
    return out


def _interpolate(costs: list[tuple[int, float]], n: int) -> float:
    """The cost of n rows from measured (rows, cost) pairs, rows ascending: the line between the two around n, past
    the largest its last slope."""
    from itertools import pairwise

    for (a, ca), (b, cb) in pairwise(costs):
        if n <= b:
            return ca + (cb - ca) * (n - a) / (b - a)
    (a, ca), (b, cb) = costs[-2], costs[-1]
    return cb + (cb - ca) / (b - a) * (n - b)
