"""OpenAI's Responses API, as Codex and the Agents SDK speak it: POST /v1/responses (whole, or streamed as
the `response.*` events) and GET/DELETE /v1/responses/{id}. A thin adapter: `instructions` and `input` items
become the chat messages, tools and settings every route uses (the same tool plans, grammars and reasoning
split as /v1/chat/completions), and the answer's pieces become output items. With `store` (on unless false)
a response and its conversation are kept (serve/responsestore.py) for `previous_response_id` to continue."""

from __future__ import annotations

import asyncio
import json
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
from localgen.serve.responseitems import Items, Shape, usage
from localgen.serve.responsestore import MAX_CONVERSATION_CHARS, ResponseStore, check_metadata, default_path
from localgen.serve.tooling import apply_plan, stream_for, tool_plan
from localgen.tools.stream import AnswerStream
from localgen.types import GenerationRequest, thinking_args

# the sampling fields chat completions reads (settings.py's table), and the Responses API's own max_output_tokens
FIELDS = {**settings.spellings("openai"), "max_output_tokens": "max_tokens"}
# reasoning.effort: none and minimal turn the template's thinking off, the others on
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# `include` values a client may send (the SDK's ResponseIncludable): accepted, and nothing is added for them
INCLUDABLE = ("file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
              "message.input_image.image_url", "computer_call_output.output.image_url",
              "code_interpreter_call.outputs", "reasoning.encrypted_content", "message.output_text.logprobs")


def routes(state: ServeState) -> list[Route]:
    """The Responses routes; the store is opened on first use."""
    store = ResponseStore(default_path())

    async def create(request: Request) -> Response:
        return await _create(state, store, request, await read_json(request))

    async def get(request: Request) -> Response:
        ident = request.path_params["ident"]
        found = await asyncio.to_thread(store.load, ident)
        if found is None:
            raise _not_found(ident)
        return JSONResponse(found.response)

    async def delete(request: Request) -> Response:
        ident = request.path_params["ident"]
        if not await asyncio.to_thread(store.delete, ident):
            raise _not_found(ident)
        return JSONResponse({"id": ident, "object": "response.deleted", "deleted": True})

    return [Route("/v1/responses", create, methods=["POST"]),
            Route("/v1/responses/{ident}", get, methods=["GET"]),
            Route("/v1/responses/{ident}", delete, methods=["DELETE"])]


def _not_found(ident: str) -> HTTPError:
    return HTTPError(404, f"Response with id '{ident}' not found.", "invalid_request_error", "response_id")


