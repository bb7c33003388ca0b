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
from typing import TYPE_CHECKING, Any, Protocol

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
        engines: tuple[Any, Any] = (target, draft)  # Engines: their llama_vocab
        check_vocab(VocabView(engines[0].vocab), VocabView(engines[1].vocab))
        self.engine = draft
        self.limit = target.n_vocab  # a draft token past the model's vocabulary ends the draft
        self.greedy = draft.sampler(SamplingParams(temperature=0.0, repeat_penalty=1.0), 0)

    def read(self, context: list[int], cancelled: Callable[[], bool]) -> bool:
        """Evaluate the context (the prompt and the first token) before the answer is shown, where a Ctrl-C or a
        cancel stops it as it stops the model's own read-in (False then); propose evaluates only what follows."""
        d = self.engine
        if len(context) + 1 >= d.n_ctx:
            return True  # propose drafts nothing there
        d.kv.evaluate(Prompt.text(context), cancelled=cancelled)
        return not cancelled()

    def propose(self, context: list[int], k: int) -> list[int]:
        d = self.engine
        if len(context) + k >= d.n_ctx:
            return []
        d.kv.evaluate(Prompt.text(context))
        out: list[int] = []
        for j in range(k):
            tok = d.sample(self.greedy)
            if d.is_eog(tok) or tok >= self.limit:
                break
            out.append(tok)
            if j < k - 1:
                d.kv.decode([tok])
        return out

    def close(self) -> None:
        chains.free(self.greedy)
        self.engine.close()


VOCAB_SLACK = 128  # tokens two vocabularies of one family may differ by (llama.cpp's speculative check allows as
# many: Qwen2.5 7B has 152,064 and its 0.5B draft 151,936, padding)


class Vocabulary(Protocol):
    """What check_vocab reads of a vocabulary."""

    n_vocab: int

    def piece(self, token: int) -> bytes: ...
    def specials(self) -> tuple[int, int]: ...


class VocabView:
    """A loaded llama_vocab as check_vocab reads it: its size, each token's text, its BOS and EOS tokens."""

    def __init__(self, vocab: Any) -> None:
        from localgen.native import vocab as native_vocab

        self.vocab = vocab
        self.n_vocab = native_vocab.n_tokens(vocab)
        self._buf = native_vocab.piece_buffer()

    def piece(self, token: int) -> bytes:
        from localgen.native import vocab as native_vocab

        return native_vocab.piece(self.vocab, token, self._buf, False)

    def specials(self) -> tuple[int, int]:
        from localgen.native import vocab as native_vocab

        return native_vocab.bos(self.vocab), native_vocab.eos(self.vocab)


