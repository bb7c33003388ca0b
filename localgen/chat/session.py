"""A chat conversation: messages, the system prompt, the summary of its compacted turns, trimming to the
window, crash-safe saving (the saved file's form and reading it: saved.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen import paths, settings
from localgen.chat.saved import (
    FORMAT,
    LOAD_READ,
    SAVED_KEYS,
    BadField,
    chats_dir,
    check_depth,
    checked_messages,
    saved_flag,
    saved_form,
    saved_time,
    stamp,
    valid_name,
    why_unreadable,
)
from localgen.errors import LocalgenError, UsageError
from localgen.media import text_of
from localgen.regular import Unreadable, read_regular
from localgen.types import Message


def check_name(name: str, model_hint: str | None = "localgen chat -m") -> str:
    """A conversation name is a plain file-name-safe word; anything else is a usage error. With `model_hint` (how
    a model is chosen where the name was given: `/model` for /load), a word that looks like a model's name
    (NAME:TAG, OWNER/REPO) says how to chat with that model; a path (../x) never does, nor /save's word."""
    if not valid_name(name):  # `$` alone would take a name ending in a newline
        model = model_hint is not None and _MODEL.fullmatch(name) and (":" in name or "/" in name) and \
            ".." not in name.split("/") and not name.lower().endswith(".gguf")  # a path (models/x.gguf) is not
        raise UsageError(f"bad conversation name {name!r}: use at most 64 letters, digits, '.', '_' or '-', "
                         "beginning with a letter or digit",
                         hint=f"to chat with the model {name}: {model_hint} {name}" if model else None)
    return name


# `ollama run MODEL` typed where the name goes: NAME:TAG, OWNER/REPO[:QUANT], hf.co/..., ollama:...; not a path
_MODEL = re.compile(r"(?:[a-z]+:)?[A-Za-z0-9][\w.-]*(?:/[\w.-]+)*(?::[\w.-]+)?")  # ollama:x:y, hf.co/o/r:q


def new_name() -> str:
    """A fresh name from the clock, e.g. chat-20261122-061502 (claimed only at the first save: see save)."""
    base = time.strftime("chat-%Y%m%d-%H%M%S")
    name = base
    while (chats_dir() / f"{name}.json").exists():
        name = _next_name(name)
    return name


def _next_name(name: str) -> str:
    """chat-...-061502 → chat-...-061502-2 → chat-...-061502-3."""
    base, _, n = name.rpartition("-")
    return f"{base}-{int(n) + 1}" if base.count("-") >= 2 and n.isdigit() and len(n) < 4 else f"{name}-2"


@dataclass(frozen=True)
class Summary:
    """What compaction made of the oldest messages: the model's summary of `messages[:covers]`, sent in their
    place after the system prompt. Those messages stay in the conversation as they were."""

    text: str
    covers: int  # messages[:covers] are folded into the text
    tokens: int  # the text's tokens, as the summary request generated them
    compactions: int  # how many compactions made it (each folds the summary before it in)
    model: str  # the model that wrote it
    created: float

    def to_dict(self) -> dict[str, Any]:
        """The saved form."""
        return {"text": self.text, "covers": self.covers, "tokens": self.tokens, "compactions": self.compactions,
                "model": self.model, "created": self.created}

    @classmethod
    def from_dict(cls, data: Any, n_messages: int) -> Summary:
        """A saved summary; ValueError when it is not one (or covers messages the conversation lacks)."""
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise ValueError("summary")
        covers, tokens, count = data.get("covers", 0), data.get("tokens", 0), data.get("compactions", 1)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (covers, tokens, count)):
            raise ValueError("summary")
        if not 0 < covers <= n_messages:
            raise ValueError("summary")
        return cls(text=data["text"], covers=covers, tokens=tokens, compactions=count,
                   model=str(data.get("model") or ""), created=float(data.get("created", 0)))


