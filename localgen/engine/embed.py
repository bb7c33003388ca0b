"""Embeddings: texts to vectors through a context of their own on the loaded model (embeddings on, the
model's pooling or the one asked for), many texts per llama_decode, as llama.cpp's llama-embedding batches
them (each text a sequence, every token an output, the cache cleared between batches), then L2-normalised
unless asked not to be."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localgen.errors import BadRequest, Cancelled, LocalgenError, PromptTooLong, UsageError, WrongModel
from localgen.native import context, logs
from localgen.native import model as native_model
from localgen.native import vocab as native_vocab
from localgen.native.batch import Batch

if TYPE_CHECKING:
    from localgen.engine.llama import Engine

POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
POOLING_NAMES = {v: k for k, v in POOLING.items()}
MAX_SEQS = 64  # texts per llama_decode (llama.cpp's limit on sequence ids is 256)
SIZE_CHECKED = 1 << 20  # characters: a text to embed past this, and past what the window's tokens come from, is cut
CUT_MARGIN = 64  # tokens past the window kept where a text is cut: the cut changes only its last few


@dataclass(frozen=True)
class Embedding:
    """One text's vector and how many tokens it took."""

    vector: list[float]
    tokens: int


class Embedder:
    """An embeddings context on an Engine's model; `embed` turns texts into vectors. Pooling: as asked,
    else the model's own (embedding models name theirs), else mean (chat models name none)."""

    def __init__(self, engine: Engine, pooling: str | None = None, scores: bool = False) -> None:
        self.engine = engine
        n_ctx = engine.n_ctx
        prm = engine.params
        # prompt-only work: flash attention as given, else llama.cpp's own choice (what llama-embedding does;
        # the tuning record and the rule weigh decoding, which embeddings never do)
        given = engine.origins.get("flash_attn") == "flag"
        p: dict[str, Any] = dict(
            n_ctx=n_ctx,
            n_batch=n_ctx,  # a text must fit one ubatch: models with non-causal attention need it whole
            n_ubatch=n_ctx, n_seq_max=MAX_SEQS,
            kv_unified=True,  # every sequence of a batch draws on the same n_ctx cells
            n_threads=prm.n_threads, n_threads_batch=prm.n_threads_batch, embeddings=True,
            pooling_type=POOLING[pooling] if pooling else -1,  # -1: the model's own (its GGUF's pooling_type)
            flash_attn_type=(1 if engine.flash_attn else 0) if given else -1, no_perf=True)
        self.ctx = _context(engine, p)
        self.n_ctx = n_ctx
        cap = engine.window_cap()
        # the window is the model's trained one (a larger --ctx was capped to it): a larger --ctx cannot help
        self.at_trained = cap is not None and cap <= n_ctx
        self.pooling = POOLING_NAMES.get(context.pooling_type(self.ctx), "none")
        if scores:
            if self.pooling != "rank":
                self.close()
                raise WrongModel(f"{engine.model.name} is not a reranker (its pooling is {self.pooling}, not rank)",
                                 hint="use a reranker model, e.g. a bge-reranker GGUF")
        elif self.pooling == "none" and pooling is None:  # a chat model names none: average its tokens
            context.free(self.ctx)
            p["pooling_type"] = POOLING["mean"]
            self.ctx = _context(engine, p)
            self.pooling = "mean"
        if self.pooling == "none":
            self.close()
            raise UsageError("--pooling none gives one vector per token, not one per text",
                             hint="choose --pooling mean, cls or last")
        if self.pooling == "rank" and not scores:
            self.close()
            raise WrongModel(f"{engine.model.name} is a reranker: its pooling gives scores, not embeddings",
                             hint="use `localgen rerank`, or --pooling mean, cls or last")
        model = engine.model_ptr
        self.n_embd = native_model.n_embd_out(model)
        if scores:
            self.n_embd = max(1, native_model.n_cls_out(model))  # a reranker's output: its scores
        self.batch = Batch(n_ctx)
        self.mem = context.memory(self.ctx)
        self._query: str | None = None  # the last query pair_tokens found room for, and its splice
        self._splice: _Splice | None = None
        self._abort: Any = None  # the ctypes thunk llama.cpp calls while it computes (abort_when)

    def abort_when(self, cancelled: Callable[[], bool] | None) -> None:
        """While set, llama.cpp asks `cancelled` between the operations of a computation and stops it when it
        says so (the encode then raises Cancelled): a window-long text need not be encoded to its end for an
        absent client. Only for a thread that takes no Ctrl-C (serve's worker): an exception raised in the
        callback could not cross llama.cpp's frames."""
        self._abort = context.set_abort(self.ctx, cancelled)

    def close(self) -> None:
        """Free the context and the batch."""
        context.drop(self)

    def tokens(self, text: str, truncate: bool = False, pair: bool = False) -> list[int]:
        """A text's tokens as llama-embedding makes them (special tokens added and parsed); too long for the
        window is an error (worded for reranking when `pair`), or cut to it with `truncate`. A text of more
        characters than the window's tokens could come from has its beginning alone tokenized (`_beginning`)."""
        text, cut = self._beginning(text)
        toks = self.engine.tokenize(text, add_special=True)
        if len(toks) > self.n_ctx:
            if not truncate:
                raise ContextTooSmall(len(toks), self.n_ctx, pair, more=cut, trained=self.at_trained)
            toks = toks[:self.n_ctx]
        return toks

    def _beginning(self, text: str) -> tuple[str, bool]:
        """The text, or past a megabyte and past CHARS_PER_TOKEN characters a token of the window (and a margin),
        its beginning alone, and whether it was cut: either way more tokens than the window holds, whose first
        are the whole text's (where it is cut, only its last few tokens may differ). A 64 MiB request, or 256 MiB
        piped to embed, is not tokenized whole to keep its first window."""
        from localgen.text import CHARS_PER_TOKEN

        most = CHARS_PER_TOKEN * (self.n_ctx + CUT_MARGIN)
        return (text[:most], True) if len(text) > max(most, SIZE_CHECKED) else (text, False)

    def pair_tokens(self, query: str, document: str, truncate: bool = False) -> list[int]:
        """A (query, document) pair as llama.cpp's llama-embedding tokenizes it for a reranker (_pair_text).
        The query is never cut: one that leaves no room for a document is a QueryTooLong; with `truncate`, the
        pair's end (the document, as templates put the query first) is cut to fit. The query is tokenized once
        per query, not once per document, where a special token parts it from the document (_Splice)."""
        if query != self._query:
            whole = self.engine.tokenize(self._pair_text(query, ""), add_special=True)
            if len(whole) >= self.n_ctx:  # cut to the window, every pair would be the query alone: equal scores
                raise QueryTooLong(len(whole), self.n_ctx, self.at_trained)
            self._splice = _Splice.make(self, query)
            self._query = query
        if self._splice is None:
            return self.tokens(self._pair_text(query, document), truncate, pair=True)
        document, cut = self._beginning(document)
        toks = self._splice.join(self.engine.tokenize(document, add_special=False))
        if len(toks) > self.n_ctx:
            if not truncate:
                raise ContextTooSmall(len(toks), self.n_ctx, pair=True, more=cut, trained=self.at_trained)
            toks = toks[:self.n_ctx]
        return toks

    def _pair_text(self, query: str, document: str) -> str:
        """The pair's text: the model's "rerank" template when it has one, else query, the EOS and SEP texts
        the vocabulary adds, then the document."""
        vocab = self.engine.vocab
        text = native_model.chat_template(self.engine.model_ptr, "rerank")
        if text is not None:
            prompt = text.replace("{query}", query).replace("{document}", document)
        else:
            between = ""
            if native_vocab.adds_eos(vocab):
                between += self.engine.token_text(native_vocab.eos(vocab))
            if native_vocab.adds_sep(vocab):
                between += self.engine.token_text(native_vocab.sep(vocab))
            prompt = query + between + document
        return prompt

    def embed(self, token_lists: list[list[int]], normalize: bool = True,
              dimensions: int | None = None) -> list[Embedding]:
        """One vector per token list, in order; texts are packed into as few llama_decode calls as fit."""
        out: list[Embedding] = []
        pending: list[list[int]] = []
        used = 0
        for toks in token_lists:
            if not toks:
                raise UsageError("an empty text has no embedding")
            if pending and (used + len(toks) > self.n_ctx or len(pending) == MAX_SEQS):
                out += self._run(pending, normalize, dimensions)
                pending, used = [], 0
            pending.append(toks)
            used += len(toks)
        if pending:
            out += self._run(pending, normalize, dimensions)
        return out

    def _run(self, seqs: list[list[int]], normalize: bool, dimensions: int | None) -> list[Embedding]:
        b = self.batch
        context.clear(self.mem, True)
        b.n_tokens = 0
        for s, toks in enumerate(seqs):
            for pos, tok in enumerate(toks):
                b.add(tok, pos, s, True)  # as llama-embedding: every token an output
        rc = context.encode(self.ctx, b) if self.engine.uses_encode else context.decode(self.ctx, b)
        logs.raise_deferred()
        if rc == 2 and self._abort is not None:  # llama.cpp's "aborted": abort_when's check said so
            raise Cancelled("cancelled")
        if rc != 0:
            raise LocalgenError(f"llama.cpp could not embed {len(seqs)} text{'s' if len(seqs) > 1 else ''} ({rc})")
        result = []
        for s, toks in enumerate(seqs):
            vec = context.embeddings_seq(self.ctx, s, self.n_embd)
            if vec is None:
                raise LocalgenError("llama.cpp returned no pooled embedding")
            result.append(Embedding(finish(vec, normalize, dimensions), len(toks)))
        return result


