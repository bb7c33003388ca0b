"""One chat: a ChatSession bound to a backend and the current sampling settings. No UI here.

The whole conversation is kept and saved; only what is sent to the model is cut to the window. The window
only moves forward (each turn's prompt then extends the last one, and the KV cache is reused)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from localgen import settings
from localgen.backend import Backend
from localgen.chat.session import ChatSession
from localgen.errors import ContextOverflowError
from localgen.types import GenerationRequest, Message, SamplingParams, Stats

SETTABLE = sorted(settings.KNOBS)


class ChatRunner:
    """Builds each turn's request from the conversation (the backend reuses the cached prefix), sends the
    newest turns that fit the window, and records answers."""

    def __init__(self, session: ChatSession, backend: Backend, sampling: SamplingParams) -> None:
        self.session = session
        self.backend = backend
        self.sampling = sampling
        self.last_stats: Stats | None = None
        self.first = 0  # the first message sent to the model
        self.trim_noticed = False
        self.last_request: GenerationRequest | None = None
        self.on_answer: Callable[[GenerationRequest, Any], None] | None = None  # told of each recorded answer

    def set(self, name: str, value: str) -> str:
        """Change one sampling setting (validated as flags are); returns a confirmation."""
        key, typed = settings.parse_text(name, value)
        self.sampling = dataclasses.replace(self.sampling, **{key: typed})
        self.session.settings[key] = settings.jsonable(typed)
        return f"{key} = {typed!r}"

    def reserve(self) -> int:
        """Tokens kept free for the answer when deciding whether the history fits."""
        n_ctx = int(self.backend.n_ctx)
        want = self.sampling.max_tokens if self.sampling.max_tokens > 0 else n_ctx // 4
        return max(16, min(want, n_ctx // 2))

    def request(self, messages: list[Message]) -> GenerationRequest:
        """A request for these messages with the current settings."""
        return GenerationRequest(messages=tuple(messages), sampling=self.sampling)

    def count(self, messages: list[Message]) -> int:
        """Prompt tokens of a conversation as the template renders it."""
        return int(self.backend.count(self.request(messages)))

    def sent(self) -> list[Message]:
        """What the model sees now: the system prompt and the messages of the window."""
        head = [{"role": "system", "content": self.session.system}] if self.session.system else []
        return head + self.session.messages[self.first:]

    def start(self, user_text: str) -> tuple[Any, int]:
        """Add the user turn and start the answer; returns (Generation, messages left out of the window).
        A message that cannot fit even alone is refused and the conversation stays as it was."""
        self.session.add("user", user_text)
        try:
            return self.answer()
        except BaseException:
            self.session.messages.pop()
            raise

    def answer(self) -> tuple[Any, int]:
        """Start an answer to the conversation as it stands (used by start and /retry)."""
        n_ctx = int(self.backend.n_ctx)
        limit = n_ctx - self.reserve()
        self.first = self.session.window_start(lambda conv: self.count(conv) <= limit, self.first)
        need = self.count(self.sent())
        if need > limit:
            raise ContextOverflowError(
                f"this message needs {need:,} tokens with the system prompt, and {self.reserve():,} more are kept "
                f"for the answer; the context window is {n_ctx:,}",
                hint="shorten it, or restart with a larger --ctx; the conversation is kept",
            )
        self.last_request = self.request(self.sent())
        return self.backend.generate(self.last_request), self.first

    def finish(self, gen: Any) -> None:
        """Record the answer (also a cancelled one: what was generated is kept)."""
        self.session.add("assistant", gen.text)
        self.last_stats = gen.stats
        self.session.save()
        if self.on_answer is not None and self.last_request is not None:
            self.on_answer(self.last_request, gen)

    def forget(self) -> None:
        """After /clear or /undo: the window cannot start past the end."""
        self.first = min(self.first, max(0, len(self.session.messages) - 1))
        if not self.session.messages:
            self.first = 0

    def context_used(self) -> tuple[int, int]:
        """(tokens the conversation takes now, context window)."""
        conv = self.sent()
        return (self.count(conv) if conv else 0), int(self.backend.n_ctx)

    def switch(self, backend: Backend, model_name: str) -> None:
        """Use another model for the rest of the conversation."""
        old = self.backend
        self.backend = backend
        self.session.model = model_name
        self.first = 0
        old.close()

    def adopt(self, session: ChatSession, sampling: SamplingParams) -> None:
        """Continue another conversation (/load) with its own settings."""
        self.session = session
        self.sampling = sampling
        self.first = 0
        self.trim_noticed = False
