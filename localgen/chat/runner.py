"""One chat: a ChatSession bound to a backend, the current sampling settings and the chat's tools. No UI
here: a turn's events go to a `show` callback and each tool call to an `approve` one.

The whole conversation is kept and saved; only what is sent to the model is cut to the window. The window
only moves forward (each turn's prompt then extends the last one, and the KV cache is reused)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localgen import settings
from localgen.backend import Backend
from localgen.chat.session import ChatSession
from localgen.errors import ContextOverflowError, LocalgenError
from localgen.types import GenerationRequest, Message, SamplingParams, Stats, thinking_args

SETTABLE = sorted(settings.KNOBS)


class ChatRunner:
    """Builds each turn's request from the conversation (the backend reuses the cached prefix), sends the
    newest turns that fit the window, and records answers."""

    def __init__(self, session: ChatSession, backend: Backend, sampling: SamplingParams) -> None:
        self.session = session
        self.backend = backend
        self.sampling = sampling
        self.last_stats: Stats | None = None  # the last turn's, over all its rounds of tool calls
        self.last_context = 0  # tokens the conversation took in the window at the end of the last turn
        self.first = 0  # the first message sent to the model
        self.trim_noticed = False
        self.last_request: GenerationRequest | None = None
        self.on_answer: Callable[[GenerationRequest, Any, str], None] | None = None  # told of each recorded answer
        self.toolbox: Any = None  # the chat's tools (tools/loop.py Toolbox), or None
        self.tool_choice = "auto"  # the first round of each answer: auto, required, or a tool's name
        self.tool_steps = 8
        self.tool_timeout = 30.0
        self.json_schema: str | None = None  # sent with every request (a remote server builds its own grammar)
        self.prompt_cache = False  # the system prompt and tools' schemas kept on disk (local backends: --prompt-cache)
        self.thinking: bool | None = None  # the template's thinking switch (--think, /set reasoning); None: default
        self.gen: Any = None  # the generation under way
        self.stopping = False  # the answer under way was asked to stop
        self._plans: dict[tuple[str | None, str, tuple[str, ...]], Any] = {}  # plan() by (template, choice, tools)
        self.warn: Callable[[str], None] = lambda text: None  # told when the conversation's file cannot be written
        self.unsaved: str | None = None  # why the conversation's file is behind it (its last save failed), or None

    def set(self, name: str, value: str) -> str:
        """Change one sampling setting (validated as flags are); returns a confirmation."""
        key, typed = settings.parse_text(name, value)
        self.sampling = dataclasses.replace(self.sampling, **{key: typed}, asked=self.sampling.asked | {key})
        self.session.settings[key] = settings.jsonable(typed)
        return f"{key} = {settings.as_text(key, typed)}"

    def reserve(self) -> int:
        """Tokens kept free for the answer when deciding whether the history fits."""
        n_ctx = int(self.backend.n_ctx)
        want = self.sampling.max_tokens if self.sampling.max_tokens > 0 else n_ctx // 4
        return max(16, min(want, n_ctx // 2))

    def request(self, messages: list[Message]) -> GenerationRequest:
        """A request for these messages with the current settings. Without tools, earlier calls and results
        are written as plain turns (a template need not know tool roles). A model here without a chat
        template gets the conversation as plain text to continue (plain_text)."""
        if self.toolbox is None and any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
            from localgen.tools.plan import plain_history

            messages = list(plain_history(tuple(messages)))
        if not has_template(self.backend):
            if self.toolbox is not None:
                raise LocalgenError(f"{self.backend.name} has no chat template (it may be a base model), which tools "
                                    "need", hint="chat without --functions/--mcp, or give a template with "
                                                 "--chat-template-file")
            return GenerationRequest(prompt=plain_text(messages, self.backend.name), sampling=self.sampling)
        return GenerationRequest(messages=tuple(messages), sampling=self.sampling, json_schema=self.json_schema,
                                 template_args=thinking_args(self.thinking), prompt_cache=self.prompt_cache)

    def count(self, messages: list[Message]) -> int:
        """Prompt tokens of a conversation as the template renders it (with the tools, when there are any)."""
        request = self.request(messages)
        plan = self.plan()
        if plan is not None:
            from localgen.tools.plan import with_tools

            request = with_tools(plan, request)
        return int(self.backend.count(request))

    def template(self) -> str | None:
        """The chat template the model renders with (None for a remote one)."""
        from localgen.tools.plan import template_of

        return template_of(self.backend)

    def plan(self, choice: str = "auto") -> Any:
        """The tools' plan for this model (None without tools), made once per template and choice: counting
        each window a turn considers would otherwise build the tools' grammar again every time."""
        from localgen.tools.loop import plan_for

        key = (self.template(), choice, tuple(s.name for s in self.toolbox.specs) if self.toolbox is not None else ())
        if key not in self._plans:  # the tools are a part of the key: those of an MCP server that stopped go
            self._plans[key] = plan_for(key[0], self.toolbox, choice)
        return self._plans[key]

    def sent(self) -> list[Message]:
        """What the model sees now: the system prompt and the messages of the window."""
        head = [{"role": "system", "content": self.session.system}] if self.session.system else []
        return head + self.session.messages[self.first:]

    def start(self, user_text: str, media: list[Any] | None = None) -> int:
        """Add the user turn (with its images or audio, if any) and get its answer ready (see prepare); returns
        the messages left out of the window. A message that cannot fit even alone is refused and the
        conversation stays as it was."""
        from localgen.media import content

        self.session.add("user", content(user_text, list(media or [])))
        try:
            return self.prepare()
        except BaseException:
            self.session.messages.pop()
            raise

    def prepare(self) -> int:
        """Fit the conversation as it stands to the window for the next answer (used by start and /retry)."""
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
        return self.first

    def reply(self, show: Callable[[Any], None], approve: Callable[[Any], bool], turn: Any) -> Any:
        """Answer the prepared request into `turn` (tools/loop.py Turn), running the tools the model calls
        (each after `approve`), until a plain answer. `show` sees every event as it happens. Whatever
        raises, `turn` holds what is settled so far (see record)."""
        from localgen.tools.loop import run_turn

        assert self.last_request is not None
        plan = self.plan()
        first = None
        if plan is not None and self.tool_choice != "auto" and (self.tool_choice in ("required", "none") or any(
                s.name == self.tool_choice for s in self.toolbox.specs)):  # not a tool of a server that stopped
            first = self.plan(self.tool_choice)
        return run_turn(self, self.last_request, plan, self.toolbox, approve, show, self.tool_steps,
                        self.tool_timeout, self.template(), first=first, turn=turn,
                        stopped=lambda: self.stopping)

    def generate(self, request: GenerationRequest) -> Any:
        """The backend's generation, kept so that stop() can reach it (reply's rounds come through here)."""
        self.gen = self.backend.generate(request)
        if self.stopping:  # stop() came before this generation existed (Ctrl-C before the answer began)
            self.gen.cancel()
        return self.gen

    def stop(self) -> None:
        """Stop the answer under way between two tokens, or the one about to begin; no further round starts
        (until the next turn clears `stopping`)."""
        self.stopping = True
        if self.gen is not None:
            self.gen.cancel()

    def record(self, turn: Any) -> None:
        """Add the turn's settled messages (also a stopped answer's: what was generated is kept), and save."""
        self.session.messages.extend(turn.messages)
        gen = turn.generations[-1] if turn.generations else None
        self.last_stats = turn.stats()
        if steps := turn.step_stats():
            self.last_context = steps[-1].prompt_tokens + steps[-1].completion_tokens
        self.save()
        if self.on_answer is not None and self.last_request is not None and gen is not None:
            self.on_answer(self.last_request, gen, turn.text)

    def save(self, warn: bool = True) -> Path | None:
        """Save the conversation; its path, or None where the file cannot be written (a read-only or full disk).
        That never stops the chat: the answer is already shown and kept in memory, the first failure is a
        warning, each later save tries again, and `unsaved` says why until one succeeds."""
        try:
            path = self.session.save()
        except OSError as e:
            where = os.fsdecode(e.filename) if e.filename is not None else str(self.session.path)
            why = f"cannot write {where}: {e.strerror or e}"
            if warn and self.unsaved is None:
                self.warn(f"{why}; the chat goes on, but the conversation is not saved")
            self.unsaved = why
            return None
        self.unsaved = None
        return path

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


def has_template(backend: Backend) -> bool:
    """Whether the backend renders messages: a remote one does (its server), a model here where it has a chat
    template (a base model has none)."""
    engine = getattr(backend, "engine", None)
    return engine is None or bool(engine.model.summary.chat_template)


def plain_text(messages: list[Message], model: str) -> str:
    """A conversation as plain text for a model without a chat template to continue: each message's text
    followed by a newline, the system prompt first (as a typed line is sent, the answer continuing it)."""
    parts = []
    for m in messages:
        if not isinstance(m["content"], str):
            raise LocalgenError(f"{model} has no chat template (it may be a base model), which images and audio "
                                "need", hint="give it a template with --chat-template-file")
        parts.append(m["content"] + "\n")
    return "".join(parts)
