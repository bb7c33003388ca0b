"""The one handler every generation route runs, whatever its API: the model looked up, the body parsed by the
API (its Ask), then the same steps for all — the messages read (media off the event loop), the prompt's size
bounded, the sampling settings layered (model, flags, request) through the one validation, an effort as a
reasoning budget, the schema as a grammar, the tool plan — and the answer, streamed or whole, through the
one answer stage, handed to the API's encoder. A capability added here reaches every API."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localgen import settings
from localgen.backend import Completion
from localgen.errors import UsageError
from localgen.media import OPENAI_WORDS
from localgen.serve.apierror import HTTPError, http_error
from localgen.serve.ask import Ask
from localgen.serve.http10 import STREAM_HEADERS
from localgen.serve.incoming import read_messages
from localgen.serve.jobs import Event, Failed, Job, Text
from localgen.serve.jsonbody import read_json
from localgen.serve.running import events, run_job, run_whole, watch_repeats
from localgen.serve.schema import schema_grammar
from localgen.serve.served import Served
from localgen.serve.state import ServeState
from localgen.serve.tooling import apply_plan, stream_for, tool_plan
from localgen.text import CHARS_PER_TOKEN
from localgen.tools.stream import AnswerStream, Piece
from localgen.tools.stream import Event as Said
from localgen.types import GenerationRequest, Message, SamplingParams

# An effort level as a reasoning budget in tokens: the lower levels bound the thinking, the higher leave it
# unbounded (none and minimal turn it off, through the template's switch)
EFFORT_BUDGETS = {"low": 1024, "medium": 4096}

# No vocabulary here averages anywhere near this many characters a token: text longer than this many per
# token of the window cannot fit, whatever the tokenizer does.


@dataclass(frozen=True)
class Made:
    """What the pipeline made of an Ask for a model, for the encoder to echo."""

    model: str  # the served model's name
    request: GenerationRequest  # what the model is asked (tools placed, sampling layered)
    messages: tuple[Message, ...]  # the conversation as read, before any tools were placed in it
    folded: int = 0  # messages a fit to the window folded into a summary or left out (serve/fitting.py)


class Encoder(Protocol):
    """One request's answer in an API's words: its stream (opening, what the answer stage gave out, then its
    end or an error after the stream began, each closing the stream) and its whole answer. The stream opens
    once the job's first event came (its prompt evaluated: that event carries the prompt's token counts)."""

    media_type: str

    def opening(self, first: Event) -> list[bytes]: ...

    def said(self, pieces: list[Said]) -> list[bytes]: ...

    def failed(self, e: HTTPError) -> list[bytes]: ...

    async def done(self, c: Completion, job: Job) -> list[bytes]: ...

    async def whole(self, c: Completion, job: Job, answer: AnswerStream | None) -> dict[str, Any] | Response: ...


class Api(Protocol):
    """An API's words: its request parsed (or a typed error naming its field), and the encoder of its answer."""

    claude: bool  # a claude-* model name not served here means the default model (Anthropic's API)

    async def parse(self, body: dict[str, Any]) -> Ask: ...

    def encoder(self, body: dict[str, Any], ask: Ask, made: Made) -> Encoder: ...


def route(state: ServeState, path: str, api: Api) -> Route:
    """A POST route whose requests the pipeline answers in `api`'s words."""

    async def endpoint(request: Request) -> Response:
        return await handle(state, request, api)

    return Route(path, endpoint, methods=["POST"])


class _Changed(Exception):
    """The worker a request took was taken away before its job was queued (its preset changed on disk)."""


async def handle(state: ServeState, http: Request, api: Api, body: dict[str, Any] | None = None) -> Response:
    """A generation request, from its body (JSON, unless the route read another kind: `body`) to its answer in
    `api`'s words. Where the model's worker was taken away while the request was read (its preset changed on
    disk: serve/state.py's current), it is made again once, from the preset as it is now."""
    body = body if body is not None else await read_json(http)
    try:
        return await _handle(state, http, api, body, again=True)
    except _Changed:
        return await _handle(state, http, api, body, again=False)


def _retry_if_taken_away(state: ServeState, worker: Any, e: HTTPError, again: bool) -> None:
    """A job's 409 from a worker taken away while the request was read (its preset changed on disk): asked again,
    once, of the worker made from the preset as it is now (handle)."""
    if again and e.status == 409 and state.taken_away(worker):
        raise _Changed from None


