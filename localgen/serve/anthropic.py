"""Anthropic's Messages API, as Claude Code and the `anthropic` SDK speak it: POST /v1/messages (whole or
streamed as Anthropic's events) and /v1/messages/count_tokens. A thin adapter: the request becomes the chat
messages, tools and settings every route uses (the same tool plans, grammars and reasoning split as
/v1/chat/completions), and the answer's pieces become Anthropic's content blocks."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localgen.serve.common import (
    HTTPError,
    ServeState,
    anthropic_error,
    check_prompt_size,
    effort_budget,
    events,
    http_error,
    read_json,
    run_job,
    run_whole,
    sampling,
    schema_grammar,
    watch_repeats,
)
from localgen.serve.incoming import read_messages
from localgen.serve.jobs import Failed, Text
from localgen.serve.tooling import apply_plan, stream_for, tool_plan
from localgen.tools.spec import ToolCall
from localgen.tools.stream import AnswerStream, Piece
from localgen.types import GenerationRequest, thinking_args

# Anthropic's fields → our settings (temperature, top_p and top_k arrive from older clients, or extra_body)
FIELDS = {"max_tokens": "max_tokens", "stop_sequences": "stop", "temperature": "temperature", "top_p": "top_p",
          "top_k": "top_k"}
EFFORTS = ("low", "medium", "high", "xhigh", "max")
def routes(state: ServeState) -> list[Route]:
    """The Messages routes."""

    async def messages(request: Request) -> Response:
        return await _messages(state, request, await read_json(request))

    async def count_tokens(request: Request) -> Response:
        body = await read_json(request)
        worker = _worker(state, body.get("model"))
        req = await _request(state, worker, body, counting=True)
        plan = await tool_plan(worker, _tools(body.get("tools")), *_choice(body.get("tool_choice")))
        req = apply_plan(plan, req)
        _, done = await run_whole(worker, req, request)  # nothing to generate: the prompt is only tokenized
        return JSONResponse({"input_tokens": done.prompt_tokens})

    return [Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"])]


def _worker(state: ServeState, name: Any) -> Any:
    """The model asked for; a claude-* name (what Claude Code asks for unless told) that is not a model here
    is the server's default model (its one -m model, or the default one)."""
    if isinstance(name, str) and name.startswith("claude-") and name not in state.workers:
        try:
            return state.worker(name)
        except HTTPError:
            return state.worker(None)
    return state.worker(name)


