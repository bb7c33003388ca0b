"""OpenAI's chat completions and completions, as llama-server and vLLM speak them: /v1/chat/completions and
/v1/completions, read into the pipeline's Ask and answered whole or as server-sent events: `usage` (also in
the last chunk with stream_options.include_usage), llama-server's `timings`, logprobs, tool_calls streamed
as deltas, reasoning in `reasoning_content`; localgen's `file_search` field searches serve --collection's stores
for the question and places what it finds as Responses' file_search does (serve/filesearch.py). (/v1/models:
serve/listings.py; /v1/embeddings and /v1/rerank: serve/embeds.py.)"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from starlette.routing import Route

from localgen.backend import Completion
from localgen.serve import filesearch
from localgen.serve.apierror import OPENAI, HTTPError, error_body
from localgen.serve.ask import (
    Ask,
    Schema,
    flag,
    keep_alive,
    one_of,
    optional_object,
    sampling_values,
    split_reasoning,
)
from localgen.serve.incoming import unanswered
from localgen.serve.jobs import Event, Job
from localgen.serve.pipeline import Made, route
from localgen.serve.responsestore import check_metadata
from localgen.serve.state import ServeState
from localgen.tools.stream import AnswerStream, Piece
from localgen.tools.stream import Event as Said
from localgen.types import token_key

UNSUPPORTED = ("functions", "function_call", "prediction")
# Names the chat template's renderer sets itself (engine/template.py's render(), and `tools` from the
# request's own field): chat_template_kwargs may not replace them.
TEMPLATE_OWN = ("messages", "tools", "add_generation_prompt", "continue_final", "bos_token", "eos_token",
                "raise_exception", "strftime_now")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
TEMPLATE_BOOLS = ("enable_thinking", "thinking")  # chat_template_kwargs that templates test for truth
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}
CUT = ("length", "context")  # the finish reasons of an answer the token budget (max_tokens, the window) ended
DONE = b"data: [DONE]\n\n"  # a stream's last event, after its end or an error


def routes(state: ServeState) -> list[Route]:
    """/v1/chat/completions and /v1/completions."""
    return [route(state, "/v1/chat/completions", Completions(chat=True, state=state)),
            route(state, "/v1/completions", COMPLETIONS)]


class Completions:
    """/v1/chat/completions (chat) and /v1/completions (a raw prompt) in the pipeline's terms."""

    claude = False

    def __init__(self, chat: bool, state: ServeState | None = None) -> None:
        self.chat, self.state = chat, state  # the state: the stores `file_search` searches

    async def parse(self, body: dict[str, Any]) -> Ask:
        for key in UNSUPPORTED:
            if body.get(key):
                raise HTTPError(400, f"`{key}` is not supported by this server", param=key)
        _check_text_output(body)
        check_metadata(body.get("metadata") if self.chat else None, body.get("user"))  # bounded as OpenAI does
        opts = optional_object(body, "stream_options")
        if opts is not None:
            flag(opts, "include_usage", "stream_options.include_usage")
        if body.get("n") not in (None, 1) or isinstance(body.get("n"), bool):  # null: OpenAI's default, 1; true ≠ 1
            raise HTTPError(400, "only n=1 is supported: send the request n times (they run in parallel slots)",
                            param="n")
        # as OpenAI's chat: at least 1 (-1, llama-server's: no limit); /v1/completions too, as api.md says (OpenAI's
        # legacy completions take 0 only to echo the prompt's logprobs, and echo is refused here)
        for key in ("max_tokens", "max_completion_tokens") if self.chat else ("max_tokens",):
            if body.get(key) == 0 and not isinstance(body.get(key), bool):
                raise HTTPError(400, f"{key} must be at least 1 (or -1: until the model stops or the window is "
                                     "full), not 0", param=key)
        logprobs = None
        count = body.get("logprobs")  # /v1/completions: a count, and 0 (the chosen tokens alone) asks too
        asked = flag(body, "logprobs") if self.chat else count is not None and count is not False
        if asked or (self.chat and body.get("top_logprobs") is not None):  # checked even when logprobs is off
            top = body.get("top_logprobs") if self.chat else body.get("logprobs")
            top = 0 if top is True or top is None else top  # null: OpenAI's default, none
            if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
                field = "top_logprobs" if self.chat else "logprobs"  # /v1/completions: logprobs is the count
                raise HTTPError(400, f"{field} must be an integer from 0 to 20", param=field)
            if not asked and body.get("top_logprobs") is not None:  # as OpenAI: alternatives need the chosen tokens'
                raise HTTPError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
            logprobs = top if asked else None
        effort = one_of(body.get("reasoning_effort"), REASONING_EFFORTS, "reasoning_effort")
        common: dict[str, Any] = dict(
            values=sampling_values(body, "openai"),
            schema=_response_format(body.get("response_format")),
            logprobs=logprobs, exact=flag(body, "exact"), stream=flag(body, "stream"),
            keep_alive=keep_alive(body.get("ttl"), "ttl"), effort=effort)
        if self.chat:
            orphan = unanswered(body.get("messages"))
            if orphan is not None:  # as OpenAI answers it
                raise HTTPError(400, f"Invalid parameter: tool_call_id {orphan[1][:100]!r} of messages[{orphan[0]}] is "
                                     "not the id of a tool call made before it ('tool_calls' of an assistant message)",
                                param=f"messages.[{orphan[0]}].tool_call_id")
            return Ask(messages=body.get("messages"), excerpts=self._searched(body),
                       template_vars=_template_vars(body.get("chat_template_kwargs")),
                       thinking=None if effort is None else effort not in ("none", "minimal"),
                       tools=body.get("tools"), tool_choice=body.get("tool_choice"),
                       parallel_tool_calls=flag(body, "parallel_tool_calls", default=True),
                       split_reasoning=split_reasoning(body), **common)
        if body.get("file_search") is not None:
            raise HTTPError(400, "`file_search` needs a chat: send it to /v1/chat/completions", param="file_search")
        if body.get("tools"):  # a raw prompt has no template to offer them in: refused, never dropped silently
            raise HTTPError(400, "`tools` need a chat: send them to /v1/chat/completions", param="tools")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise HTTPError(400, "`prompt` must be a string (one prompt per request)", param="prompt")
        for key in ("echo", "suffix"):
            if flag(body, key) if key == "echo" else body.get(key):
                raise HTTPError(400, f"`{key}` is not supported by this server", param=key)
        best = body.get("best_of")  # as n: one completion is generated, so more to choose from is refused, not dropped
        if best not in (None, 1) or isinstance(best, bool):
            raise HTTPError(400, "only best_of=1 is supported: send the request several times and choose",
                            param="best_of")
        return Ask(prompt=prompt, chat=False, **common)

    def _searched(self, body: dict[str, Any]) -> filesearch.Deferred | None:
        """localgen's `file_search` field (a file_search tool's fields, without its type), checked: the question
        (the last user message) is searched for in the stores it names when the pipeline places the texts found,
        once the request's messages, sampling and tools were checked; the file_search_call item, its results those
        placed, in SEARCHED for the encoder."""
        filesearch.SEARCHED.set(None)
        spec = optional_object(body, "file_search")
        if spec is None:
            return None
        if self.state is None:
            raise HTTPError(400, "`file_search`: no vector store is offered here", param="file_search")
        searching = filesearch.tool(self.state, dict(spec), "file_search")
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return None  # the pipeline's reading of `messages` says what is wrong with them
        return filesearch.Deferred(self.state, searching, messages, f"fs_{uuid.uuid4().hex[:24]}")

    def encoder(self, body: dict[str, Any], ask: Ask, made: Made) -> _Encoder:
        opts = body.get("stream_options")
        usage = isinstance(opts, dict) and opts.get("include_usage") is True  # checked by parse
        searched = filesearch.SEARCHED.get() if self.chat else None
        return _Encoder(self.chat, made.model, ask.logprobs is not None, usage, searched)


