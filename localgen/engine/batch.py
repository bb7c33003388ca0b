"""Many prompts on one model: up to N sequences share one context and one KV cache and are decoded
together, several sequence ids per llama_batch. Continuous batching: the moment a sequence finishes,
its slot takes the next prompt. Each sequence has its own sampler chain (same stages and order as the
single-stream path).

Two schedulers, one per mode (engine/batchmode.py):
- throughput (the default wherever exactness costs more than 10 %): one pool of KV cells for every slot, or a stream
  of cells per slot (--kv-unified; engine/batchmode.py, kv_pool); each step is one llama_decode that carries a token
  of every decoding sequence plus chunks of the new prompts (many prompts in one call), so arrivals neither stall
  the running streams nor wait behind them; a new prompt starts from the longest prefix any slot holds (a system
  prompt, few-shot examples), its cells shared, not recomputed. A request that asks for exactness runs on the
  engine's own single-sequence context beside the batch, one at a time (`Solo`, in engine/batchseq.py with the
  per-sequence state).
- exact: each slot its own KV stream, and exact sequences meet only batch-invariant kernels (see
  `groups`), so at temperature 0 each output is what the prompt gives alone."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from localgen.backend import Completion
from localgen.engine.batchmode import kv_pool
from localgen.engine.batchseq import END, Request, Seq, from_iterator, is_exact, next_span
from localgen.engine.slots import Slots
from localgen.engine.stepcosts import StepCosts, measure
from localgen.engine.tokens import grid_end, reusable_prefix
from localgen.errors import Cancelled, LocalgenError
from localgen.native import context, logs
from localgen.native import model as native_model
from localgen.native import sampler as chains
from localgen.native import vocab as native_vocab
from localgen.native.batch import Batch
from localgen.native.lib import logits_row
from localgen.native.prompt import Prompt
from localgen.types import KV_CACHE_TYPES, SamplingParams

if TYPE_CHECKING:
    from localgen.engine.llama import Engine


# a step of more rows than this (prompts being read) stops inside at a Ctrl-C where `ctrl_c` is set; one of fewer
# (tokens being generated) ends first: the abort check is a call into Python per llama.cpp operation, a cost a
# token's step would pay on every step (docs/benchmarks.md, Costs noted in the code)
CTRL_C_ROWS = 64


class ParallelContext:
    """A second context on the Engine's model with n_seq_max sequences, each with its own window."""

    def __init__(self, engine: Engine, n_parallel: int, n_ctx_per_seq: int, unified: bool = False,
                 n_seq_max: int | None = None, pooled: bool = False, share_prefixes: bool = True,
                 cache_ram: int = 0, draft_max: int = 0) -> None:
        """`unified`: one pool of n_ctx_per_seq cells (beam search); `pooled`: the throughput scheduler, with
        n_ctx_per_seq cells per slot, in one pool shared by all or in a stream per slot (kv_pool); else the exact
        scheduler, each slot its own stream of cells.
        `cache_ram`: bytes of host memory for slot states saved before a slot is reused (engine/hostcache.py;
        -1 no limit, 0 none); used where requests run with `reuse`. `draft_max`: the
        throughput scheduler drafts up to that many tokens per sequence and step by prompt lookup, where they
        pay (engine/policies.py, Throughput.drafts; 0 none)."""
        self.engine = engine
        self.n_parallel = n_parallel
        self.n_ctx_seq = -(-n_ctx_per_seq // 256) * 256
        prm = engine.params
        # unified: one pool of cells shared by all sequences (sequence copies share cells: beam search)
        n_ctx = self.n_ctx_seq if unified else self.n_ctx_seq * n_parallel
        self.n_chunk = engine.n_batch  # prompt chunk per llama_decode, as in the single-stream path
        # the throughput scheduler takes up to llama-server's n_batch (2048) tokens per step, in ubatches
        n_batch = max(prm.n_batch, n_parallel, 2048 if pooled else 0)
        n_ubatch = max(min(cast(int, prm.n_ubatch), n_batch), 1)  # resolved at load
        self.pooled = pooled
        # the throughput scheduler's tokens per step: one ubatch (one pass over the weights) on a GPU, so a
        # burst of prompts costs each running stream one such pass per step, never a whole burst's. On a CPU a
        # pass costs in proportion to its rows, so cutting prompts into steps does not lower what they cost
        # the running streams, it only spreads it over more of their tokens (and delays the new ones' first
        # token): a whole n_batch per step, as llama-server takes. (Small steps spread a burst's stall over
        # many of the streams' steps: docs/benchmarks.md, Costs noted in the code.)
        self.step_tokens = n_ubatch if engine.offloaded else n_batch
        # the throughput scheduler's cells: one pool, or each slot its own stream (--kv-unified; kv_pool's rule)
        self.one_pool = unified or kv_pool(engine, pooled)
        self.ctx = context.new(
            engine.model_ptr, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq_max or n_parallel,
            n_threads=prm.n_threads, n_threads_batch=prm.n_threads_batch,
            flash_attn_type=1 if engine.flash_attn else 0, type_k=KV_CACHE_TYPES[prm.cache_type_k],
            type_v=KV_CACHE_TYPES[prm.cache_type_v],
            kv_unified=self.one_pool,  # otherwise each sequence gets its own n_ctx_seq window
            no_perf=False)
        if not self.ctx:
            raise LocalgenError(f"llama.cpp could not create a context for {n_parallel} sequences",
                                hint="lower --parallel or --ctx")
        self.n_batch = n_batch
        # a fresh prompt's pieces: n_chunk (each prompt alone) or step_tokens (the throughput scheduler), cut
        # by llama.cpp into ubatches of n_ubatch; a reused prefix keeps to what gives the same rows bit for bit
        # and the rest is evaluated on the same grid (engine/tokens.py, reusable_prefix)
        self.n_ubatch = n_ubatch
        self.grid = self.step_tokens if pooled else self.n_chunk
        # --prefix-reuse all: every common token but the prompt's last, answers too, in plain pieces (llama.cpp's)
        self.reuse_all = prm.prefix_reuse == "all"
        self.slots = Slots(self.ctx, share_prefixes, self.one_pool, cache_ram,  # what each slot's cells hold
                           (lambda n, p, m: min(n, m - 1)) if self.reuse_all else
                           (lambda n, p, m: reusable_prefix(n, p, m, n_ubatch, self.grid)))
        self.turn = -1  # the slot served last when exact sequences take turns (groups)
        self.steps = 0  # generation llama_decode calls, and the rows they carried
        self.rows = 0
        self.evaluated = 0  # the tokens every decode evaluated, prompts' too: serve counts each step's (/metrics)
        self.rounds = 0  # scheduler steps (one or more llama_decode calls each)
        self.warmed_in: int | None = None  # the thread that ran warm_up (its OpenMP team decodes)
        # drafting needs the throughput scheduler, and a memory that can drop the tail of a sequence's cells (the
        # drafts not kept): not a recurrent or hybrid model's, nor an encoder-decoder's (its decode needs an encode)
        self.draft_max = draft_max if pooled and not native_model.whole_states_only(engine.model_ptr) and not (
            engine.encoder_only or native_model.has_encoder(engine.model_ptr)) else 0
        self.drafted = self.accepted = 0  # drafted tokens, and those kept
        # serve --draft: a draft model proposes the drafts instead of prompt lookup (engine/speculative.py,
        # SlotDrafter; set by whoever loads it, before warm_up)
        self.drafter: Any = None
        self.draft_off: str | None = None  # why drafting was turned off while serving (a draft-model failure)
        self.draft_error: BaseException | None = None
        self.costs = StepCosts()  # what a step of n rows costs, in one-row steps (measured by `calibrate`)
        self.batch = Batch(self.n_batch)
        self.ctrl_c = False  # whether a Ctrl-C stops a long step inside it (decode): set by a command's own run
        self.vocab = engine.vocab
        self.n_vocab = engine.n_vocab

    def close(self) -> None:
        """Free the context and batch, the draft model's, and the slot states saved in host memory now: the
        context is held in reference cycles (its slots' `reusable`, its scheduler's policy) that only Python's
        rare full collection frees, and serve's RSS grew by MBs at each model swap with the prompt cache on disk."""
        if self.drafter is not None:
            self.drafter.close()
            self.drafter = None
        self.slots.reset()
        context.drop(self)  # the batch and the context, as one step a Ctrl-C cannot split

    def warm_up(self, eog: bool = True) -> None:
        """What llama.cpp's tools do after a load (common_init_from_params): decode BOS and EOS in sequence 0,
        then forget them and reset the counters, so that the first request does not pay for the compute
        graph's first allocation. Also loads now what the first request would load: numpy (sampling) and,
        with `eog` (when no request waits for the load), the vocabulary's end-of-generation tokens, which
        only ignore_eos needs (a scan of every token, slow for a large vocabulary). The first request's time to
        first token is then the later ones' (docs/benchmarks.md, Warm-up; the scan: Costs noted in the code).
        With drafting on, it also measures what a drafted row costs (`calibrate`)."""
        import numpy  # noqa: F401  (sampling's first pick imports it)

        if self.engine.encoder_only or native_model.has_encoder(self.engine.model_ptr):
            return  # no decoder to warm (T5 would need an encode first, as llama.cpp's warm-up does)
        tokens = [t for t in (native_vocab.bos(self.vocab), native_vocab.eos(self.vocab)) if t >= 0] or [0]
        self.batch.n_tokens = 0
        for k, t in enumerate(tokens):
            self.add(t, k, 0, k == len(tokens) - 1)
        self.decode(1)
        context.clear(context.memory(self.ctx), True)
        context.synchronize(self.ctx)
        if self.draft_max and not self.costs.steps:
            self.calibrate()
        context.reset_perf(self.ctx)
        self.batch.n_tokens = 0
        if eog:
            _ = self.engine.eog_tokens
        self.warmed_in = threading.get_ident()

    def calibrate(self, reps: int = 3) -> float:
        """Measure what steps of n rows cost (engine/stepcosts.py, measure) into `costs`; returns what the first
        drafted row costs, as a share of a one-row step."""
        self.costs = measure(self, reps)
        return self.costs.steps[1][1] - 1.0

    def stop_drafting(self, error: BaseException) -> None:
        """Turn a failing draft model off for good: the requests go on without drafts (serve's worker says so once
        in its log, with the traceback of an error other than a LocalgenError; /health and /metrics show it). The
        draft model is freed."""
        if self.drafter is not None:
            drafter, self.drafter = self.drafter, None
            with contextlib.suppress(Exception):  # it failed already: what matters is that nothing uses it
                drafter.close()
        self.draft_max = 0
        self.draft_off = error.message if isinstance(error, LocalgenError) else \
            f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        self.draft_error = error

    def clear(self, seq: int = -1) -> None:
        """Forget one sequence's KV entries (all with -1)."""
        context.seq_rm(context.memory(self.ctx), seq, -1, -1)

    def sampler(self, s: SamplingParams, seed: int, history: list[int] | tuple[int, ...] = ()) -> Any:
        """A sampler chain with the single-stream path's stages and order."""
        eog = self.engine.eog_tokens if s.ignore_eos else ()
        return chains.build(self.vocab, self.n_vocab, s, seed, self.n_ctx_seq, eog, history)

    def logits(self, row: int) -> Any:
        return logits_row(self.ctx, row, self.n_vocab)

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        return self.batch.add(token, pos, seq, logits)

    def run(self, requests: Iterator[Request] | Callable[[bool], Any], on_done: Callable[[Completion], None],
            should_stop: Callable[[], bool] = lambda: False, exact: bool | None = None,
            reuse: bool = False, serial_exact: bool = False, interleave: bool = False) -> None:
        """Complete every request, N at a time, through a Scheduler (engine/scheduler.py; the options are its
        own); `on_done` gets each Completion as it finishes. `requests` is an iterator, or a function
        `take(wait)` returning the next Request, None when there is none yet (it may block when `wait`:
        nothing is running), or END. Once `should_stop` says so, what runs ends as cancelled."""
        from localgen.engine.scheduler import Finished, Scheduler

        take = requests if callable(requests) else from_iterator(requests)
        sched = Scheduler(self, exact, reuse, interleave, serial_exact)
        exhausted = stopping = False
        while True:
            while not exhausted and not stopping and sched.room > 0:
                req = take(sched.idle)
                if req is END:
                    exhausted = True
                elif req is not None:
                    sched.add(req)
                    continue
                break
            if not stopping and should_stop():
                stopping = True
                sched.abort_all()
            for out in sched.step():
                if isinstance(out, Finished):
                    on_done(out.completion)
            if sched.idle and (exhausted or stopping):
                return

    def groups(self, seqs: list[Seq], exact: bool | None) -> list[list[Seq]]:
        """The llama_decode calls of one decoding step (sequences in slot order).

        A sequence that must come out exactly as it would alone (greedy ones, or all with exact=True;
        none with exact=False) gets only batch-invariant kernels: at most `engine.exact_rows` rows per call
        where the weights' CPU matmul computes wider batches differently (repacked layouts: 3; K- and
        IQ-quants, which ggml's tiled matmul takes from 8 rows: 7), a call of its own once flash attention
        would split its KV range over threads alone (a single query over 512+ cells), and on a GPU always
        one of its own (kernels there change with batch size). When more such sequences are waiting than
        one call takes, the step decodes a full call of them, in turn, and the others wait for the next
        step (one full call per step, rather than a full one and a nearly empty one that pays for every
        layer's pass again). The rest go together in one call."""
        eng = self.engine
        long_fa = eng.flash_attn and self.n_ctx_seq >= 512
        cap = eng.exact_rows
        alone: list[Seq] = []
        few: list[Seq] = []  # at most `cap` per call
        rest: list[Seq] = []  # all in one call
        for seq in seqs:
            if not is_exact(seq.req, exact):
                rest.append(seq)
            elif eng.offloaded or (long_fa and seq.next_pos >= 255):
                alone.append(seq)
            else:
                (few if cap else rest).append(seq)
        if len(few) > cap:  # the first `cap` after the last one served: each waits at most one step
            nxt = next((i for i, s in enumerate(few) if s.slot > self.turn), 0)
            few = (few[nxt:] + few[:nxt])[:cap]
            self.turn = few[-1].slot
        return [[s] for s in alone] + ([few] if few else []) + ([rest] if rest else [])

    def media(self, prompt: Prompt, slot: int, pos: int) -> int:
        """Evaluate into the slot the prompt's media spans that start at `pos`; returns the position after them
        (`pos` when none starts there). The caller records them as held."""
        spans = prompt.spans
        while pos in spans:
            spans[pos].evaluate(self.ctx, pos, slot, self.n_batch)
            pos += spans[pos].n_pos
        return pos

    def prefill(self, prompt: Prompt, seq: int, first: int = 0) -> int:
        """Evaluate one sequence's prompt (from `first`: the cache holds the rest) alone, in the single-stream
        path's n_batch pieces (llama.cpp rounds a row differently in batches of other sizes), the first ending
        where a fresh evaluation's ubatch ends (engine/tokens.py, grid_end); returns the
        batch row of the last token's logits. Media spans evaluate themselves between the pieces."""
        row, start = -1, first
        while start < len(prompt.tokens):
            start, row = self.prefill_piece(prompt, seq, start, row)
        return row

    def prefill_piece(self, prompt: Prompt, seq: int, start: int, row: int = -1,
                      cancelled: Callable[[], bool] | None = None) -> tuple[int, int]:
        """One piece of `prefill` (a media span before it, if one comes first): where the next starts, and
        the batch row of the piece's last token (`row` when there was only media). Stopped inside its decode by
        `cancelled` (the batch holds this sequence alone): Cancelled, what it had evaluated from `start` gone."""
        tokens = prompt.tokens
        first, start = start, self.media(prompt, seq, start)
        if start >= len(tokens):
            return start, row
        end = min(self.piece_end(start, len(tokens), self.n_chunk), next_span(prompt, start))
        self.batch.n_tokens = 0
        for k in range(start, end):
            row = self.add(tokens[k], k, seq, k == end - 1)
        if not self.decode(1, cancelled):
            self.forget(seq, first)
            raise Cancelled("cancelled")
        return end, row

    def piece_end(self, start: int, end: int, size: int) -> int:
        """Where a piece of a prompt of `end` tokens that starts at `start` ends, in pieces of `size`: where a
        fresh evaluation's ubatch ends (engine/tokens.py, grid_end), or with --prefix-reuse all `size` on."""
        return min(end, start + size) if self.reuse_all else grid_end(start, end, self.n_ubatch, size)

    def decode(self, n_seqs: int, cancelled: Callable[[], bool] | None = None) -> bool:
        """One llama_decode of the batch. With `cancelled` (only for a batch that holds one sequence: an abort stops
        the whole decode), llama.cpp asks it between its operations, on the CPU (a GPU's backend asks nothing), and
        stops there once it says so: False, and the memory may hold the ubatches done before (forget them). With
        `ctrl_c` set (a command's own batch: run --file), a step of more than CTRL_C_ROWS rows (prompts) stops at a
        Ctrl-C inside it, which is raised: the command ends, and nothing of the step is used."""
        if cancelled is None and self.ctrl_c and self.batch.n_tokens > CTRL_C_ROWS:
            thunk = context.stop_on_ctrl_c(self.ctx)  # None off the main thread, or under another handler
        else:
            thunk = context.set_abort(self.ctx, cancelled) if cancelled is not None else None
        try:
            rc = context.decode(self.ctx, self.batch)
        finally:
            if thunk is not None:
                context.set_abort(self.ctx, None)
                del thunk  # referenced until llama.cpp no longer holds it
        if rc == 2:
            logs.raise_deferred()  # a Ctrl-C stopped it
            if cancelled is not None and cancelled():
                return False
        if rc != 0:
            raise LocalgenError(f"llama_decode failed ({rc}) with {n_seqs} sequence{'s' if n_seqs != 1 else ''}",
                                hint="lower --parallel or raise --ctx")
        logs.raise_deferred()
        self.evaluated += self.batch.n_tokens
        return True

    def forget(self, seq: int, pos: int) -> None:
        """Drop sequence `seq`'s cells from `pos` on, and the slot's record of them (a prompt stopped part-way)."""
        if not context.seq_rm(context.memory(self.ctx), seq, pos, -1):
            raise LocalgenError("llama.cpp could not forget a prompt stopped part-way")
        del self.slots.held[seq][pos:]