@dataclass(frozen=True)
class _Splice:
    """A query's pair tokens around the place of the document: `head` (the start tokens, the query, up to a
    special token) and `tail` (from a special token, or nothing, to the end tokens). llama.cpp's tokenizer
    parts text at special tokens first and tokenizes each piece alone, so head + document's tokens + tail is
    what tokenizing the whole pair gives; checked on the pair with an empty document and with a word."""

    head: list[int]
    tail: list[int]

    def join(self, document: list[int]) -> list[int]:
        return self.head + document + self.tail

    @staticmethod
    def make(emb: Embedder, query: str) -> _Splice | None:
        """The splice for `query`, or None where no special token parts query and document (a template with
        text between them: such pairs are tokenized whole, query and all)."""
        eng = emb.engine
        marker = "\x00"  # never in a text the template's parts could merge with
        before, _, after = emb._pair_text(query, marker).partition(marker)
        ends = eng.tokenize("", add_special=True)  # the start and end tokens the vocabulary adds to any text
        n_start = 1 if ends and native_vocab.adds_bos(eng.vocab) else 0
        head = ends[:n_start] + eng.tokenize(before, add_special=False)
        tail = eng.tokenize(after, add_special=False) + ends[n_start:]

        def parts(tok: int) -> bool:
            return native_vocab.parts_text(eng.vocab, tok)

        if len(head) == n_start or not parts(head[-1]) or (after and not parts(tail[0])):
            return None
        splice = _Splice(head, tail)
        for doc in ("", "word"):
            whole = eng.tokenize(emb._pair_text(query, doc), add_special=True)
            if splice.join(eng.tokenize(doc, add_special=False)) != whole:
                return None
        return splice


