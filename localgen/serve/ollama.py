"""Ollama's native API, enough for the official `ollama` Python client and front-ends that speak only Ollama:
/api/chat and /api/generate, read into the pipeline's Ask: NDJSON streaming, durations in nanoseconds,
keep_alive, and a request with nothing to generate that loads or unloads the model. (The listings:
serve/listings.py; embeddings: serve/embeds.py; /api/show and the routes that manage models: serve/manage.py.)"""

from __future__ import annotations

import datetime
import json
import math
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen import loadsettings, settings
from localgen.backend import Completion
from localgen.serve.apierror import OLLAMA, HTTPError, error_body
from localgen.serve.ask import Ask, Schema, flag, keep_alive, sampling_values, split_reasoning
from localgen.serve.describe import thinks
from localgen.serve.jobs import Event, Job
from localgen.serve.jsonbody import read_json
from localgen.serve.loadnow import load_or_unload
from localgen.serve.pipeline import Made, handle, parts
from localgen.serve.state import ServeState
from localgen.tools.stream import AnswerStream, Piece
from localgen.tools.stream import Event as Said

NS = 1_000_000_000
NUM_KEEP = 4  # Ollama's default num_keep: the tokens a prompt cut to the window keeps at its start


def routes(state: ServeState) -> list[Route]:
    """/api/chat and /api/generate (the listings: serve/listings.py; embeddings: serve/embeds.py)."""

    async def chat(request: Request) -> Response:
        return await load(state, request, chat=True) or await _answer(state, request, CHAT)

    async def generate(request: Request) -> Response:
        return await load(state, request, chat=False) or await _answer(state, request, GENERATE)

    return [Route("/api/chat", chat, methods=["POST"]), Route("/api/generate", generate, methods=["POST"])]


class Generate:
    """/api/chat (chat) and /api/generate in the pipeline's terms."""

    claude = False

    def __init__(self, chat: bool) -> None:
        self.chat = chat

    async def parse(self, body: dict[str, Any]) -> Ask:
        opts = body.get("options") or {}
        if not isinstance(opts, dict):
            raise HTTPError(400, "`options` must be an object", param="options")
        opts = _integers(opts)
        if opts.get("num_predict") == -2 and not isinstance(opts["num_predict"], bool):  # Ollama's "fill the
            opts = {**opts, "num_predict": -1}  # context": here -1, until the model stops or the window is full
        # load-time options are ignored (`serve` loaded the model before any request); others are a 400
        known = {*settings.spellings("ollama"), *loadsettings.OLLAMA_LOAD_OPTIONS, "exact", "num_keep"}
        unknown = set(opts) - known
        if unknown:
            raise HTTPError(400, f"unknown options: {', '.join(sorted(unknown))}", param="options")
        _check_load_kinds(opts)
        if isinstance(opts.get("stop"), str) and opts["stop"]:  # Ollama's FromMap: 'option "stop" must be of type
            # array' ("" is dropped, as every API here drops an empty stop)
            raise HTTPError(400, 'options.stop must be a list of strings (["\\n\\n"]), not a string',
                            param="options.stop")
        think = body.get("think")
        if think is not None and not isinstance(think, bool) and think not in ("low", "medium", "high"):
            raise HTTPError(400, "`think` must be true, false, \"low\", \"medium\" or \"high\"", param="think")
        fmt = body.get("format")
        keep = NUM_KEEP if opts.get("num_keep") is None else opts["num_keep"]
        if isinstance(keep, bool) or not isinstance(keep, int):  # a negative one keeps all it can, as Ollama's
            raise HTTPError(400, "`options.num_keep` must be an integer", param="options.num_keep")
        common: dict[str, Any] = dict(
            logprobs=_logprobs(body),
            values=sampling_values(opts, "ollama", "options."),
            schema=Schema(fmt, "format") if fmt not in (None, "") else None,
            thinking=None if think is None else think is not False, effort=think if isinstance(think, str) else None,
            exact=flag(opts, "exact", "options.exact"), split_reasoning=split_reasoning(body),
            stream=flag(body, "stream", default=True), keep_alive=keep_alive(body.get("keep_alive"), "keep_alive"),
            truncate_keep=keep if flag(body, "truncate", default=True) else None)
        if self.chat:
            return Ask(messages=_with_content(body.get("messages")), tools=body.get("tools"),
                       tool_choice=body.get("tool_choice"),
                       parallel_tool_calls=flag(body, "parallel_tool_calls", default=True), **common)
        if body.get("suffix"):  # Ollama's fill-in-the-middle ("insert"): no model here is run that way
            raise HTTPError(400, "`suffix` is not supported by this model: it does not support insert "
                                 "(fill-in-the-middle)", param="suffix")
        _refuse_context(body.get("context"))
        template = body.get("template")
        if template is not None and not isinstance(template, str):
            raise HTTPError(400, "`template` must be a string", param="template")
        if template:  # Ollama's Go template for this request: never run here, and never dropped unsaid
            raise HTTPError(400, "`template` is not supported: it is an Ollama Go template, which localgen cannot "
                                 "run; the model's own chat template renders the prompt (send `raw` with the prompt "
                                 "written out, or make a preset with a Jinja TEMPLATE)", param="template")
        prompt, system, images = body.get("prompt"), body.get("system"), body.get("images")
        if not isinstance(prompt, str):
            raise HTTPError(400, "`prompt` must be a string", param="prompt")
        if system is not None and not isinstance(system, str):  # never dropped unsaid
            raise HTTPError(400, "`system` must be a string", param="system")
        if flag(body, "raw"):
            if images:
                raise HTTPError(400, "`images` need the model's chat template: they cannot go with a raw prompt",
                                param="images")
            return Ask(prompt=prompt, chat=False, **common)
        user: dict[str, Any] = {"role": "user", "content": prompt, **({"images": images} if images is not None else {})}
        head = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
        # raw when the model has no template
        return Ask(messages=[*head, user], prompt=prompt, chat=False, conversation="prompt", **common)

    def encoder(self, body: dict[str, Any], ask: Ask, made: Made) -> _Encoder:
        return _Encoder(self.chat, made.model, ask.logprobs is not None)


