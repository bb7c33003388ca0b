"""Loading a model on a client's word, generating nothing: llama-server's POST /models/load and Ollama's
/api/chat or /api/generate with no messages or prompt. The answer waits for the load, and says why it failed
(no room, more than --max-memory, a broken file) instead of claiming a load that did not happen. A client
that leaves meanwhile cancels the load's job (a 499), before anything is unloaded to make room for it."""

from __future__ import annotations

import asyncio

from starlette.requests import Request

from localgen.errors import LocalgenError
from localgen.serve.jobs import Job
from localgen.serve.running import first_event, refused
from localgen.serve.served import Served
from localgen.types import GenerationRequest, SamplingParams


async def load_now(worker: Served, http: Request) -> None:
    """Load the model now: a job told to finish before its first step, so loading is all it does (and, as it
    answers nothing, its tokens are counted nowhere); an HTTPError when it cannot load, or the client left."""
    job = Job(GenerationRequest(prompt=" ", sampling=SamplingParams(max_tokens=1)), asyncio.get_running_loop(),
              stream=False, answers=False)
    job.finish.set()
    try:
        worker.submit(job)
    except LocalgenError as e:  # a full queue, a worker that has stopped, a model being deleted
        raise refused(e) from None
    await first_event(job, http)
