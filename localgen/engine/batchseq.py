"""One sequence of the batch schedulers (engine/batch.py): the request, its running state, accepting a
sampled token, the Completion it ends with, and `Solo`, which runs an exact request on the engine's own
context beside a throughput batch."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localgen.backend import Completion
from localgen.engine.budget import budget_for, feed, pick
from localgen.engine.sequence import SequenceDecoder
from localgen.errors import EmptyPrompt, ServeError, prompt_too_long
from localgen.native import sampler as chains
from localgen.native.prompt import Prompt
from localgen.types import SamplingParams

if TYPE_CHECKING:
    from localgen.engine.llama import Engine


END = object()  # what a request source returns when it has nothing more, ever


@dataclass
class Request:
    """One prompt to complete: its id (unique among the scheduler's jobs), prompt (with any media spans) and
    sampling."""

    index: int
    prompt: Prompt
    sampling: SamplingParams
    seed: int = 0
    logprobs: int | None = None
    exact: bool = False  # in the throughput scheduler: run alone, on the engine's own context (`Solo`)
    # whether its client has left (serve: the job's cancelled event), asked by llama.cpp while a piece of its prompt
    # is evaluated alone in a decode, which then stops where it is (ParallelContext.decode); None: never asked
    cancelled: Callable[[], bool] | None = None

    @property
    def tokens(self) -> list[int]:
        """The prompt's token ids (media positions as placeholders)."""
        return self.prompt.tokens


@dataclass
class Seq:
    req: Request
    slot: int
    sampler: Any
    started: float
    dec: SequenceDecoder  # tokens → text, stops, limits, finish reason (engine/sequence.py)
    pending: int | None = None  # sampled, not yet fed
    first: float | None = None
    cached: int = 0  # prompt tokens the slot's KV cache already held (or shared from another slot)
    prefilled: float = 0.0  # when the prompt was evaluated
    filled: int = 0  # prompt tokens evaluated so far (the throughput scheduler evaluates prompts in chunks)
    text: list[str] = field(default_factory=list)  # pieces of text decided since the scheduler last took them
    budget: Any = None  # its reasoning budget (engine/budget.py), if it has one
    drafts: list[int] = field(default_factory=list)  # tokens drafted after `pending`, in this step's batch
    lookup: Any = None  # its prompt-lookup index (engine/speculative.py, NgramIndex), once it drafts
    drafted: int = 0  # tokens drafted for it, and those the model kept
    accepted: int = 0
    undrafted: int = 0  # steps since it last drafted (a sequence that stopped drafting tries again now and then)
    probe_gap: int = 16  # ... after this many: doubled by each try that fails, back to 16 once a draft is kept

    @property
    def next_pos(self) -> int:
        """The position of the token fed next (the last sampled one)."""
        return len(self.req.tokens) + len(self.dec.tokens) - 1


def is_exact(req: Request, exact: bool | None) -> bool:
    """Whether a request must come out as it would alone: greedy ones by default, and any that asks (see
    `groups`)."""
    return req.exact or (exact if exact is not None else req.sampling.greedy)


def refuse(req: Request, on_done: Callable[[Completion], None], n_ctx: int) -> None:
    """A request with nothing to generate (as llama.cpp's -n 0), a prompt of no tokens (nothing to decode), or
    one that does not fit a slot."""
    if req.sampling.max_tokens == 0:
        on_done(Completion(req.index, "", "length", len(req.tokens), 0, 0.0, 0.0, req.seed))
    else:
        e: ServeError = EmptyPrompt() if not req.tokens else prompt_too_long(
            f"the prompt is {len(req.tokens):,} tokens; the context window is {n_ctx:,}",
            len(req.tokens), n_ctx)
        on_done(Completion(req.index, "", f"error: {e.message}", len(req.tokens), 0, 0.0, 0.0, req.seed, error=e))


def refused(req: Request, n_ctx: int) -> bool:
    """Whether `refuse` answers the request at once, before any decode."""
    return req.sampling.max_tokens == 0 or not req.tokens or len(req.tokens) >= n_ctx


def accept(seq: Seq, tok: int, logits: Callable[[], Any], piece: Callable[[int], bytes]) -> None:
    """Record a sampled token: its log-probability (when asked), the first token's time, the text it makes."""
    if seq.req.logprobs is not None:
        from localgen.engine.generate import token_logprob

        seq.dec.logprobs.append(token_logprob(logits(), piece, tok, seq.req.logprobs))
    if seq.first is None:
        seq.first = time.perf_counter()
    text = seq.dec.push(tok)
    if text:
        seq.text.append(text)


def completion(seq: Seq) -> Completion:
    """End a sequence (as cancelled, if it had not ended by itself) and say how it went."""
    dec, req = seq.dec, seq.req
    tail = dec.end("cancelled")  # a no-op for a sequence that ended by itself
    if tail:
        seq.text.append(tail)
    now = time.perf_counter()
    prefilled = seq.prefilled or now
    assert dec.reason is not None
    return Completion(req.index, dec.text, dec.reason, len(req.tokens), len(dec.tokens),
                      (seq.first or now) - seq.started, now - seq.started, req.seed, dec.logprobs,
                      cached_tokens=seq.cached, prompt_s=prefilled - seq.started, decode_s=now - prefilled,
                      drafted=seq.drafted, accepted=seq.accepted)


class Solo:
    """A request that asks for exactness while the throughput scheduler runs: `run`'s own path on the engine's
    single-sequence context (Engine.kv.evaluate, Engine.sample, Engine.kv.decode: what `run` does with this
    prompt alone), one token per scheduler step beside the batch. One at a time; the context is made on first
    use and kept."""

    def __init__(self, eng: Engine, req: Request, on_done: Callable[[Completion], None]) -> None:
        self.eng, self.on_done = eng, on_done
        dec = SequenceDecoder.for_request(eng.piece, eng.is_eog, req.sampling, len(req.tokens), eng.n_ctx)
        self.seq = Seq(req, -1, None, time.perf_counter(), dec)
        self._pieces: Iterator[int] | None = None  # the prompt's pieces still to evaluate

    def step(self, stop: bool) -> bool:
        """One piece of the prompt (n_batch tokens, as `run` cuts it) or one token; True once the request has
        ended (and been handed on); with `stop`, it ends now (cancelled)."""
        eng, seq = self.eng, self.seq
        req = seq.req
        if seq.sampler is None:
            if refused(req, eng.n_ctx):
                refuse(req, self.on_done, eng.n_ctx)
                return True
            seq.sampler = eng.sampler(req.sampling, req.seed, req.tokens)
            seq.budget = budget_for(eng, req.sampling, req.tokens)
            seq.cached, self._pieces = eng.kv.evaluating(req.prompt)
        if stop:
            return self._finish()
        if self._pieces is not None:
            if next(self._pieces, len(req.tokens)) < len(req.tokens):
                return False
            self._pieces = None
            seq.prefilled = time.perf_counter()
        tok = pick(seq.budget, seq.sampler, lambda: eng.sample(seq.sampler), chains.accept)
        accept(seq, tok, eng.logits, eng.piece)
        feed(seq.budget, eng, tok)
        if seq.dec.reason is not None:
            return self._finish()
        eng.kv.decode([tok])
        return False

    def _finish(self) -> bool:
        self.close()
        self.on_done(completion(self.seq))
        return True

    def close(self) -> None:
        """Free the sampler chain."""
        if self.seq.sampler is not None:
            chains.free(self.seq.sampler)
            self.seq.sampler = None


def from_iterator(it: Iterator[Request]) -> Callable[[bool], Any]:
    return lambda wait: next(it, END)


def new_seed() -> int:
    """A fresh seed for a request without one."""
    return random.getrandbits(31)


def next_span(prompt: Prompt, start: int) -> int:
    """Where the prompt's next media span at or after `start` begins (its length when none)."""
    return min((s for s in prompt.spans if s >= start), default=len(prompt.tokens))
