"""One stream of tokens: evaluate the prompt (reusing what the KV cache holds), then sample, decode and
detokenize one token at a time (or check drafts in batches: speculative.py), with stop strings held back
until they are known not to be one, and stats at the end."""

from __future__ import annotations

import codecs
import random
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localgen.engine.stops import StopMatcher
from localgen.types import Chunk, FinishReason, SamplingParams, Stats, TokenLogprob

if TYPE_CHECKING:
    from localgen.engine.decoding import DecodingEngine


@dataclass(frozen=True)
class _Limit:
    tokens: int  # most tokens to generate
    by_request: bool  # the request's max_tokens (finish "length"), not the window (finish "context")


def limit_for(s: SamplingParams, prompt_len: int, n_ctx: int) -> _Limit:
    """How many tokens may be generated: max_tokens (0: none, -1: no limit), within the window."""
    room = max(0, n_ctx - prompt_len)
    if s.max_tokens >= 0 and s.max_tokens <= room:
        return _Limit(s.max_tokens, True)
    return _Limit(room, False)


class Generation:
    """A lazy stream: iterate for Chunks; read .text, .finish_reason and .stats when it is done."""

    def __init__(self, engine: DecodingEngine, tokens: list[int], sampling: SamplingParams,
                 started: float | None = None, drafter: Any = None, draft_max: int = 6,
                 logprobs: int | None = None) -> None:
        self.engine = engine
        self.prompt = tokens
        self.seed = sampling.seed if sampling.seed is not None else random.getrandbits(31)
        self.sampling = sampling
        self.text = ""
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.finish_reason: FinishReason | None = None
        self.stats: Stats | None = None
        self._cancel = False
        self._started = started
        self.drafter = drafter
        self.draft_max = draft_max
        self.n_logprobs = logprobs
        self.counters: Any = None
        self.prompt_cache = "off"
        self._iter = self._run()

    def __iter__(self) -> Iterator[Chunk]:
        return self._iter

    def cancel(self) -> None:
        """Stop after the token being decoded; the text so far is kept."""
        self._cancel = True

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
                                          self.counters, self._record_logprob)
            return
        chain = eng.sampler(self.sampling, self.seed, self.prompt)
        try:
            eng.evaluate(self.prompt)
            while True:
                tok = eng.sample(chain)
                self._record_logprob(tok, -1)
                yield tok
                eng.decode([tok])
        finally:
            eng.free_sampler(chain)

    def _record_logprob(self, token: int, row: int) -> None:
        if self.n_logprobs is not None:
            eng = self.engine
            self.logprobs.append(token_logprob(eng.logits(row), eng.piece, token, self.n_logprobs))

    def _run(self) -> Iterator[Chunk]:
        eng, s = self.engine, self.sampling
        cached = eng.cached_prefix(self.prompt)
        eng.reset_perf()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        stops = StopMatcher(s.stop)
        emitted = 0
        t0 = self._started if self._started is not None else time.perf_counter()
        t_first: float | None = None
        t_last: float | None = None
        limit = limit_for(s, len(self.prompt), eng.n_ctx)
        reason: FinishReason = "length" if limit.by_request else "context"
        finished = False
        gen = self._tokens() if limit.tokens > 0 else _no_tokens()
        try:
            try:
                for token in gen:
                    t_last = time.perf_counter()
                    if t_first is None:
                        t_first = t_last
                    if eng.is_eog(token) and not s.ignore_eos:
                        reason = "eos"
                        del self.logprobs[len(self.tokens):]  # the end token is not part of the answer
                        break
                    self.tokens.append(token)
                    self.text += decoder.decode(eng.piece(token))
                    hit = stops.find(self.text)
                    if hit is not None:
                        self.text = self.text[:hit]
                        reason = "stop"
                        if hit > emitted:
                            yield Chunk(self.text[emitted:], len(self.tokens))
                        emitted = len(self.text)
                        break
                    safe = stops.safe(self.text)
                    if safe > emitted:
                        yield Chunk(self.text[emitted:safe], len(self.tokens))
                        emitted = safe
                    if self._cancel:
                        reason = "cancelled"
                        break
                    if len(self.tokens) >= limit.tokens:
                        reason = "length" if limit.by_request else "context"
                        break
            finally:
                gen.close()
            if reason != "stop":
                # flush held-back text that turned out not to start a stop sequence
                self.text += decoder.decode(b"", final=True)
                if len(self.text) > emitted:
                    tail, emitted = self.text[emitted:], len(self.text)
                    yield Chunk(tail, len(self.tokens))
            finished = True
        finally:
            self.finish_reason = reason if finished else "cancelled"
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
            prefill = (len(self.prompt) - cached) / (t_first - t0) if t_first and t_first > t0 else None
        assert self.finish_reason is not None
        return Stats(
            prompt_tokens=len(self.prompt),
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
    if top > 0:
        k = min(top, logits.shape[0])
        idx = np.argpartition(-logits, k - 1)[:k]
        idx = idx[np.argsort(-logits[idx], kind="stable")]
        alternatives = tuple((piece(int(t)).decode("utf-8", errors="replace"), float(logits[t]) - logz) for t in idx)
    text = piece(token).decode("utf-8", errors="replace")
    return TokenLogprob(text, token, float(logits[token]) - logz, alternatives)
