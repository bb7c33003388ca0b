"""Ollama's native API, enough for the official `ollama` Python client and front-ends that speak only Ollama:
/api/chat and /api/generate (NDJSON streaming; durations in nanoseconds; keep_alive), /api/tags, /api/ps,
/api/version (/api/show and the routes that manage models: serve/manage.py)."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from localgen import settings
from localgen.errors import LocalgenError
from localgen.serve.common import (
    HTTPError,
    ServeState,
    check_prompt_size,
    effort_budget,
    events,
    exact_field,
    read_json,
    run_job,
    run_whole,
    sampling,
    schema_grammar,
    watch_repeats,
)
from localgen.serve.embeds import embed, embed_inputs
from localgen.serve.incoming import read_messages
from localgen.serve.jobs import Done, Event, Text, parse_duration
from localgen.serve.loadnow import load_now
from localgen.serve.tooling import apply_plan, stream_for, tool_plan
from localgen.tools.stream import AnswerStream, Piece
from localgen.types import GenerationRequest, ModelRef, thinking_args

# Ollama's `options` → our settings (settings.py's table; llama-server's names for what Ollama lacks)
OPTIONS = settings.spellings("ollama")
IGNORED = settings.OLLAMA_LOAD_OPTIONS  # load-time: `serve` loaded the model before any request


def routes(state: ServeState) -> list[Route]:
    """The /api routes."""

    async def root(request: Request) -> Response:
        return PlainTextResponse("Ollama is running (localgen)")

    async def version(request: Request) -> Response:
        import localgen

        return JSONResponse({"version": localgen.__version__})

    async def tags(request: Request) -> Response:
        offered = await asyncio.to_thread(state.offered)  # reads GGUF headers
        return JSONResponse({"models": [_model_entry(name, ref) for name, ref, _ in offered]})

    async def ps(request: Request) -> Response:
        return JSONResponse({"models": [{**_model_entry(w.name, w.ref), "size": w.need or w.ref.summary.file_size,
                                         "expires_at": _expires(w), "size_vram": w.vram_bytes,
                                         "context_length": w.n_ctx}
                                        for w in list(state.workers.values()) if w.loaded]})

    async def chat(request: Request) -> Response:
        return await _generate(state, request, await read_json(request), chat=True)

    async def generate(request: Request) -> Response:
        return await _generate(state, request, await read_json(request), chat=False)

    async def embed_route(request: Request) -> Response:
        """/api/embed: `input` a string or strings; `truncate` (default true) cuts texts to the window."""
        body = await read_json(request)
        worker = state.worker(body.get("model"))
        truncate = body.get("truncate", True)
        if not isinstance(truncate, bool):
            raise HTTPError(400, "`truncate` must be true or false")
        t0 = time.perf_counter()
        vectors = await embed(worker, embed_inputs(body.get("input")), body.get("dimensions"), truncate, http=request)
        ns = 1_000_000_000
        return JSONResponse({"model": worker.name, "embeddings": [v.vector for v in vectors],
                             "total_duration": int((time.perf_counter() - t0) * ns), "load_duration": 0,
                             "prompt_eval_count": sum(v.tokens for v in vectors)})

    async def embeddings_legacy(request: Request) -> Response:
        """/api/embeddings (Ollama's older route): one `prompt`, one `embedding`."""
        body = await read_json(request)
        worker = state.worker(body.get("model"))
        vectors = await embed(worker, embed_inputs(body.get("prompt"), "prompt"), None, True, http=request)
        return JSONResponse({"embedding": vectors[0].vector})

    return [Route("/", root, methods=["GET", "HEAD"]), Route("/api/version", version), Route("/api/tags", tags),
            Route("/api/ps", ps),
            Route("/api/chat", chat, methods=["POST"]), Route("/api/generate", generate, methods=["POST"]),
            Route("/api/embed", embed_route, methods=["POST"]),
            Route("/api/embeddings", embeddings_legacy, methods=["POST"])]


async def _request(state: ServeState, worker: Any, body: dict[str, Any], chat: bool) -> GenerationRequest:
    opts = body.get("options") or {}
    if not isinstance(opts, dict):
        raise HTTPError(400, "`options` must be an object")
    unknown = set(opts) - set(OPTIONS) - IGNORED - {"exact"}
    if unknown:
        raise HTTPError(400, f"unknown options: {', '.join(sorted(unknown))}")
    values = {OPTIONS[k]: v for k, v in opts.items() if k in OPTIONS}
    think = body.get("think")
    if think is not None and not isinstance(think, bool) and think not in ("low", "medium", "high"):
        raise HTTPError(400, "`think` must be true, false, \"low\", \"medium\" or \"high\"")
    effort_budget(values, think)  # a level bounds the thinking as reasoning_effort does
    args = thinking_args(None if think is None else think is not False)
    fmt = body.get("format")
    grammar = await schema_grammar(fmt, "format") if fmt not in (None, "") else None
    s = sampling(state, worker, values, grammar)
    exact = exact_field(opts, "options.exact")
    if chat:
        msgs = await read_messages(body.get("messages"), state.allow_image_urls)
        check_prompt_size(worker, [m["content"] for m in msgs])
        return GenerationRequest(messages=msgs, sampling=s, exact=exact, template_args=args)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise HTTPError(400, "`prompt` must be a string")
    system = body.get("system")
    check_prompt_size(worker, [prompt, system if isinstance(system, str) else ""])
    if body.get("raw") or not worker.ref.summary.chat_template:
        if body.get("images"):
            raise HTTPError(400, "`images` need the model's chat template: they cannot go with a raw prompt"
                            if body.get("raw") else f"{worker.ref.name} has no chat template to place `images` in")
        return GenerationRequest(prompt=prompt, sampling=s, exact=exact)
    head = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
    user: dict[str, Any] = {"role": "user", "content": prompt}
    if body.get("images") is not None:
        user["images"] = body["images"]
        (user,) = await read_messages([user])
    return GenerationRequest(messages=(*head, user), sampling=s, exact=exact, template_args=args)


async def _generate(state: ServeState, http: Request, body: dict[str, Any], chat: bool) -> Response:
    worker = state.worker(body.get("model"))
    keep_alive = None
    if "keep_alive" in body:
        try:
            keep_alive = parse_duration(body["keep_alive"])
        except LocalgenError as e:
            raise HTTPError(400, e.message) from None
    if (chat and body.get("messages") == []) or (not chat and body.get("prompt") in (None, "")):
        # Ollama's way to load (or, with keep_alive 0, unload) a model without generating
        if keep_alive is not None:
            worker.keep_alive = keep_alive
        if keep_alive == 0:  # the worker thread unloads once its jobs end; an idle one at once
            unloaded = worker.request_unload()
            if not worker.busy:
                await asyncio.to_thread(unloaded.wait, 10)
        else:  # loaded now, or the reason it cannot be (no room, over --max-memory), as /models/load says
            await load_now(worker)
        return JSONResponse({**_head(worker), **({"message": {"role": "assistant", "content": ""}} if chat
                                                 else {"response": ""}), "done": True,
                             "done_reason": "unload" if keep_alive == 0 else "load"})
    request = await _request(state, worker, body, chat)
    answer = None
    if chat:
        plan = await tool_plan(worker, body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
        request = apply_plan(plan, request)
        answer = stream_for(worker, plan, request)
    if body.get("stream", True):  # Ollama streams unless told not to
        job, first = await run_job(worker, request, keep_alive)
        return StreamingResponse(_ndjson(worker, job, first, chat, answer), media_type="application/x-ndjson")
    watch = stream_for(worker, plan, request) if answer is not None and plan is not None else None
    job, final = await run_whole(worker, request, http, keep_alive, watch)
    text = final.text
    if answer is None:
        return JSONResponse(_final(worker, job, final, chat, text))
    return JSONResponse(_final(worker, job, final, chat, "", _message(answer.feed(text) + answer.finish())))


def _message(events: list[Any]) -> dict[str, Any]:
    """Ollama's assistant message for what the answer stage gave out: content, thinking, tool_calls (with
    arguments as an object)."""
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    for e in events:
        if isinstance(e, Piece):
            key = "content" if e.kind == "content" else "thinking"
            msg[key] = msg.get(key, "") + e.text
        else:
            msg.setdefault("tool_calls", []).append({"function": {"name": e.name, "arguments": e.args}})
    return msg


async def _ndjson(worker: Any, job: Any, first: Event, chat: bool,
                  answer: AnswerStream | None) -> AsyncIterator[bytes]:
    async for event in events(job, first):
        if isinstance(event, Text):
            if answer is not None:
                pieces = watch_repeats(job, answer, event.text)
                if not pieces:
                    continue
                piece: dict[str, Any] = {"message": _message(pieces)}
            else:
                piece = {"message": {"role": "assistant", "content": event.text}} if chat else {"response": event.text}
            doc = {**_head(worker), **piece, "done": False}
        elif isinstance(event, Done):
            rest = answer.finish() if answer is not None else []
            if rest:
                yield (json.dumps({**_head(worker), "message": _message(rest), "done": False}, ensure_ascii=False)
                       + "\n").encode()
            doc = _final(worker, job, event.completion, chat, "")
        else:  # after the first token: Ollama's error line, which its client raises as a ResponseError
            doc = {"error": event.message}
        yield (json.dumps(doc, ensure_ascii=False) + "\n").encode()


def _final(worker: Any, job: Any, c: Any, chat: bool, text: str,
           message: dict[str, Any] | None = None) -> dict[str, Any]:
    piece = ({"message": message or {"role": "assistant", "content": text}} if chat else {"response": text})
    ns = 1_000_000_000
    total = time.perf_counter() - job.enqueued
    return {**_head(worker), **piece, "done": True,
            "done_reason": "length" if c.finish_reason in ("length", "context") else "stop",
            "total_duration": int(total * ns), "load_duration": int(job.load_s * ns),
            "prompt_eval_count": c.prompt_tokens, "prompt_eval_duration": int(c.prompt_s * ns),
            "eval_count": c.completion_tokens, "eval_duration": int(c.decode_s * ns)}


def _head(worker: Any) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
    return {"model": worker.name, "created_at": now}


def _details(ref: ModelRef) -> dict[str, Any]:
    s = ref.summary
    n = s.n_params
    size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
    return {"format": "gguf", "family": s.architecture, "families": [s.architecture], "parameter_size": size,
            "quantization_level": s.quantization or "", "parent_model": ""}


def _model_entry(name: str, ref: ModelRef) -> dict[str, Any]:
    import os

    try:
        stamp = os.path.getmtime(ref.path)
    except OSError:  # not written yet: an embedded model in chunks, assembled when a request first uses it
        stamp = time.time()
    mtime = datetime.datetime.fromtimestamp(stamp, datetime.UTC).isoformat().replace("+00:00", "Z")
    return {"name": name, "model": name, "modified_at": mtime, "size": ref.summary.file_size,
            "digest": ref.sha256 or "", "details": _details(ref)}


def _expires(worker: Any) -> str:
    when = worker.expires()
    when = when if when is not None else time.time() + 10 * 365 * 86400  # keep-alive -1: never
    return datetime.datetime.fromtimestamp(when, datetime.UTC).isoformat().replace("+00:00", "Z")
