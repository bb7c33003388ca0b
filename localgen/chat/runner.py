"""One chat: a ChatSession bound to a loaded engine and the current sampling settings. No UI here."""

from __future__ import annotations

import dataclasses
from typing import Any

from localgen.chat.session import ChatSession
from localgen.errors import UsageError
from localgen.types import SAMPLING_RANGES, SamplingParams, Stats, in_range

# /set names a user may type, mapped to SamplingParams fields.
ALIASES = {
    "temp": "temperature", "top-k": "top_k", "top-p": "top_p", "min-p": "min_p", "typical": "typical_p",
    "typical-p": "typical_p", "repeat-penalty": "repeat_penalty", "repeat-last-n": "repeat_last_n",
    "presence-penalty": "presence_penalty", "frequency-penalty": "frequency_penalty",
    "max-tokens": "max_tokens", "num_predict": "max_tokens",
}
SETTABLE = sorted({*SAMPLING_RANGES, "stop"})


def parse_setting(name: str, value: str) -> tuple[str, Any]:
    """Validate `/set NAME VALUE` for a sampling knob; returns (field, typed value)."""
    key = ALIASES.get(name.lower(), name.lower().replace("-", "_"))
    if key == "stop":
        return key, tuple(v for v in value.split("|") if v) if value not in ("", "none", "off") else ()
    if key not in SAMPLING_RANGES:
        raise UsageError(f"unknown setting {name!r}; settable: {', '.join(SETTABLE)}, system, think, verbose")
    default = getattr(SamplingParams(), key)
    if key == "seed" and value.lower() in ("none", "random", "off"):
        return key, None
    try:
        typed: Any = int(value) if isinstance(default, int) or key == "seed" else float(value)
    except ValueError:
        raise UsageError(f"{key} takes a number, not {value!r}") from None
    if not in_range(key, typed):
        lo, hi = SAMPLING_RANGES[key]
        bounds = f"{lo if lo is not None else '-inf'} to {hi if hi is not None else 'inf'}"
        raise UsageError(f"{key} must be within {bounds}, not {value}")
    return key, typed


class ChatRunner:
    """Builds each turn's prompt from the whole conversation (the engine reuses the cached prefix),
    trims old turns when the window is full, and records answers."""

    def __init__(self, session: ChatSession, engine: Any, sampling: SamplingParams) -> None:
        self.session = session
        self.engine = engine
        self.sampling = sampling
        self.last_stats: Stats | None = None
        self.trim_noticed = False

    def set(self, name: str, value: str) -> str:
        """Change one sampling setting; returns a confirmation."""
        key, typed = parse_setting(name, value)
        self.sampling = dataclasses.replace(self.sampling, **{key: typed})
        self.session.settings[key] = list(typed) if isinstance(typed, tuple) else typed
        return f"{key} = {typed!r}"

    def reserve(self) -> int:
        """Tokens kept free for the answer when deciding whether the history fits."""
        n_ctx = int(self.engine.n_ctx)
        want = self.sampling.max_tokens if self.sampling.max_tokens > 0 else n_ctx // 4
        return max(16, min(want, n_ctx // 2))

    def count(self, conversation: list[dict[str, str]]) -> int:
        """Prompt tokens of a conversation as the template renders it."""
        return len(self.engine.chat_tokens(conversation))

    def start(self, user_text: str) -> tuple[Any, int]:
        """Add the user turn and start the answer; returns (Generation, messages dropped to fit)."""
        self.session.add("user", user_text)
        return self.answer()

    def answer(self) -> tuple[Any, int]:
        """Start an answer to the conversation as it stands (used by start and /retry)."""
        limit = int(self.engine.n_ctx) - self.reserve()
        dropped = self.session.trim(lambda conv: self.count(conv) <= limit)
        tokens = self.engine.chat_tokens(self.session.conversation())
        return self.engine.generate(tokens, self.sampling), dropped

    def finish(self, gen: Any) -> None:
        """Record the answer (also a cancelled one: what was generated is kept)."""
        self.session.add("assistant", gen.text)
        self.last_stats = gen.stats
        self.session.save()

    def context_used(self) -> tuple[int, int]:
        """(tokens the conversation takes now, context window)."""
        conv = self.session.conversation()
        return (self.count(conv) if conv else 0), int(self.engine.n_ctx)

    def switch(self, engine: Any, model_name: str) -> None:
        """Use another model for the rest of the conversation."""
        old = self.engine
        self.engine = engine
        self.session.model = model_name
        old.close()

