"""A chat conversation: messages, the system prompt, the summary of its compacted turns, trimming to the
window, crash-safe saving."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen import paths, settings
from localgen.errors import LocalgenError, UsageError
from localgen.media import text_of
from localgen.types import Message
from localgen.units import format_bytes

TOOL_KEYS = ("tool_calls", "tool_call_id", "name", "reasoning_content")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FORMAT = 1


def chats_dir() -> Path:
    """Where conversations are saved."""
    return paths.data_dir() / "chats"


def check_name(name: str, model_hint: bool = True) -> str:
    """A conversation name is a plain file-name-safe word; anything else is a usage error (with `model_hint`, one
    that looks like a model's name says how to chat with that model: not for /save, whose word is a name)."""
    if not _NAME.fullmatch(name):  # `$` alone would take a name ending in a newline
        model = model_hint and (":" in name or "/" in name)  # `ollama run MODEL`: the model where the name goes
        raise UsageError(f"bad conversation name {name!r}: use at most 64 letters, digits, '.', '_' or '-', "
                         "beginning with a letter or digit",
                         hint=f"to chat with the model {name}: localgen chat -m {name}" if model else None)
    return name


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
            "messages": [_saved_form(m) for m in self.messages], "system": self.system, "settings": self.settings,
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
        claimed = self.fresh
        if claimed:
            self._claim()
        target = self.path
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_dict(), f, ensure_ascii=False, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            paths.fsync_dir(target.parent)
            self.seen = _stamp(target)
        except BaseException:
            if claimed:  # a full disk: the empty file claimed is not left to read as a corrupt conversation
                target.unlink(missing_ok=True)
                self.fresh = True
            raise
        finally:
            tmp.unlink(missing_ok=True)
        return target

    def _changed_since_seen(self) -> bool:
        """Whether this conversation's file is not as this chat last read or wrote it: another chat resumed on
        it has saved since (a file this chat never read, such as one /save was told to overwrite, is not)."""
        if self.seen is None or self.seen[0] != str(self.path):
            return False
        try:
            return _stamp(self.path) != self.seen
        except OSError:  # gone (removed by hand): this chat's save makes it again
            return False

    def _claim(self) -> None:
        """Create this conversation's file exclusively, taking the next free name if an automatic one was
        taken meanwhile; a chosen name that was taken is an error, and nothing is overwritten."""
        while True:
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
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
        saves there is an error naming the file (and the entry), and the file is left as it is."""
        check_name(name)
        path = chats_dir() / f"{name}.json"
        try:
            data = json.loads(_read_regular(path, LOAD_READ, whole=True).decode("utf-8"))
            _check_depth(data)
        except FileNotFoundError:
            raise LocalgenError(f"no saved conversation named {name!r}", hint="see `localgen chat --list`") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, Unreadable, RecursionError) as e:
            raise LocalgenError(f"the saved conversation {path} is unreadable: {_unreadable(e)}",
                                hint="the file was left as it is") from None
        try:
            if not isinstance(data, dict):
                raise BadField("it is not a JSON object")
            messages = _messages(data["messages"], path)
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
                compact=_flag(data.get("compact")),
                extra={k: v for k, v in data.items() if k not in SAVED_KEYS},
            )
        except BadField as e:
            raise LocalgenError(f"the saved conversation {path} is not in localgen's format: {e}",
                                hint="fix or remove it in the file; the file was left as it is") from None
        except (KeyError, TypeError, ValueError, AttributeError):
            raise LocalgenError(f"the saved conversation {path} is not in localgen's format",
                                hint="fix or remove it in the file; the file was left as it is") from None
        with contextlib.suppress(OSError):  # removed this instant: nothing to compare a save with
            session.seen = _stamp(path)
        try:
            settings.validate(session.settings)
        except UsageError as e:
            raise LocalgenError(f"the saved conversation {path} has a bad setting: {e.message}",
                                hint="fix or remove it in the file; the file was left as it is") from None
        return session


# the fields a save writes (localgen's own); a loaded file's others are kept as they were
SAVED_KEYS = ("format", "name", "model", "created", "updated", "turns", "messages", "system", "settings", "log_id",
              "summary", "compact")
LOAD_READ = 1 << 30  # the bytes a saved conversation may take to be loaded (a chat's file is far smaller)
DEPTH = 200  # how deep a loaded file may nest: a save writes it again, and Python's JSON writer recurses


class Unreadable(Exception):
    """A saved conversation's path that is not read, and why in words: not a regular file (a FIFO, a device, a
    folder: never opened), or too large to load."""


class BadField(ValueError):
    """A field of localgen's in a saved file that holds what a save never writes there, in words."""


