"""OpenAI's Responses API, as Codex and the Agents SDK speak it: POST /v1/responses (whole, or streamed as
the `response.*` events: serve/responseitems.py) and GET/DELETE /v1/responses/{id}. `instructions` and
`input` items are read into the pipeline's Ask (the same messages, tool plans and grammars as every route).
With `store` (on unless false) a response and its conversation are kept (serve/responsestore.py, which
also answers GET and DELETE) for `previous_response_id` to continue."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from localgen.serve import filesearch
from localgen.serve.apierror import HTTPError
from localgen.serve.ask import (
    Ask,
    Schema,
    flag,
    optional_object,
    positive_int,
    sampling_values,
    split_reasoning,
)
from localgen.serve.jsonbody import read_json
from localgen.serve.pipeline import Made, check_prompt_size, handle
from localgen.serve.responseitems import DECLINED, Encoder, new_id, replayed_answers
from localgen.serve.responsestore import MAX_CONVERSATION_CHARS, ResponseStore, check_metadata, default_path
from localgen.serve.responsestore import routes as store_routes
from localgen.serve.schema import MAX_SCHEMA_CHARS
from localgen.serve.servelog import LOG
from localgen.serve.state import ServeState
from localgen.serve.tooling import MAX_TOOLS, checked_tool

# reasoning.effort: none and minimal turn the template's thinking off, the others on
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# the fields of `reasoning` and `text`, with their enums (OpenAI's; None: any value, checked where it is used)
SUMMARIES = ("auto", "concise", "detailed")
REASONING_FIELDS: dict[str, tuple[str, ...] | None] = {"effort": EFFORTS, "summary": SUMMARIES,
                                                       "generate_summary": SUMMARIES}  # the older name of summary
TEXT_FIELDS: dict[str, tuple[str, ...] | None] = {"format": None, "verbosity": ("low", "medium", "high")}
FORMAT_FIELDS = ("type", "name", "schema", "description", "strict")
FORMAT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# `include` values a client may send (the SDK's ResponseIncludable): accepted, and nothing is added for them
INCLUDABLE = ("file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
              "message.input_image.image_url", "computer_call_output.output.image_url",
              "code_interpreter_call.outputs", "reasoning.encrypted_content", "message.output_text.logprobs")


# The messages at the end of a request's conversation that are its own input: set by parse, read by the encoder
# of the same request, which keeps their count with the response (GET .../input_items lists those messages), and
# the messages themselves where truncation folded some of them away.
INPUTS: ContextVar[list[dict[str, Any]] | None] = ContextVar("localgen_responses_inputs", default=None)


def routes(state: ServeState) -> list[Route]:
    """POST /v1/responses (a request with an mcp tool answered over rounds: serve/responsemcp.py), and the
    stored responses' GET and DELETE; the store is opened on first use."""
    from localgen.serve import responsemcp

    store = ResponseStore(default_path())
    api = Responses(store, state)

    async def endpoint(request: Request) -> Response:
        body = await read_json(request)
        if responsemcp.wanted(body):
            return await responsemcp.respond(state, request, api, body)
        return await handle(state, request, api, body)

    return [Route("/v1/responses", endpoint, methods=["POST"]), *store_routes(store)]