async def _messages(state: ServeState, http: Request, body: dict[str, Any]) -> Response:
    worker = _worker(state, body.get("model"))
    request = await _request(state, worker, body)
    plan = await tool_plan(worker, _tools(body.get("tools")), *_choice(body.get("tool_choice")))
    request = apply_plan(plan, request)
    answer = stream_for(worker, plan, request)
    shape = _Shape(f"msg_{uuid.uuid4().hex[:24]}", str(body.get("model") or worker.name), request.sampling.stop)
    if not body.get("stream"):
        watch = stream_for(worker, plan, request) if plan is not None else None
        _, final = await run_whole(worker, request, http, watch=watch)
        answer.feed(final.text)
        answer.finish()
        return JSONResponse(shape.whole(final, answer))
    job, first = await run_job(worker, request)
    return StreamingResponse(_sse(shape, job, first, answer), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _request(state: ServeState, worker: Any, body: dict[str, Any], counting: bool = False) -> GenerationRequest:
    max_tokens = body.get("max_tokens")
    if not counting and max_tokens is None:
        raise HTTPError(400, "max_tokens: Field required", param="max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise HTTPError(400, "max_tokens must be a positive integer", param="max_tokens")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise HTTPError(400, "metadata must be an object", param="metadata")
    values = {ours: body[theirs] for theirs, ours in FIELDS.items() if theirs in body}
    if counting:
        values["max_tokens"] = 0  # the prompt is tokenized and nothing evaluated
    grammar, enable_thinking = await _output_config(body.get("output_config"))
    thinking = _thinking(body.get("thinking"))
    if thinking is not None:
        enable_thinking = thinking
        budget = body["thinking"].get("budget_tokens")
        if isinstance(budget, int) and not isinstance(budget, bool):
            values.setdefault("reasoning_budget", budget)
    config = body.get("output_config")
    effort_budget(values, config.get("effort") if isinstance(config, dict) else None)
    msgs = await read_messages(_chat_messages(body.get("system"), body.get("messages")), state.allow_image_urls)
    check_prompt_size(worker, [m["content"] for m in msgs])
    args = thinking_args(enable_thinking)
    return GenerationRequest(messages=msgs, sampling=sampling(state, worker, values, grammar), template_args=args)


async def _output_config(config: Any) -> tuple[str | None, bool | None]:
    """output_config's format (a JSON schema for the answer: a grammar) and effort (which asks for thinking
    unless it is low)."""
    if config is None:
        return None, None
    if not isinstance(config, dict):
        raise HTTPError(400, "output_config must be an object", param="output_config")
    grammar = None
    fmt = config.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise HTTPError(400, "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                            param="output_config.format")
        grammar = await schema_grammar(fmt["schema"], "output_config.format")
    effort = config.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise HTTPError(400, f"output_config.effort must be one of {', '.join(EFFORTS)}", param="output_config.effort")
    return grammar, None if effort is None else True


def _thinking(config: Any) -> bool | None:
    """`thinking`: enabled (with budget_tokens), adaptive or disabled → the template's thinking switch."""
    if config is None:
        return None
    kind = config.get("type") if isinstance(config, dict) else None
    if kind not in ("enabled", "adaptive", "disabled"):
        raise HTTPError(400, "thinking.type must be enabled, adaptive or disabled", param="thinking")
    if kind == "enabled":
        budget = config.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise HTTPError(400, "thinking.budget_tokens must be a positive integer", param="thinking.budget_tokens")
    return bool(kind != "disabled")


def _chat_messages(system: Any, raw: Any) -> list[dict[str, Any]]:
    """Anthropic's system and messages as the chat messages every route uses: text and image blocks become
    content parts, tool_use blocks an assistant's tool_calls, tool_result blocks tool messages (ahead of the
    user's text that came with them); thinking blocks from earlier turns are dropped."""
    out: list[dict[str, Any]] = []
    if system is not None:
        if isinstance(system, list):
            system = "".join(_text_of(b, "system") for b in system)
        if not isinstance(system, str):
            raise HTTPError(400, "system must be a string or a list of text blocks", param="system")
        if system:
            out.append({"role": "system", "content": system})
    if not isinstance(raw, list) or not raw:
        raise HTTPError(400, "messages must be a non-empty list", param="messages")
    for m in raw:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise HTTPError(400, "each message needs a role: user or assistant", param="messages")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise HTTPError(400, "message content must be a string or a list of content blocks", param="messages")
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": _text_of(block, "messages")})
            elif kind == "image":
                parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"))}})
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                    raise HTTPError(400, "a tool_use block needs a name and an input object", param="messages")
                calls.append({"id": str(block.get("id") or f"toolu_{len(calls)}"), "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
            elif kind == "tool_result" and m["role"] == "user":
                out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                            "content": _result_text(block)})
            elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
                continue
            else:
                raise HTTPError(400, f"a {m['role']} message cannot hold a {kind!r} block here", param="messages")
        if parts or calls or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            msg: dict[str, Any] = {"role": m["role"], "content": parts}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _text_of(block: Any, param: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise HTTPError(400, "a text block needs its text", param=param)
    return str(block["text"])


def _image_url(source: Any) -> str:
    """An image block's source as the URL the media reader takes (a base64 source as a data: URI)."""
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    raise HTTPError(400, "an image block's source must be base64 (media_type, data) or a url", param="messages")


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        content = "".join(_text_of(b, "messages") for b in content if not (isinstance(b, dict) and
                                                                            b.get("type") == "image"))
    if not isinstance(content, str):
        raise HTTPError(400, "a tool_result's content must be a string or text blocks", param="messages")
    return f"Error: {content}" if block.get("is_error") else content


def _tools(raw: Any) -> Any:
    """Anthropic's tools as OpenAI's (the tool plan reads those)."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise HTTPError(400, "tools must be a list", param="tools")
    out = []
    for t in raw:
        if not isinstance(t, dict) or t.get("type", "custom") != "custom":
            kind = t.get("type") if isinstance(t, dict) else None
            raise HTTPError(400, f"only custom tools (name, input_schema) are served here, not {kind!r}", param="tools")
        fn = {"name": t.get("name"), "description": t.get("description", ""), "parameters": t.get("input_schema")}
        out.append({"type": "function", "function": fn})
    return out


def _choice(raw: Any) -> tuple[Any, bool | None]:
    """tool_choice (auto, any, tool, none) as OpenAI's, and whether calls may come several at once."""
    if raw is None:
        return None, None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise HTTPError(400, "tool_choice.type must be auto, any, tool or none", param="tool_choice")
    assert isinstance(raw, dict)
    parallel = raw.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise HTTPError(400, "disable_parallel_tool_use must be true or false", param="tool_choice")
    if kind == "tool":
        if not isinstance(raw.get("name"), str):
            raise HTTPError(400, "tool_choice of type tool needs the tool's name", param="tool_choice")
        choice: Any = {"type": "function", "function": {"name": raw["name"]}}
    else:
        choice = {"auto": "auto", "any": "required", "none": "none"}[kind]
    return choice, None if parallel is None else not parallel


def _block(piece: Piece | ToolCall) -> dict[str, Any]:
    """The content block a piece of the answer is (empty, as a stream opens one)."""
    if isinstance(piece, ToolCall):
        return {"type": "tool_use", "id": _tool_id(piece), "name": piece.name, "input": {}}
    if piece.kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {"type": "text", "text": ""}


def _tool_id(call: ToolCall) -> str:
    return call.id.replace("call_", "toolu_", 1)


class _Shape:
    """Builds the response objects of one request."""

    def __init__(self, ident: str, model: str, stops: tuple[str, ...]) -> None:
        self.ident, self.model, self.stops = ident, model, stops

    def stop(self, c: Any, calls: bool) -> tuple[str, str | None]:
        """stop_reason and stop_sequence (which one is known when only one was given)."""
        if calls:
            return "tool_use", None
        if c.finish_reason == "stop" and self.stops:
            return "stop_sequence", self.stops[0] if len(self.stops) == 1 else None
        return ("max_tokens" if c.finish_reason in ("length", "context") else "end_turn"), None

    def usage(self, c: Any) -> dict[str, Any]:
        return {"input_tokens": c.prompt_tokens - c.cached_tokens, "output_tokens": c.completion_tokens,
                "cache_read_input_tokens": c.cached_tokens, "cache_creation_input_tokens": 0}

    def message(self, content: list[dict[str, Any]], reason: str | None, sequence: str | None,
                usage: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.ident, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": usage}

    def whole(self, c: Any, answer: AnswerStream) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if answer.reasoning:
            content.append({"type": "thinking", "thinking": answer.reasoning, "signature": ""})
        if answer.content or not (answer.calls or answer.reasoning):  # an empty answer is one empty text block
            content.append({"type": "text", "text": answer.content})
        content += [{"type": "tool_use", "id": _tool_id(t), "name": t.name, "input": t.args} for t in answer.calls]
        return self.message(content, *self.stop(c, bool(answer.calls)), self.usage(c))


def _event(kind: str, doc: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **doc}, ensure_ascii=False).encode() + \
        b"\n\n"


class _Blocks:
    """The stream's content blocks: a piece of another kind than the open block's closes it and opens its own."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None
        self.calls = 0

    def events(self, pieces: list[Any]) -> list[bytes]:
        out: list[bytes] = []
        for p in pieces:
            block = _block(p)
            if isinstance(p, ToolCall) or block["type"] != self.kind:
                out += self.close()
                self.index += 1
                self.kind = block["type"]
                out.append(_event("content_block_start", {"index": self.index, "content_block": block}))
            if isinstance(p, ToolCall):
                self.calls += 1
                delta = {"type": "input_json_delta", "partial_json": p.arguments}
            elif p.kind == "reasoning":
                delta = {"type": "thinking_delta", "thinking": p.text}
            else:
                delta = {"type": "text_delta", "text": p.text}
            out.append(_event("content_block_delta", {"index": self.index, "delta": delta}))
        return out

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":
            out.append(_event("content_block_delta", {"index": self.index,
                                                      "delta": {"type": "signature_delta", "signature": ""}}))
        out.append(_event("content_block_stop", {"index": self.index}))
        self.kind = None
        return out


async def _sse(shape: _Shape, job: Any, first: Any, answer: AnswerStream) -> AsyncIterator[bytes]:
    # the prompt's tokens are counted once the answer ends: message_delta's usage carries them
    yield _event("message_start", {"message": shape.message([], None, None, {"input_tokens": 0, "output_tokens": 0})})
    yield _event("ping", {})
    blocks = _Blocks()
    async for event in events(job, first):
        if isinstance(event, Text):
            for chunk in blocks.events(watch_repeats(job, answer, event.text)):
                yield chunk
            continue
        if isinstance(event, Failed):  # after the answer began: Anthropic's error event ends the stream
            e = http_error(event)
            yield _event("error", {"error": anthropic_error(e.status, e.message)["error"]})
            return
        for chunk in blocks.events(answer.finish()):
            yield chunk
        if blocks.index < 0:  # an empty answer is one empty text block
            for chunk in blocks.events([Piece("content", "")]):
                yield chunk
        for chunk in blocks.close():
            yield chunk
        c = event.completion
        reason, sequence = shape.stop(c, blocks.calls > 0)
        usage = shape.usage(c)
        yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage})
        yield _event("message_stop", {})