@dataclass
class ChatSession:
    """The conversation so far. `messages` holds user and assistant turns (an assistant turn may carry
    tool_calls, answered by `tool` messages); the system prompt is apart, so trimming can never drop it."""

    name: str
    model: str
    system: str | None = None
    messages: list[Message] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    log_id: str | None = None  # this chat's conversation in the log (localgen logs --cid)
    fresh: bool = False  # a new conversation: its first save claims the name, never overwriting another's
    auto_named: bool = False  # the name came from the clock: if taken meanwhile, the next free one is used
    summary: Summary | None = None  # the oldest messages folded by compaction (they stay in `messages`)
    compact: bool | None = None  # compaction chosen on (--compact, /set compact) or off; None: never chosen
    # the file as this chat last read or wrote it (path, mtime_ns, size): another chat's save since is seen
    seen: tuple[str, int, int] | None = field(default=None, compare=False, repr=False)
    forked: str | None = None  # the name this chat left, its file saved by another chat since (said once)
    # what a loaded file holds that localgen does not use (another tool's fields): written back as it was
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def conversation(self) -> list[Message]:
        """Messages as the template sees them, system prompt first."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def add(self, role: str, content: str | list[dict[str, Any]]) -> None:
        """Append a turn."""
        self.messages.append({"role": role, "content": content})

    def undo(self) -> bool:
        """Drop the last exchange (the last user message and everything after it)."""
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i]["role"] == "user":
                del self.messages[i:]
                return True
        return False

    def pop_answer(self) -> str | None:
        """Remove the last answer, with its tool calls and results (for /retry); returns the user message it
        answered."""
        while self.messages and self.messages[-1]["role"] in ("assistant", "tool"):
            self.messages.pop()
        if self.messages and self.messages[-1]["role"] == "user":
            return text_of(self.messages[-1]["content"])
        return None

    def window_start(self, fits: Callable[[list[Message]], bool], start: int = 0,
                     head: list[Message] | None = None) -> int:
        """The index of the first message to send so that `fits(head + messages[i:])`, from `start` on (`head`:
        the system prompt, and the summary where there is one); a window always begins at a user turn and
        keeps the last message. Nothing is removed: the saved conversation keeps every turn."""
        i = min(start, max(0, len(self.messages) - 1))
        if head is None:
            head = [{"role": "system", "content": self.system}] if self.system else []
        while i < len(self.messages) - 1 and not fits(head + self.messages[i:]):
            i += 1
            while i < len(self.messages) - 1 and self.messages[i]["role"] != "user":
                i += 1  # a window restarts at a user turn
        return i

    # ---- persistence --------------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The file this conversation saves to."""
        return chats_dir() / f"{self.name}.json"

    def to_dict(self) -> dict[str, Any]:
        """The saved form."""
        # what `chat --list` shows comes first (its turns counted here), so it reads a file's head, not all of it
        out = {
            "format": FORMAT, "name": self.name, "model": self.model, "created": self.created,
            "updated": self.updated, "turns": sum(1 for m in self.messages if m.get("role") == "user"),
            "messages": [saved_form(m) for m in self.messages], "system": self.system, "settings": self.settings,
            "log_id": self.log_id, "summary": self.summary.to_dict() if self.summary is not None else None,
            "compact": self.compact,
        }
        return {**out, **{k: v for k, v in self.extra.items() if k not in out}}

    def save(self) -> Path:
        """Write atomically: a temporary file (0600, in a 0700 folder), fsync, rename, fsync the folder. A
        crash mid-write leaves the last save whole. A new conversation first claims its file (O_EXCL), so two
        chats started in the same second never write over each other."""
        self.updated = time.time()
        paths.private_dir(chats_dir())
        if not self.fresh and self._changed_since_seen():  # another chat on the same conversation saved since
            self.forked, self.fresh, self.auto_named = self.name, True, True  # its turns and ours are both kept
            self.name = _next_name(self.name)
        claimed: list[Path] = []  # the file a new conversation made its own (a signal may come right after)
        tmp: Path | None = None
        try:
            if self.fresh:
                self._claim(claimed)
            target = self.path
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o600)
            with open(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_dict(), f, ensure_ascii=False, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            paths.fsync_dir(target.parent)
            self.seen = stamp(target)
        except BaseException:
            if claimed:  # a full disk, a SIGTERM: the empty file claimed is not left to read as a corrupt one
                claimed[0].unlink(missing_ok=True)
                self.fresh = True
            raise
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        return target

    def _changed_since_seen(self) -> bool:
        """Whether this conversation's file is not as this chat last read or wrote it: another chat resumed on
        it has saved since (a file this chat never read, such as one /save was told to overwrite, is not)."""
        if self.seen is None or self.seen[0] != str(self.path):
            return False
        try:
            return stamp(self.path) != self.seen
        except OSError:  # gone (removed by hand): this chat's save makes it again
            return False

    def _claim(self, claimed: list[Path]) -> None:
        """Create this conversation's file exclusively (added to `claimed`), taking the next free name if an
        automatic one was taken meanwhile; a chosen name that was taken is an error, and nothing is overwritten."""
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                claimed.append(self.path)
                os.close(fd)
            except FileExistsError:
                if not self.auto_named:
                    raise LocalgenError(f"a conversation named {self.name!r} was saved by another chat meanwhile",
                                        hint="/save NAME keeps this one under another name") from None
                self.name = _next_name(self.name)
                continue
            self.fresh = False
            return

    @classmethod
    def load(cls, name: str) -> ChatSession:
        """Read a saved conversation by name. What localgen does not use of it (another tool's fields, at the top
        or in a message) is kept and written back as it was; a field of localgen's that holds what it never
        saves there, or a "format" newer than FORMAT, is an error naming the file (and the entry), and the file
        is left as it is."""
        check_name(name)
        path = chats_dir() / f"{name}.json"
        try:
            data = json.loads(read_regular(path, LOAD_READ, whole=True, what="a conversation").decode("utf-8"))
            check_depth(data)
        except FileNotFoundError:
            raise LocalgenError(f"no saved conversation named {name!r}", hint="see `localgen chat --list`") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, Unreadable, RecursionError) as e:
            raise LocalgenError(f"the saved conversation {path} is unreadable: {why_unreadable(e)}",
                                hint="the file was left as it is") from None
        try:
            if not isinstance(data, dict):
                raise BadField("it is not a JSON object")
            fmt = data.get("format", FORMAT)  # none: written before the field was
            if not isinstance(fmt, int) or isinstance(fmt, bool):
                raise BadField('its "format" is not a whole number')
            if fmt > FORMAT:  # its fields may mean what this version cannot keep: a save would drop them
                raise LocalgenError(f"the saved conversation {path} was written by a newer localgen (format {fmt})",
                                    hint="resume it with that version; the file was left as it is")
            messages = checked_messages(data["messages"], path)
            saved = data.get("settings") or {}
            if not isinstance(saved, dict):
                raise BadField('its "settings" are not an object')
            system = data.get("system")
            if system is not None and not isinstance(system, str):
                raise BadField('its "system" is not text')
            for key in ("model", "log_id"):
                if data.get(key) is not None and not isinstance(data[key], str):
                    raise BadField(f'its "{key}" is not text')
            session = cls(
                name=name, model=data.get("model") or "", system=system, messages=messages,
                settings=dict(saved), created=saved_time(data, "created", 0),
                updated=saved_time(data, "updated", 0), log_id=data.get("log_id") or None,
                summary=Summary.from_dict(data["summary"], len(messages)) if data.get("summary") else None,
                compact=saved_flag(data.get("compact")),
                extra={k: v for k, v in data.items() if k not in SAVED_KEYS},
            )
        except BadField as e:
            raise LocalgenError(f"the saved conversation {path} is not in localgen's format: {e}",
                                hint="fix or remove it in the file; the file was left as it is") from None
        except (KeyError, TypeError, ValueError, AttributeError):
            raise LocalgenError(f"the saved conversation {path} is not in localgen's format",
                                hint="fix or remove it in the file; the file was left as it is") from None
        with contextlib.suppress(OSError):  # removed this instant: nothing to compare a save with
            session.seen = stamp(path)
        try:
            settings.validate(session.settings)
        except UsageError as e:
            raise LocalgenError(f"the saved conversation {path} has a bad setting: {e.message}",
                                hint="fix or remove it in the file; the file was left as it is") from None
        return session


