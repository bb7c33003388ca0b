"""Speculative decoding: a drafter proposes tokens, the main model checks them all in one batch.

Drafts are deterministic (a small model's greedy choice, or the continuation of an n-gram already in
the context: prompt lookup). At each drafted position the main model samples with its own sampler
chain; the draft token is kept while the sample equals it, and the first sample that differs is kept
instead and ends the round. For a deterministic draft this is exactly the standard acceptance rule
(accept x with probability p(x); on rejection draw from p without x), so the output follows the main
model's distribution. At temperature 0 the text is that of plain decoding wherever llama.cpp's kernels
compute a batch of tokens exactly as one token at a time (flash attention does not; see run.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from localgen.errors import UsageError
from localgen.native import sampler as chains
from localgen.native.prompt import Prompt
from localgen.types import SamplingParams

if TYPE_CHECKING:
    from localgen.engine.decoding import DecodingEngine


@dataclass
class Counters:
    """Drafted and accepted tokens."""

    drafted: int = 0
    accepted: int = 0


class Drafter(Protocol):
    """Proposes up to k next tokens for a context."""

    def propose(self, context: list[int], k: int) -> list[int]: ...
    def close(self) -> None: ...


class LookupDrafter:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens (n from
    max_ngram down to 1) and propose what followed it. Strong when the answer copies from the prompt."""

    def __init__(self, max_ngram: int = 3, window: int = 8192) -> None:
        self.max_ngram = max_ngram
        self.window = window

    def propose(self, context: list[int], k: int) -> list[int]:
        ctx = context[-self.window:]
        for n in range(min(self.max_ngram, len(ctx) - 1), 0, -1):
            tail = ctx[-n:]
            first = tail[0]
            for start in range(len(ctx) - n - 1, -1, -1):
                if ctx[start] == first and ctx[start:start + n] == tail:
                    cont = ctx[start + n:start + n + k]
                    if cont:
                        return cont
        return []

    def close(self) -> None:
        pass


class NgramIndex:
    """Prompt lookup for the batch schedulers (engine/policies.py): as LookupDrafter, the text after the latest
    earlier occurrence of the last n tokens (n from `max_ngram` down to 1), from an index kept as tokens come,
    so a proposal costs a few dictionary reads however long the context is (a scan of it each step, for
    every sequence of a batch, would cost a GPU's step again)."""

    def __init__(self, tokens: list[int], max_ngram: int = 3, window: int = 8192) -> None:
        self.tokens = list(tokens[-window:])  # as LookupDrafter's window: a long prompt's index costs no more
        self.max_ngram = max_ngram
        self.last: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram)]  # n-gram → where it ends
        for end in range(len(self.tokens) - 1):
            self._index(end)

    def _index(self, end: int) -> None:
        """Record the n-grams that end at `end` (each has a continuation: the token after it)."""
        t = self.tokens
        for n in range(1, min(self.max_ngram, end + 1) + 1):
            self.last[n - 1][tuple(t[end - n + 1:end + 1])] = end

    def append(self, token: int) -> None:
        self.tokens.append(token)
        self._index(len(self.tokens) - 2)

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest tail found."""
        t = self.tokens
        for n in range(min(self.max_ngram, len(t) - 1), 0, -1):
            end = self.last[n - 1].get(tuple(t[-n:]))
            if end is not None:
                return t[end + 1:end + 1 + k]
        return []


def draft_length(alpha: float, tokens: float, rows: int, cost: Callable[[int], float], k_max: int) -> int:
    """How many tokens to draft after a sequence's pending one: the number that makes the step's tokens per unit
    of time largest. Without them the step makes `tokens` (expected) from `rows` rows, at cost(rows); the j-th
    drafted token adds alpha**j (each is kept while every one before it was) and a row. 0 where none pays."""
    best_k, best = 0, tokens / cost(rows)
    gain = 0.0
    for k in range(1, k_max + 1):
        gain += alpha ** k
        rate = (tokens + gain) / cost(rows + k)
        if rate > best:
            best_k, best = k, rate
    return best_k


class ModelDrafter:
    """A small model with the same vocabulary, drafting greedily; its KV cache follows the context."""

    def __init__(self, target: DecodingEngine, draft: DecodingEngine) -> None:
        check_vocab(target, draft)
        self.engine = draft
        self.greedy = draft.sampler(SamplingParams(temperature=0.0, repeat_penalty=1.0), 0)

    def propose(self, context: list[int], k: int) -> list[int]:
        d = self.engine
        if len(context) + k >= d.n_ctx:
            return []
        d.kv.evaluate(Prompt.text(context))
        out: list[int] = []
        for j in range(k):
            tok = d.sample(self.greedy)
            if d.is_eog(tok):
                break
            out.append(tok)
            if j < k - 1:
                d.kv.decode([tok])
        return out

    def close(self) -> None:
        chains.free(self.greedy)
        self.engine.close()


def check_vocab(target: DecodingEngine, draft: DecodingEngine) -> None:
    """Refuse a draft model whose vocabulary differs (size, or the text of sampled token ids)."""
    nt, nd = target.n_vocab, draft.n_vocab
    if nt != nd:
        raise UsageError(f"the draft model's vocabulary ({nd:,} tokens) differs from the model's ({nt:,})",
                         hint="pick a draft model of the same family")
    step = max(1, nt // 512)
    for t in range(0, nt, step):
        if target.piece(t) != draft.piece(t):
            raise UsageError(f"the draft model's vocabulary differs from the model's (token {t})",
                             hint="pick a draft model of the same family")


def tokens(engine: DecodingEngine, prompt: Prompt, s: SamplingParams, seed: int, drafter: Drafter, k: int,
           counters: Counters, on_sample: Callable[[int, int], None] = lambda tok, row: None) -> Iterator[int]:
    """Yield sampled tokens as the plain path does, checking drafts in batches. `on_sample(token, row)` is
    called with each sampled token while its logits row is valid."""
    # The prompt is evaluated as the plain path evaluates it, and the first token sampled from the same
    # logits: a GPU rounds a row differently when the batch around it has another shape, so a prompt cut
    # elsewhere could change a near-tie greedy choice. After that, a check with no drafts is the plain path's
    # one-token decode.
    engine.kv.evaluate(prompt)
    context = list(prompt.tokens)
    chain = engine.sampler(s, seed, prompt.tokens)
    valid = len(engine.kv.held)
    try:
        first = engine.sample(chain)
        on_sample(first, -1)
        context.append(first)
        yield first
        while True:
            room = engine.n_ctx - len(engine.kv.held) - 1
            drafts = drafter.propose(context, min(k, room - 1, engine.n_batch - 1)) if room > 1 else []
            base = len(engine.kv.held)
            engine.kv.decode([context[-1], *drafts])
            counters.drafted += len(drafts)
            valid = base + 1  # the last token's entry is valid context
            for i in range(len(drafts) + 1):
                y = engine.sample(chain, i)
                on_sample(y, i)
                hit = i < len(drafts) and y == drafts[i]
                context.append(y)
                if hit:
                    counters.accepted += 1
                yield y
                if not hit:
                    break
                valid += 1  # the accepted draft's entry is valid context
            engine.kv.truncate(valid)
    finally:
        engine.kv.truncate(valid)  # drafts that were not checked, or were rejected, leave the cache
        chains.free(chain)
