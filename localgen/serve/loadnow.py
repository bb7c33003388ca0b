"""Loading a model on a client's word, generating nothing: llama-server's POST /models/load and Ollama's /api/chat,
/api/generate, /api/embed or /api/embeddings with nothing to do. The answer waits for the load, and says why it
failed (no room, more than --max-memory, a broken file) instead of claiming a load that did not happen. A client
that leaves meanwhile cancels the load's job (a 499), before anything is unloaded to make room for it."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request

from localgen.errors import LocalgenError
from localgen.serve.apierror import http_error
from localgen.serve.jobs import EmbedJob, Failed, Job
from localgen.serve.running import await_embed, first_event, refused
from localgen.serve.served import Served
from localgen.types import GenerationRequest, SamplingParams


async def load_now(worker: Served, http: Request) -> None:
    """Load the model now: a job told to finish before its first step, so loading is all it does (and, as it
    answers nothing, its tokens are counted nowhere); an HTTPError when it cannot load, or the client left. A model
    made for embeddings (an encoder, a GGUF naming its pooling) loads by an embeddings job of no texts (a
    reranker's, of no documents): a generation job is refused there ("an encoder model: ... not text")."""
    from localgen.serve.model import embeds, reranks

    ref = getattr(worker, "ref", None)  # (a remote model has none: it loads on its own server)
    if ref is not None and embeds(ref):
        await _load_embedder(worker, http, query="" if reranks(ref) else None)  # a reranker's scorer
        return
    job = Job(GenerationRequest(prompt=" ", sampling=SamplingParams(max_tokens=1)), asyncio.get_running_loop(),
              stream=False, answers=False)
    job.finish.set()
    try:
        worker.submit(job)
    except LocalgenError as e:  # a full queue, a worker that has stopped, a model being deleted
        raise refused(e) from None
    await first_event(job, http)


async def _load_embedder(worker: Served, http: Request, query: str | None) -> None:
    """An embeddings job of no texts: the model loads, its embeddings context made, and nothing is encoded."""
    result = await await_embed(worker, EmbedJob([], asyncio.get_running_loop(), query=query), http)
    if isinstance(result, Failed):
        raise http_error(result)


async def load_or_unload(worker: Served, http: Request, ttl: float | None) -> None:
    """Ollama's request with nothing to do, by its keep_alive: 0 unloads the model (once its jobs end; an idle one
    at once), any other loads it now (an HTTPError saying why it cannot) and keeps it that long from then on."""
    if ttl:  # 0 unloads this once: the model keeps its keep-alive for when it loads again
        worker.keep_alive = ttl
    if ttl == 0:
        unloaded = worker.request_unload(by_keep_alive=time.perf_counter())
        if not worker.busy:
            await asyncio.to_thread(unloaded.wait, 10)
    else:
        await load_now(worker, http)
