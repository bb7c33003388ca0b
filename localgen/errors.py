"""The one exception family users see: a message, a hint, and an exit code."""

from __future__ import annotations


class LocalgenError(Exception):
    """An error the user can act on; printed as one line at the CLI boundary."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(LocalgenError):
    """The command line asks for something impossible."""

    exit_code = 2


class ModelNotFoundError(LocalgenError):
    """No model file or catalogue entry matches the name."""


class NotDownloadedError(ModelNotFoundError):
    """A Hub model that is not in the cache, where nothing may be downloaded (offline, or a caller that never
    downloads): `name` is the model as `localgen pull` takes it."""

    def __init__(self, message: str, hint: str | None = None, *, name: str) -> None:
        super().__init__(message, hint)
        self.name = name


class ModelFormatError(LocalgenError):
    """The file is not a GGUF model llama.cpp can read (not GGUF, truncated, corrupt)."""


class NotAModelFile(UsageError, ModelFormatError):
    """A path given as a model names a folder: no model, as a bad file is, but the command line's mistake (exit 2,
    as a folder given to -m is)."""


class ModelLoadError(LocalgenError):
    """llama.cpp refused to load the model; carries the last llama.cpp log lines."""

    def __init__(self, message: str, hint: str | None = None, log: list[str] | None = None) -> None:
        super().__init__(message, hint)
        self.log = log or []


class TemplateError(LocalgenError):
    """The model's chat template is missing, broken, hostile, or too slow."""


class ContextOverflowError(LocalgenError):
    """The prompt does not fit the context window."""


class GrammarError(UsageError):
    """A grammar or JSON schema for constrained output is invalid: bad usage (exit 2), as any other flag's bad
    file is; a server's 400. `part`: which of several schemas converted together (a request's tools) it is."""

    def __init__(self, message: str, hint: str | None = None, part: int | None = None) -> None:
        super().__init__(message, hint)
        self.part = part


class RemoteError(LocalgenError):
    """A remote endpoint failed: unreachable, refused, or broke its stream. `down` says the endpoint
    itself is gone (others may take its work); `partial` that part of an answer had already arrived."""

    def __init__(self, message: str, hint: str | None = None, down: bool = False, partial: bool = False) -> None:
        super().__init__(message, hint)
        self.down = down
        self.partial = partial


class ToolError(LocalgenError):
    """A tool definition, a model's call to a tool, or a tool's run went wrong. The message is one line, as
    every error is: a tool's own text (an exception's message, an MCP server's error, a traceback) has its lines
    joined and is cut at MESSAGE_CHARS."""

    MESSAGE_CHARS = 400

    def __init__(self, message: str, hint: str | None = None) -> None:
        text = " ".join(line.strip() for line in message.splitlines() if line.strip())
        if len(text) > self.MESSAGE_CHARS:
            text = text[:self.MESSAGE_CHARS - 1] + "…"
        super().__init__(text, hint)


# ---- a served request's faults: raised where the fault is found, each with the HTTP status it answers with
# (serve/common.py maps them to each API's error shape, in one place)


class ServeError(LocalgenError):
    """A request the server cannot complete; `status` is the HTTP status it answers with, `param` the request
    field at fault (when one is)."""

    status = 500
    param: str | None = None


class BadRequest(ServeError):
    """The request is malformed or asks for something impossible."""

    status = 400


class BiasOutsideVocabulary(UsageError, BadRequest):
    """A logit bias on a token the model's vocabulary lacks: a usage error (`run --logit-bias`), a server's 400
    naming the request's field."""

    param = "logit_bias"


class PromptTooLong(BadRequest):
    """The prompt (or a text to embed) does not fit the window: a 400, as OpenAI answers it (code
    context_length_exceeded) and Anthropic ("prompt is too long: N tokens > M maximum"), which agents read to
    compact their context. `tokens` and `window`, when known, give each API its own words."""

    status = 400
    tokens: int | None = None
    window: int | None = None


def prompt_too_long(message: str, tokens: int, window: int) -> PromptTooLong:
    """A PromptTooLong that knows its numbers."""
    e = PromptTooLong(message)
    e.tokens, e.window = tokens, window
    return e


class EmptyPrompt(UsageError, BadRequest):
    """A prompt of no tokens: nothing to evaluate, so nothing to predict from (llama.cpp cannot decode it)."""

    status = 400

    def __init__(self, param: str = "prompt") -> None:
        super().__init__("prompt must not be empty: it makes no tokens for this model to predict from",
                         hint="give a prompt of at least one token")
        self.param = param  # the request's field: `messages` for a chat whose template rendered nothing


class WrongModel(UsageError, BadRequest):
    """The model cannot do what it is asked: text from an encoder, scores from a model that is not a reranker,
    embeddings from a reranker, an image read by a model without a projector. In a request, `param` names the
    field at fault: its `model`, or the conversation that sent what the model cannot read."""

    status = 400

    def __init__(self, message: str, hint: str | None = None, param: str = "model") -> None:
        super().__init__(message, hint)
        self.param = param


def no_chat_template(name: str, needs: str, hint: str) -> WrongModel:
    """A model without a chat template asked for what only a template carries, said alike by run, chat and their
    plans: "NAME has no chat template (it may be a base model), which tools need"."""
    return WrongModel(f"{name} has no chat template (it may be a base model), which {needs}", hint=hint)


class NotFound(ServeError):
    """No such model or route."""

    status = 404


class Cancelled(ServeError):
    """The client went away or the job was aborted (nginx's 499: nobody reads the answer)."""

    status = 499


class Overloaded(ServeError):
    """Every slot is busy and the queue is full, or the server is shutting down."""

    status = 503


class Internal(ServeError):
    """A bug or a fault, not the client's: the details go to the server's log."""

    status = 500
