"""OpenAI's API, as llama-server and vLLM speak it: /v1/models, /v1/chat/completions, /v1/completions,
streaming as server-sent events, `usage` (also in the last chunk with stream_options.include_usage),
llama-server's `timings`, logprobs, response_format mapped to a grammar, tools and tool_calls (streamed as
deltas), and reasoning apart in `reasoning_content`."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localgen import settings
from localgen.serve.common import (
    HTTPError,
    ServeState,
    check_prompt_size,
    effort_budget,
    events,
    exact_field,
    http_error,
    read_json,
    run_job,
    run_whole,
    sampling,
    schema_grammar,
    timings,
    watch_repeats,
)
from localgen.serve.embeds import embed, embed_inputs
from localgen.serve.incoming import read_messages
from localgen.serve.jobs import Event, Failed, Text
from localgen.serve.tooling import apply_plan, stream_for, tool_plan
from localgen.tools.stream import AnswerStream, Piece
from localgen.types import GenerationRequest, thinking_args

# OpenAI's fields, then llama-server's extensions under their own names → our settings (settings.py's table)
FIELDS = settings.spellings("openai")
UNSUPPORTED = ("functions", "function_call", "prediction")
# Names the chat template's renderer sets itself (engine/template.py's render(), and `tools` from the
# request's own field): chat_template_kwargs may not replace them.
TEMPLATE_OWN = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                "strftime_now")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
# chat_template_kwargs that templates test for truth: "no" would be taken as yes
TEMPLATE_BOOLS = ("enable_thinking", "thinking")


def routes(state: ServeState) -> list[Route]:
    """The /v1 routes."""

    async def models(request: Request) -> Response:
        offered = await asyncio.to_thread(state.offered)  # reads GGUF headers
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": int(state.started), "owned_by": "localgen",
             "max_model_len": state.window(ref, w), **({"default": True} if name == state.default else {})}
            for name, ref, w in offered]})

    async def chat(request: Request) -> Response:
        return await _complete(state, request, await read_json(request), chat=True)

    async def completions(request: Request) -> Response:
        return await _complete(state, request, await read_json(request), chat=False)

    async def embeddings(request: Request) -> Response:
        body = await read_json(request)
        worker = state.worker(body.get("model"))
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise HTTPError(400, "encoding_format must be float or base64", param="encoding_format")
        texts = embed_inputs(body.get("input"))
        vectors = await embed(worker, texts, body.get("dimensions"), http=request)
        data = [{"object": "embedding", "index": i, "embedding": _encoded(v.vector, fmt)}
                for i, v in enumerate(vectors)]
        used = sum(v.tokens for v in vectors)
        return JSONResponse({"object": "list", "data": data, "model": worker.name,
                             "usage": {"prompt_tokens": used, "total_tokens": used}})

    async def rerank(request: Request) -> Response:
        """llama-server's /v1/rerank, in the shape Jina's and Cohere's APIs share: results by relevance."""
        body = await read_json(request)
        worker = state.worker(body.get("model"))
        query = body.get("query")
        if not isinstance(query, str) or not query:
            raise HTTPError(400, "`query` must be a non-empty string", param="query")
        from localgen.serve.common import CHARS_PER_TOKEN

        if len(query) > CHARS_PER_TOKEN * worker.n_ctx:  # bounded before it is tokenized with every document
            raise HTTPError(400, f"`query` is {len(query):,} characters; the reranker's window of {worker.n_ctx:,} "
                                 "tokens cannot hold it", param="query")
        docs = embed_inputs(body.get("documents"), "documents")
        top = body.get("top_n", len(docs))
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise HTTPError(400, "`top_n` must be a positive integer", param="top_n")
        keep = body.get("return_documents", False)
        # documents are cut to fit beside the query; one with no room left is a 400 (embed.py QueryTooLong)
        scored = await embed(worker, docs, None, True, query=query, http=request)
        order = sorted(range(len(docs)), key=lambda i: -scored[i][0])[:top]
        results = [{"index": i, "relevance_score": scored[i][0], **({"document": {"text": docs[i]}} if keep else {})}
                   for i in order]
        used = sum(t for _, t in scored)
        return JSONResponse({"model": worker.name, "object": "list", "results": results,
                             "usage": {"prompt_tokens": used, "total_tokens": used}})

    return [Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/v1/rerank", rerank, methods=["POST"]), Route("/rerank", rerank, methods=["POST"])]


def _encoded(vec: list[float], fmt: str) -> Any:
    from localgen.embeddings.store import b64

    return vec if fmt == "float" else b64(vec)


async def _request(state: ServeState, worker: Any, body: dict[str, Any], chat: bool) -> GenerationRequest:
    for key in UNSUPPORTED:
        if body.get(key):
            raise HTTPError(400, f"`{key}` is not supported by this server", param=key)
    _check_text_output(body)
    n = body.get("n", 1)
    if n != 1:
        raise HTTPError(400, "only n=1 is supported: send the request n times (they run in parallel slots)",
                        param="n")
    values = {ours: body[theirs] for theirs, ours in FIELDS.items() if theirs in body}
    effort_budget(values, body.get("reasoning_effort"))
    grammar = None
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        grammar = await schema_grammar(spec.get("schema", spec) if isinstance(spec, dict) else None)
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        grammar = await schema_grammar(fmt.get("schema", "json"))
    elif fmt not in (None, {"type": "text"}) and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise HTTPError(400, "response_format must be text, json_object or json_schema", param="response_format")
    logprobs = None
    if body.get("logprobs"):
        top = body.get("top_logprobs", 0) if chat else body.get("logprobs")
        top = 0 if top is True else top
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise HTTPError(400, "top_logprobs must be an integer from 0 to 20", param="top_logprobs")
        logprobs = top
    s = sampling(state, worker, values, grammar)
    exact = exact_field(body, "exact")
    if chat:
        msgs = await read_messages(body.get("messages"), state.allow_image_urls)
        check_prompt_size(worker, [m["content"] for m in msgs])
        return GenerationRequest(messages=msgs, sampling=s, logprobs=logprobs, exact=exact,
                                 template_args=_template_args(body))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise HTTPError(400, "`prompt` must be a string (one prompt per request)", param="prompt")
    if body.get("echo") or body.get("suffix"):
        raise HTTPError(400, "`echo` and `suffix` are not supported", param="echo")
    check_prompt_size(worker, [prompt])
    return GenerationRequest(prompt=prompt, sampling=s, logprobs=logprobs, exact=exact)


def _check_text_output(body: dict[str, Any]) -> None:
    """`modalities` may ask for text (OpenAI's clients send ["text"]); audio output is a 400."""
    mods = body.get("modalities")
    if mods is not None and (not isinstance(mods, list) or not all(isinstance(m, str) for m in mods)):
        raise HTTPError(400, "`modalities` must be a list of strings, such as [\"text\"]", param="modalities")
    other = [m for m in mods or () if m != "text"]
    if other:
        raise HTTPError(400, f"this server answers in text only: `modalities` cannot ask for "
                             f"{', '.join(repr(m) for m in other)}", param="modalities")
    if body.get("audio"):
        raise HTTPError(400, "this server answers in text only: `audio` (spoken output) is not supported",
                        param="audio")


def _template_args(body: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Template variables a request may set: chat_template_kwargs (llama-server's and vLLM's field), with
    enable_thinking, which reasoning templates read."""
    name = "chat_template_kwargs"
    kwargs = body.get(name)
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise HTTPError(400, f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}",
                        param="reasoning_effort")
    if kwargs is None:  # the effort turns the template's thinking switch: none and minimal off, the rest on
        return thinking_args(None if effort is None else effort not in ("none", "minimal"))
    if not isinstance(kwargs, dict):
        raise HTTPError(400, f"`{name}` must be an object of template variables", param=name)
    for key, value in kwargs.items():
        if key in TEMPLATE_OWN:
            raise HTTPError(400, f"`{name}.{key}` cannot be set: the server gives the chat template this "
                                 "variable itself", param=f"{name}.{key}")
        if key in TEMPLATE_BOOLS and not isinstance(value, bool):
            raise HTTPError(400, f"`{name}.{key}` must be true or false, not {json.dumps(value)[:40]}",
                            param=f"{name}.{key}")
        if not isinstance(value, (bool, int, float, str)):
            raise HTTPError(400, f"`{name}.{key}` must be a string, a number or true/false", param=f"{name}.{key}")
    if effort is not None:
        kwargs = {"enable_thinking": effort not in ("none", "minimal"), **kwargs}  # an explicit switch wins
    return tuple(sorted(kwargs.items()))


async def _complete(state: ServeState, http: Request, body: dict[str, Any], chat: bool) -> Response:
    worker = state.worker(body.get("model"))
    ttl = _ttl(body.get("ttl"))
    request = await _request(state, worker, body, chat)
    plan = None
    if chat:
        plan = await tool_plan(worker, body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
        request = apply_plan(plan, request)
    split = body.get("reasoning_format", "auto") != "none"
    answer = stream_for(worker, plan, request, split) if chat else None
    ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    shape = _Shape(ident, worker.name, chat, request.logprobs is not None)
    if not body.get("stream"):
        watch = stream_for(worker, plan, request, split) if plan is not None else None
        _, final = await run_whole(worker, request, http, ttl, watch)
        return JSONResponse(shape.whole(final, final.text, answer))
    job, first = await run_job(worker, request, ttl)
    opts = body.get("stream_options") or {}
    usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    return StreamingResponse(_sse(shape, job, first, usage, answer), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _ttl(value: Any) -> float | None:
    """LM Studio's `ttl`: seconds the model stays loaded once idle after this request (as Ollama's keep_alive)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise HTTPError(400, "`ttl` must be a number of seconds, 0 or more", param="ttl")
    return float(value)


def _deltas(pieces: list[Any], calls: list[Any]) -> list[dict[str, Any]]:
    """A chat stream's deltas for what the answer stage gave out: content, reasoning_content, and each tool
    call as OpenAI streams one (id, name and empty arguments first, then the arguments)."""
    out: list[dict[str, Any]] = []
    for p in pieces:
        if isinstance(p, Piece):
            out.append({"content": p.text} if p.kind == "content" else {"reasoning_content": p.text})
            continue
        index = len(calls)
        calls.append(p)
        out.append({"tool_calls": [{"index": index, "id": p.id, "type": "function",
                                    "function": {"name": p.name, "arguments": ""}}]})
        out.append({"tool_calls": [{"index": index, "function": {"arguments": p.arguments}}]})
    return out


async def _sse(shape: _Shape, job: Any, first: Event, usage: bool,
               answer: AnswerStream | None) -> AsyncIterator[bytes]:
    calls: list[Any] = []
    if shape.chat:
        yield _data(shape.chunk({"role": "assistant", "content": ""}, None))
    async for event in events(job, first):
        if isinstance(event, Text):
            if answer is None:
                yield _data(shape.chunk({"content": event.text} if shape.chat else event.text, None))
                continue
            for delta in _deltas(watch_repeats(job, answer, event.text), calls):
                yield _data(shape.chunk(delta, None))
            continue
        if isinstance(event, Failed):  # after the first token: OpenAI's error event, then [DONE] as after any end
            e = http_error(event)
            yield _data({"error": {"message": e.message, "type": e.kind, "param": None, "code": e.status}})
            continue  # the job's last event
        if answer is not None:
            for delta in _deltas(answer.finish(), calls):
                yield _data(shape.chunk(delta, None))
        c = event.completion
        last = shape.chunk({} if shape.chat else "", "tool_calls" if calls else _finish(c.finish_reason), c)
        last["timings"] = _timings(c)
        yield _data(last)
        if usage:
            yield _data({**shape.head(), "choices": [], "usage": _usage(c)})
    yield b"data: [DONE]\n\n"


def _data(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, ensure_ascii=False).encode() + b"\n\n"


def _finish(reason: str) -> str:
    return {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}.get(reason, "stop")


def _usage(c: Any) -> dict[str, Any]:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": c.cached_tokens}}


def _timings(c: Any) -> dict[str, Any]:
    return timings(c)


class _Shape:
    """Builds the response objects of one request."""

    def __init__(self, ident: str, model: str, chat: bool, logprobs: bool) -> None:
        self.ident, self.model, self.chat, self.logprobs = ident, model, chat, logprobs
        self.created = int(time.time())
        self._sent = 0  # logprobs already sent in stream chunks

    def head(self) -> dict[str, Any]:
        return {"id": self.ident, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model}

    def chunk(self, delta: Any, finish: str | None, done: Any = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.chat:
            choice["delta"] = delta
        else:
            choice["text"] = delta
        if done is not None and self.logprobs:
            choice["logprobs"] = self._logprobs(done.logprobs)
        return {**self.head(), "choices": [choice]}

    def whole(self, c: Any, text: str, answer: AnswerStream | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(c.finish_reason),
                                  "logprobs": self._logprobs(c.logprobs) if self.logprobs else None}
        if self.chat and answer is not None:
            answer.feed(text)
            answer.finish()
            message: dict[str, Any] = {"role": "assistant", "content": answer.content or None}
            if answer.reasoning:
                message["reasoning_content"] = answer.reasoning
            if answer.calls:
                message["tool_calls"] = [call.to_openai() for call in answer.calls]
                choice["finish_reason"] = "tool_calls"
            elif message["content"] is None:
                message["content"] = ""
            choice["message"] = message
        elif self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {"id": self.ident, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": _usage(c),
                "timings": _timings(c)}

    def _logprobs(self, items: list[Any]) -> dict[str, Any]:
        if self.chat:
            return {"content": [t.to_dict() for t in items]}
        return {"tokens": [t.text for t in items], "token_logprobs": [t.logprob for t in items],
                "top_logprobs": [{a: lp for a, lp in t.top} for t in items]}