class Responses:
    """POST /v1/responses in the pipeline's terms."""

    claude = False

    def __init__(self, store: ResponseStore, state: ServeState) -> None:
        self.store, self.state = store, state

    async def parse(self, body: dict[str, Any]) -> Ask:
        flag(body, "store", default=True)
        if body.get("store") is not False:  # a store that cannot keep the answer: said before it is made
            await asyncio.to_thread(self.store.check)
        history = await self._history(body.get("previous_response_id"))
        _check_options(body)
        positive_int(body, "max_output_tokens")
        reasoning = optional_object(body, "reasoning") or {}
        thinking = _effort(reasoning)
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise HTTPError(400, "instructions must be a string", param="instructions")
        lead = [{"role": "system", "content": instructions}] if instructions else []
        inputs = _input_messages(body.get("input"), history)
        INPUTS.set(inputs)
        messages = [*lead, *history, *inputs]
        searching = _file_search(self.state, body.get("tools"))
        choice, tools = _choice(body.get("tool_choice")), _tools(body.get("tools"))
        filesearch.SEARCHED.set(None)
        filesearch.SENT.set(())
        excerpts = None
        if searching is not None and choice != "none":  # the stores searched for the question (placed by the
            # pipeline, as many as the window holds); no tool runs with tool_choice none. A prompt that cannot fit
            # is refused before any embedding, as the pipeline would refuse it after
            check_prompt_size(self.state.worker(body.get("model")), messages, fit=body.get("truncation") == "auto",
                              param="input")
            excerpts = await filesearch.run(self.state, searching, messages, len(lead) + len(history),
                                            "file_search_call.results" in (body.get("include") or []), new_id("fs"))
        if searching is not None and choice == "required" and tools is None:  # file_search ran: nothing more to call
            choice = None
        return Ask(values=sampling_values(body, "responses"), excerpts=excerpts,
                   conversation="input", schema=_text_format(body.get("text")), fit=body.get("truncation") == "auto",
                   messages=messages,
                   tools=tools, tool_choice=choice,
                   parallel_tool_calls=flag(body, "parallel_tool_calls", default=True), thinking=thinking,
                   effort=reasoning.get("effort") if thinking else None, split_reasoning=split_reasoning(body),
                   stream=flag(body, "stream"))

    def encoder(self, body: dict[str, Any], ask: Ask, made: Made) -> Encoder:
        keep = body.get("store") is not False
        conversation = list(made.messages[1 if body.get("instructions") else 0:])  # without the instructions
        if keep and len(json.dumps(conversation, ensure_ascii=False)) > MAX_CONVERSATION_CHARS:
            raise HTTPError(400, f"the conversation is over {MAX_CONVERSATION_CHARS:,} characters, more than a "
                                 "stored response may hold: send it with store: false", param="store")
        inputs = INPUTS.get()
        return Encoder(body, str(body.get("model") or made.model), made.request, self.store if keep else None,
                       conversation, inputs=-1 if inputs is None else len(inputs), searched=filesearch.SEARCHED.get(),
                       sent=filesearch.SENT.get(), given=inputs if made.folded else None)

    async def _history(self, previous: Any) -> list[dict[str, Any]]:
        """The conversation a previous response ended (its instructions are not carried over, as OpenAI's
        are not)."""
        if previous is None:
            return []
        if not isinstance(previous, str) or not previous:
            raise HTTPError(400, "previous_response_id must be a response's id", param="previous_response_id")
        found = await asyncio.to_thread(self.store.load, previous)
        if found is None:
            raise HTTPError(400, f"Previous response with id '{_cut(previous)}' not found.",
                            param="previous_response_id")
        return found.conversation


def _check_options(body: dict[str, Any]) -> None:
    """The fields that change nothing here, checked: a value this server cannot honour is a 400."""
    check_metadata(body.get("metadata"), body.get("user"))  # what a stored response keeps beside its conversation
    _check_echoed(body)
    if body.get("truncation") not in (None, "disabled", "auto"):
        raise HTTPError(400, "truncation must be \"auto\" or \"disabled\"", param="truncation")
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or any(i not in INCLUDABLE for i in include)):
        raise HTTPError(400, f"include must be a list of: {', '.join(INCLUDABLE)}", param="include")
    top = body.get("top_logprobs")  # no log-probabilities come back here (`logprobs` is []), but OpenAI's bound holds
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise HTTPError(400, "top_logprobs must be an integer from 0 to 20", param="top_logprobs")  # as chat's
    for key in ("background", "conversation", "prompt"):
        if flag(body, key) if key == "background" else body.get(key):  # background: a true/false field
            raise HTTPError(400, f"`{key}` is not supported by this server", param=key)


def _check_echoed(body: dict[str, Any]) -> None:
    """What the response object echoes (and the store keeps) as OpenAI checks it: `reasoning` and `text` hold
    only their known fields, each a word of its enum, and text.format's name, description and strict are
    bounded; so no echoed field is larger than the prompt, the schema or metadata already allow."""
    for key, fields in (("reasoning", REASONING_FIELDS), ("text", TEXT_FIELDS)):
        given = optional_object(body, key) or {}
        for name, value in given.items():
            param = f"{key}.{name}"
            if name not in fields:
                raise HTTPError(400, f"Unknown parameter: '{param[:100]}'.", param=param[:100])
            allowed = fields[name]
            if allowed and value is not None and value not in allowed:
                raise HTTPError(400, f"Invalid value for '{param}': it must be one of {', '.join(allowed)}.",
                                param=param)
    fmt = (body.get("text") or {}).get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise HTTPError(400, "text.format must be an object", param="text.format")
    for field in fmt:
        if field not in FORMAT_FIELDS:
            raise HTTPError(400, f"Unknown parameter: 'text.format.{field[:100]}'.",
                            param=f"text.format.{field[:100]}")
    label = fmt.get("name")
    if label is not None and not (isinstance(label, str) and FORMAT_NAME.fullmatch(label)):
        raise HTTPError(400, "text.format.name must be letters, digits, '_' and '-', at most 64",
                        param="text.format.name")
    description = fmt.get("description")
    if description is not None and not (isinstance(description, str) and len(description) <= MAX_SCHEMA_CHARS):
        raise HTTPError(400, f"text.format.description must be a string of at most {MAX_SCHEMA_CHARS:,} characters",
                        param="text.format.description")
    if fmt.get("strict") not in (None, True, False):
        raise HTTPError(400, "text.format.strict must be true or false", param="text.format.strict")


