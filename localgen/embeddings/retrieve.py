"""Retrieval from a collection (store.py): the query embedded as the collection's texts were (its stored model,
pooling, dimensions and normalisation), its entries ranked by cosine similarity, the best K returned. `similar`
prints them; `run --rag` and `chat --rag` put them into the user's message (`rag_message`, one fixed template
naming each excerpt by its id), dropping the lowest-scoring ones that do not fit the window (`fit`). A Retriever
loads its embedding model once, at its first search, and keeps it for many queries (a chat) until closed; it
keeps the vectors in memory too, and reads them again when the collection was written since (a chat sees
entries stored or removed while it runs)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from localgen.embeddings import store
from localgen.errors import LocalgenError, ModelNotFoundError, UsageError


@dataclass(frozen=True)
class Hit:
    """One entry of a collection found for a query."""

    id: str
    score: float  # cosine similarity with the query
    text: str

    @property
    def shown_score(self) -> float:
        """The score as `similar` prints it (6 decimals)."""
        return round(self.score, 6)


class Retriever:
    """A collection opened for search. `load(model_spec)` loads the collection's embedding model (the caller's:
    the CLI loads it as `embed` does) and returns a backend with embed() and embedder(); it runs at the first
    search, and the model stays loaded until close()."""

    def __init__(self, name: str, load: Callable[[str | None], Any]) -> None:
        self.name = name
        self.written = store.written(name)  # read before the vectors: a write after them reads them again
        self.collection = store.get(name)  # an unknown name: a usage error naming the collections there are
        self.rows = store.vectors(name)
        self._load = load
        self.backend: Any = None

    def __enter__(self) -> Retriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def require_entries(self) -> None:
        """A collection with no entry has nothing to answer from: a usage error."""
        if not self.rows:
            raise UsageError(f"the collection {self.name!r} is empty: there is nothing to answer from",
                             hint=f"store texts in it with `localgen embed --file FILE --store {self.name}`")

    def load(self) -> None:
        """Load the collection's embedding model now (else the first search does), once; a model whose fingerprint
        is not the collection's (its name now means another file: a relative path from another folder, a file
        replaced) is a usage error, as its queries would not compare with the stored vectors."""
        if self.backend is None:
            c = self.collection
            try:
                backend = self._load(c.model_spec)
            except ModelNotFoundError as e:  # its model gone, or a relative path read from another folder
                spec = c.model_spec or c.model
                relative = "no such model file" in e.message and not os.path.isabs(os.path.expanduser(spec))
                raise ModelNotFoundError(
                    f"the collection {self.name!r} was made with {spec}: {e.message}",
                    hint="a relative path is read from the current folder: run this from the folder it was stored "
                         "from, or store it again with the model's full path" if relative
                    else e.hint or f"bring the model back, or store into the collection with it from where it is "
                    f"now (`localgen embed -m PATH --store {self.name} ...`: the same file is the same model, and "
                    "the collection then loads it from there)") from None
            if c.model_id is not None and store.fingerprint(backend.engine.model.path,
                                                            backend.engine.adapters) != c.model_id:
                backend.close()
                raise UsageError(f"the collection {self.name!r} was made with another {c.model} than "
                                 f"{c.model_spec or c.model} is now (a file of other content), so its vectors do "
                                 "not compare with this model's",
                                 hint=f"store it again with this model (`localgen embed -m {c.model_spec or c.model} "
                                      f"--store NEWNAME`), or bring back the model it was made with")
            self.backend = backend

    def embed_query(self, query: str, truncate: bool = False) -> list[float]:
        """The query's vector, made as the collection's were (the model loads here the first time). A query
        longer than the embeddings window is a usage error, or is cut to its first tokens with `truncate`."""
        from localgen.engine.embed import ContextTooSmall

        c = self.collection
        self.load()
        try:
            return list(self.backend.embed([query], c.pooling, c.normalized, c.dimensions if c.dimensions else None,
                                           truncate=truncate)[0].vector)
        except ContextTooSmall as e:  # refused once tokenized, before any of it is embedded: as embed refuses a text
            window = self.backend.embedder(c.pooling).n_ctx
            raise UsageError(f"the query is {'more than ' if e.more else ''}{e.n:,} tokens; the embeddings window "
                             f"is {window:,}",
                             hint=f"give a shorter query, or --truncate to embed its first {window:,} tokens") from None

    def rank(self, vector: Sequence[float], k: int) -> list[Hit]:
        """The k entries nearest to a query's vector (cosine), best first; equal scores in stored order."""
        return rank(self.rows, [vector], k)

    def refresh(self) -> None:
        """Read the vectors again if the collection was written since they were read (entries stored or removed
        by another process during a chat): one small read when it was not. A collection removed meanwhile has
        no entries to search; one made again another way (its model, pooling or size) is an error."""
        written = store.written(self.name)
        if written == self.written:
            return
        self.written = written
        if written is None:
            self.rows = []
            return
        now = store.get(self.name)
        was = self.collection
        if (now.model, now.pooling, now.dimensions, now.normalized) != (
                was.model, was.pooling, was.dimensions, was.normalized) or (
                None not in (now.model_id, was.model_id) and now.model_id != was.model_id):
            raise LocalgenError(f"the collection {self.name!r} was made again with {now.model} during this "
                                "search; its vectors no longer match the loaded model",
                                hint="start again to search it with its new model")
        self.rows = store.vectors(self.name)

    def why_empty(self) -> str:
        """Why a search finds nothing: the collection removed or emptied since it was opened ("" while it has
        entries; one empty at the start is refused, require_entries)."""
        if self.rows:
            return ""
        return f"the collection {self.name!r} {'was removed' if self.written is None else 'is empty now'}"

    def search(self, query: str, k: int, truncate: bool = False) -> list[Hit]:
        """The k entries nearest to the query, best first, as the collection is now (refresh())."""
        vector = self.embed_query(query, truncate)
        self.refresh()
        return self.rank(vector, k)

    def close(self) -> None:
        """Free the embedding model (idempotent); a later search loads it again."""
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()