CHAT, COMPLETIONS = Completions(chat=True), Completions(chat=False)  # (the route's chat has the server's state)


def _response_format(fmt: Any) -> Schema | None:
    """response_format: text (no constraint), json_object (any object, or its schema) or json_schema."""
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        if not isinstance(fmt.get("json_schema"), dict):  # as OpenAI: the type names the field that holds it
            raise HTTPError(400, "response_format of type json_schema needs `json_schema`, an object with the "
                                 "`schema`", param="response_format.json_schema")
        spec = fmt["json_schema"]
        if "schema" not in spec:  # its name and strict alone constrain nothing: not taken as "any JSON"
            raise HTTPError(400, "response_format.json_schema.schema is required: the JSON schema the answer must "
                                 "match", param="response_format.json_schema.schema")
        return Schema(spec["schema"], "response_format")
    if kind == "json_object":
        assert isinstance(fmt, dict)
        return Schema(fmt.get("schema", "json"), "response_format")
    if fmt is not None and kind != "text":
        raise HTTPError(400, "response_format must be text, json_object or json_schema", param="response_format")
    return None


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


def _template_vars(kwargs: Any) -> tuple[tuple[str, Any], ...]:
    """chat_template_kwargs (llama-server's and vLLM's field): template variables, checked."""
    name = "chat_template_kwargs"
    if kwargs is None:
        return ()
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
    return tuple(sorted(kwargs.items()))


