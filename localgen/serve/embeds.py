"""Embeddings and rerank over HTTP, in each API's shape: OpenAI's /v1/embeddings, llama-server's /v1/rerank
(Jina's and Cohere's shape), Ollama's /api/embed and older /api/embeddings. Their inputs checked, and the job
run on the model's worker a slice at a time between decoding steps (engine/embed.py's EmbedTask), stopped
when the client leaves."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen.serve.apierror import HTTPError, http_error
from localgen.serve.ask import flag, keep_alive, one_of
from localgen.serve.jobs import EmbedJob, Failed
from localgen.serve.jsonbody import read_json
from localgen.serve.loadnow import load_or_unload
from localgen.serve.running import await_embed
from localgen.serve.served import Served
from localgen.serve.state import ServeState
from localgen.text import CHARS_PER_TOKEN

MAX_INPUTS = 2048  # texts in one embeddings request (OpenAI's bound)
NS = 1_000_000_000


def routes(state: ServeState) -> list[Route]:
    """The embeddings and rerank routes of both APIs."""

    async def embeddings(request: Request) -> Response:
        body = await read_json(request)
        worker = state.worker(body.get("model"))
        fmt = one_of(body.get("encoding_format", "float"), ("float", "base64"), "encoding_format")
        vectors = (await embed(worker, embed_inputs(body.get("input")), dimensions(body.get("dimensions")),
                               http=request)).values
        from localgen.embeddings.store import b64

        data = [{"object": "embedding", "index": i, "embedding": v.vector if fmt == "float" else b64(v.vector)}
                for i, v in enumerate(vectors)]
        used = sum(v.tokens for v in vectors)
        return JSONResponse({"object": "list", "data": data, "model": worker.name,
                             "usage": {"prompt_tokens": used, "total_tokens": used}})

    async def rerank(request: Request) -> Response:
        """Results by relevance, as Jina's and Cohere's APIs give them."""
        body = await read_json(request)
        worker = state.worker(body.get("model"))
        query = body.get("query")
        if not isinstance(query, str) or not query:
            raise HTTPError(400, "`query` must be a non-empty string", param="query")
        if len(query) > CHARS_PER_TOKEN * worker.n_ctx:  # bounded before it is tokenized with every document
            raise HTTPError(400, f"`query` is {len(query):,} characters; the reranker's window of {worker.n_ctx:,} "
                                 "tokens cannot hold it", param="query")
        docs = embed_inputs(body.get("documents"), "documents")
        top = body.get("top_n", len(docs))
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise HTTPError(400, "`top_n` must be a positive integer", param="top_n")
        keep = flag(body, "return_documents")
        # documents are cut to fit beside the query; one with no room left is a 400 (embed.py QueryTooLong)
        scored = (await embed(worker, docs, None, True, query=query, http=request, param="documents")).values
        order = sorted(range(len(docs)), key=lambda i: -scored[i][0])[:top]
        results = [{"index": i, "relevance_score": scored[i][0], **({"document": {"text": docs[i]}} if keep else {})}
                   for i in order]
        used = sum(t for _, t in scored)
        return JSONResponse({"model": worker.name, "object": "list", "results": results,
                             "usage": {"prompt_tokens": used, "total_tokens": used}})

    async def ollama_embed(request: Request) -> Response:
        """/api/embed: `input` a string or strings; `truncate` (default true) cuts texts to the window."""
        body = await read_json(request)
        worker = state.worker(body.get("model"))
        truncate = flag(body, "truncate", default=True)
        t0 = time.perf_counter()
        if body.get("input") in (None, "", []):  # Ollama's way to load an embedding model: nothing to embed
            dimensions(body.get("dimensions"))  # checked all the same, as Ollama decodes it
            await load_or_unload(worker, request, keep_alive(body.get("keep_alive"), "keep_alive"))
            return JSONResponse({"model": worker.name, "embeddings": []})  # Ollama's: no counts, no durations
        done = await embed(worker, embed_inputs(body.get("input")), dimensions(body.get("dimensions")), truncate,
                           http=request,
                           keep=keep_alive(body.get("keep_alive"), "keep_alive"))
        return JSONResponse({"model": worker.name, "embeddings": [v.vector for v in done.values],
                             "total_duration": int((time.perf_counter() - t0) * NS),
                             "load_duration": int(done.load_s * NS),
                             "prompt_eval_count": sum(v.tokens for v in done.values)})

    async def ollama_embeddings(request: Request) -> Response:
        """/api/embeddings (Ollama's older route): one `prompt`, one `embedding`."""
        body = await read_json(request)
        if "input" in body and "prompt" not in body:  # an OpenAI client given Ollama's /api as its base URL: the
            raise HTTPException(404)  # 404 that names /v1/embeddings, as its other routes get (it loaded the model)
        worker = state.worker(body.get("model"))
        prompt = body.get("prompt")
        if prompt in (None, ""):  # as /api/embed's: loads the model (keep_alive 0 unloads it), embeds nothing
            await load_or_unload(worker, request, keep_alive(body.get("keep_alive"), "keep_alive"))
            return JSONResponse({"embedding": []})
        if not isinstance(prompt, str):  # one text, one vector: a list would be embedded whole for its first
            raise HTTPError(400, "`prompt` must be a string (one text; /api/embed takes several)", param="prompt")
        done = await embed(worker, embed_inputs(prompt, "prompt"), None, True, http=request, param="prompt",
                           keep=keep_alive(body.get("keep_alive"), "keep_alive"))
        return JSONResponse({"embedding": done.values[0].vector})

    return [Route("/v1/embeddings", embeddings, methods=["POST"]), Route("/v1/rerank", rerank, methods=["POST"]),
            Route("/rerank", rerank, methods=["POST"]), Route("/api/embed", ollama_embed, methods=["POST"]),
            Route("/api/embeddings", ollama_embeddings, methods=["POST"])]


def embed_inputs(raw: Any, param: str = "input") -> list[str]:
    """An embeddings request's input: a string or a non-empty list of strings (token arrays are refused)."""
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise HTTPError(400, f"`{param}` must be a string or a non-empty list of strings", param=param)
    if len(texts) > MAX_INPUTS:
        raise HTTPError(400, f"at most {MAX_INPUTS:,} inputs in one request, not {len(texts):,}", param=param)
    if any(not t for t in texts):
        raise HTTPError(400, "an empty string has no embedding", param=param)
    return texts


def dimensions(raw: object) -> int | None:
    """OpenAI's `dimensions`: a positive integer, or absent."""
    if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int) or raw < 1):
        raise HTTPError(400, "`dimensions` must be a positive integer", param="dimensions")
    return raw