def _context(engine: Engine, params: dict[str, Any]) -> Any:
    """A llama.cpp context on the engine's model with these parameters, or a LocalgenError."""
    ctx = context.new(engine.model_ptr, **params)
    if not ctx:
        raise LocalgenError("llama.cpp could not create an embeddings context", hint="lower --ctx")
    return ctx


class EmbedTask:
    """An embeddings (or, with `query`, rerank) request as a scheduler task (engine/scheduler.py): each `step`
    tokenizes and encodes the next texts that fit its budget of tokens (at least one whole text: a pooled
    text is encoded whole), so a large request runs a slice at a time between decoding steps and stops
    between two slices when aborted. `value`: the Embeddings, or (score, tokens) pairs for rerank."""

    def __init__(self, id: int, embedder: Embedder, texts: list[str], normalize: bool = True,
                 dimensions: int | None = None, truncate: bool = False, query: str | None = None,
                 cancelled: Callable[[], bool] | None = None) -> None:
        """`cancelled` (from another thread): stop even inside a slice, through llama.cpp's abort callback."""
        self.id = id
        self.cancelled = cancelled
        self.embedder = embedder
        self.texts = texts
        self.normalize = normalize and query is None
        self.dimensions = dimensions
        self.truncate = truncate
        self.query = query
        self.done: list[Embedding] = []
        self._next: list[int] | None = None  # the next text's tokens, made by a step that had no room for them

    def _tokens(self, i: int) -> list[int]:
        """Text `i`'s tokens; one too long for the window is a ContextTooSmall that says which (its `item`)."""
        emb, text = self.embedder, self.texts[i]
        try:
            return emb.pair_tokens(self.query, text, self.truncate) if self.query is not None else \
                emb.tokens(text, self.truncate)
        except ContextTooSmall as e:
            e.item = i
            raise

    def step(self, budget: int | None = None) -> bool:
        """Encode the next slice (texts of up to `budget` tokens in all, else the window); True once all are."""
        emb = self.embedder
        budget = min(budget or emb.n_ctx, emb.n_ctx)
        batch: list[list[int]] = []
        used = 0
        while len(self.done) + len(batch) < len(self.texts) and len(batch) < MAX_SEQS:
            toks = self._next if self._next is not None else self._tokens(len(self.done) + len(batch))
            self._next = None
            if batch and used + len(toks) > budget:
                self._next = toks
                break
            batch.append(toks)
            used += len(toks)
        if batch:
            emb.abort_when(self.cancelled)
            try:
                self.done += emb.embed(batch, self.normalize, self.dimensions)
            finally:
                emb.abort_when(None)
        return len(self.done) == len(self.texts)

    @property
    def value(self) -> list[Any]:
        if self.query is not None:
            return [(e.vector[0], e.tokens) for e in self.done]
        return self.done