async def _handle(state: ServeState, http: Request, api: Api, body: dict[str, Any], again: bool) -> Response:
    worker = state.worker(body.get("model"), api.claude)
    ask = await api.parse(body)
    request, said = await generation(state, worker, ask)
    plan = await tool_plan(worker, ask.tools, ask.tool_choice, ask.parallel_tool_calls) if ask.chat else None
    folded = 0
    try:  # file_search's excerpts and truncation `auto` ask the worker first: a job it may refuse as taken away
        if ask.excerpts is not None and request.messages:
            request, said = await ask.excerpts.place(worker, request, plan, http, ask.keep_alive)
        if ask.fit and request.messages:
            request, said, folded = await _fitted(worker, request, said, plan, http, ask)
    except HTTPError as e:
        _retry_if_taken_away(state, worker, e, again)
        raise
    asked, request = request, apply_plan(plan, request)
    encoder = api.encoder(body, ask, Made(worker.name, request, said, folded))
    # the answer stage reads a chat's answer, and a prompt put through the chat template (Ollama's /api/generate:
    # its thinking apart, in `thinking`); a raw prompt's text is given as it is
    answer = stream_for(worker, plan, request, ask.split_reasoning) if ask.chat or request.messages else None
    for fitting in (True, False):
        try:
            if not ask.stream:
                watch = stream_for(worker, plan, request, ask.split_reasoning) if plan is not None else None
                job, final = await run_whole(worker, request, http, ask.keep_alive, watch)
            else:
                job, first = await run_job(worker, request, http, ask.keep_alive)
            break
        except HTTPError as e:  # the model's thread names the conversation `messages`: the request's own field
            _retry_if_taken_away(state, worker, e, again)
            if not (fitting and ask.truncate_keep is not None and e.overflow is not None and e.overflow[0]):
                raise _in_request_words(e, ask, asked) from None
            tokens = e.overflow[0]
        # past the window, and the API fits it as Ollama does: asked again, fitted (its refusal, the first time,
        # was made before anything was evaluated)
        from localgen.serve.ollamatrim import trimmed

        asked = await trimmed(worker, dataclasses.replace(asked, truncate_keep=ask.truncate_keep), plan, http,
                              ask.keep_alive, tokens, ask.chat)
        request = apply_plan(plan, asked)
    if not ask.stream:
        if answer is not None:
            answer.feed(final.text)
            answer.finish(final.finish_reason)
        doc = await encoder.whole(final, job, answer)
        return doc if isinstance(doc, Response) else JSONResponse(doc)
    return StreamingResponse(_stream(job, first, answer, encoder), media_type=encoder.media_type,
                             headers=STREAM_HEADERS)


def _in_request_words(e: HTTPError, ask: Ask, request: GenerationRequest | None = None) -> HTTPError:
    """An error about the conversation in the request's own words: the field it came in (`input`, not
    `messages`; a prompt past the window names it too, or a raw prompt's `prompt`), and inline media as the API
    names it (an image block's source.data), which the model's thread, decoding the media in OpenAI's words,
    does not know."""
    if e.param is None and e.overflow is not None:
        e.param = "prompt" if request is not None and request.raw else "messages"
    if e.param == "messages":
        e.param = ask.conversation
        default = OPENAI_WORDS.decoded
        if e.message.startswith(default + " ") and ask.inline.decoded != default:
            e.message = ask.inline.decoded + e.message[len(default):]
    return e