CHAT, GENERATE = Generate(chat=True), Generate(chat=False)


async def load(state: ServeState, request: Request, chat: bool) -> Response | None:
    """Ollama's way to load (or, with keep_alive 0, unload) a model without generating: /api/chat with no
    messages (none sent, null or []), /api/generate with no prompt. None for any other request."""
    body = await read_json(request)  # cached by Starlette: the pipeline reads it again
    nothing = (None, []) if chat else (None, "")  # Ollama's zero values: a field not sent is one
    if body.get("messages" if chat else "prompt") not in nothing:
        return None
    worker = state.worker(body.get("model"))
    ttl = keep_alive(body.get("keep_alive"), "keep_alive")
    await load_or_unload(worker, request, ttl)  # or the reason it cannot load (no room, over --max-memory)
    said = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return JSONResponse({**_head(worker.name), **said, "done": True, "done_reason": "unload" if ttl == 0 else "load"})


async def _answer(state: ServeState, request: Request, api: Generate) -> Response:
    """A generation, refused first where it asks a model that cannot think to think (`think` true or a level), as
    Ollama refuses it: the thinking would never come."""
    body = await read_json(request)
    think = body.get("think")
    if think is True or think in ("low", "medium", "high"):
        worker = state.worker(body.get("model"))
        if not thinks(worker.ref.summary.chat_template):
            named = body.get("model") if isinstance(body.get("model"), str) and body.get("model") else worker.name
            raise HTTPError(400, f'"{named}" does not support thinking', param="think")  # the name as sent
    return await handle(state, request, api)


def _integers(opts: dict[str, Any]) -> dict[str, Any]:
    """The options, an integer one sent as a float (`"top_k": 40.0`) made an int as Ollama's options.FromMap makes
    it: cut toward zero (40.9 is 40), as Go's int(); an infinity or NaN is left for the check to refuse."""
    ints = {k for k, knob in settings.spellings("ollama").items() if settings.KNOBS[knob].kind == settings.INT}
    return {k: int(v) if (k in ints or k == "num_keep") and isinstance(v, float) and math.isfinite(v) else v
            for k, v in opts.items()}


# Ollama's load options (api/types.go's Runner) by the kind its FromMap checks ("option must be of type integer");
# the older ones it no longer knows (use_mlock, numa, low_vram, f16_kv, vocab_only, penalize_newline, tfs_z) it
# lets be whatever they hold (its log: "invalid option provided"), and so does serve; llama.cpp's names for
# placement are Ollama's unknowns, let be unchecked too
LOAD_KINDS = {**dict.fromkeys(("num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread"), "an integer"),
              "use_mmap": "true or false"}


def _check_load_kinds(opts: dict[str, Any]) -> None:
    """A 400 for a load option of the wrong kind, as Ollama's FromMap refuses it (`"num_ctx": "big"`); right, it
    is let be (serve loaded the model before any request). A float is an integer's number, as FromMap takes it."""
    for name, kind in LOAD_KINDS.items():
        value = opts.get(name)
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        ok = isinstance(value, bool) if kind == "true or false" else number
        if not ok:
            raise HTTPError(400, f"options.{name} must be {kind}, not {settings.shown_value(value)[:100]}",
                            param=f"options.{name}")