def _text_format(text: Any) -> Schema | None:
    """text.format: text, json_object (any JSON object) or json_schema (its schema)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise HTTPError(400, "text must be an object", param="text")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return Schema("json", "text.format")
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        if not isinstance(fmt.get("schema"), dict):
            raise HTTPError(400, "text.format of type json_schema needs its schema", param="text.format.schema")
        return Schema(fmt["schema"], "text.format.schema")
    raise HTTPError(400, "text.format.type must be text, json_object or json_schema", param="text.format")


def _effort(reasoning: Mapping[str, Any] | None) -> bool | None:
    """reasoning.effort as the template's thinking switch (None: the template's own default)."""
    effort = reasoning.get("effort") if reasoning else None
    if effort is None:
        return None
    if effort not in EFFORTS:
        raise HTTPError(400, f"reasoning.effort must be one of {', '.join(EFFORTS)}", param="reasoning.effort")
    return effort not in ("none", "minimal")


def _input_messages(raw: Any, history: list[dict[str, Any]] | tuple[()] = ()) -> list[dict[str, Any]]:
    """`input` (a string, or items) as chat messages: message items by role, function_call items as an
    assistant's tool_calls, function_call_output items as tool messages; reasoning items are dropped."""
    if isinstance(raw, str) and raw:
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise HTTPError(400, "input must be a non-empty string or a non-empty list of items", param="input")
    out: list[dict[str, Any]] = []
    # call_id → the tool's name (from this input or the conversation it continues), for the output answering it
    names = {c["id"]: c["function"]["name"] for m in history for c in m.get("tool_calls") or ()}
    replayed = replayed_answers(raw)
    left_out: set[Any] = set()  # the call_ids of namespace calls left out: their outputs go with them
    for at, item in enumerate(raw):
        if not isinstance(item, dict):
            raise HTTPError(400, "each input item must be an object", param="input")
        kind = item.get("type", "message")
        if kind in ("function_call", "function_call_output") and (
                item.get("namespace") is not None or (isinstance(item.get("call_id"), str)
                                                      and item["call_id"] in left_out)):
            if kind == "function_call" and isinstance(item.get("call_id"), str):
                left_out.add(item["call_id"])
            continue  # a call or output of a namespace's tool (Codex's own, with or without a call_id):
            # namespaces are left out of what the model is offered (_tools)
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
            if call_id not in names:  # as OpenAI answers it: no call of this conversation has that id
                raise HTTPError(400, f"No tool call found for function call output with call_id {call_id[:100]!r}",
                                param="input")
            out.append({"role": "tool", "tool_call_id": call_id, "content": output, "name": names[call_id]})
        elif kind in ("mcp_call", "mcp_approval_request"):  # an mcp tool's call, answered or waiting
            _mcp_call(item, out, names)
        elif kind in ("mcp_approval_response", "mcp_list_tools"):  # read by serve/responsemcp.py
            _mcp_checked(item)
            if at < replayed and kind == "mcp_approval_response" and not item["approve"]:  # a refusal answered in
                # an earlier turn (its history sent back): what the model was told then
                ident = item["approval_request_id"]
                out.append({"role": "tool", "tool_call_id": ident, "content": DECLINED,
                            **({"name": names[ident]} if ident in names else {})})
        elif kind != "reasoning":
            raise HTTPError(400, f"input items of type {kind!r} are not served here (message, function_call, "
                                 "function_call_output, reasoning and the mcp tool's items are)", param="input")
    return out


def _mcp_call(item: dict[str, Any], out: list[dict[str, Any]], names: dict[str, str]) -> None:
    """An earlier mcp_call (its output or error as the tool's message) or mcp_approval_request (a call that waits
    for its mcp_approval_response) as an assistant's tool call; its id is the call's."""
    ident, name, args = item.get("id"), item.get("name"), item.get("arguments", "{}")
    if not isinstance(ident, str) or not isinstance(name, str) or not isinstance(args, str):
        raise HTTPError(400, f"an {item.get('type')} item needs id, name and arguments (a JSON string)", param="input")
    names[ident] = name
    asked = item.get("approval_request_id")
    if item.get("type") == "mcp_call" and isinstance(asked, str) and asked in names:  # the approved call's result
        # answers its mcp_approval_request, the call the model made (not a second one)
        ident = asked
    else:
        call = {"id": ident, "type": "function", "function": {"name": name, "arguments": args}}
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    if item.get("type") == "mcp_call":
        said = item.get("output") if item.get("error") is None else json.dumps(item.get("error"), ensure_ascii=False)
        out.append({"role": "tool", "tool_call_id": ident, "name": name, "content": str(said or "")})