async def generation(state: ServeState, worker: Served, ask: Ask) -> tuple[GenerationRequest, tuple[Message, ...]]:
    """The request the model is asked, and the conversation as read (empty for a raw prompt)."""
    values = dict(ask.values)
    effort_budget(values, ask.effort)
    grammar = await schema_grammar(ask.schema.value, ask.schema.param) if ask.schema is not None else None
    chosen = sampling(state, worker, values, grammar)
    raw = ask.prompt is not None and (ask.messages is None or not worker.ref.summary.chat_template)
    if raw:
        if _has_media(ask.messages):
            raise HTTPError(400, f"{worker.name} has no chat template to place `images` in", param="images")
        assert ask.prompt is not None
        check_prompt_size(worker, [ask.prompt], trim=ask.truncate_keep is not None, param="prompt")
        return GenerationRequest(prompt=ask.prompt, sampling=chosen, logprobs=ask.logprobs, exact=ask.exact), ()
    summary = worker.ref.summary
    if not summary.chat_template and not summary.encoder_only and not worker.ref.mmproj \
            and not _has_media(ask.messages):  # said before the model's thread is asked, with the way round it
        # (an encoder, a projector or media: the model's thread says what the model cannot do instead)
        raise HTTPError(400, f"{worker.name} has no chat template (it may be a base model): send it a plain prompt "
                             "at /v1/completions, or Ollama's /api/generate", param="model")
    try:
        msgs = await read_messages(ask.messages, state.allow_image_urls, ask.inline)
        # truncation folds a long one, Ollama's truncate leaves its oldest messages out
        check_prompt_size(worker, list(msgs), fit=ask.fit, trim=ask.truncate_keep is not None)
    except HTTPError as e:
        raise _in_request_words(e, ask) from None
    # a final assistant message is continued, as llama-server, Ollama and Anthropic's API do (docs/api.md)
    return GenerationRequest(messages=msgs, sampling=chosen, logprobs=ask.logprobs, exact=ask.exact,
                             template_args=template_args(ask), continue_final=True), msgs


def sampling(state: ServeState, worker: Served, values: Mapping[str, Any],
             grammar: str | None = None) -> SamplingParams:
    """The request's settings over the flags `serve` was given over the model's recommended ones, all
    through the one validation (settings.py). Each route checked the fields it read under the request's own
    names (ask.sampling_values); what is checked here again also covers values a route derived (a thinking
    budget, an effort level's budget)."""
    for key, value in values.items():
        if value is None:
            continue
        try:
            settings.check(key, value)  # the request's own fields were checked under their names (ask.py)
        except UsageError as e:
            raise HTTPError(400, e.message, param=key) from None
    try:
        base = settings.apply(SamplingParams(), worker.ref.sampling_defaults)
        base = settings.apply(base, state.flag_sampling)
        chosen = settings.apply(base, {k: v for k, v in values.items() if v is not None})
    except UsageError as e:
        raise HTTPError(400, e.message) from None
    return dataclasses.replace(chosen, grammar=grammar)


def effort_budget(values: dict[str, Any], effort: object) -> None:
    """The reasoning budget an effort level sets (engine/budget.py), unless the request set one itself."""
    if isinstance(effort, str) and effort in EFFORT_BUDGETS:
        values.setdefault("reasoning_budget", EFFORT_BUDGETS[effort])


def template_args(ask: Ask) -> tuple[tuple[str, Any], ...]:
    """The template's variables: those the request set, and the thinking switch unless they set it."""
    args = dict(ask.template_vars)
    if ask.thinking is not None:
        args.setdefault("enable_thinking", ask.thinking)
    return tuple(sorted(args.items()))


def check_prompt_size(worker: Served, messages: list[Any], fit: bool = False, trim: bool = False,
                      param: str = "messages") -> None:
    """A 400 for text that cannot fit a slot's window whatever the tokenizer does, before tokenizing it (a raw
    prompt's characters, or a conversation's, and its count of messages), naming `param`. With `fit` (truncation
    folds the conversation to the window, serve/fitting.py) the window's bounds hold for what must fit word for
    word, the instructions and the turn being answered, and the whole conversation may be FOLD_WINDOWS times
    them: a fold's summary costs the model's time for every turn it reads. With `trim` (Ollama's truncate,
    serve/ollamatrim.py) the prompt may be TRIM_WINDOWS times them."""
    from localgen.serve.fitting import FOLD_WINDOWS, must_fit
    from localgen.serve.ollamatrim import TRIM_WINDOWS

    def texts(ms: list[Any]) -> list[Any]:
        return [m.get("content") if isinstance(m, dict) else m for m in ms]

    def arguments(ms: list[Any]) -> int:  # tool calls' arguments: a fold's summary reads them too
        return sum(len(str((c.get("function") or {}).get("arguments") or "")) for m in ms if isinstance(m, dict)
                   for c in (m.get("tool_calls") or ()) if isinstance(c, dict))

    if fit:
        _within(worker, texts(must_fit(messages)), 1, param)
        _within(worker, texts(messages), FOLD_WINDOWS, param, arguments(messages),
                f"truncation \"auto\" folds at most {FOLD_WINDOWS} times that")
    elif trim:
        _within(worker, texts(messages), TRIM_WINDOWS, param,
                said=f"`truncate` fits at most {TRIM_WINDOWS} times that")
    else:
        _within(worker, texts(messages), 1, param)


