"""Ollama's fit of a prompt past a slot's window (its `truncate`, on unless a request sends false), as Ollama's
server (server/prompt.go, chatPrompt) and runner do it: /api/chat's conversation leaves out its oldest messages
until its prompt fits, keeping the system messages and the latest message, and never a tool's result without
the assistant turn that called it; a prompt that still does not fit (the latest message alone is too long, or
/api/generate's prompt) is cut to the window, its first `num_keep` tokens kept and then its end
(serve/prepare.py's cut). The server's log says so in one line, as Ollama's "truncating input prompt"."""

from __future__ import annotations

import dataclasses

from starlette.requests import Request

from localgen.serve.apierror import HTTPError
from localgen.serve.fitting import least
from localgen.serve.running import run_whole
from localgen.serve.served import Served
from localgen.serve.tooling import apply_plan
from localgen.tools.plan import ToolPlan
from localgen.types import GenerationRequest, Message

TRIM_WINDOWS = 4  # a prompt to fit is at most this many times a window's bounds by its characters (pipeline.py):
# leaving out messages costs a tokenization of what is left for each try, cutting one costs one


async def trimmed(worker: Served, request: GenerationRequest, plan: ToolPlan | None, http: Request,
                  keep_alive: float | None, tokens: int, chat: bool) -> GenerationRequest:
    """The request whose prompt of `tokens` tokens is past a slot's window, fitted as Ollama fits it: `chat`, its
    oldest messages left out (the fewest that make it fit; where none do, all but the system messages and the
    latest); then, where it is still too long, cut by the model's thread (the request's truncate_keep)."""
    window = worker.n_ctx
    messages = list(request.messages)
    counted: dict[int, int | None] = {0: tokens}

    async def count(start: int) -> int | None:
        """The prompt's tokens from `start` on (None: the template refused it so, which no fit takes)."""
        if start not in counted:
            kept = dataclasses.replace(request, messages=tuple(_kept(messages, start)),
                                       sampling=dataclasses.replace(request.sampling, max_tokens=0))
            try:
                _, done = await run_whole(worker, apply_plan(plan, kept), http, keep_alive, answers=False)
                counted[start] = done.prompt_tokens
            except HTTPError as e:
                if e.status != 400:
                    raise
                counted[start] = None
        return counted[start]

    async def fits(start: int) -> bool:
        n = await count(start)
        return n is not None and n < window  # a token of room at least, for the answer

    start, kept = 0, len(messages)
    if chat and len(messages) > 1:  # the fewest oldest messages whose leaving out makes it fit (Ollama's first)
        start = await least(len(messages) - 1, fits)
        request = dataclasses.replace(request, messages=tuple(_kept(messages, start)))
        kept = len(request.messages)
    now = await count(start)
    _log(worker, tokens, now if now is not None else tokens, len(messages) - kept, request.truncate_keep)
    return request


def _begin(messages: list[Message], i: int) -> int:
    """Where a conversation kept from message `i` begins: at the assistant turn whose calls a tool's result at `i`
    answers (Ollama's toolBlockStartIndex), never at the result alone."""
    if i <= 0 or i >= len(messages) or messages[i]["role"] != "tool":
        return i
    start = i
    while start > 0 and messages[start - 1]["role"] == "tool":
        start -= 1
    call = start - 1
    return call if call >= 0 and messages[call]["role"] == "assistant" and messages[call].get("tool_calls") else i


def _kept(messages: list[Message], i: int) -> list[Message]:
    """The conversation kept from message `i` on: the system messages before it, then the rest."""
    start = _begin(messages, i)
    return [m for m in messages[:start] if m["role"] == "system"] + messages[start:]


def _log(worker: Served, tokens: int, now: int, dropped: int, keep: int | None) -> None:
    """The server's line for a prompt fitted to the window (Ollama's words and numbers)."""
    from localgen.serve.servelog import LOG

    window = worker.n_ctx
    cut = now >= window
    new = window - 1 if cut else now
    text = (f"{worker.name}: truncating input prompt: limit={window} prompt={tokens}"
            + (f" keep={keep}" if cut else "") + f" new={new}"
            + (f" ({dropped} oldest message{'s' if dropped != 1 else ''} left out)" if dropped else ""))
    LOG.get().event("truncated", worker.name, text, limit=window, prompt=tokens, keep=keep if cut else None,
                    new=new, dropped=dropped)