async def _create(state: ServeState, store: ResponseStore, http: Request, body: dict[str, Any]) -> Response:
    worker = state.worker(body.get("model"))
    keep = body.get("store", True)
    if not isinstance(keep, bool):
        raise HTTPError(400, "store must be true or false", param="store")
    history = await _history(store, body.get("previous_response_id"))
    request, conversation = await _request(state, worker, body, history)
    if keep and len(json.dumps(conversation, ensure_ascii=False)) > MAX_CONVERSATION_CHARS:
        raise HTTPError(400, f"the conversation is over {MAX_CONVERSATION_CHARS:,} characters, more than a stored "
                             "response may hold: send it with store: false", param="store")
    plan = await tool_plan(worker, _tools(body.get("tools")), _choice(body.get("tool_choice")),
                           body.get("parallel_tool_calls"))
    request = apply_plan(plan, request)
    answer = stream_for(worker, plan, request)
    shape = Shape(body, str(body.get("model") or worker.name), request, store if keep else None, conversation)
    if not body.get("stream"):
        watch = stream_for(worker, plan, request) if plan is not None else None
        _, final = await run_whole(worker, request, http, watch=watch)
        answer.feed(final.text)
        answer.finish()
        doc = shape.whole(final, answer)
        await shape.keep(doc, answer)
        return JSONResponse(doc)
    job, first = await run_job(worker, request)
    return StreamingResponse(_sse(shape, job, first, answer), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _history(store: ResponseStore, previous: Any) -> list[dict[str, Any]]:
    """The conversation a previous response ended (its instructions are not carried over, as OpenAI's are not)."""
    if previous is None:
        return []
    if not isinstance(previous, str) or not previous:
        raise HTTPError(400, "previous_response_id must be a response's id", param="previous_response_id")
    found = await asyncio.to_thread(store.load, previous)
    if found is None:
        raise HTTPError(400, f"Previous response with id '{previous}' not found.", param="previous_response_id")
    return found.conversation


async def _request(state: ServeState, worker: Any, body: dict[str, Any],
                   history: list[dict[str, Any]]) -> tuple[GenerationRequest, list[dict[str, Any]]]:
    """The generation request, and the conversation (without instructions) a stored response keeps."""
    _check_options(body)
    values = {ours: body[theirs] for theirs, ours in FIELDS.items() if theirs in body}
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise HTTPError(400, "max_output_tokens must be a positive integer", param="max_output_tokens")
    grammar = await _text_format(body.get("text"))
    enable_thinking = _effort(body.get("reasoning"))
    effort_budget(values, body["reasoning"].get("effort") if enable_thinking else None)
    raw = [*history, *_input_messages(body.get("input"), history)]
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise HTTPError(400, "instructions must be a string", param="instructions")
    lead = [{"role": "system", "content": instructions}] if instructions else []
    msgs = await read_messages([*lead, *raw], state.allow_image_urls)
    check_prompt_size(worker, [m["content"] for m in msgs])
    args = thinking_args(enable_thinking)
    request = GenerationRequest(messages=msgs, sampling=sampling(state, worker, values, grammar), template_args=args)
    return request, list(msgs[len(lead):])


def _check_options(body: dict[str, Any]) -> None:
    """The fields that change nothing here, checked: a value this server cannot honour is a 400."""
    check_metadata(body.get("metadata"), body.get("user"))  # what a stored response keeps beside its conversation
    truncation = body.get("truncation")
    if truncation not in (None, "disabled"):
        raise HTTPError(400, "truncation: only \"disabled\" is served: a conversation longer than the model's "
                             "window is an error, never cut", param="truncation")
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or any(i not in INCLUDABLE for i in include)):
        raise HTTPError(400, f"include must be a list of: {', '.join(INCLUDABLE)}", param="include")
    for key in ("background", "conversation", "prompt"):
        if body.get(key):
            raise HTTPError(400, f"`{key}` is not supported by this server", param=key)


async def _text_format(text: Any) -> str | None:
    """text.format: text, json_object (any JSON object) or json_schema (its schema as a grammar)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise HTTPError(400, "text must be an object", param="text")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return await schema_grammar("json", "text.format")
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        if not isinstance(fmt.get("schema"), dict):
            raise HTTPError(400, "text.format of type json_schema needs its schema", param="text.format.schema")
        return await schema_grammar(fmt["schema"], "text.format.schema")
    raise HTTPError(400, "text.format.type must be text, json_object or json_schema", param="text.format")


def _effort(reasoning: Any) -> bool | None:
    """reasoning.effort as the template's thinking switch (None: the template's own default)."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise HTTPError(400, "reasoning must be an object", param="reasoning")
    effort = reasoning.get("effort")
    if effort is None:
        return None
    if effort not in EFFORTS:
        raise HTTPError(400, f"reasoning.effort must be one of {', '.join(EFFORTS)}", param="reasoning.effort")
    return effort not in ("none", "minimal")