def timings(c: Completion) -> dict[str, Any]:
    """llama-server's `timings` object."""
    prompt_n = max(0, c.prompt_tokens - c.cached_tokens)
    prompt_ms = c.prompt_s * 1000
    predicted_ms = c.decode_s * 1000
    return {
        "cache_n": c.cached_tokens, "prompt_n": prompt_n, "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else None,
        "prompt_per_second": round(prompt_n / c.prompt_s, 2) if c.prompt_s > 0 and prompt_n else None,
        "predicted_n": c.completion_tokens, "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / c.completion_tokens, 3) if c.completion_tokens else None,
        "predicted_per_second": round(c.completion_tokens / c.decode_s, 2) if c.decode_s > 0 else None,
        **({"draft_n": c.drafted, "draft_n_accepted": c.accepted} if c.drafted else {}),
    }


def _usage(c: Completion) -> dict[str, Any]:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": c.cached_tokens}}


def _data(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, ensure_ascii=False).encode() + b"\n\n"


class _Encoder:
    """One request's chunks and whole answer."""

    media_type = "text/event-stream"

    def __init__(self, chat: bool, model: str, logprobs: bool, usage: bool,
                 searched: dict[str, Any] | None = None) -> None:
        self.chat, self.model, self.logprobs, self.usage = chat, model, logprobs, usage
        self.searched = searched  # file_search's file_search_call item: in the first chunk, or the whole answer
        self.ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.calls = 0  # tool calls streamed

    def head(self, whole: bool = False) -> dict[str, Any]:
        kind = ("chat.completion" if whole else "chat.completion.chunk") if self.chat else "text_completion"
        return {"id": self.ident, "object": kind, "created": self.created, "model": self.model}

    def chunk(self, delta: Any, finish: str | None, done: Completion | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None,
                                  ("delta" if self.chat else "text"): delta}
        if done is not None and self.logprobs:
            choice["logprobs"] = self._logprobs(done)
        return {**self.head(), "choices": [choice]}

    def opening(self, first: Event) -> list[bytes]:
        if not self.chat:
            return []
        opened = self.chunk({"role": "assistant", "content": ""}, None)
        return [_data({**opened, "file_search_call": self.searched} if self.searched else opened)]

    def said(self, pieces: list[Said]) -> list[bytes]:
        """Content, reasoning_content, and each tool call as OpenAI streams one (id, name and empty arguments
        first, then the arguments); a completion's text as it is."""
        out: list[Any] = []
        for p in pieces:
            if isinstance(p, Piece):
                out.append(p.text if not self.chat else {"content": p.text} if p.kind == "content" else
                           {"reasoning_content": p.text})
                continue
            out.append({"tool_calls": [{"index": self.calls, "id": p.id, "type": "function",
                                        "function": {"name": p.name, "arguments": ""}}]})
            out.append({"tool_calls": [{"index": self.calls, "function": {"arguments": p.arguments}}]})
            self.calls += 1
        return [_data(self.chunk(delta, None)) for delta in out]

    def failed(self, e: HTTPError) -> list[bytes]:  # after the first token: the error, then [DONE] as ever
        return [_data(error_body(OPENAI, e)), DONE]

    async def done(self, c: Completion, job: Job) -> list[bytes]:
        cut = c.finish_reason in CUT  # the token budget ended it: `length`, as OpenAI says, whatever came before
        last = self.chunk({} if self.chat else "", "tool_calls" if self.calls and not cut else
                          FINISH.get(c.finish_reason, "stop"), c)
        out = [_data({**last, "timings": timings(c)})]
        if self.usage:
            out.append(_data({**self.head(), "choices": [], "usage": _usage(c)}))
        return [*out, DONE]

    async def whole(self, c: Completion, job: Job, answer: AnswerStream | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": FINISH.get(c.finish_reason, "stop"),
                                  "logprobs": self._logprobs(c) if self.logprobs else None}
        if answer is None:
            choice["text"] = c.text
        else:
            message: dict[str, Any] = {"role": "assistant", "content": answer.content or None}
            if answer.reasoning:
                message["reasoning_content"] = answer.reasoning
            if answer.calls:
                message["tool_calls"] = [call.to_openai() for call in answer.calls]
                if c.finish_reason not in CUT:  # (cut by the token budget: `length`, a call before it or not)
                    choice["finish_reason"] = "tool_calls"
            elif message["content"] is None:
                message["content"] = ""
            choice["message"] = message
        found = {"file_search_call": self.searched} if self.searched else {}
        return {**self.head(whole=True), "choices": [choice], "usage": _usage(c), "timings": timings(c), **found}

    def _logprobs(self, c: Completion) -> dict[str, Any]:
        items = c.logprobs
        if self.chat:
            return {"content": [t.to_dict() for t in items]}
        return {"tokens": [token_key(t.own_bytes) for t in items], "token_logprobs": [t.logprob for t in items],
                "top_logprobs": [{token_key(raw): lp for _, lp, raw in t.alternatives()} for t in items]}
