"""serve --collection NAME: the named embeddings collections (localgen embed --store) offered read-only as
OpenAI's vector stores. GET /v1/vector_stores lists them, GET /v1/vector_stores/{id} is one, and POST
/v1/vector_stores/{id}/search embeds the query on the collection's own model, through that model's worker as
/v1/embeddings does (so it loads, queues and unloads as any request's model does), and ranks the collection's
texts by cosine similarity. Only the collections serve was given are offered: a collection holds its owner's
texts."""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen.serve.apierror import HTTPError
from localgen.serve.jsonbody import read_json
from localgen.serve.served import Served
from localgen.serve.state import ServeState
from localgen.text import CHARS_PER_TOKEN

MAX_RESULTS = 50  # max_num_results: OpenAI's bound
MAX_QUERIES = 16  # queries in one search (OpenAI's API takes a list and names no bound)


def routes(state: ServeState) -> list[Route]:
    """The vector store routes (answering 404 for any store when serve was given no --collection)."""

    def offered(ident: str) -> str:
        if ident not in state.collections:
            store, _, rest = ident.rpartition("/")
            if store in state.collections and rest == "search":  # GET of the search route
                raise HTTPError(405, "a vector store's search is a POST")
            if any(ident.startswith(f"{name}/") for name in state.collections):
                raise HTTPError(404, f"'/v1/vector_stores/{ident[:100]}' is not served here: a vector store's files "
                                     "are a collection's entries, changed with localgen embed --store",
                                param="vector_store_id")
            there = ", ".join(state.collections) or "none: serve offers a collection with --collection NAME"
            raise HTTPError(404, f"No vector store found with id '{ident[:100]}' (offered here: {there})",
                            param="vector_store_id")
        return ident

    async def listing(request: Request) -> Response:
        data = [_store(x) for x in await asyncio.to_thread(_described, state.collections) if x is not None]
        return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None, "has_more": False})

    async def one(request: Request) -> Response:
        name = offered(request.path_params["id"])
        found = (await asyncio.to_thread(_described, [name]))[0]
        if found is None:
            raise _gone(name)
        return JSONResponse(_store(found))

    async def searched(request: Request) -> Response:
        name = offered(request.path_params["id"])
        body = await read_json(request)
        queries, count, threshold = _search_args(body)
        hits = await search(state, name, queries, count, threshold, request)
        return JSONResponse({"object": "vector_store.search_results.page", "search_query": queries,
                             "data": [{"file_id": h.id, "filename": document(h.id), "score": h.shown_score,
                                       "attributes": {"vector_store_id": name},
                                       "content": [{"type": "text", "text": h.text}]} for h in hits],
                             "has_more": False, "next_page": None})

    return [Route("/v1/vector_stores", listing),
            Route("/v1/vector_stores/{id:path}/search", searched, methods=["POST"]),
            Route("/v1/vector_stores/{id:path}", one)]


def document(ident: str) -> str:
    """The document a text's id names: the id without its chunk's `#N` (`notes.md#3`: notes.md), as a result's
    and a citation's filename."""
    return re.sub(r"#[0-9]+$", "", ident) or ident


def check_offered(state: ServeState, ident: object, param: str) -> str:
    """A vector store's id, one that serve --collection offers; else a 400 naming the ones it does (a 404 is the
    store routes' own answer)."""
    if not isinstance(ident, str) or ident not in state.collections:
        there = ", ".join(state.collections) or "none: serve offers a collection with --collection NAME"
        raise HTTPError(400, f"No vector store found with id '{str(ident)[:100]}' (offered here: {there})",
                        param=param)
    return ident


async def search(state: ServeState, name: str, queries: list[str], count: int, threshold: float | None = None,
                 http: Request | None = None) -> list[Any]:
    """The `count` texts of an offered collection most like the queries (at or above `threshold`), the queries
    embedded on the collection's model through its worker."""
    from localgen.embeddings import store as collections
    from localgen.errors import LocalgenError
    from localgen.serve.embeds import embed

    try:
        coll = await asyncio.to_thread(collections.get, name)
    except LocalgenError:  # removed (localgen collections rm) since serve started
        raise _gone(name) from None
    worker = state.worker(coll.model)
    if await asyncio.to_thread(other_model, worker, coll):  # a file of that name, not the one it was made with
        raise HTTPError(400, f"vector store '{name[:100]}' {made_with_another(coll, worker)}",
                        param="vector_store_id")
    # each query cut to its first tokens the embedding model's window holds, as run --rag cuts a question: here
    # first to the characters that hold them (no token is longer than CHARS_PER_TOKEN), where a longer text
    # would be refused as past that window before it is tokenized
    most = CHARS_PER_TOKEN * worker.n_ctx
    queries = [q[:most] for q in queries]
    vectors = (await embed(worker, queries, coll.dimensions, truncate=True, http=http, pooling=coll.pooling,
                          param="query")).values
    rows = await asyncio.to_thread(collections.vectors, name)
    from localgen.embeddings.retrieve import rank

    found = rank(rows, [v.vector for v in vectors], count)
    return [h for h in found if threshold is None or h.shown_score >= threshold]


