"""OpenAI's speech-to-text routes on an audio model (a model whose projector hears: Ultravox, Qwen2.5-Omni,
Voxtral, Gemma 3n), as llama-server has them (#21863) and OpenAI's clients call them: POST
/v1/audio/transcriptions and /v1/audio/translations take a multipart form (file, model, prompt, language,
temperature, response_format, stream), made one chat request (the clip, then the instruction) that the pipeline
answers like every generation route: queued, batched, streamed as `transcript.text.delta` events. An audio
language model writes no timestamps, so srt, vtt and verbose_json (whose segments carry them) are refused,
not made up."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from localgen import settings
from localgen.backend import Completion
from localgen.media_headers import MediaError
from localgen.serve.apierror import HTTPError, error_body
from localgen.serve.ask import Ask, sampling_values
from localgen.serve.jobs import Event, Job
from localgen.serve.pipeline import Made, handle
from localgen.serve.state import ServeState
from localgen.tools.stream import AnswerStream, Piece
from localgen.tools.stream import Event as Said

TRANSCRIPTIONS, TRANSLATIONS = "/v1/audio/transcriptions", "/v1/audio/translations"
PATHS = (TRANSCRIPTIONS, TRANSLATIONS)  # multipart bodies: the gate leaves them to the route (serve/guard.py)
FORMATS = ("json", "text")
TIMED = ("verbose_json", "srt", "vtt")  # OpenAI's formats with timestamps, which an audio LLM does not give
FIELDS = ("file", "model", "prompt", "language", "response_format", "stream", "exact")
IGNORED = ("include", "chunking_strategy")  # OpenAI's, for its own models' logprobs and server-side VAD
OPENAI_MODELS = ("whisper-", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")  # the default model's, unless served
FORM_SLACK = 64 * 1024  # the form's boundaries, part headers and text fields, besides the file
TRANSCRIBE = "Transcribe the audio to text. Write only the words that are spoken, nothing else."
TRANSLATE = "Translate the speech in the audio into English text. Write only the translation, nothing else."
# ISO-639-1 codes as OpenAI's `language` takes them, by name for the instruction (a code not here is given as is)
LANGUAGES = {"ar": "Arabic", "bn": "Bengali", "ca": "Catalan", "cs": "Czech", "da": "Danish", "de": "German",
             "el": "Greek", "en": "English", "es": "Spanish", "fa": "Persian", "fi": "Finnish", "fr": "French",
             "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian", "it": "Italian",
             "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "no": "Norwegian", "pl": "Polish",
             "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sv": "Swedish", "sw": "Swahili",
             "ta": "Tamil", "th": "Thai", "tr": "Turkish", "uk": "Ukrainian", "ur": "Urdu", "vi": "Vietnamese",
             "zh": "Chinese"}


def routes(state: ServeState, bounds: Callable[[], tuple[int, float]]) -> list[Route]:
    """Both routes; `bounds()`: the largest body (serve --max-body) and the read timeout (--read-timeout)."""

    def endpoint(translate: bool) -> Any:
        async def answer(request: Request) -> Response:
            limit, timeout = bounds()
            body = await _form(request, limit, timeout)
            name = body.get("model")
            if isinstance(name, str) and name.startswith(OPENAI_MODELS) and name not in state.workers:
                try:  # OpenAI's model names (Open WebUI's default, whisper-1) mean the default model here
                    state.worker(name)
                except HTTPError:
                    body.pop("model")
            return await handle(state, request, Speech(translate), body)

        return answer

    return [Route(TRANSCRIPTIONS, endpoint(False), methods=["POST"]),
            Route(TRANSLATIONS, endpoint(True), methods=["POST"])]


async def _form(request: Request, limit: int, timeout: float) -> dict[str, Any]:
    """The form's fields, its file's bytes read within the bounds (a 413 past --max-body, a 408 when it stalls),
    or a 4xx that names the field."""
    from starlette.datastructures import UploadFile

    from localgen.serve.files import bounded_body, read_form

    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "multipart/form-data":
        raise HTTPError(415, "send the audio as multipart/form-data, with the field `file` (curl -F file=@clip.wav "
                             f"-F model=NAME; got {kind or 'no content type'!r})", param="file")
    too_big = HTTPError(413, f"the request body is over the limit of {limit:,} bytes (serve --max-body)",
                        param="file")
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit + FORM_SLACK:
        raise too_big
    form = await read_form(request, bounded_body(request, timeout, limit + FORM_SLACK, too_big), 16, "the request")
    try:
        out: dict[str, Any] = {"sampling": {}}
        spellings = settings.spellings("openai")
        for key, value in form.multi_items():
            if key.startswith("timestamp_granularities"):
                raise HTTPError(400, "timestamp_granularities: an audio language model gives no timestamps",
                                param="timestamp_granularities")
            if key == "file" or key.removesuffix("[]") in IGNORED:
                continue
            if key not in FIELDS and key not in spellings:
                raise HTTPError(400, f"unknown field `{key[:40]}` (the fields: {', '.join(FIELDS)}, and chat "
                                     "completions' sampling fields)", param=key[:40])
            if not isinstance(value, str):
                raise HTTPError(400, f"`{key}` must be a text field, not a file", param=key)
            if key in FIELDS:
                out[key] = value
            else:  # a form's values are text: a number, true/false or a JSON list read as JSON
                out["sampling"][key] = _typed(value)
        file = form.get("file")
        if isinstance(file, str):  # a part with no filename (curl's -F 'file=<clip.wav')
            raise HTTPError(400, "the field `file` came as text, with no filename: send it as a file (curl -F "
                                 "file=@clip.wav)", param="file")
        if not isinstance(file, UploadFile):
            raise HTTPError(400, "the form has no file: send the audio as the field `file`", param="file")
        if file.size is not None and file.size > limit:
            raise too_big
        out["file"] = (file.filename or "audio", await file.read(limit + 1))
        return out
    finally:
        await form.close()


class Speech:
    """A transcription (or a translation into English) in the pipeline's terms."""

    claude = False

    def __init__(self, translate: bool) -> None:
        self.translate = translate

    async def parse(self, body: dict[str, Any]) -> Ask:
        import asyncio

        from localgen import media

        name, data = body["file"]
        try:
            clip = await asyncio.to_thread(media.sniff, data, f"the file {name[:100]!r}")
        except MediaError as e:
            raise HTTPError(400, e.message + (f" ({e.hint})" if e.hint else ""), param="file") from None
        if clip.kind != "audio":
            what = f"a {clip.format} image" if clip.kind == "image" else f"{clip.format} video"
            raise HTTPError(400, f"the file {name[:100]!r} is {what}, not audio "
                                 f"(audio: {', '.join(media.AUDIO_FORMATS)})", param="file")
        fmt = body.get("response_format") or "json"
        if fmt in TIMED:
            raise HTTPError(400, f"response_format {fmt} has timestamps, which an audio language model does not "
                                 "give: use json or text", param="response_format")
        if fmt not in FORMATS:
            raise HTTPError(400, f"response_format must be json or text (got {fmt[:40]!r})", param="response_format")
        values = {"temperature": 0.0, **sampling_values(body["sampling"], "openai")}  # OpenAI's default here: 0
        stream, exact = _switch(body, "stream"), _switch(body, "exact")
        audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode("ascii"),
                                                        "format": clip.format.lower()}}
        return Ask(values=values, conversation="file", thinking=False, stream=stream, exact=exact,
                   messages=[{"role": "user", "content": [audio, {"type": "text", "text": self._instruction(body)}]}])

    def _instruction(self, body: dict[str, Any]) -> str:
        """What the model is asked: the client's `prompt` as llama-server takes it (the instruction itself), else
        ours, with the spoken language when it is given."""
        prompt = (body.get("prompt") or "").strip()
        if prompt:
            return prompt
        language = (body.get("language") or "").strip()
        if self.translate or not language:
            return TRANSLATE if self.translate else TRANSCRIBE
        return f"{TRANSCRIBE} The speech is in {LANGUAGES.get(language.lower(), language[:40])}."

    def encoder(self, body: dict[str, Any], ask: Ask, made: Made) -> _Encoder:
        return _Encoder(body.get("response_format") or "json")