def _mcp_checked(item: dict[str, Any]) -> None:
    """An mcp_approval_response or mcp_list_tools input item's fields, checked (serve/responsemcp.py reads them)."""
    if item.get("type") == "mcp_list_tools":
        if not isinstance(item.get("server_label"), str):
            raise HTTPError(400, "an mcp_list_tools item needs its server_label", param="input")
    elif not isinstance(item.get("approval_request_id"), str) or not isinstance(item.get("approve"), bool):
        raise HTTPError(400, "an mcp_approval_response item needs approval_request_id and approve (true or false)",
                        param="input")


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
        elif kind != "refusal":
            raise HTTPError(400, f"content parts of type {kind!r} are not served here (input_text, input_image "
                                 "and output_text are)", param="input")
    if all(p["type"] == "text" for p in parts):
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _text(part: Any) -> str:
    if not isinstance(part, dict) or not isinstance(part.get("text"), str):
        raise HTTPError(400, "a text part needs its text", param="input")
    return str(part["text"])


def _file_search(state: ServeState, raw: Any) -> filesearch.FileSearch | None:
    """The request's file_search tool, checked (at most one: it names every store to search)."""
    found = [t for t in raw if isinstance(t, dict) and t.get("type") == "file_search"] if isinstance(raw, list) else []
    if len(found) > 1:
        raise HTTPError(400, "at most one file_search tool: list every store in its vector_store_ids", param="tools")
    return filesearch.tool(state, found[0]) if found else None


# The Responses API's tool types that the client runs but not as a function call: a model offered none of them
# could not call them, so they are refused rather than left out
CLIENT_RUN = ("custom", "local_shell", "shell", "apply_patch", "computer_use_preview", "computer_use")


def _tools(raw: Any) -> Any:
    """Function tools as chat completions' (the tool plan reads those); file_search is the server's own. A tool
    the client runs in another shape (CLIENT_RUN: a freeform `custom` tool, a shell) is a 400 naming its type, as
    the agent would otherwise lose it unawares; any other type (a hosted one such as web_search, which the server
    cannot run, or a namespace of tools, whose calls a client names in a way chat templates have no place for) is
    left out of what the model is offered: Codex sends both by default, and a request refused over them would end
    every turn."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise HTTPError(400, "tools must be a list", param="tools")
    if len(raw) > MAX_TOOLS:  # every type counted, before any is read (chat completions' limit, tool_plan)
        raise HTTPError(400, f"`tools` holds {len(raw):,} tools; at most {MAX_TOOLS:,} in one request", param="tools")
    out = []
    for i, t in enumerate(raw):
        kind = t.get("type") if isinstance(t, dict) else None
        if not isinstance(kind, str):
            raise HTTPError(400, f"tools[{i}] needs a type", param=f"tools[{i}].type")
        if kind in CLIENT_RUN:
            raise HTTPError(400, f"only function, file_search and mcp tools are served here, not {kind!r}",
                            param="tools")
        if kind in ("file_search", "mcp"):  # the server's own (serve/responsemcp.py reads mcp tools)
            continue
        if kind != "function":  # a hosted tool or a namespace: said once in serve's log, not to the client
            LOG.get().once(f"responses-tool:{kind[:40]}", f"/v1/responses leaves out tools of type {kind[:40]!r}: "
                           "the model is offered only function, file_search and mcp tools")
            continue
        assert isinstance(t, dict)
        if t.get("strict") not in (None, True, False):  # echoed as given
            raise HTTPError(400, "a tool's strict must be true or false", param="tools")
        checked_tool(t, i, "parameters")
        fn = {"name": t.get("name"), "description": t.get("description") or "",
              "parameters": t.get("parameters") or {"type": "object", "properties": {}}}
        out.append({"type": "function", "function": fn})
    return out if out or not raw else None  # file_search, mcp or hosted tools alone: no function tools


def _choice(raw: Any) -> Any:
    """tool_choice: auto, none, required, or {"type": "function", "name"} as chat completions' names it; an mcp
    tool's choice, {"type": "mcp", "server_label"[, "name"]}, as it is (serve/responsemcp.py names the tool)."""
    if raw is None or raw in ("auto", "none", "required"):
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("name"), str):
        return {"type": "function", "function": {"name": raw["name"]}}
    if isinstance(raw, dict) and raw.get("type") == "mcp" and isinstance(raw.get("server_label"), str) \
            and isinstance(raw.get("name"), (str, type(None))):
        return raw
    raise HTTPError(400, "tool_choice must be auto, none, required, {\"type\": \"function\", \"name\": ...} or "
                         "{\"type\": \"mcp\", \"server_label\": ...}", param="tool_choice")


def _cut(text: str, most: int = 100) -> str:
    """A client's string as an error echoes it: at most `most` characters."""
    return text if len(text) <= most else text[:most] + "..."
