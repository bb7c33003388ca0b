"""--rag for run and chat (docs/rag.md): the collection's embedding model loaded as `similar` loads it, each
question's excerpts retrieved (embeddings/retrieve.py) and put into its message, the lowest-scoring left out
where they do not fit the window (one stderr line says which)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localgen.cli.options.plan import LoadPlan, RagPlan
from localgen.embeddings.retrieve import Hit, Retriever, dropped_line, fit, rag_message


def answering_model_there(name: str | None) -> None:
    """The model that answers found (a path's file, a name's model; nothing loaded or downloaded) before the
    collection's embedding model loads, which may take minutes: its ModelNotFoundError, or nothing. One that would
    be downloaded as it loads (a NotDownloadedError here) is no mistake."""
    import contextlib

    from localgen.errors import NotDownloadedError
    from localgen.models.resolve import resolve

    with contextlib.suppress(NotDownloadedError):
        resolve(name, offline=True, pull_missing=False)


def embedding_loader(load: LoadPlan, warn: Callable[[str], None]) -> Callable[[str | None], Any]:
    """Loads a collection's embedding model as `similar` does: its default window, llama.cpp's repacked CPU
    layouts (unless --no-repack was given), the command's threads."""
    def open_model(spec: str | None) -> Any:
        from localgen.cli.progress import make_progress
        from localgen.engine.local import LocalBackend
        from localgen.models.load import open_engine
        from localgen.models.resolve import resolve
        from localgen.types import LoadParams

        ref = resolve(spec, offline=load.offline, progress=make_progress())
        repack = load.params.repack if "repack" in load.load_given else True
        params = LoadParams(n_threads=load.params.n_threads, n_threads_batch=load.params.n_threads_batch,
                            repack=repack)
        return LocalBackend(open_engine(ref, params, verbose=load.verbose, warn=warn), warn=warn)

    return open_model


class Rag:
    """A command's --rag: the collection, its model (loaded at the first question and kept until close), and the
    excerpts the last question was sent with."""

    def __init__(self, plan: RagPlan, load: LoadPlan, warn: Callable[[str], None]) -> None:
        self.plan = plan
        self.retriever = Retriever(plan.collection, embedding_loader(load, warn))
        self.retriever.require_entries()
        self.last: list[Hit] = []  # sent with the last question (after fitting)
        self.said_empty = ""  # why the collection has no entries, as last said (once, not at each question)

    def search(self, question: str) -> list[Hit]:
        """The question's --rag-top excerpts, best first (a question longer than the embeddings window is
        searched by its first tokens; the model still gets all of it)."""
        return self.retriever.search(question, self.plan.top, truncate=True)

    def message(self, question: str, hits: list[Hit], fits: Callable[[str], bool], say: Callable[[str], None]) -> str:
        """fitted() for the question, its excerpts remembered as `last` (chat's /sources); a collection removed or
        emptied meanwhile is said once (its sources line says only "none")."""
        why = self.retriever.why_empty()
        if why and why != self.said_empty:
            say(f"rag: {why}: the question goes without excerpts")
        self.said_empty = why
        message, self.last = fitted(question, hits, fits, say)
        return message

    def close(self) -> None:
        """Free the embedding model."""
        self.retriever.close()


def fitted(question: str, hits: list[Hit], fits: Callable[[str], bool],
           say: Callable[[str], None]) -> tuple[str, list[Hit]]:
    """The message for the question with the excerpts that fit (`fits`: whether a message fits the window), the
    lowest-scoring left out first, said in one line (`say`); and those excerpts."""
    kept = fit(hits, lambda some: fits(rag_message(question, some)))
    if len(kept) < len(hits) and (kept or fits(question)):  # a question too long alone: the caller's error is all
        say(dropped_line(hits[len(kept):], len(kept)))
    return rag_message(question, kept), kept