def _within(worker: Served, texts: list[Any], windows: int, param: str, extra: int = 0, said: str = "") -> None:
    from localgen.media import text_of

    most = worker.n_ctx * windows
    said = f" ({said})" if said else ""
    if len(texts) > most:  # a conversation's messages: each takes a token at least (its turn's marks), and
        # rendering them all through the template would take seconds first
        raise HTTPError(400, f"the conversation is {len(texts):,} messages; a slot's window of {worker.n_ctx:,} "
                             f"tokens holds at most {worker.n_ctx:,} (each takes a token at least){said}",
                        param=param, overflow=(0, worker.n_ctx), messages=len(texts))
    chars = sum(len(text_of(t)) for t in texts) + extra
    if chars > CHARS_PER_TOKEN * most:
        raise HTTPError(400, f"the prompt is {chars:,} characters; a slot's window of {worker.n_ctx:,} tokens "
                             f"takes at most {CHARS_PER_TOKEN * worker.n_ctx:,} here{said}", param=param,
                        overflow=(0, worker.n_ctx), chars=chars)


def parts(answer: AnswerStream) -> list[Said]:
    """A finished answer's pieces as a whole answer gives them: its reasoning, its content (also when empty
    and nothing else came: an empty answer is one empty text), its calls."""
    out: list[Said] = [Piece("reasoning", answer.reasoning)] if answer.reasoning else []
    if answer.content or not (answer.calls or answer.reasoning):
        out.append(Piece("content", answer.content))
    return [*out, *answer.calls]


async def _fitted(worker: Served, request: GenerationRequest, said: tuple[Message, ...], plan: Any, http: Request,
                  ask: Ask) -> tuple[GenerationRequest, tuple[Message, ...], int]:
    """The conversation fitted to a slot's window (serve/fitting.py), said in the server's log when it was, and
    how many of its messages were folded or left out."""
    from localgen.serve.fitting import fit
    from localgen.serve.servelog import LOG

    fitted = await fit(worker, request, said, plan, http, ask.keep_alive)
    if fitted.folded or fitted.dropped:
        text = (f"{worker.name}: a conversation past a slot's window of {worker.n_ctx:,} tokens: "
                f"{fitted.folded} message{'s' if fitted.folded != 1 else ''} folded into a summary, "
                f"{fitted.dropped} left out" + (f" ({fitted.summary_tokens:,} tokens for the summary)"
                                                  if fitted.summary_tokens else ""))
        LOG.get().event("fitted", worker.name, text, folded=fitted.folded, dropped=fitted.dropped,
                        summary_tokens=fitted.summary_tokens)
    return fitted.request, fitted.conversation, fitted.folded + fitted.dropped


def _has_media(messages: Any) -> bool:
    return isinstance(messages, list) and any(isinstance(m, dict) and (m.get("images") or isinstance(
        m.get("content"), list)) for m in messages)


async def _stream(job: Job, first: Event, answer: AnswerStream | None, encoder: Encoder) -> AsyncIterator[bytes]:
    """The job's events through the answer stage (a raw prompt's text as it is) into the encoder's stream."""
    for chunk in encoder.opening(first):
        yield chunk
    async for event in events(job, first):
        if isinstance(event, Text):
            out = encoder.said(watch_repeats(job, answer, event.text) if answer else [Piece("content", event.text)])
        elif isinstance(event, Failed):
            error = http_error(event)
            out = encoder.failed(error)
            trace = getattr(job, "trace", None)
            if trace is not None:  # the stream said 200 at its start: its access line says how it ended
                trace.fail(error)
        else:
            said = answer.finish(event.completion.finish_reason) if answer else []
            out = encoder.said(said) + await encoder.done(event.completion, job)
        for chunk in out:
            yield chunk
