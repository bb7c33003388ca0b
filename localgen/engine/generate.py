"""One stream of tokens: evaluate the prompt (reusing what the KV cache holds), then sample, decode and
detokenize one token at a time (or check drafts in batches: speculative.py), with stop strings held back
until they are known not to be one, and stats at the end."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from localgen.engine.budget import budget_for, feed, pick
from localgen.engine.sequence import SequenceDecoder
from localgen.native import sampler as chains
from localgen.native.prompt import Prompt
from localgen.types import Chunk, FinishReason, SamplingParams, Stats, TokenLogprob

if TYPE_CHECKING:
    from localgen.engine.decoding import DecodingEngine


class Generation:
    """A lazy stream: iterate for Chunks; read .text, .finish_reason and .stats when it is done."""

    def __init__(self, engine: DecodingEngine, prompt: Prompt, sampling: SamplingParams,
                 started: float | None = None, drafter: Any = None, draft_max: int = 6,
                 logprobs: int | None = None, lead: Callable[[Generation], None] | None = None) -> None:
        self.engine = engine
        self.prompt = prompt
        self.seed = sampling.seed if sampling.seed is not None else random.getrandbits(31)
        self.sampling = sampling
        self.seq = SequenceDecoder.for_request(engine.piece, engine.is_eog, sampling, len(prompt.tokens),
                                              engine.n_ctx)
        self.finish_reason: FinishReason | None = None
        self.stats: Stats | None = None
        self._cancel = False
        self._started = started
        self.drafter = drafter
        self.draft_max = draft_max
        self.n_logprobs = logprobs
        self.counters: Any = None
        self.prompt_cache = "off"
        self.lead = lead  # the prompt's shared prefix held first, as the stream begins (Engine.generate)
        self.held_before: int | None = None  # of the KV cache's tokens, those a cache gave back (None: all)
        self._iter = self._run()

    def __iter__(self) -> Iterator[Chunk]:
        return self._iter

    @property
    def text(self) -> str:
        """The answer so far (all of it once the stream has ended)."""
        return self.seq.text

    @property
    def tokens(self) -> list[int]:
        """The answer's tokens so far."""
        return self.seq.tokens

    @property
    def logprobs(self) -> list[TokenLogprob]:
        """One per answer token, when asked for."""
        return self.seq.logprobs

    def cancel(self) -> None:
        """Stop after the token being decoded; inside the prompt's piece being evaluated, where the SIGINT handler
        is ours and the CPU computes it (else after it: KVCache._piece); the text so far is kept."""
        self._cancel = True

    def cancelled(self) -> bool:
        """Whether cancel() was called."""
        return self._cancel

    def close(self) -> None:
        """Stop the stream (if still running) and settle the stats as cancelled."""
        self._iter.close()  # type: ignore[attr-defined]

    def _tokens(self) -> Generator[int, None, None]:
        """Sampled tokens, one by one (each decoded before the next is sampled)."""
        eng = self.engine
        if self.drafter is not None:
            from localgen.engine import speculative

            self.counters = speculative.Counters()
            yield from speculative.tokens(eng, self.prompt, self.sampling, self.seed, self.drafter, self.draft_max,
                                          self.counters, self._record_logprob, self.cancelled)
            return
        chain = eng.sampler(self.sampling, self.seed, self.prompt.tokens)
        budget = budget_for(eng, self.sampling, self.prompt.tokens)
        sample = functools.partial(eng.sample, chain)
        try:
            if not self._prompt_evaluated():
                return
            while True:
                tok = pick(budget, chain, sample, chains.accept)
                feed(budget, eng, tok)
                self._record_logprob(tok, -1)
                yield tok
                eng.kv.decode([tok])
        finally:
            chains.free(chain)

    def _prompt_evaluated(self) -> bool:
        """Evaluate the prompt a piece at a time, as kv.evaluate does; False when cancelled, before a piece or
        inside one (the pieces evaluated before it stay held, and the record true)."""
        _, pieces = self.engine.kv.evaluating(self.prompt, cancelled=lambda: self._cancel)
        while not self._cancel:
            if next(pieces, None) is None:
                return not self._cancel
        return False

    def _record_logprob(self, token: int, row: int) -> None:
        if self.n_logprobs is not None:
            eng = self.engine
            self.logprobs.append(token_logprob(eng.logits(row), eng.piece, token, self.n_logprobs))

    def _run(self) -> Iterator[Chunk]:
        eng, seq = self.engine, self.seq
        if self.lead is not None:  # the shared prefix first: a cancel stops it as it stops the prompt's pieces
            self.lead(self)
        cached = eng.kv.cached_prefix(self.prompt)
        if self.held_before is not None:  # a prefix evaluated for this answer just before it: not cached, and
            cached = min(cached, self.held_before)  # the counters, reset before it by the lead, count it
        else:
            eng.reset_perf()
        t0 = self._started if self._started is not None else time.perf_counter()
        t_first: float | None = None
        t_last: float | None = None
        finished = False
        gen = self._tokens() if seq.limit.tokens > 0 else _no_tokens()
        try:
            try:
                for token in gen:
                    t_last = time.perf_counter()
                    if t_first is None:
                        t_first = t_last
                    text = seq.push(token)
                    if text:
                        yield Chunk(text, len(seq.tokens))
                    if seq.reason is None and self._cancel:  # asked while the chunk was out
                        text = seq.end("cancelled")
                        if text:
                            yield Chunk(text, len(seq.tokens))
                    if seq.reason is not None:
                        break
            finally:
                gen.close()
            text = seq.end("cancelled" if self._cancel else seq.limit.reason)  # no token: cancelled, or a limit of 0
            if text:
                yield Chunk(text, len(seq.tokens))
            finished = True
        finally:
            self.finish_reason = seq.reason if finished and seq.reason is not None else "cancelled"
            self.stats = self._stats(t0, t_first, t_last, cached)

    def _stats(self, t0: float, t_first: float | None, t_last: float | None, cached: int) -> Stats:
        perf = self.engine.perf() if self.engine.alive else None  # a stream closed after its engine: no counters
        total = time.perf_counter() - t0
        prefill = perf.n_p_eval / (perf.t_p_eval_ms / 1000) if perf and perf.t_p_eval_ms > 0 else None
        decode = perf.n_eval / (perf.t_eval_ms / 1000) if perf and perf.t_eval_ms > 0 and perf.n_eval > 0 else None
        c = self.counters
        if c is not None:  # verification batches count as prompt work in llama.cpp's counters: use the clock
            n = len(self.tokens)
            decode = (n - 1) / (t_last - t_first) if t_first and t_last and t_last > t_first and n > 1 else None
            prefill = (len(self.prompt.tokens) - cached) / (t_first - t0) if t_first and t_first > t0 else None
        assert self.finish_reason is not None
        return Stats(
            prompt_tokens=len(self.prompt.tokens),
            cached_tokens=cached,
            completion_tokens=len(self.tokens),
            load_s=self.engine.load_s,
            ttft_s=(t_first - t0) if t_first is not None else None,
            prefill_tps=prefill,
            decode_tps=decode,
            total_s=total,
            finish_reason=self.finish_reason,
            drafted=c.drafted if c is not None else None,
            accepted=c.accepted if c is not None else None,
            media_tokens=self.prompt.media_tokens,
            encode_s=self.engine.kv.encode_s if self.prompt.spans else None,
        )


def _no_tokens() -> Generator[int, None, None]:
    yield from ()


def token_logprob(raw: Any, piece: Callable[[int], bytes], token: int, top: int) -> TokenLogprob:
    """The model's log-probability of `token` given one row of logits (before sampling settings), and the
    `top` likeliest alternatives."""
    import numpy as np

    logits = raw.astype(np.float64)
    m = float(logits.max())
    logz = m + float(np.log(np.exp(logits - m).sum()))
    alternatives: tuple[tuple[str, float], ...] = ()
    raws: tuple[bytes, ...] = ()
    if top > 0:
        k = min(top, logits.shape[0])
        idx = np.argpartition(-logits, k - 1)[:k]
        idx = idx[np.argsort(-logits[idx], kind="stable")]
        raws = tuple(piece(int(t)) for t in idx)
        alternatives = tuple((raw.decode("utf-8", errors="replace"), float(logits[t]) - logz)
                             for raw, t in zip(raws, idx, strict=True))
    raw = piece(token)  # a token may be part of a character: its own bytes kept beside the text shown
    return TokenLogprob(raw.decode("utf-8", errors="replace"), token, float(logits[token]) - logz, alternatives,
                        raw, raws)
