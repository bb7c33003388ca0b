"""What the server offers, as each API lists it: OpenAI's /v1/models (with each model's window, and the router
fields of llama-server's GET /models, the same listing), Ollama's
/api/tags (every model), /api/ps (the loaded ones: memory, expiry), /api/version and the bare / that Ollama's
clients probe. Nothing here loads a model: a listing reads GGUF headers only."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import os
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from localgen.serve.apierror import HTTPError
from localgen.serve.remotes import Remote
from localgen.serve.state import ServeState
from localgen.serve.worker import ModelWorker
from localgen.types import ModelRef

OLLAMA_API_VERSION = "0.12.0"  # /api/version: the Ollama whose API serve speaks (docs/api.md)


def routes(state: ServeState) -> list[Route]:
    """The listing routes of both APIs."""

    def openai_model(name: str, ref: ModelRef, w: Any) -> dict[str, Any]:
        """OpenAI's model, with llama-server's router fields: `path` (the file's name, not its folders: a client
        learns which file, never where it is) and `status`."""
        return {"id": name, "object": "model", "created": int(state.started), "owned_by": "localgen",
                "max_model_len": state.window(ref, w), **({"default": True} if name == state.default else {}),
                "path": ref.path and os.path.basename(ref.file),
                "status": {"value": "loaded" if w is not None and w.loaded else "unloaded"}}

    def anthropic_model(name: str) -> dict[str, Any]:
        return {"type": "model", "id": name, "display_name": name, "created_at": _iso(state.started)}

    async def models(request: Request) -> Response:
        offered = await asyncio.to_thread(state.offered)  # reads GGUF headers
        if _anthropic(request):  # a remote model is not listed here: /v1/messages cannot reach it
            return JSONResponse(_anthropic_page([anthropic_model(name) for name, _, _ in offered], request))
        return JSONResponse({"object": "list", "data": [*(openai_model(*entry) for entry in offered),
                                                        *(remote_model(n, r) for n, r in remote())]})

    def remote() -> list[tuple[str, Remote]]:
        return state.upstreams.listing() if state.upstreams is not None else []

    def remote_model(name: str, where: Remote) -> dict[str, Any]:
        """A model another server runs (serve --endpoint): owned_by names that server, `upstream` its URL."""
        return {"id": name, "object": "model", "created": int(state.started), "owned_by": where.label,
                "upstream": where.endpoint.url}

    async def model(request: Request) -> Response:
        ident = request.path_params["id"]
        where = state.upstreams.find(ident) if state.upstreams is not None and not _anthropic(request) else None
        if where is not None:
            return JSONResponse(remote_model(ident, where))
        offered = await asyncio.to_thread(state.offered)
        meant = state.ollama_name(ident)  # an Ollama model's name in any of its spellings
        found = next((entry for entry in offered if entry[0] in (ident, meant)), None)
        if found is None:
            raise HTTPError(404, f"The model '{ident[:100]}' does not exist", param="model")
        return JSONResponse(anthropic_model(ident) if _anthropic(request) else openai_model(*found))

    async def root(request: Request) -> Response:
        return PlainTextResponse("Ollama is running (localgen)")

    async def version(request: Request) -> Response:
        import localgen

        # Ollama's clients read `version` as Ollama's, and some turn features off below a version: the one whose
        # API this server speaks (tools, structured outputs, thinking with its levels), and localgen's own beside
        return JSONResponse({"version": OLLAMA_API_VERSION, "localgen": localgen.__version__})

    def local_tags() -> list[dict[str, Any]]:
        return [_model_entry(name, ref) for name, ref, _ in state.offered()]

    async def tags(request: Request) -> Response:
        local = await asyncio.to_thread(local_tags)  # reads GGUF headers, and stats each file (its digest)
        return JSONResponse({"models": [*local,
                                        *(_remote_entry(name, where, state.started) for name, where in remote())]})

    def loaded() -> list[dict[str, Any]]:
        # each worker looked at first (a preset changed on disk: taken away), as the other listings do; one taken
        # away that still holds its model (it ends the requests it answers) is listed after, `unloading`; one
        # whose room another model waits for (a swap) unloads once its running requests end: `yielding_to` names
        # those waiting; one whose room was made and whose model is being loaded is listed `loading` (a swap's
        # new model: for a large one, the seconds its memory fills)
        held = list(state.current_workers().values())
        return [{**_model_entry(w.name, w.ref), "size": w.residence.need or w.ref.summary.file_size,
                 "expires_at": _expires(w), "size_vram": w.residence.vram_bytes, "context_length": w.n_ctx,
                 "placement": w.residence.placement, **({"unloading": True} if gone else {}),
                 **({"loading": True} if loading else {}),
                 **({"yielding_to": waiting} if (waiting := w.yielding_to) else {})}
                for gone, workers in ((False, held), (True, state.unloading())) for w in workers
                if (loading := not w.loaded and w.residence.loading) or w.loaded]

    async def ps(request: Request) -> Response:
        return JSONResponse({"models": await asyncio.to_thread(loaded)})  # each file stat'ed too (its digest)

    # GET /models (llama-server's router list, and /v1/models without its /v1) is this route: serve/routing.py
    return [Route("/v1/models", models), Route("/v1/models/{id:path}", model),
            Route("/", root, methods=["GET", "HEAD"]), Route("/api/version", version),
            Route("/api/tags", tags), Route("/api/ps", ps)]


def details(ref: ModelRef) -> dict[str, Any]:
    """Ollama's `details` of a model (its listings and /api/show)."""
    s = ref.summary
    return {"format": "gguf", "family": s.architecture, "families": [s.architecture],
            "parameter_size": human_number(s.n_params), "quantization_level": s.quantization or "", "parent_model": ""}


