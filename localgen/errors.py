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


class ModelFormatError(LocalgenError):
    """The file is not a GGUF model llama.cpp can read (not GGUF, truncated, corrupt)."""


class ModelLoadError(LocalgenError):
    """llama.cpp refused to load the model; carries the last llama.cpp log lines."""

    def __init__(self, message: str, hint: str | None = None, log: list[str] | None = None) -> None:
        super().__init__(message, hint)
        self.log = log or []


class TemplateError(LocalgenError):
    """The model's chat template is missing, broken, hostile, or too slow."""


class ContextOverflowError(LocalgenError):
    """The prompt does not fit the context window."""


class GrammarError(LocalgenError):
    """A grammar or JSON schema for constrained output is invalid."""


class RemoteError(LocalgenError):
    """A remote endpoint failed: unreachable, refused, or broke its stream. `down` says the endpoint
    itself is gone (others may take its work); `partial` that part of an answer had already arrived."""

    def __init__(self, message: str, hint: str | None = None, down: bool = False, partial: bool = False) -> None:
        super().__init__(message, hint)
        self.down = down
        self.partial = partial


class ToolError(LocalgenError):
    """A tool definition, a model's call to a tool, or a tool's run went wrong."""