class ContextTooSmall(UsageError, PromptTooLong):
    """A text longer than the embeddings window (`pair`: a rerank document with its query, the reranker's;
    `trained`: the window is the model's trained one, which no --ctx raises)."""

    def __init__(self, n: int, n_ctx: int, pair: bool = False, more: bool = False, trained: bool = False) -> None:
        self.tokens, self.window = n, n_ctx
        count = f"more than {n:,}" if more else f"{n:,}"  # `more`: its beginning alone was tokenized
        limit = ", the most this model was trained on" if trained else ""
        raise_ctx = "" if trained else "raise --ctx, or "
        if pair:
            super().__init__(f"a document is {count} tokens with the query; the reranker's window is {n_ctx:,}"
                             f"{limit}", hint=f"{raise_ctx}--truncate to score the pair's first tokens")
        else:
            super().__init__(f"a text is {count} tokens; the embeddings window is {n_ctx:,}{limit}",
                             hint=f"{raise_ctx}--truncate to embed its first tokens")
        self.n, self.more = n, more
        self.item: int | None = None  # which of a request's texts (EmbedTask), when known


class QueryTooLong(UsageError, BadRequest):
    """A rerank query that leaves no room in the window for a document."""

    param = "query"

    def __init__(self, n: int, n_ctx: int, trained: bool = False) -> None:
        super().__init__(f"the query is {n:,} tokens with the model's separators; the reranker's window of "
                         f"{n_ctx:,}{', the most this model was trained on,' if trained else ''} must hold it and "
                         "some of each document", hint="shorten the query" + ("" if trained else ", or raise --ctx"))


class DimensionsOutOfRange(UsageError, BadRequest):
    """More dimensions asked for than the model's embeddings have (`embed --dimensions`, the APIs'
    `dimensions`)."""

    param = "dimensions"


def finish(vec: list[float], normalize: bool, dimensions: int | None) -> list[float]:
    """Cut to `dimensions` (Matryoshka models keep meaning in the first ones), then L2-normalise."""
    if dimensions is not None:
        if not 1 <= dimensions <= len(vec):
            raise DimensionsOutOfRange(f"dimensions must be within 1 to {len(vec)} (the model's size), not "
                                       f"{dimensions}")
        vec = vec[:dimensions]
    if normalize:
        norm = math.sqrt(sum(x * x for x in vec))
        if norm > 0:
            vec = [x / norm for x in vec]
    return vec