def rank(rows: Sequence[tuple[str, str, bytes]], queries: Sequence[Sequence[float]], k: int) -> list[Hit]:
    """The k rows (id, text, packed float32 vector) nearest to any of the query vectors (each row scored by its
    best cosine), best first; equal scores in stored order. `similar`, --rag and serve's vector stores rank here."""
    import numpy as np

    if not rows:
        return []
    matrix = np.frombuffer(b"".join(r[2] for r in rows), dtype="<f4").reshape(len(rows), -1).astype(np.float64)
    q = np.asarray(queries, dtype=np.float64).reshape(len(queries), -1)
    cosines = (matrix @ q.T) / (np.linalg.norm(matrix, axis=1)[:, None] * np.linalg.norm(q, axis=1)[None, :] + 1e-30)
    scores = cosines.max(axis=1)
    best = np.argsort(-scores, kind="stable")[:k]
    return [Hit(rows[int(i)][0], float(scores[i]), rows[int(i)][1]) for i in best]


RAG_INSTRUCTION = ("Answer the question at the end from the excerpts below. Cite the excerpts you use by their ids "
                   "in brackets, as [id]. If the excerpts do not hold the answer, say so.")


def rag_message(question: str, hits: Sequence[Hit]) -> str:
    """The user's message with the excerpts before the question (without excerpts: the question alone)."""
    if not hits:
        return question
    excerpts = "\n\n".join(f"[{h.id}]\n{h.text}" for h in hits)
    return f"{RAG_INSTRUCTION}\n\n{excerpts}\n\nQuestion: {question}"


def asked(message: str) -> str:
    """The question a message asks: a rag_message's own question (after its excerpts), else the message."""
    if message.startswith(RAG_INSTRUCTION) and "\n\nQuestion: " in message:
        return message.rsplit("\n\nQuestion: ", 1)[1]
    return message


def fit(hits: Sequence[Hit], fits: Callable[[list[Hit]], bool]) -> list[Hit]:
    """The best hits whose message fits (`fits`: whether a message with these hits fits the window): the
    lowest-scoring are dropped first, down to none (the question alone, which the caller then checks). Each
    `fits` renders and tokenizes the whole prompt, so how many fit is found by halving (a few calls for any
    --rag-top), not by dropping one at a time."""
    if not hits or fits(list(hits)):
        return list(hits)
    fit_n, too_many = 0, len(hits)  # fit_n hits fit (none always "fits": the caller checks the question alone)
    while too_many - fit_n > 1:
        n = (fit_n + too_many) // 2
        if fits(list(hits[:n])):
            fit_n = n
        else:
            too_many = n
    return list(hits[:fit_n])


NAMED_DROPPED = 5  # excerpts named in the line that says some were left out; the rest counted


def dropped_line(dropped: Sequence[Hit], kept: int) -> str:
    """The one stderr line that says which excerpts did not fit (the first few named, the rest counted)."""
    ids = ", ".join(h.id for h in dropped[:NAMED_DROPPED])
    if len(dropped) > NAMED_DROPPED:
        ids += f" and {len(dropped) - NAMED_DROPPED:,} more"
    return (f"rag: {len(dropped)} excerpt{'s' if len(dropped) != 1 else ''} left out to fit the context window "
            f"({ids}); {kept} sent")


def sources_line(hits: Sequence[Hit]) -> str:
    """The short line after an answer: each excerpt's id and score; "none" where a line before the answer said
    why (dropped_line: none fit; Rag: the collection removed or emptied)."""
    return "sources: " + (", ".join(f"{h.id} ({h.score:.3f})" for h in hits) if hits else "none")
