"""Embeddings and rerank requests for both APIs: their inputs checked, and the job run on the model's
worker a slice at a time between decoding steps (engine/embed.py's EmbedTask), stopped when the client
leaves."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from localgen.errors import LocalgenError
from localgen.serve.apierror import HTTPError, http_error
from localgen.serve.jobs import EmbedJob, Failed
from localgen.serve.pipeline import check_prompt_size
from localgen.serve.running import watch_disconnect
from localgen.serve.served import Served

MAX_INPUTS = 2048  # texts in one embeddings request (OpenAI's bound)


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


async def embed(worker: Served, texts: list[str], dimensions: Any = None, truncate: bool = False,
                query: str | None = None, http: Request | None = None) -> list[Any]:
    """Embed (or with a query, rerank) on the worker's thread, a slice at a time between decoding steps; the
    Embeddings (or (score, tokens) pairs), or an HTTPError. A client that disconnects (`http`) or a handler
    cancelled stops the job at its next slice."""
    import asyncio

    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise HTTPError(400, "`dimensions` must be a positive integer", param="dimensions")
    for t in texts:
        check_prompt_size(worker, [t])
    job = EmbedJob(texts, asyncio.get_running_loop(), dimensions, truncate, query)
    try:
        worker.submit(job)
    except LocalgenError as e:
        raise HTTPError(503, e.message, "server_error") from None
    watcher = asyncio.ensure_future(watch_disconnect(http, job)) if http is not None else None
    try:
        result = await job.result
    finally:
        if watcher is not None:
            watcher.cancel()
        job.cancelled.set()  # a no-op once done; stops the job at its next slice when the handler was cancelled
    if isinstance(result, Failed):
        raise http_error(result)
    return list(result)