def _input_messages(raw: Any, history: list[dict[str, Any]] | tuple[()] = ()) -> list[dict[str, Any]]:
    """`input` (a string, or items) as chat messages: message items by role, function_call items as an
    assistant's tool_calls, function_call_output items as tool messages; reasoning items are dropped."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise HTTPError(400, "input must be a string or a non-empty list of items", param="input")
    out: list[dict[str, Any]] = []
    # call_id → the tool's name (from this input or the conversation it continues), for the output answering it
    names = {c["id"]: c["function"]["name"] for m in history for c in m.get("tool_calls") or ()}
    for item in raw:
        if not isinstance(item, dict):
            raise HTTPError(400, "each input item must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item))
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(args, str):
                raise HTTPError(400, "a function_call item needs call_id, name and arguments (a JSON string)",
                                param="input")
            names[call_id] = name
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and isinstance(last["content"], str):
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if isinstance(output, list):
                output = "".join(_text(p) for p in output)
            if not isinstance(call_id, str) or not isinstance(output, str):
                raise HTTPError(400, "a function_call_output item needs call_id and output (a string)", param="input")
            msg = {"role": "tool", "tool_call_id": call_id, "content": output}
            if call_id in names:
                msg["name"] = names[call_id]
            out.append(msg)
        elif kind == "reasoning":
            continue
        else:
            raise HTTPError(400, f"input items of type {kind!r} are not served here (message, function_call, "
                                 "function_call_output and reasoning are)", param="input")
    return out


def _message(item: dict[str, Any]) -> dict[str, Any]:
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "assistant", "system", "developer"):
        raise HTTPError(400, "a message item needs a role: user, assistant, system or developer", param="input")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise HTTPError(400, "a message item's content must be a string or a list of parts", param="input")
    parts: list[dict[str, Any]] = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in ("input_text", "output_text"):
            parts.append({"type": "text", "text": _text(p)})
        elif kind == "input_image" and isinstance(p, dict) and isinstance(p.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": p["image_url"]}})
        elif kind == "input_image":
            raise HTTPError(400, "an input_image part needs an image_url (a data: URI or a URL); file_id is not "
                                 "served here", param="input")
        elif kind == "refusal":
            continue
        else:
            raise HTTPError(400, f"content parts of type {kind!r} are not served here (input_text, input_image "
                                 "and output_text are)", param="input")
    if all(p["type"] == "text" for p in parts):
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _text(part: Any) -> str:
    if not isinstance(part, dict) or not isinstance(part.get("text"), str):
        raise HTTPError(400, "a text part needs its text", param="input")
    return str(part["text"])


def _tools(raw: Any) -> Any:
    """Function tools as chat completions' (the tool plan reads those)."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise HTTPError(400, "tools must be a list", param="tools")
    out = []
    for t in raw:
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            raise HTTPError(400, f"only function tools are served here, not {kind!r}", param="tools")
        assert isinstance(t, dict)
        fn = {"name": t.get("name"), "description": t.get("description") or "",
              "parameters": t.get("parameters") or {"type": "object", "properties": {}}}
        out.append({"type": "function", "function": fn})
    return out


def _choice(raw: Any) -> Any:
    """tool_choice: auto, none, required, or {"type": "function", "name"} as chat completions' names it."""
    if raw is None or raw in ("auto", "none", "required"):
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("name"), str):
        return {"type": "function", "function": {"name": raw["name"]}}
    raise HTTPError(400, "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}",
                    param="tool_choice")


async def _sse(shape: Shape, job: Any, first: Any, answer: AnswerStream) -> AsyncIterator[bytes]:
    items = Items(shape)
    yield items.event("response.created", response=shape.response("in_progress", []))
    yield items.event("response.in_progress", response=shape.response("in_progress", []))
    async for event in events(job, first):
        if isinstance(event, Text):
            for chunk in items.events(watch_repeats(job, answer, event.text)):
                yield chunk
            continue
        if isinstance(event, Failed):  # after the stream began: the response fails, with its error
            e = http_error(event)
            error = {"code": "server_error" if e.status >= 500 else "invalid_prompt", "message": e.message}
            for chunk in items.close("incomplete"):  # what was said so far stays in the output
                yield chunk
            yield items.event("response.failed", response=shape.response("failed", items.output, error=error))
            return
        for chunk in items.events(answer.finish()):
            yield chunk
        c = event.completion
        status = shape.status(c, bool(items.calls))
        if items.kind is None and not items.output:  # an empty answer is one empty message
            for chunk in items.open("message"):
                yield chunk
        for chunk in items.close(status):
            yield chunk
        doc = shape.response(status, items.output, usage(c))
        await shape.keep(doc, answer)
        yield items.event(f"response.{status}", response=doc)
