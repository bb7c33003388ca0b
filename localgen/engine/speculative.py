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

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from localgen.engine.llama import common_prefix
from localgen.errors import LocalgenError, UsageError
from localgen.types import SamplingParams


@dataclass
class Counters:
    """Drafted and accepted tokens, and main-model decode steps."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0


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


class ModelDrafter:
    """A small model with the same vocabulary, drafting greedily; its KV cache follows the context."""

    def __init__(self, target: Any, draft: Any) -> None:
        check_vocab(target, draft)
        self.engine = draft
        lc = draft._lc
        self.lc = lc
        self.greedy = lc.llama_sampler_init_greedy()

    def propose(self, context: list[int], k: int) -> list[int]:
        d = self.engine.llm
        if len(context) + k >= self.engine.n_ctx:
            return []
        # evaluate at least the last token, for fresh logits
        keep = min(common_prefix(d._input_ids, context), len(context) - 1)
        d.n_tokens = keep
        d.eval(context[keep:])
        out: list[int] = []
        for j in range(k):
            tok = int(self.lc.llama_sampler_sample(self.greedy, d.ctx, -1))
            if self.lc.llama_vocab_is_eog(self.engine._vocab, tok):
                break
            out.append(tok)
            if j < k - 1:
                d.eval([tok])
        return out

    def close(self) -> None:
        self.lc.llama_sampler_free(self.greedy)
        self.engine.close()


def check_vocab(target: Any, draft: Any) -> None:
    """Refuse a draft model whose vocabulary differs (size, or the text of sampled token ids)."""
    nt, nd = target.llm.n_vocab(), draft.llm.n_vocab()
    if nt != nd:
        raise UsageError(f"the draft model's vocabulary ({nd:,} tokens) differs from the model's ({nt:,})",
                         hint="pick a draft model of the same family")
    step = max(1, nt // 512)
    for t in range(0, nt, step):
        if target.piece(t) != draft.piece(t):
            raise UsageError(f"the draft model's vocabulary differs from the model's (token {t})",
                             hint="pick a draft model of the same family")


def tokens(engine: Any, prompt: list[int], s: SamplingParams, seed: int, drafter: Drafter, k: int,
           counters: Counters) -> Iterator[int]:
    """Yield sampled tokens like Llama.generate(), checking drafts in batches. Keeps the bindings'
    record of the KV cache (input_ids, n_tokens) true, so later prefix reuse works."""
    from localgen.engine import sampling

    lc = engine._lc
    llm = engine.llm
    ctx = llm.ctx
    mem = lc.llama_get_memory(ctx)
    keep = min(common_prefix(llm._input_ids, prompt), len(prompt) - 1)
    llm.n_tokens = keep
    if prompt[keep:-1]:
        llm.eval(prompt[keep:-1])  # drops KV past `keep`, evaluates the rest of the prompt but its last token
    else:
        lc.llama_memory_seq_rm(mem, -1, keep, -1)
    n_past = llm.n_tokens
    context = list(prompt)
    smpl = sampling.build(lc, engine._vocab, llm.n_vocab(), s, seed, engine.n_ctx)
    batch = lc.llama_batch_init(k + 1, 0, 1)
    valid = n_past
    try:
        while True:
            room = engine.n_ctx - n_past - 1
            drafts = drafter.propose(context, min(k, room - 1)) if room > 1 else []
            batch.n_tokens = 0
            for i, tok in enumerate([context[-1], *drafts]):
                batch.token[i] = tok
                batch.pos[i] = n_past + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            batch.n_tokens = 1 + len(drafts)
            if lc.llama_decode(ctx, batch) != 0:
                raise LocalgenError("llama_decode failed during speculative decoding", hint="raise --ctx")
            counters.steps += 1
            counters.drafted += len(drafts)
            valid = n_past + 1  # the last token is in the cache now
            for i in range(len(drafts) + 1):
                y = int(lc.llama_sampler_sample(smpl, ctx, i))
                hit = i < len(drafts) and y == drafts[i]
                context.append(y)
                if hit:
                    counters.accepted += 1
                yield y
                if not hit:
                    break
                valid += 1  # the accepted draft's cache entry is valid context
            lc.llama_memory_seq_rm(mem, -1, valid, -1)
            n_past = valid
    finally:
        lc.llama_memory_seq_rm(mem, -1, valid, -1)
        llm.input_ids[:valid] = context[:valid]
        llm.n_tokens = valid
        llm._requires_eval = True
        lc.llama_sampler_free(smpl)
        lc.llama_batch_free(batch)
