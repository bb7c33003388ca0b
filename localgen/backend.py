"""The seam between the commands and whatever generates: `run`, `chat`, `bench` and `serve` hold a
Backend and send it GenerationRequests. The local engine is one implementation (engine/local.py); a
remote OpenAI-compatible endpoint is another. Stdlib only: nothing here loads a model."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from localgen.types import Chunk, FinishReason, GenerationRequest, Stats, TokenLogprob


class Generation(Protocol):
    """A lazy stream: iterate for Chunks; .text, .finish_reason and .stats are final once it ends."""

    text: str
    seed: int
    finish_reason: FinishReason | None
    stats: Stats | None
    logprobs: list[TokenLogprob]
    prompt_cache: str  # "hit", "saved", "skipped", "too big", "unwritable" or "off"

    def __iter__(self) -> Iterator[Chunk]: ...
    def cancel(self) -> None: ...
    def close(self) -> None: ...


@dataclass
class Completion:
    """What one of many requests produced (run --file, serve's batch)."""

    index: int
    text: str
    finish_reason: str  # a FinishReason, or "error: ..." for a request that could not run
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    total_s: float
    seed: int
    logprobs: list[TokenLogprob] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens a slot's cache already held
    prompt_s: float = 0.0  # evaluating the prompt
    decode_s: float = 0.0  # generating
    error: Exception | None = None  # why a request could not run (its finish_reason then says "error: ...")
    drafted: int = 0  # speculative decoding (prompt lookup): tokens drafted, and those the model kept
    accepted: int = 0
    stats: Stats | None = None  # a remote answer's, as its stream counted them (run --file --json's "stats")
    server_timings: dict[str, Any] | None = None  # what a remote server reported (llama-server's shape)


@dataclass(frozen=True)
class Indexed:
    """One of many requests, with its position in the input."""

    index: int
    request: GenerationRequest
    seed: int


class Backend(Protocol):
    """Something that generates. `name` is the model as the user named it; `n_ctx` its window; `defaults`
    the sampling settings recommended for it (under the user's)."""

    name: str
    defaults: dict[str, Any]

    @property
    def n_ctx(self) -> int:
        """The context window in tokens."""
        ...

    def generate(self, request: GenerationRequest, started: float | None = None) -> Generation:
        """Start a stream (raises ContextOverflowError, TemplateError, GrammarError before any work)."""
        ...

    def window_cap(self) -> int | None:
        """The largest window any --ctx gives: a local model's trained context, where the load caps the window
        (engine/defaults.py); None where nothing caps it (a remote server's window is its own)."""
        ...

    def count(self, request: GenerationRequest) -> int:
        """Prompt tokens the request takes."""
        ...

    def check_size(self, request: GenerationRequest) -> None:
        """A ContextOverflowError for a prompt whose text cannot fit the window whatever the tokenizer makes of it,
        found by its size alone, before the template writes it out or the tokenizer reads it."""
        ...

    def render(self, request: GenerationRequest) -> str:
        """The prompt text as the model sees it (after the chat template)."""
        ...

    def run_many(self, requests: Iterable[Indexed], parallel: int, on_done: Callable[[Completion], None],
                 exact: bool | None = None) -> dict[str, Any]:
        """Complete many requests, up to `parallel` at once; on_done gets each as it finishes (any order).
        Returns counters for --stats (e.g. decode calls and rows; a local model's `why`: the batching mode's
        reason)."""
        ...

    def save_conversation(self, name: str) -> None:
        """Keep what makes resuming conversation `name` cheap (a local KV state; nothing for a remote)."""
        ...

    def restore_conversation(self, name: str, request: GenerationRequest) -> int:
        """Restore it if it still matches the request; returns the prompt tokens it saves."""
        ...

    def describe(self) -> dict[str, Any]:
        """The model and load settings, for --json and /show."""
        ...

    def close(self) -> None:
        """Free what the backend holds."""
        ...


OverflowCase = Literal["open", "full", "past", "grow"]


def overflow_case(n_ctx: int, cap: int | None, needed: int | None = None, room: int = 1) -> OverflowCase:
    """Which remedy helps a prompt of `needed` tokens (None: not counted) that an `n_ctx` window cannot hold, where
    `cap` is the largest window any --ctx gives (Backend.window_cap; None: nothing caps it) and `room` the tokens the
    window keeps free beside the prompt (one: a window of N holds N - 1; chat's answer room at that window):
    "open" (a larger --ctx), "full" (the window is the cap already), "past" (the cap cannot hold it: shorter, or
    RoPE scaling) or "grow" (a larger --ctx, up to the cap). run's and chat's overflow hints word each case."""
    if not cap:
        return "open"
    if n_ctx >= cap:
        return "full"
    if needed is not None and needed + room > cap:
        return "past"
    return "grow"
