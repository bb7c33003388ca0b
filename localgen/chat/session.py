"""A chat conversation: messages, the system prompt, the summary of its compacted turns, trimming to the
window, crash-safe saving (the saved file's form and reading it: saved.py)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
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
    saved_json,
    saved_time,
    stamp,
    system_entry,
    valid_name,
    why_unreadable,
)
from localgen.errors import LocalgenError, UsageError
from localgen.media import text_of
from localgen.regular import Unreadable, read_regular
from localgen.text import mended
from localgen.types import Message


def check_name(name: str, model_hint: str | None = "localgen chat -m") -> str:
    """A conversation name is a plain file-name-safe word; anything else is a usage error. With `model_hint` (how
    a model is chosen where the name was given: `/model` for /load), a word that looks like a model's name
    (NAME:TAG, OWNER/REPO) says how to chat with that model; a path (../x) never does, nor /save's word."""
    if not valid_name(name):  # `$` alone would take a name ending in a newline
        model = model_hint is not None and _MODEL.fullmatch(name) and (":" in name or "/" in name) and \
            ".." not in name.split("/") and not name.lower().endswith(".gguf")  # a path (models/x.gguf) is not
        # a byte not UTF-8 (caf\xe8 typed on a Latin-1 terminal): U+FFFD, as a preset's name shows it, not '\udce8'
        raise UsageError(f"bad conversation name {mended(name)!r}: use at most 64 ASCII letters, digits, '.', '_' "
                         "or '-', beginning with a letter or digit",
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
    numbered = base.count("-") >= 2 and n.isascii() and n.isdigit() and len(n) < 4  # "²" is a digit int() refuses
    return f"{base}-{int(n) + 1}" if numbered else f"{name}-2"


LOCK_WAIT_S = 30  # how long a save waits for another chat's to end before it fails (as a failed write does)


class NameTaken(LocalgenError):
    """A new conversation's chosen name was taken by another chat before its first save: like a failed write, it
    never stops the chat (ChatRunner.save)."""


def _link(tmp: Path, path: Path) -> bool:
    """Give the written file `tmp` the name `path` unless that name exists (False): a hard link, atomic and refused
    where the name is taken. Where the file system has no hard links, the check and a rename (the lock held keeps
    them one step among chats; a dangling link counts as taken, never replaced)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:  # EPERM/EOPNOTSUPP: FAT, some network shares
        if os.path.lexists(path):
            return False
        os.replace(tmp, path)
    return True


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


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
    # how many of messages[:covers] the text stands for: the rest (the oldest) were left out, a compaction folding
    # at most compact.FOLD_WINDOWS windows of tokens; None: all of them
    summarized: int | None = None

    @property
    def count(self) -> int:
        """How many messages the text stands for."""
        return self.covers if self.summarized is None else self.summarized

    def to_dict(self) -> dict[str, Any]:
        """The saved form."""
        return {"text": self.text, "covers": self.covers, "summarized": self.count, "tokens": self.tokens,
                "compactions": self.compactions, "model": self.model, "created": self.created}

    @classmethod
    def from_dict(cls, data: Any, n_messages: int) -> Summary:
        """A saved summary; BadField, saying what is wrong, when it is not one (or covers messages the
        conversation lacks)."""
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise BadField('its "summary" is not an object with a "text"')
        covers, tokens, count = data.get("covers", 0), data.get("tokens", 0), data.get("compactions", 1)
        summarized: Any = data.get("summarized", covers)  # (saved before it was kept: all of them)
        for key, n in (("covers", covers), ("tokens", tokens), ("compactions", count), ("summarized", summarized)):
            if not isinstance(n, int) or isinstance(n, bool):
                raise BadField(f'its "summary"\'s "{key}" is not a whole number')
        if not 0 < covers <= n_messages:
            raise BadField(f'its "summary" covers {covers:,} messages, and the conversation has {n_messages:,}')
        if not 0 < summarized <= covers:
            raise BadField(f'its "summary" summarized {summarized:,} of the {covers:,} messages it covers')
        return cls(text=data["text"], covers=covers, tokens=tokens, compactions=count,
                   model=str(data.get("model") or ""), created=float(data.get("created", 0)),
                   summarized=None if summarized == covers else summarized)


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
    # the file as this chat last read or wrote it (path, inode, mtime_ns, size): another chat's save since is seen
    seen: tuple[str, int, int, int] | None = field(default=None, compare=False, repr=False)
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
        """Write atomically: a temporary file (0600, in a 0700 folder), written whole and fsynced, then named, and the
        folder fsynced. A crash mid-write leaves the last save whole. Naming happens under a lock every chat's save
        takes (_locked): a resumed conversation's file that another chat saved since this one read it is never
        renamed over (this chat's turns go to the next free name), and a new conversation's file is made by a hard
        link that is refused where the name exists, so it never appears empty or half-written and two chats
        started in the same second never write over each other. A chosen name taken meanwhile: NameTaken."""
        self.updated = time.time()
        folder = paths.private_dir(chats_dir())
        tmp = folder / f".{self.name}.{secrets.token_hex(6)}.tmp"  # one per writer
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
        try:
            os.close(fd)
            self._write(tmp)
            written = self.name  # the name the temporary file holds (its "name" field)
            with self._locked():
                if not self.fresh and self._changed_since_seen():  # another chat on the same conversation saved since
                    self.forked, self.fresh, self.auto_named = self.name, True, True  # its turns and ours are kept
                    self.name = _next_name(self.name)
                while True:
                    if written != self.name:
                        self._write(tmp)
                        written = self.name
                    if not self.fresh:
                        os.replace(tmp, self.path)
                        break
                    if _link(tmp, self.path):
                        self.fresh = False
                        break
                    if not self.auto_named:
                        raise NameTaken(f"a conversation named {self.name!r} was saved by another chat meanwhile",
                                        hint="/save NAME keeps this one under another name")
                    self.name = _next_name(self.name)
                self.seen = stamp(self.path)  # this chat's own save: no other chat's comes between (the lock)
            paths.fsync_dir(folder)
        except BaseException:
            if self.fresh and _same_file(tmp, self.path):  # named the instant before a signal: it is this chat's file
                self.fresh = False
            raise
        finally:
            tmp.unlink(missing_ok=True)
        return self.path

    def _write(self, tmp: Path) -> None:
        """The saved form into `tmp`, whole and fsynced."""
        text = json.dumps(self.to_dict(), ensure_ascii=False, indent=1)
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # a model path not UTF-8 (kept as surrogates): escaped, read back as it was
                text = json.dumps(self.to_dict(), indent=1)
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_BINARY", 0))  # Windows: \n stays \n
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The lock every chat's save holds while it checks and names its file (<data dir>/chats.lock); one that
        cannot be taken is an OSError about this conversation's file, as a failed write is."""
        from filelock import FileLock, Timeout

        lock = FileLock(str(chats_dir().with_name("chats.lock")), timeout=LOCK_WAIT_S, mode=0o600)
        try:
            lock.acquire()
        except Timeout:  # another chat's save held it that long (flock's lock goes with its process: not a dead one)
            raise OSError(errno.EBUSY, f"another chat's save held the lock on saving for {LOCK_WAIT_S} s",
                          str(self.path)) from None
        except OSError as e:  # a read-only disk
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        try:
            yield
        finally:
            lock.release()

    def _changed_since_seen(self) -> bool:
        """Whether this conversation's file is not as this chat last read or wrote it: another chat resumed on
        it has saved since (a file this chat never read, such as one /save was told to overwrite, is not)."""
        if self.seen is None or self.seen[0] != str(self.path):
            return False
        try:
            return stamp(self.path) != self.seen
        except OSError:  # gone (removed by hand): this chat's save makes it again
            return False

    @classmethod
    def load(cls, name: str) -> ChatSession:
        """Read a saved conversation by name. What localgen does not use of it (another tool's fields, at the top
        or in a message) is kept and written back as it was; a first message with the role "system" (OpenAI's
        shape) is its system prompt. A field of localgen's that holds what it never saves there, or a "format"
        newer than FORMAT, is an error naming the file (and the entry), and the file is left as it is."""
        check_name(name)
        path = chats_dir() / f"{name}.json"
        try:
            # a file saved as UTF-16 is one line naming it (Utf16File), as a file of settings is
            data = saved_json(read_regular(path, LOAD_READ, whole=True, what="a conversation"), path)
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
            entry = system_entry(data["messages"])  # a file in OpenAI's shape: its first message is the prompt
            if entry is not None:
                if system and system != entry:  # a save writes one of them: the other would be lost
                    raise BadField('its "system" and its first message, a system message, differ: keep one')
                system = entry
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


