"""What a client asked for, in no API's words: the one typed request every API's parser (serve/openai.py,
anthropic.py, responses.py, ollama.py) gives the pipeline (serve/pipeline.py), and the checks of the fields
they share. A parser checks shapes and names the field at fault; the pipeline does what needs the model."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localgen import settings
from localgen.errors import LocalgenError, UsageError
from localgen.media import OPENAI_WORDS, Inline
from localgen.serve.apierror import HTTPError
from localgen.serve.jobs import NEVER_AFTER, parse_duration


@dataclass(frozen=True)
class Schema:
    """A JSON schema the answer must follow (or "json": any JSON object), and the field that gave it."""

    value: Any
    param: str


@dataclass(frozen=True)
class Ask:
    """One generation request, as every API's parser gives it."""

    values: Mapping[str, Any] = field(default_factory=dict)  # sampling settings by the table's names, unchecked
    messages: Any = None  # chat messages in OpenAI's shape, their media not read yet (read_messages checks them)
    prompt: str | None = None  # a raw prompt; with messages too, it is used when the model has no chat template
    chat: bool = True  # the answer goes through the answer stage (reasoning apart, tool calls); tools allowed
    schema: Schema | None = None  # the answer's JSON schema, made a grammar
    tools: Any = None  # OpenAI's shape (tools/spec.py reads them)
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    thinking: bool | None = None  # the template's thinking switch (None: the template's default)
    template_vars: tuple[tuple[str, Any], ...] = ()  # more template variables (checked chat_template_kwargs)
    effort: str | None = None  # a reasoning effort: low and medium bound the thinking (pipeline.EFFORT_BUDGETS)
    split_reasoning: bool = True  # reasoning apart from the content (reasoning_format "none": left in it)
    logprobs: int | None = None  # top alternatives per token, when log-probabilities are asked for
    exact: bool = False  # the answer this prompt gives alone, even where the server batches
    stream: bool = False
    keep_alive: float | None = None  # seconds the model stays loaded once idle after this request
    conversation: str = "messages"  # the request's field the messages came from (errors name it): input, prompt
    inline: Inline = OPENAI_WORDS  # how the API's errors name media sent inline (Anthropic: source.data)
    fit: bool = False  # fold the oldest turns into a summary where the window cannot hold them (serve/fitting.py)
    excerpts: Any = None  # texts found for the question, placed in it as the window allows (serve/filesearch.py)
    # Ollama's `truncate`: a prompt past the window drops its oldest messages, then keeps this many tokens at its
    # start and the end that fits (serve/ollamatrim.py); None: it is a 400
    truncate_keep: int | None = None


# Where an API's own range for a knob is narrower than the knob's (settings.py: the command line's and Ollama's), a
# request there is held to it, as that API answers it: OpenAI's temperature is 0 to 2 (a client's 3 is a bug there,
# not a wish). Anthropic's narrower ranges are anthropic.py's. More than OpenAI's 4 `stop` strings are taken, as
# llama-server and vLLM take them: a client that sends them was written for those, and they work.
NARROWER: dict[str, dict[str, tuple[float, float]]] = {
    "openai": {"temperature": (0.0, 2.0)}, "responses": {"temperature": (0.0, 2.0)}}


def sampling_values(where: Mapping[str, Any], api: str, prefix: str = "") -> dict[str, Any]:
    """The sampling settings a request gives in an API's spellings (settings.py's table: a knob added there
    reaches every API), by the table's names; each value checked here, so that a 400 names the field the client
    sent (Ollama's options.num_predict, not max_tokens). `prefix`: where they sit (Ollama's "options.")."""
    out: dict[str, Any] = {}
    for theirs, ours in settings.spellings(api).items():
        if theirs in where:
            value = where[theirs]
            if ours == "stop" and api != "anthropic":  # an empty stop string is dropped, as llama-server drops it
                value = _without_empty(value)  # (Anthropic's stop_sequences refuse one, as Anthropic does)
            if value is None:  # null is "not given" (as OpenAI reads it): never over another spelling's value
                out.setdefault(ours, None)
                continue
            _within_api_range(api, theirs, value, prefix + theirs)
            try:
                settings.check(ours, value, prefix + theirs)
            except UsageError as e:
                raise HTTPError(400, e.message, param=prefix + theirs) from None
            out[ours] = value
    return out


def _within_api_range(api: str, theirs: str, value: Any, label: str) -> None:
    """A 400 naming the field when a number is past the API's own range for it (NARROWER); anything else is
    settings.check's to judge."""
    bounds = NARROWER.get(api, {}).get(theirs)
    if bounds is None or isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(settings.as_float(value)):  # (an integer of 400 digits is not a finite number)
        return
    lo, hi = bounds
    if not lo <= value <= hi:
        raise HTTPError(400, f"{settings.out_of_range(label, lo, hi, value)} (OpenAI's range)", param=label)


def _without_empty(stop: Any) -> Any:
    """A stop field without its empty strings ("" alone: none given); any other shape, as sent (checked after)."""
    if stop == "":
        return None
    if isinstance(stop, list) and "" in stop:
        return [x for x in stop if x != ""]
    return stop


def split_reasoning(body: Mapping[str, Any]) -> bool:
    """llama-server's `reasoning_format`: "none" leaves the thinking in the answer's text; any other value (or
    none given) puts it apart, in each API's reasoning field."""
    return body.get("reasoning_format") != "none"


def flag(where: Mapping[str, Any], key: str, param: str | None = None, default: bool = False) -> bool:
    """A true/false field (absent or null: `default`)."""
    value = where.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise HTTPError(400, f"`{param or key}` must be true or false", param=param or key)
    return value


def positive_int(where: Mapping[str, Any], key: str, required: bool = False) -> int | None:
    """A positive integer field (absent: None, or a 400 saying it is required)."""
    value = where.get(key)
    if value is None:
        if required:
            raise HTTPError(400, f"{key}: Field required", param=key)
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HTTPError(400, f"{key} must be a positive integer", param=key)
    return value


def optional_object(where: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """A field that must be an object when given."""
    value = where.get(key)
    if value is not None and not isinstance(value, dict):
        raise HTTPError(400, f"{key} must be an object", param=key)
    return value


def one_of(value: Any, allowed: tuple[str, ...], param: str) -> str | None:
    """A field that is one of a few words when given."""
    if value is not None and value not in allowed:
        raise HTTPError(400, f"{param} must be one of {', '.join(allowed)}", param=param)
    return str(value) if value is not None else None


def keep_alive(value: Any, param: str) -> float | None:
    """How long the model stays loaded once idle: Ollama's keep_alive (a duration) or LM Studio's ttl (seconds,
    0 or more)."""
    if value is None:
        return None
    if param == "ttl":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise HTTPError(400, "`ttl` must be a number of seconds, 0 or more", param="ttl")
        return -1.0 if value > NEVER_AFTER else float(value)  # a century or more: never, as keep_alive's
    try:
        return parse_duration(value)
    except LocalgenError as e:
        raise HTTPError(400, f"`{param}`: {e.message}", param=param) from None