def _refuse_context(context: Any) -> None:
    """Ollama's `context` (an earlier /api/generate's token ids, to continue it): a 400 for a wrong type, and for
    any ids, since no answer here gives them (the conversation goes to /api/chat as `messages`); `[]` continues
    nothing."""
    if context is None:
        return
    if not isinstance(context, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in context):
        raise HTTPError(400, "`context` must be a list of token ids (integers)", param="context")
    if context:
        raise HTTPError(400, "`context` is not supported: this server gives no token ids to continue an answer "
                             "from; send the conversation as `messages` to /api/chat", param="context")


def _message(pieces: list[Said]) -> dict[str, Any]:
    """Ollama's assistant message for what the answer stage gave out: content, thinking, tool_calls (with
    arguments as an object)."""
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    for e in pieces:
        if isinstance(e, Piece):
            key = "content" if e.kind == "content" else "thinking"
            msg[key] = msg.get(key, "") + e.text
        else:
            msg.setdefault("tool_calls", []).append({"function": {"name": e.name, "arguments": e.args}})
    return msg


# characters Python's str.splitlines() ends a line at, which JSON leaves unescaped: the ollama client (httpx's
# iter_lines) split a line at them, mid-string. Escaped as Go's encoding/json escapes U+2028 and U+2029.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _line(doc: dict[str, Any]) -> bytes:
    """One NDJSON line: no character in it a client's line reader may split at."""
    return (json.dumps(doc, ensure_ascii=False).translate(_LINE_BREAKS) + "\n").encode()


class _Encoder:
    """One request's NDJSON lines and whole answer."""

    media_type = "application/x-ndjson"

    def __init__(self, chat: bool, model: str, logprobs: bool = False) -> None:
        self.chat, self.model, self.logprobs = chat, model, logprobs

    def opening(self, first: Event) -> list[bytes]:
        return []

    def said(self, pieces: list[Said]) -> list[bytes]:
        if not pieces:
            return []
        message = _message(pieces)
        text = {"message": message} if self.chat else _generated(message)
        return [_line({**_head(self.model), **text, "done": False})]

    def failed(self, e: HTTPError) -> list[bytes]:  # after the first token: Ollama's client raises it
        return [_line(error_body(OLLAMA, e))]

    async def done(self, c: Completion, job: Job) -> list[bytes]:
        return [_line(self._final(c, job, _message([])))]

    async def whole(self, c: Completion, job: Job, answer: AnswerStream | None) -> dict[str, Any]:
        return self._final(c, job, _message(parts(answer) if answer else [Piece("content", c.text)]))

    def _final(self, c: Completion, job: Job, message: dict[str, Any]) -> dict[str, Any]:
        said = {"message": message} if self.chat else _generated(message)
        return {**_head(self.model), **said, "done": True,
                "done_reason": "length" if c.finish_reason in ("length", "context") else "stop",
                "total_duration": int((time.perf_counter() - job.enqueued) * NS), "load_duration": int(job.load_s * NS),
                "prompt_eval_count": c.prompt_tokens, "prompt_eval_duration": int(c.prompt_s * NS),
                "eval_count": c.completion_tokens, "eval_duration": int(c.decode_s * NS),
                **({"logprobs": [_logprob(t.to_dict()) for t in c.logprobs]} if self.logprobs else {})}


def _logprobs(body: dict[str, Any]) -> int | None:
    """`logprobs: true` (and `top_logprobs`, 0 to 20, the alternatives at each token), as Ollama's native API takes
    them (v0.12.11): the top_logprobs to ask for, or None where logprobs are not asked for."""
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise HTTPError(400, "top_logprobs must be between 0 and 20", param="top_logprobs")
    return (top or 0) if flag(body, "logprobs") else None


def _logprob(entry: dict[str, Any]) -> dict[str, Any]:
    """One token's log-probability in Ollama's shape: OpenAI's, with `bytes` and `top_logprobs` left out when
    empty (Ollama's omitempty)."""
    return {k: v for k, v in entry.items() if v != [] or k not in ("bytes", "top_logprobs")}


def _generated(message: dict[str, Any]) -> dict[str, Any]:
    """/api/generate's words for an answer: `response`, and the model's reasoning apart in `thinking`."""
    return {"response": message["content"], **({"thinking": message["thinking"]} if "thinking" in message else {})}


def _head(model: str) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
    return {"model": model, "created_at": now}


def _with_content(messages: Any) -> Any:
    """Ollama's messages, one without `content` (or with null) read as "", as Ollama reads it (OpenAI's routes
    refuse a user or system message without it)."""
    if not isinstance(messages, list):
        return messages
    return [{**m, "content": ""} if isinstance(m, dict) and m.get("content") is None else m for m in messages]