def check_vocab(target: Vocabulary, draft: Vocabulary) -> None:
    """Refuse a draft model whose vocabulary differs: in size by more than VOCAB_SLACK, in its BOS or EOS token, or
    in the text of sampled token ids they share. A draft token past the model's vocabulary is never proposed (the
    drafters stop there)."""
    nt, nd = target.n_vocab, draft.n_vocab
    if abs(nt - nd) > VOCAB_SLACK:
        raise UsageError(f"the draft model's vocabulary ({nd:,} tokens) differs from the model's ({nt:,}) by more "
                         f"than {VOCAB_SLACK}", hint="pick a draft model of the same family")
    (tb, te), (db, de) = target.specials(), draft.specials()
    if (tb, te) != (db, de):
        raise UsageError(f"the draft model's special tokens (BOS {db}, EOS {de}) differ from the model's (BOS {tb}, "
                         f"EOS {te})", hint="pick a draft model of the same family")
    shared = min(nt, nd)
    step = max(1, shared // 512)
    for t in range(0, shared, step):
        if target.piece(t) != draft.piece(t):
            raise UsageError(f"the draft model's vocabulary differs from the model's (token {t})",
                             hint="pick a draft model of the same family")


def check_vocab_files(model: str, draft: str, draft_name: str) -> None:
    """check_vocab on two GGUF files, before either model loads: their vocabularies alone are read (llama.cpp's
    vocab_only load: no weights, in a moment)."""
    from localgen.errors import LocalgenError
    from localgen.native import model as native_model
    from localgen.native import vocab as native_vocab

    ptrs: list[Any] = []
    try:
        for path, name in ((model, None), (draft, draft_name)):
            ptr = native_model.load(path, native_model.ModelOptions(vocab_only=True))
            if ptr is None:
                raise LocalgenError(f"llama.cpp cannot read {'the model' if name is None else name}'s vocabulary")
            ptrs.append(ptr)
        check_vocab(VocabView(native_vocab.of_model(ptrs[0])), VocabView(native_vocab.of_model(ptrs[1])))
    finally:
        for ptr in ptrs:
            native_model.free(ptr)


def tokens(engine: DecodingEngine, prompt: Prompt, s: SamplingParams, seed: int, drafter: Drafter, k: int,
           counters: Counters, on_sample: Callable[[int, int], None] = lambda tok, row: None,
           cancelled: Callable[[], bool] = bool) -> Iterator[int]:
    """Yield sampled tokens as the plain path does, checking drafts in batches. `on_sample(token, row)` is
    called with each sampled token while its logits row is valid. `cancelled` stops the prompt's read-in, the
    draft model's too, with no token yielded."""
    # The prompt is evaluated as the plain path evaluates it, and the first token sampled from the same
    # logits: a GPU rounds a row differently when the batch around it has another shape, so a prompt cut
    # elsewhere could change a near-tie greedy choice. After that, a check with no drafts is the plain path's
    # one-token decode.
    engine.kv.evaluate(prompt, cancelled=cancelled)
    if cancelled():
        return
    context = list(prompt.tokens)
    chain = engine.sampler(s, seed, prompt.tokens)
    valid = len(engine.kv.held)
    try:
        first = engine.sample(chain)
        on_sample(first, -1)
        context.append(first)
        # the draft model reads the prompt before the first token is shown: a press during it takes the message
        # back, as during the model's own read-in
        if isinstance(drafter, ModelDrafter) and not drafter.read(context, cancelled):
            return
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


class SlotDrafter:
    """A draft model for the throughput scheduler (engine/policies.py, `serve --draft`): one llama context on it with a
    sequence per slot (sequence id = the slot), each following its slot's tokens (the prompt and the answer so far),
    and greedy drafts for every drafting slot at once: one decode of the draft model per drafted position, with each
    slot still drafting in it. A sequence evaluates what it lacks (`lag`) only when its slot drafts, before its draft,
    at most `catch_up` tokens a step for all the slots together (the rest in later steps, the slot drafting once it
    has caught up), in decodes of at most n_batch rows. `kept` drops a sequence's cells past what the model kept; a
    sequence outlives its request, so the slot's next request (the same conversation, given the slot that holds
    its prefix) keeps the prefix both share; `clear` empties sequences.

    Built on a loaded draft Engine whose vocabulary `check_vocab` accepted; the Engine's own context is released
    (this one has a window of `n_ctx_seq` cells per slot) and the model is freed by `close`."""

    def __init__(self, draft: Any, n_parallel: int, n_ctx_seq: int, limit: int | None = None) -> None:
        from localgen.errors import LocalgenError
        from localgen.native import context
        from localgen.native.batch import Batch
        from localgen.types import KV_CACHE_TYPES

        draft.release_context()
        self.engine = draft
        prm = draft.params
        self.n_batch = max(draft.n_batch, n_parallel)
        self.n_vocab = draft.n_vocab
        self.limit = limit or draft.n_vocab  # the model's vocabulary: a draft token past it ends that draft
        self.ctx = context.new(
            draft.model_ptr, n_ctx=n_ctx_seq * n_parallel, n_batch=self.n_batch,
            n_ubatch=max(min(prm.n_ubatch or 512, self.n_batch), 1), n_seq_max=n_parallel,
            n_threads=prm.n_threads, n_threads_batch=prm.n_threads_batch,
            flash_attn_type=1 if draft.flash_attn else 0, type_k=KV_CACHE_TYPES[prm.cache_type_k],
            type_v=KV_CACHE_TYPES[prm.cache_type_v], kv_unified=False)
        if not self.ctx:
            raise LocalgenError(f"llama.cpp could not create the draft model's context for {n_parallel} sequences",
                                hint="lower --parallel or --ctx")
        self.mem = context.memory(self.ctx)
        self.batch = Batch(self.n_batch)
        self.held: list[list[int]] = [[] for _ in range(n_parallel)]  # what each slot's sequence holds
        self.decodes = 0  # draft-model decodes, for the tests and the counters
        self.caught_up = 0  # tokens evaluated to catch a sequence up (not drafts), for the tests

    def lag(self, slot: int, tokens: list[int]) -> int:
        """How many of `tokens` (the prompt, the answer so far and the pending token) the slot's sequence would
        evaluate before its first draft decode: those past the prefix it holds, but the last."""
        held = self.held[slot]
        n = min(len(held), len(tokens) - 1)
        if held[:n] != tokens[:n]:
            n = next(i for i, (a, b) in enumerate(zip(held[:n], tokens[:n], strict=True)) if a != b)
        return len(tokens) - 1 - n

    def propose(self, wants: dict[int, tuple[list[int], int]],
                catch_up: dict[int, int] | None = None) -> dict[int, list[int]]:
        """slot → (its tokens: the prompt, the answer so far and the pending token; k) → up to k greedy tokens
        (fewer where the draft model ends the text). Each sequence first drops what is past its tokens (drafts
        not kept) and evaluates what it lacks but the last token, at most `catch_up[slot]` tokens (no bound
        without); a slot not caught up by then drafts nothing in this step. Then every caught-up slot's last token
        goes into one decode, with logits, and each next draft token into the next, until each has its k."""
        for slot, (tokens, _) in wants.items():
            self._trim(slot, tokens, len(tokens) - 1)
        wants = dict(sorted(wants.items()))  # in slot order: llama.cpp splits a batch of streams out of order into
        # more passes over the weights (engine/policies.py sorts the model's rows so, for the same reason)
        behind: list[tuple[int, list[int]]] = []
        for slot, (tokens, _) in wants.items():
            lacking = tokens[len(self.held[slot]):-1]
            if catch_up is not None:
                lacking = lacking[:max(catch_up.get(slot, 0), 0)]
            if lacking:
                behind.append((slot, lacking))
        if behind:  # a pass of its own: llama.cpp would cut these rows beside the one-row slots into more passes
            self._decode(behind, logits=False)
            self.caught_up += sum(len(t) for _, t in behind)
        ready = {slot: want for slot, want in wants.items() if len(self.held[slot]) == len(want[0]) - 1}
        picks = self._decode([(slot, tokens[-1:]) for slot, (tokens, _) in ready.items()]) if ready else {}
        out: dict[int, list[int]] = {slot: [] for slot in ready}
        while picks:
            feed: list[tuple[int, list[int]]] = []
            for slot, tok in picks.items():
                if self.engine.is_eog(tok) or tok >= self.limit:
                    continue
                out[slot].append(tok)
                if len(out[slot]) < ready[slot][1]:
                    feed.append((slot, [tok]))
            picks = self._decode(feed) if feed else {}
        return {slot: d for slot, d in out.items() if d}

    def kept(self, slot: int, n: int) -> None:
        """The model kept the slot's first `n` tokens: the cells past them (drafts it did not keep) go."""
        if len(self.held[slot]) > n:
            self._forget(slot, n)

    def clear(self, slot: int = -1) -> None:
        """Empty a slot's sequence (every slot's with -1)."""
        for s in range(len(self.held)) if slot < 0 else (slot,):
            if self.held[s]:
                self._forget(s, 0)

    def measure(self, sizes: list[int], reps: int = 3) -> list[tuple[int, float]]:
        """Seconds a decode of n rows of the draft model takes, for each n of `sizes` (rows in one sequence, as
        ParallelContext.calibrate measures the model's steps, with the last row's greedy pick): each size once
        untimed, then `reps` times in turn, the fastest. Its cells are forgotten after each. Call it while no
        sequence holds cells."""
        import time

        times: dict[int, list[float]] = {n: [] for n in sizes}
        for rep in range(reps + 1):
            for n in sizes:
                t0 = time.perf_counter()
                self._decode([(0, [0] * n)])
                dt = time.perf_counter() - t0
                self._forget(0, 0)
                if rep:
                    times[n].append(dt)
        return [(n, min(times[n])) for n in sizes]

    def close(self) -> None:
        """Free the context, the batch and the draft model (once)."""
        from localgen.native import context

        if self.ctx:
            context.drop(self)
            self.engine.close()

    def _trim(self, slot: int, tokens: list[int], end: int) -> None:
        """Keep the longest prefix of the slot's cells that `tokens[:end]` starts with."""
        held = self.held[slot]
        n = min(len(held), end)
        if held[:n] != tokens[:n]:
            n = next(i for i, (a, b) in enumerate(zip(held[:n], tokens[:n], strict=True)) if a != b)
        if len(held) > n:
            self._forget(slot, n)

    def _forget(self, slot: int, n: int) -> None:
        from localgen.errors import LocalgenError
        from localgen.native import context

        if not context.seq_rm(self.mem, slot, n, -1):
            raise LocalgenError("llama.cpp could not forget the draft model's drafts", hint="serve without --draft")
        del self.held[slot][n:]

    def _decode(self, feed: list[tuple[int, list[int]]], logits: bool = True) -> dict[int, int]:
        """Evaluate each slot's tokens after what it holds, in decodes of at most n_batch rows, each slot's last
        with logits (none without `logits`): slot → the draft model's greedy choice after them."""
        import numpy

        from localgen.errors import LocalgenError
        from localgen.native import context
        from localgen.native.lib import logits_row

        b = self.batch
        picks: dict[int, int] = {}
        lasts: list[tuple[int, int]] = []  # (slot, row) of the logits wanted in the batch being filled

        def run() -> None:
            rc = context.decode(self.ctx, b)
            self.decodes += 1
            if rc != 0:
                self.clear()
                raise LocalgenError(f"llama_decode failed ({rc}) in the draft model", hint="lower --parallel or --ctx")
            for slot, row in lasts:
                picks[slot] = int(numpy.argmax(logits_row(self.ctx, row, self.n_vocab)))
            lasts.clear()
            b.n_tokens = 0

        b.n_tokens = 0
        for slot, tokens in feed:
            held = self.held[slot]
            for j, tok in enumerate(tokens):
                if b.n_tokens == self.n_batch:
                    run()
                last = logits and j == len(tokens) - 1
                row = b.add(tok, len(held), slot, last)
                held.append(tok)
                if last:
                    lasts.append((slot, row))
        if b.n_tokens:
            run()
        return picks