@dataclass(frozen=True)
class Embedded:
    """An embedding job's result: the Embeddings (or (score, tokens) pairs), and the seconds it spent loading
    the model (0 when it was loaded)."""

    values: list[Any]
    load_s: float


async def embed(worker: Served, texts: list[str], dimensions: int | None = None, truncate: bool = False,
                query: str | None = None, http: Request | None = None, keep: float | None = None,
                pooling: str | None = None, param: str = "input") -> Embedded:
    """Embed (or with a query, rerank) on the worker's thread, a slice at a time between decoding steps; the
    result, or an HTTPError. A client that disconnects (`http`) or a handler cancelled stops the job at its
    next slice. `keep`: Ollama's keep_alive, applied once the job ends. `pooling`: the pooling the vectors must
    have been made with (a collection's), else a 400. `param`: the field the texts came in (a 400's param, with
    the text's index)."""
    import asyncio

    most = CHARS_PER_TOKEN * worker.n_ctx
    if truncate:  # cut first to the characters that hold the window's tokens (none is longer than CHARS_PER_TOKEN):
        texts = [t[:most] for t in texts]  # the rest would be tokenized for nothing, then cut
    for i, t in enumerate(texts):  # refused before it is tokenized: too long for the window
        said = param if len(texts) == 1 else f"{param}[{i}]"
        if not truncate and len(t) > most:
            raise HTTPError(400, f"`{said}` is {len(t):,} characters; a slot's window of {worker.n_ctx:,} tokens "
                                 f"takes at most {most:,} here", param=said, overflow=(0, worker.n_ctx), chars=len(t))
    job = EmbedJob(texts, asyncio.get_running_loop(), dimensions, truncate, query, keep_alive=keep, pooling=pooling)
    result = await await_embed(worker, job, http)
    if isinstance(result, Failed):
        raise _named(http_error(result), result.item, param, len(texts))
    return Embedded(list(result), job.load_s)


def _named(e: HTTPError, item: int | None, param: str, count: int) -> HTTPError:
    """An error about one of the texts, naming it as the request sent it (`input[2]`, or `input` for one text) in
    its message and param, where the model's thread said "a text" or "a document"."""
    if item is None:
        return e
    said = param if count == 1 else f"{param}[{item}]"
    e.param = said
    for words in ("a text ", "a document "):
        if e.message.startswith(words):
            e.message = f"`{said}` " + e.message[len(words):]
    return e
