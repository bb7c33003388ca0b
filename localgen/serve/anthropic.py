"""Anthropic's Messages API, as Claude Code and the `anthropic` SDK speak it: POST /v1/messages (whole or
streamed as Anthropic's events) and /v1/messages/count_tokens. Its system, blocks, tools and thinking are
read into the pipeline's Ask (the same messages, tool plans and grammars as every route), and the answer's
pieces become Anthropic's content blocks."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from starlette.routing import Route

from localgen import settings
from localgen.backend import Completion
from localgen.media import Inline
from localgen.serve.apierror import ANTHROPIC, HTTPError, error_body
from localgen.serve.ask import (
    Ask,
    Schema,
    flag,
    one_of,
    optional_object,
    positive_int,
    sampling_values,
    split_reasoning,
)
from localgen.serve.incoming import unanswered
from localgen.serve.jobs import Done, Event, Job, Text
from localgen.serve.pipeline import Made, parts, route
from localgen.serve.state import ServeState
from localgen.serve.tooling import checked_tool
from localgen.tools.spec import ToolCall
from localgen.tools.stream import AnswerStream, Piece
from localgen.tools.stream import Event as Said

EFFORTS = ("low", "medium", "high", "xhigh", "max")
MIN_BUDGET = 1024  # the least thinking.budget_tokens Anthropic's API takes
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # Anthropic's
# an image block's base64 source reaches the media reader as a data: URI: its errors name the block's field
INLINE = Inline(decoded="an image block's source.data", encoded="an image block's source.data",
                instead="send it as a base64 source (source.data)")


def routes(state: ServeState) -> list[Route]:
    """The Messages routes."""
    return [route(state, "/v1/messages", MESSAGES), route(state, "/v1/messages/count_tokens", COUNT)]


class Messages:
    """/v1/messages (or, `counting`, count_tokens: the prompt is tokenized and nothing generated)."""

    claude = True  # a claude-* name not served here is the default model

    def __init__(self, counting: bool) -> None:
        self.counting = counting

    async def parse(self, body: dict[str, Any]) -> Ask:
        most = settings.KNOBS["max_tokens"].hi
        if (positive_int(body, "max_tokens", required=not self.counting) or 0) > (most or 0):  # no -1 here
            raise HTTPError(400, f"max_tokens must be an integer from 1 to {most:,}", param="max_tokens")
        user_id = (optional_object(body, "metadata") or {}).get("user_id")
        if user_id is not None and (not isinstance(user_id, str) or len(user_id) > 256):  # as Anthropic bounds it
            raise HTTPError(400, "metadata.user_id must be a string of at most 256 characters",
                            param="metadata.user_id")
        for key in ("temperature", "top_p"):  # Anthropic's ranges are 0 to 1 (wider elsewhere)
            value = body.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 <= value <= 1):
                raise HTTPError(400, f"{key} must be a number from 0 to 1", param=key)
        values = sampling_values(body, "anthropic")
        stops = body.get("stop_sequences")
        if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)):
            raise HTTPError(400, "stop_sequences must be a list of non-empty strings", param="stop_sequences")
        if self.counting:
            values["max_tokens"] = 0  # the prompt is tokenized and nothing evaluated
        schema, effort = _output_config(body.get("output_config"))
        thinking = _thinking(body.get("thinking"))
        if thinking and body["thinking"]["type"] == "enabled":  # its budget, unless the request set a reasoning_budget
            if isinstance(body.get("max_tokens"), int) and body["thinking"]["budget_tokens"] >= body["max_tokens"]:
                raise HTTPError(400, "max_tokens must be greater than thinking.budget_tokens (Anthropic's rule: the "
                                     "thinking is part of the answer's tokens)", param="thinking.budget_tokens")
            values.setdefault("reasoning_budget", body["thinking"].get("budget_tokens"))
        choice, parallel = _choice(body.get("tool_choice"))
        messages = _chat_messages(body.get("system"), body.get("messages"))
        orphan = unanswered(messages)
        if orphan is not None:  # as Anthropic answers it
            raise HTTPError(400, f"unexpected `tool_use_id` found in `tool_result` blocks: {orphan[1][:100]!r}. Each "
                                 "`tool_result` block must have a corresponding `tool_use` block in the previous "
                                 "message.", param="messages")
        return Ask(values=values,
                   messages=messages, schema=schema,
                   tools=_tools(body.get("tools")), tool_choice=choice, parallel_tool_calls=parallel, effort=effort,
                   thinking=thinking if thinking is not None else (None if effort is None else True),
                   split_reasoning=split_reasoning(body), stream=flag(body, "stream") and not self.counting,
                   inline=INLINE)

    def encoder(self, body: dict[str, Any], ask: Ask, made: Made) -> _Encoder:
        return _Encoder(str(body.get("model") or made.model), made.request.sampling.stop, self.counting)


MESSAGES, COUNT = Messages(counting=False), Messages(counting=True)


def _output_config(config: Any) -> tuple[Schema | None, str | None]:
    """output_config's format (a JSON schema for the answer) and effort (which asks for thinking)."""
    if config is None:
        return None, None
    if not isinstance(config, dict):
        raise HTTPError(400, "output_config must be an object", param="output_config")
    fmt = config.get("format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "json_schema"
                            or not isinstance(fmt.get("schema"), dict)):
        raise HTTPError(400, "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                        param="output_config.format")
    schema = Schema(fmt["schema"], "output_config.format") if fmt is not None else None
    return schema, one_of(config.get("effort"), EFFORTS, "output_config.effort")


def _thinking(config: Any) -> bool | None:
    """`thinking`: enabled (with budget_tokens), adaptive or disabled → the template's thinking switch."""
    if config is None:
        return None
    kind = config.get("type") if isinstance(config, dict) else None
    if kind not in ("enabled", "adaptive", "disabled"):
        raise HTTPError(400, "thinking.type must be enabled, adaptive or disabled", param="thinking")
    if kind == "enabled":
        budget = config.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or not MIN_BUDGET <= budget <= settings.INT32:
            raise HTTPError(400, f"thinking.budget_tokens must be an integer from {MIN_BUDGET:,} to "
                                 f"{settings.INT32:,}, as Anthropic's API takes it (a smaller budget: thinking "
                                 "`adaptive` and llama-server's `reasoning_budget`)", param="thinking.budget_tokens")
    return bool(kind != "disabled")


# Claude Code (2.1.36 on) puts a billing line first in its system prompt, whose `cch=` changes with every request:
# kept, each request's prompt would differ from its first tokens, and no cached prefix would ever be reused
# (llama.cpp #20623, vLLM #36829 leave it out too). It says nothing to the model.
BILLING = "x-anthropic-billing-header:"


def _without_billing(text: str) -> str:
    """`text` without a first line that is Claude Code's billing line."""
    return text.partition("\n")[2] if text.startswith(BILLING) else text


def _chat_messages(system: Any, raw: Any) -> list[dict[str, Any]]:
    """Anthropic's system and messages as the chat messages every route uses: text and image blocks become
    content parts, tool_use blocks an assistant's tool_calls, tool_result blocks tool messages (ahead of the
    user's text that came with them); thinking blocks from earlier turns are dropped."""
    out: list[dict[str, Any]] = []
    if system is not None:
        if isinstance(system, list):
            system = "".join(_without_billing(_text_of(b, "system")) for b in system)
        if not isinstance(system, str):
            raise HTTPError(400, "system must be a string or a list of text blocks", param="system")
        system = _without_billing(system)
    if not isinstance(raw, list) or not raw:
        raise HTTPError(400, "messages must be a non-empty list", param="messages")
    # system messages among the others (Claude Code sends one after the user's): their text is joined to the
    # system prompt, where every chat template takes it (most refuse a system message after the first)
    extra = [_system_text(m.get("content"), i) for i, m in enumerate(raw)
             if isinstance(m, dict) and m.get("role") == "system"]
    system = "\n\n".join(t for t in [system or "", *extra] if t)
    if system:
        out.append({"role": "system", "content": system})
    kept = [i for i, m in enumerate(raw) if not (isinstance(m, dict) and m.get("role") == "system")]
    if not kept:
        raise HTTPError(400, "messages needs a user message besides the system ones", param="messages")
    for i, m in enumerate(raw):
        if isinstance(m, dict) and m.get("role") == "system":
            continue
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise HTTPError(400, "each message needs a role: user, assistant or system", param="messages")
        content = m.get("content")
        if content in ("", []) and not (i == kept[-1] and m["role"] == "assistant"):  # as Anthropic says it
            raise HTTPError(400, f"messages.{i}: all messages must have non-empty content except for the "
                                 "optional final assistant message", param=f"messages.{i}.content")
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
                parts.append(_image_part(block))
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                    raise HTTPError(400, "a tool_use block needs a name and an input object", param="messages")
                calls.append({"id": str(block.get("id") or f"toolu_{len(calls)}"), "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
            elif kind == "tool_result" and m["role"] == "user":
                if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
                    raise HTTPError(400, "a tool_result block needs the tool_use_id of the call it answers",
                                    param="messages")
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": _result(block)})
            elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
                continue
            else:
                raise HTTPError(400, f"a {m['role']} message cannot hold a {kind!r} block here", param="messages")
        if parts or calls or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            msg: dict[str, Any] = {"role": m["role"], "content": parts}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    _check_prefill(out[-1], kept[-1])
    return out


def _check_prefill(last: dict[str, Any], i: int) -> None:
    """A final assistant message is the answer's beginning (the model continues it): ending in whitespace,
    a 400, as Anthropic's API refuses it (the model would go on from a token it never ends a word with)."""
    content = last["content"]
    text = content if isinstance(content, str) else "".join(
        p["text"] for p in content if p.get("type") == "text")
    if last["role"] == "assistant" and text != text.rstrip():
        raise HTTPError(400, "messages: final assistant content cannot end with trailing whitespace",
                        param=f"messages.{i}.content")


def _system_text(content: Any, i: int) -> str:
    """A system message's content (a string or text blocks) as text."""
    if isinstance(content, list):
        return "".join(_text_of(b, f"messages.{i}.content") for b in content)
    if not isinstance(content, str):
        raise HTTPError(400, "a system message's content must be a string or text blocks",
                        param=f"messages.{i}.content")
    return content


def _text_of(block: Any, param: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise HTTPError(400, "a text block needs its text", param=param)
    return str(block["text"])


def _image_part(block: dict[str, Any]) -> dict[str, Any]:
    """An image block as OpenAI's image_url content part."""
    return {"type": "image_url", "image_url": {"url": _image_url(block.get("source"))}}


def _image_url(source: Any) -> str:
    """An image block's source as the URL the media reader takes (a base64 source as a data: URI, which the
    reader's errors name as the block's source.data: INLINE)."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        assert isinstance(source, dict)
        mime, data = source.get("media_type", "image/png"), source.get("data")
        if not isinstance(mime, str) or not re.fullmatch(r"image/[\w.+-]+", mime):
            raise HTTPError(400, f"an image block's source.media_type must be an image type such as "
                                 f"{', '.join(IMAGE_TYPES)}, not {mime!r}", param="messages")
        if not isinstance(data, str) or not data:
            raise HTTPError(400, "an image block's source.data must be the image, base64-encoded", param="messages")
        return f"data:{mime};base64,{data}"
    if kind == "url":
        assert isinstance(source, dict)
        url = source.get("url")
        if not isinstance(url, str) or not re.match(r"https?://.", url, re.I):
            raise HTTPError(400, "an image block's source.url must be an http(s) URL", param="messages")
        return url
    raise HTTPError(400, "an image block's source must be {\"type\": \"base64\", \"media_type\", \"data\"} or "
                         "{\"type\": \"url\", \"url\"}", param="messages")


def _result(block: dict[str, Any]) -> str | list[dict[str, Any]]:
    """A tool_result's content as a tool message's: its text, or its text and image blocks as content parts in
    their order (a screenshot a tool returned reaches the model, as it does Anthropic's)."""
    content = block.get("content", "")
    if isinstance(content, list):
        parts = [_image_part(b) if isinstance(b, dict) and b.get("type") == "image"
                 else {"type": "text", "text": _text_of(b, "messages")} for b in content]
        if any(p["type"] == "image_url" for p in parts):
            if flag(block, "is_error"):
                parts.insert(0, {"type": "text", "text": "Error:"})
            return parts
        content = "".join(str(p["text"]) for p in parts)
    if not isinstance(content, str):
        raise HTTPError(400, "a tool_result's content must be a string, or text and image blocks", param="messages")
    return f"Error: {content}" if flag(block, "is_error") else content


def _tools(raw: Any) -> Any:
    """Anthropic's tools as OpenAI's (the tool plan reads those)."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise HTTPError(400, "tools must be a list", param="tools")
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom":
            kind = t.get("type") if isinstance(t, dict) else None
            raise HTTPError(400, f"only custom tools (name, input_schema) are served here, not {kind!r}", param="tools")
        checked_tool(t, i, "input_schema", required=True)
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


def _block(piece: Said) -> dict[str, Any]:
    """The content block a piece of the answer is (empty, as a stream opens one)."""
    if isinstance(piece, ToolCall):
        return {"type": "tool_use", "id": piece.id.replace("call_", "toolu_", 1), "name": piece.name, "input": {}}
    if piece.kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {"type": "text", "text": ""}


def _event(kind: str, doc: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **doc}, ensure_ascii=False).encode() + \
        b"\n\n"


class _Encoder:
    """One request's message and stream events: a piece of another kind than the open block's (every tool
    call) closes it and opens its own; a whole answer is the same blocks, unstreamed."""

    media_type = "text/event-stream"

    def __init__(self, model: str, stops: tuple[str, ...], counting: bool) -> None:
        self.ident, self.model, self.stops, self.counting = f"msg_{uuid.uuid4().hex[:24]}", model, stops, counting
        self.blocks: list[dict[str, Any]] = []  # the content blocks so far, whole
        self.kind: str | None = None  # the open block's

    def _stop(self, c: Completion) -> dict[str, str | None]:
        """stop_reason and stop_sequence (which one is known when only one was given). An answer the window cut
        (not max_tokens) is Anthropic's model_context_window_exceeded."""
        if c.finish_reason == "context":
            return {"stop_reason": "model_context_window_exceeded", "stop_sequence": None}
        if any(b["type"] == "tool_use" for b in self.blocks) and c.finish_reason != "length":
            return {"stop_reason": "tool_use", "stop_sequence": None}  # (cut by max_tokens: max_tokens, calls or not)
        if c.finish_reason == "stop" and self.stops:
            return {"stop_reason": "stop_sequence", "stop_sequence": self.stops[0] if len(self.stops) == 1 else None}
        return {"stop_reason": "max_tokens" if c.finish_reason == "length" else "end_turn", "stop_sequence": None}

    def _message(self, content: list[dict[str, Any]], stop: dict[str, str | None],
                 usage: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.ident, "type": "message", "role": "assistant", "model": self.model, "content": content,
                **stop, "usage": usage}

    @staticmethod
    def _usage(c: Completion) -> dict[str, Any]:
        return {"input_tokens": c.prompt_tokens - c.cached_tokens, "output_tokens": c.completion_tokens,
                "cache_read_input_tokens": c.cached_tokens, "cache_creation_input_tokens": 0}

    def opening(self, first: Event) -> list[bytes]:
        """message_start, with the prompt's tokens as Anthropic gives them there (a client's context meter reads
        them): the prompt was evaluated before the first event, text or the end, came."""
        if isinstance(first, Done):
            prompt, cached = first.completion.prompt_tokens, first.completion.cached_tokens
        else:
            prompt, cached = (first.prompt_tokens, first.cached) if isinstance(first, Text) else (0, 0)
        usage = {"input_tokens": prompt - cached, "output_tokens": 0, "cache_read_input_tokens": cached,
                 "cache_creation_input_tokens": 0}
        empty: dict[str, str | None] = {"stop_reason": None, "stop_sequence": None}
        return [_event("message_start", {"message": self._message([], empty, usage)}), _event("ping", {})]

    def said(self, pieces: list[Said]) -> list[bytes]:
        out: list[bytes] = []
        for p in pieces:
            block = _block(p)
            if isinstance(p, ToolCall) or block["type"] != self.kind:
                out += self._close()
                self.kind = block["type"]
                out.append(_event("content_block_start", {"index": len(self.blocks), "content_block": block}))
                self.blocks.append(block)
            if isinstance(p, ToolCall):
                block["input"] = p.args
                delta = {"type": "input_json_delta", "partial_json": p.arguments}
            else:
                key = "thinking" if p.kind == "reasoning" else "text"
                self.blocks[-1][key] += p.text
                delta = {"type": f"{key}_delta", key: p.text}
            out.append(_event("content_block_delta", {"index": len(self.blocks) - 1, "delta": delta}))
        return out

    def _close(self) -> list[bytes]:
        if self.kind is None:
            return []
        at = {"index": len(self.blocks) - 1}
        sign = [_event("content_block_delta", {**at, "delta": {"type": "signature_delta", "signature": ""}})]
        self.kind = None
        return [*(sign if self.blocks[-1]["type"] == "thinking" else []), _event("content_block_stop", at)]

    def failed(self, e: HTTPError) -> list[bytes]:  # after the answer began: Anthropic's error event ends it
        return [_event("error", error_body(ANTHROPIC, e))]

    async def done(self, c: Completion, job: Job) -> list[bytes]:
        out = self.said([Piece("content", "")]) if not self.blocks else []  # an empty answer: one empty text block
        return [*out, *self._close(), _event("message_delta", {"delta": self._stop(c), "usage": self._usage(c)}),
                _event("message_stop", {})]

    async def whole(self, c: Completion, job: Job | None, answer: AnswerStream | None) -> dict[str, Any]:
        if self.counting:
            return {"input_tokens": c.prompt_tokens}
        assert answer is not None
        self.said(parts(answer))  # the same blocks, their events unsent
        return self._message(self.blocks, self._stop(c), self._usage(c))