def _typed(text: str) -> Any:
    """A form field's text as the JSON value it spells (0.2, 42, true, ["a"]), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _switch(body: dict[str, Any], key: str) -> bool:
    word = str(body.get(key) or "false").strip().lower()
    if word not in ("true", "false"):
        raise HTTPError(400, f"{key} must be true or false", param=key)
    return word == "true"


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, ensure_ascii=False).encode() + b"\n\n"


def _usage(c: Completion) -> dict[str, Any]:
    """gpt-4o-transcribe's usage: tokens in (the clip's among them) and out."""
    return {"type": "tokens", "input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens}


class _Encoder:
    """The text whole (json or plain text), or streamed as OpenAI's transcript.text.delta events and a done."""

    media_type = "text/event-stream"

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.text: list[str] = []

    def opening(self, first: Event) -> list[bytes]:
        return []

    def said(self, pieces: list[Said]) -> list[bytes]:
        out = []
        for p in pieces:  # the answer only: reasoning (a model that thinks anyway) is not the transcript
            if isinstance(p, Piece) and p.kind == "content":
                text = p.text if self.text else p.text.lstrip()  # as the whole text, without leading space
                if text:
                    self.text.append(text)
                    out.append(_event({"type": "transcript.text.delta", "delta": text}))
        return out

    def failed(self, e: HTTPError) -> list[bytes]:
        return [_event({"type": "error", **error_body("openai", e)})]

    async def done(self, c: Completion, job: Job) -> list[bytes]:
        return [_event({"type": "transcript.text.done", "text": "".join(self.text).strip(), "usage": _usage(c)})]

    async def whole(self, c: Completion, job: Job, answer: AnswerStream | None) -> Any:
        text = (answer.content if answer is not None else c.text).strip()
        if self.fmt == "text":
            return PlainTextResponse(text + "\n")
        return {"text": text, "usage": _usage(c)}