def _search_args(body: dict[str, Any]) -> tuple[list[str], int, float | None]:
    """A search's queries, how many results, and the score below which none is given; what is not done here
    (filters, rewriting the query) is a 400 rather than silently ignored."""
    raw = body.get("query")
    queries = [raw] if isinstance(raw, str) else raw
    if not isinstance(queries, list) or not queries or not all(isinstance(q, str) and q.strip() for q in queries):
        raise HTTPError(400, "`query` must be a non-empty string or a list of them", param="query")
    if len(queries) > MAX_QUERIES:
        raise HTTPError(400, f"at most {MAX_QUERIES} queries in one search, not {len(queries):,}", param="query")
    if body.get("rewrite_query") is True:
        raise HTTPError(400, "`rewrite_query` is not supported: the query is searched as it is sent",
                        param="rewrite_query")
    count, threshold = search_options(body, 10, lambda field: (f"`{field}`", field))
    return queries, count, threshold


def search_options(where: dict[str, Any], default: int,
                   named: Callable[[str], tuple[str, str]]) -> tuple[int, float | None]:
    """How many results (max_num_results: 1 to MAX_RESULTS, else `default`) and the lowest score kept
    (ranking_options.score_threshold, a cosine), as a search or a file_search tool gives them; filters are a
    400 (entries have no attributes). `named`: a field's name in an error, and its param."""
    count = where.get("max_num_results", default)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RESULTS:
        said, param = named("max_num_results")
        raise HTTPError(400, f"{said} must be a whole number from 1 to {MAX_RESULTS}", param=param)
    if where.get("filters") is not None:
        said, param = named("filters")
        raise HTTPError(400, f"{said} are not supported: a collection's entries have no attributes", param=param)
    ranking = where.get("ranking_options")
    threshold = ranking.get("score_threshold") if isinstance(ranking, dict) else None
    if (ranking is not None and not isinstance(ranking, dict)) or (threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not -1 <= threshold <= 1)):
        said, param = named("ranking_options.score_threshold")
        raise HTTPError(400, f"{said} must be a number from -1 to 1 (a cosine)", param=param)
    return count, None if threshold is None else float(threshold)


def other_model(worker: Served, coll: Any) -> bool:
    """Whether the worker's model is not the file the collection was made with (its fingerprint, whatever the
    name: another file of the same name embeds into vectors that do not compare); a collection made before
    fingerprints were recorded knows only the name, which the worker was found by."""
    if coll.model_id is None:
        return False
    residence = getattr(worker, "residence", None)  # serve --lora's adapters, over the preset's own
    lora = tuple(residence.load.lora) if residence is not None else ()
    found = _fingerprint(worker.ref.path, (*worker.ref.adapters, *lora))
    return found is not None and found != coll.model_id


def made_with_another(coll: Any, worker: Served) -> str:
    """Why a collection's vectors do not compare with the served model's, after the collection's name."""
    return (f"was made with another {coll.model} than the one served as {worker.name} (a file of other content), "
            "so its vectors do not compare with this model's")


def _fingerprint(path: str, adapters: tuple[tuple[str, float], ...]) -> str | None:
    """The model's fingerprint (embeddings/store.py), read once per file as it stands (a few MB read)."""
    import os

    from localgen.errors import LocalgenError

    try:
        stats = [os.stat(p) for p in (path, *(a for a, _ in adapters))]
        stamps = tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)
        return _fingerprint_of(path, adapters, stamps)
    except (OSError, LocalgenError):  # the file gone or unreadable since it loaded: not known to differ
        return None


@functools.lru_cache(maxsize=32)
def _fingerprint_of(path: str, adapters: tuple[tuple[str, float], ...],
                    stamps: tuple[tuple[int, int, int, int], ...]) -> str:
    from localgen.embeddings.store import fingerprint

    return fingerprint(path, adapters)


def _gone(name: str) -> HTTPError:
    """A 404 for an offered collection removed since serve started (naming no other collection: those not
    offered are not the client's to know)."""
    return HTTPError(404, f"vector store '{name[:100]}' is gone: its collection was removed since the server started",
                     param="vector_store_id")


def _described(names: list[str]) -> list[tuple[Any, int] | None]:
    """Each collection as `localgen collections` lists it, and its bytes; None for one removed since."""
    from localgen.embeddings import store as collections
    from localgen.errors import LocalgenError

    out: list[tuple[Any, int] | None] = []
    for n in names:
        try:
            out.append((collections.described(n), collections.stored_bytes(n)))
        except LocalgenError:
            out.append(None)
    return out


def _store(described: tuple[Any, int]) -> dict[str, Any]:
    """A collection as OpenAI's vector store object (its entries counted as files: each is one text)."""
    x, size = described
    counts = {"in_progress": 0, "completed": x.entries, "failed": 0, "cancelled": 0, "total": x.entries}
    return {"id": x.name, "object": "vector_store", "name": x.name, "created_at": int(x.created),
            "last_active_at": int(x.last_written), "usage_bytes": size, "file_counts": counts, "status": "completed",
            "expires_after": None, "expires_at": None,
            "metadata": {"model": x.model, "pooling": x.pooling, "dimensions": str(x.dimensions)}}