def _read_regular(path: Path, limit: int, whole: bool = False) -> bytes:
    """At most `limit` + 1 bytes of a regular file (`whole`: all of it, Unreadable when it is larger than `limit`,
    before a byte is read). Anything but a regular file is Unreadable before it is opened (a FIFO would block the
    read, /dev/zero never end it); the open does not block either, and what it opened is checked again."""
    if not stat.S_ISREG(mode := os.stat(path).st_mode):
        raise Unreadable(_kind(mode))
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced since the stat
            raise Unreadable(_kind(st.st_mode))
        if whole and st.st_size > limit:
            raise Unreadable(f"it is {st.st_size:,} bytes, more than the {format_bytes(limit)} a conversation "
                             "is read to")
        return f.read(limit + 1)


def _kind(mode: int) -> str:
    return ("it is a folder" if stat.S_ISDIR(mode) else "it is a FIFO" if stat.S_ISFIFO(mode) else
            "it is a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "it is not a regular file")


def _check_depth(data: Any) -> None:
    """Unreadable when `data` nests deeper than DEPTH (a save could not write it again)."""
    todo = [(data, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > DEPTH:
            raise Unreadable(f"it nests more than {DEPTH} levels deep")
        if isinstance(value, dict):
            todo.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            todo.extend((v, depth + 1) for v in value)


def saved_time(data: dict[str, Any], key: str, default: float) -> float:
    """A saved time (seconds since the epoch) that a date can be written of; BadField for anything else (text,
    NaN, 1e400, a year past 9999)."""
    value = data.get(key, default)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            time.strftime("%Y", time.localtime(value))
            return float(value)
        except (OverflowError, OSError, ValueError):
            pass
    raise BadField(f'its "{key}" is not a time')


def _stamp(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_mtime_ns, st.st_size


ROLES = ("user", "assistant", "tool")  # what `messages` holds (the system prompt is saved apart)


def _messages(saved: Any, path: Path) -> list[Message]:
    """A saved file's messages; a LocalgenError naming the file and the first entry that is not a message (a
    conversation loaded without it would be saved without it: the file is reported, and left as it is)."""
    if not isinstance(saved, list):
        raise BadField('its "messages" are not a list')
    out = []
    for i, m in enumerate(saved, 1):
        why = _malformed(m)
        if why is not None:
            raise LocalgenError(f"the saved conversation {path} has a malformed message: entry {i} of "
                                f"\"messages\" {why}", hint="fix or remove it in the file; the file was left as it is")
        out.append(_message(m))
    return out


def _malformed(m: Any) -> str | None:
    """What keeps a saved entry from being a message (None when it is one): its role and content, and a tool field
    that holds what localgen never saves there (a message loaded without it would be saved without it)."""
    if not isinstance(m, dict):
        return f"is {type(m).__name__}, not an object"
    role = m.get("role")
    if role not in ROLES:
        return f"has the role {json.dumps(role, ensure_ascii=False)[:40]} (user, assistant or tool)"
    for key in TOOL_KEYS:
        value = m.get(key)
        if value is None:
            continue
        if key == "tool_calls":
            if not (isinstance(value, list) and all(_is_call(c) for c in value)):
                return 'has "tool_calls" that are not a list of calls (each with a "function" and its "name")'
        elif not isinstance(value, str):
            return f'has a "{key}" of type {type(value).__name__}, not text'
    content = m.get("content")
    if isinstance(content, str) or (isinstance(content, list) and all(isinstance(p, dict) and
                                                                         isinstance(p.get("type"), str)
                                                                         for p in content)):
        return None
    if content is None and role == "assistant" and m.get("tool_calls"):  # OpenAI's shape of a call alone
        return None
    return "has no text content" if content is None else f"has a content of type {type(content).__name__}"


class Loaded(dict[str, Any]):
    """A loaded message that held fields localgen does not use: they are kept apart in `extra` (never sent to a
    model or a server) and written back at each save as they were."""

    __slots__ = ("extra",)

    def __init__(self, fields: dict[str, Any], extra: dict[str, Any]) -> None:
        super().__init__(fields)
        self.extra = extra


def _message(m: dict[str, Any]) -> Message:
    """A saved message (checked by _malformed): role and content, and the tool fields it has (calls, a result's
    call id and name, the reasoning); the others, kept beside it."""
    content = m.get("content")
    kept: Any = content if content is not None else ""  # parts: text with images or audio (checked when sent)
    out: Message = {"role": str(m["role"]), "content": kept}
    for key in TOOL_KEYS:
        if m.get(key) is not None:
            out[key] = m[key]
    extra = {k: v for k, v in m.items() if k not in out}
    return Loaded(out, extra) if extra else out


def _saved_form(m: Message) -> Message:
    """A message as a save writes it: a loaded one with the fields localgen did not use, as they were."""
    extra = getattr(m, "extra", None)
    if not extra:
        return m
    return {**m, **{k: v for k, v in extra.items() if k not in m}}


def _flag(value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ValueError("compact")
    return value


def _is_call(c: Any) -> bool:
    return isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)


@dataclass(frozen=True)
class SessionInfo:
    """One line of `chat --list`."""

    name: str
    model: str
    turns: int
    updated: float
    preview: str


LIST_READ = 1 << 20  # the bytes `chat --list` reads of one saved file at most


def list_sessions(asked: Callable[[str], str] = lambda text: text,
                  skipped: list[tuple[Path, str]] | None = None) -> list[SessionInfo]:
    """Saved conversations, most recent first, each previewed by what `asked` makes of its first message (the CLI
    gives a --rag chat's question, not its excerpts). Each file is read up to LIST_READ bytes: a larger one is
    listed from its head (a save writes the listed fields before the messages). Unreadable files, and larger ones
    whose head lacks them, are skipped, never altered, and added to `skipped` (the file, why) when it is given."""
    out = []
    d = chats_dir()
    if not d.is_dir():
        return []
    for p in d.glob("*.json"):
        try:
            raw = _read_regular(p, LIST_READ)  # a FIFO, a device or a folder of that name: skipped, never opened
            if len(raw) <= LIST_READ:
                data = json.loads(raw.decode("utf-8"))
                if not isinstance(data, dict):
                    raise TypeError
                msgs = data.get("messages") or []
                first = next((m.get("content", "") for m in msgs if m.get("role") == "user"), "")
                turns = sum(1 for m in msgs if m.get("role") == "user")
            else:
                data, first = _head(raw)
                turns = data["turns"]
                if not isinstance(turns, int):
                    raise TypeError
            out.append(SessionInfo(
                name=p.stem, model=str(data.get("model", "")), turns=turns,
                updated=saved_time(data, "updated", p.stat().st_mtime),  # a time `chat --list` can write
                preview=" ".join(str(asked(text_of(first))).split())[:60],
            ))
        except _TooBig:
            if skipped is not None:
                skipped.append((p, f"it is larger than {LIST_READ >> 20} MiB and does not begin with the fields "
                                   "`chat --list` shows; its next save writes them"))
        except (OSError, ValueError, AttributeError, TypeError, Unreadable, RecursionError) as e:
            if skipped is not None:
                skipped.append((p, _unreadable(e)))
            continue
    return sorted(out, key=lambda s: s.updated, reverse=True)


class _TooBig(Exception):
    """A saved file larger than LIST_READ whose head does not hold what its line shows."""


def _head(raw: bytes) -> tuple[dict[str, Any], Any]:
    """The fields before "messages" of a saved file's first LIST_READ bytes, and its first user message's
    content ("" when there is none); _TooBig when these are not all within them."""
    import codecs

    text = codecs.getincrementaldecoder("utf-8")().decode(raw[:LIST_READ])  # a character cut at the end: held
    dec = json.JSONDecoder()
    ws = re.compile(r"[ \t\n\r]*")

    def at(i: int) -> int:
        return ws.match(text, i).end()  # type: ignore[union-attr]

    try:
        i = at(0)
        if text[i] != "{":
            raise TypeError
        fields: dict[str, Any] = {}
        i = at(i + 1)
        while text[i] != "}":
            key, i = dec.raw_decode(text, i)
            i = at(i)
            if text[i] != ":":
                raise json.JSONDecodeError("':' expected", text, i)
            i = at(i + 1)
            if key == "messages":
                break
            fields[str(key)], i = dec.raw_decode(text, i)
            i = at(i)
            if text[i] == ",":
                i = at(i + 1)
        else:
            raise _TooBig
        if "turns" not in fields or text[i] != "[":
            raise _TooBig
        i = at(i + 1)
        while text[i] != "]":
            m, i = dec.raw_decode(text, i)
            if isinstance(m, dict) and m.get("role") == "user":
                return fields, m.get("content", "")
            i = at(i)
            if text[i] == ",":
                i = at(i + 1)
        return fields, ""
    except (IndexError, json.JSONDecodeError):  # the head ends before these: what the read left off
        raise _TooBig from None


def _unreadable(e: Exception) -> str:
    """Why a saved conversation's file could not be read, in words."""
    if isinstance(e, (Unreadable, BadField)):
        return str(e)
    if isinstance(e, RecursionError):  # JSON's reader: far deeper than DEPTH
        return f"it nests more than {DEPTH} levels deep"
    if isinstance(e, UnicodeDecodeError):
        return "it is not UTF-8 text"
    if isinstance(e, json.JSONDecodeError):
        return "it is not JSON"
    if isinstance(e, OSError):
        return (e.strerror or str(e)).lower()
    return "it is not a saved conversation"


def latest() -> str | None:
    """The most recently updated conversation's name."""
    sessions = list_sessions()
    return sessions[0].name if sessions else None
