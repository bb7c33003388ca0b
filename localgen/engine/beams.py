"""Beam search: N hypotheses decoded together in one batch per step, sharing the prompt's KV cells
through llama.cpp sequence copies (unified KV cache, so a copy shares cells instead of duplicating them).
Hypotheses are ranked by total log-probability while searching, and finished ones by
logprob / length ** length_penalty. With one beam it is exactly greedy decoding."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localgen.engine.sequence import decode_all
from localgen.errors import ContextOverflowError, LocalgenError
from localgen.native import context
from localgen.native import vocab as native_vocab
from localgen.native.lib import logits_row
from localgen.native.prompt import Prompt

if TYPE_CHECKING:
    from localgen.engine.batch import ParallelContext
    from localgen.engine.llama import Engine

# Without -n, beams stop here: each beam's tokens take their own KV cells (len(prompt) + N × max_new in all).
DEFAULT_MAX_NEW = 256


def kv_cells(prompt_len: int, n_beams: int, max_new: int, n_ctx: int) -> int:
    """The KV cells a beam search holds at most (the prompt once, N continuations), for the memory estimate."""
    budget = n_ctx - prompt_len
    new = min(max_new, budget) if max_new >= 0 else min(budget, DEFAULT_MAX_NEW)
    return prompt_len + n_beams * new + 16


@dataclass
class Hypothesis:
    """One beam: its tokens, summed log-probability, and why it ended."""

    tokens: list[int]
    logprob: float
    finish_reason: str = "length"
    text: str = ""
    score: float = 0.0


@dataclass
class BeamResult:
    """All hypotheses, best first, and timings."""

    beams: list[Hypothesis]
    prompt_tokens: int
    decode_s: float
    prefill_s: float
    decoded_tokens: int


def search(engine: Engine, prompt: Prompt, n_beams: int, max_new: int, length_penalty: float = 1.0,
           stop: tuple[str, ...] = ()) -> BeamResult:
    """Run beam search on the prompt; returns every hypothesis ranked."""
    from localgen.engine.batch import ParallelContext

    n_prompt = len(prompt.tokens)
    if n_prompt >= engine.n_ctx:
        raise ContextOverflowError(f"the prompt is {n_prompt:,} tokens; the context window is {engine.n_ctx:,}")
    budget = engine.n_ctx - n_prompt
    max_new = min(max_new, budget) if max_new >= 0 else min(budget, DEFAULT_MAX_NEW)
    if max_new == 0:
        return BeamResult([Hypothesis([], 0.0)], n_prompt, 0.0, 0.0, 0)
    engine.release_context()  # the beams work in a context of their own
    pc = ParallelContext(engine, n_beams, kv_cells(n_prompt, n_beams, max_new, engine.n_ctx), unified=True,
                         n_seq_max=2 * n_beams)
    try:
        t0 = time.perf_counter()
        row = pc.prefill(prompt, 0)
        t1 = time.perf_counter()
        live, done, decoded = _steps(engine, pc, n_prompt, row, n_beams, max_new, stop)
        t2 = time.perf_counter()
    finally:
        pc.close()
    # Early stopping: once N hypotheses have ended, unfinished ones are not ranked with them.
    finals = done if len(done) >= n_beams else done + live
    for h in finals:
        h.text, stopped = decode_all(engine.piece, h.tokens, stop)
        if stopped:
            h.finish_reason = "stop"
        h.score = h.logprob / max(1, len(h.tokens)) ** length_penalty
    finals.sort(key=lambda h: -h.score)
    return BeamResult(finals[:n_beams], n_prompt, t2 - t1, t1 - t0, decoded)


def _steps(engine: Engine, pc: ParallelContext, n_prompt: int, row: int, n_beams: int, max_new: int,
           stop: tuple[str, ...]) -> tuple[list[Hypothesis], list[Hypothesis], int]:
    """Grow the beams step by step; returns (live hypotheses, finished ones, tokens decoded)."""
    ctx = pc.ctx
    mem = context.memory(ctx)
    live: list[tuple[Hypothesis, int, int]] = [(Hypothesis([], 0.0), 0, row)]  # (hyp, seq id, logits row)
    done: list[Hypothesis] = []
    bank = decoded = 0
    for step in range(max_new):
        cands = _candidates(pc, live, n_beams)
        bank ^= 1
        chosen: list[tuple[Hypothesis, int, int]] = []
        pc.batch.n_tokens = 0
        for lp, li, tok in cands:
            if len(chosen) == n_beams:
                break
            parent, pseq, _ = live[li]
            h = Hypothesis([*parent.tokens, tok], lp)
            if native_vocab.is_eog(pc.vocab, tok):
                h.tokens.pop()
                h.finish_reason = "eos"
                done.append(h)
                continue
            seq = bank * n_beams + len(chosen)
            context.seq_rm(mem, seq, -1, -1)
            context.seq_cp(mem, pseq, seq, -1, -1)
            chosen.append((h, seq, pc.add(tok, n_prompt + step, seq, True)))
        for _h, pseq, _r in live:
            context.seq_rm(mem, pseq, -1, -1)
        live = chosen
        if not live or len(done) >= n_beams or step + 1 == max_new:
            break
        _decode(ctx, pc.batch)
        decoded += len(live)
        if stop and all(decode_all(engine.piece, h.tokens, stop)[1] for h, _s, _r in live):
            break
    return [h for h, _s, _r in live], done, decoded


def _candidates(pc: ParallelContext, live: list[tuple[Hypothesis, int, int]],
                n_beams: int) -> list[tuple[float, int, int]]:
    """The n_beams likeliest continuations of each live beam, best first: (summed logprob, beam, token)."""
    import numpy as np

    cands: list[tuple[float, int, int]] = []
    for li, (h, _seq, row) in enumerate(live):
        logits = logits_row(pc.ctx, row, pc.n_vocab).astype(np.float64)
        m = logits.max()
        logp = logits - m - np.log(np.exp(logits - m).sum())
        top = np.argpartition(-logp, n_beams)[:n_beams] if pc.n_vocab > n_beams else np.arange(pc.n_vocab)
        cands += [(h.logprob + float(logp[t]), li, int(t)) for t in top]
    cands.sort(key=lambda c: (-c[0], c[1], c[2]))
    return cands


def _decode(ctx: Any, batch: Any) -> None:
    if context.decode(ctx, batch) != 0:
        raise LocalgenError("llama_decode failed during beam search", hint="fewer --beams or a larger --ctx")