def human_number(n: int) -> str:
    """A count as Ollama writes a parameter size (its format.HumanNumber): 116K, 134.52M, 125M, 2.8B, 7B."""
    for unit, scale, places in (("B", 10**9, 1), ("M", 10**6, 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{places}f}{unit}"
    return f"{n / 1000:.0f}K" if n >= 1000 else str(n)


def modified_at(ref: ModelRef) -> str:
    """When the model's file was last written, as Ollama's listings and /api/show give it."""
    try:
        stamp = os.path.getmtime(ref.path)
    except OSError:  # not written yet: an embedded model in chunks, assembled when a request first uses it
        stamp = time.time()
    return _iso(stamp)


def _model_entry(name: str, ref: ModelRef) -> dict[str, Any]:
    return {"name": name, "model": name, "modified_at": modified_at(ref), "size": ref.summary.file_size,
            "digest": _digest(ref), "details": details(ref)}


def _remote_entry(name: str, where: Remote, started: float) -> dict[str, Any]:
    """A model another server runs (serve --endpoint), as Ollama lists its cloud models: remote_host its URL,
    no size known here; its digest stands for its name at that URL."""
    digest = hashlib.sha256(f"remote|{where.endpoint.url}|{name}".encode("utf-8", "surrogatepass")).hexdigest()
    return {"name": name, "model": name, "modified_at": _iso(started), "size": 0, "digest": digest,
            "remote_model": name, "remote_host": where.endpoint.url,
            "details": {"format": "remote", "family": "", "families": [], "parameter_size": "",
                        "quantization_level": "", "parent_model": ""}}


def _digest(ref: ModelRef) -> str:
    """A model's digest as Ollama lists it: an Ollama model's is its manifest's (as `ollama list` shows it), not
    its GGUF blob's; any other model's, its file's SHA-256 where known, else one of the file's real path, size and
    modification time (a stat, never its bytes read: a listing reads headers only). Ollama's clients key a model
    by its digest: the same while the file is, another once it is written again."""
    if ref.source == "ollama":
        from localgen.models import ollamastore

        found = ollamastore.manifest_digest(ref.name)
        if found is not None:
            return found
    if ref.sha256:
        return ref.sha256
    real = os.path.realpath(ref.path)
    try:
        st = os.stat(real)
        stamp = f"{st.st_size}|{st.st_mtime_ns}"
    except OSError:  # not written yet: an embedded model in chunks, assembled when a request first uses it
        stamp = "unwritten"
    return hashlib.sha256(f"file|{real}|{stamp}".encode("utf-8", "surrogatepass")).hexdigest()


def _expires(worker: ModelWorker) -> str:
    when = worker.expires()  # the keep-alive from its last request's end; while it answers, from now
    return _iso(when if when is not None else time.time() + 10 * 365 * 86400)  # keep-alive -1: never


def _iso(stamp: float) -> str:
    return datetime.datetime.fromtimestamp(stamp, datetime.UTC).isoformat().replace("+00:00", "Z")


def _anthropic(request: Request) -> bool:
    """A request from Anthropic's clients (its SDK sends anthropic-version on every call): answered in its shape."""
    return "anthropic-version" in request.headers


def _anthropic_page(data: list[dict[str, Any]], request: Request) -> dict[str, Any]:
    """Anthropic's page of models: `limit` (1 to 1,000; 20) of them, after `after_id`, before `before_id`, or
    between the two."""
    query = request.query_params
    text = query.get("limit", "20")
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 1000:
        raise HTTPError(400, f"limit must be a whole number from 1 to 1000 (got {text[:20]!r})", param="limit")
    limit, ids = int(text), [d["id"] for d in data]
    for key in ("after_id", "before_id"):
        if key in query and query[key] not in ids:
            raise HTTPError(400, f"{key}: no model {query[key][:100]!r} here", param=key)
    # both: the models between the two (after_id was let be when before_id came with it)
    start = ids.index(query["after_id"]) + 1 if "after_id" in query else 0
    end = max(start, ids.index(query["before_id"])) if "before_id" in query else len(data)
    if "before_id" in query:
        page, more = data[max(start, end - limit):end], end - limit > start
    else:
        page, more = data[start:start + limit], start + limit < end
    return {"data": page, "has_more": more, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None}
