"""A chat conversation's saved file: where it lives, what its fields may hold, reading it without trusting it (a
FIFO, a huge file, deep nesting, another tool's fields) and listing the saved ones by their heads."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localgen import paths
from localgen.errors import LocalgenError
from localgen.media import text_of
from localgen.regular import Unreadable, read_regular
from localgen.text import SAVE_AS_UTF8, Utf16File, config_text, mended, utf16
from localgen.types import Message

TOOL_KEYS = ("tool_calls", "tool_call_id", "name", "reasoning_content")
# the saved layout's version: raised when a change means an older localgen would misread a file or drop what it
# holds on a save (a load refuses a higher one); fields added since 1 (tool_calls, summary, ...) are ones older
# versions that never read "format" drop anyway, so raising it then would have warned no one
FORMAT = 1


def chats_dir() -> Path:
    """Where conversations are saved."""
    return paths.data_dir() / "chats"


# the fields a save writes (localgen's own); a loaded file's others are kept as they were
SAVED_KEYS = ("format", "name", "model", "created", "updated", "turns", "messages", "system", "settings", "log_id",
              "summary", "compact")
LOAD_READ = 1 << 30  # the bytes a saved conversation may take to be loaded (a chat's file is far smaller)
DEPTH = 200  # how deep a loaded file may nest: a save writes it again, and Python's JSON writer recurses


class BadField(ValueError):
    """A field of localgen's in a saved file that holds what a save never writes there, in words."""


def check_depth(data: Any) -> None:
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


def stamp(path: Path) -> tuple[str, int, int, int]:
    """What tells a saved file from the next save of it: each save is a new file (its inode), written at a time."""
    st = path.stat()
    return str(path), st.st_ino, st.st_mtime_ns, st.st_size


ROLES = ("user", "assistant", "tool")  # what `messages` holds (the system prompt is saved apart)


def saved_json(raw: bytes, path: Path) -> Any:
    """A saved file's JSON, read as a file of settings is (text.config_text): a byte order mark an editor wrote
    dropped; Utf16File naming the file where it is UTF-16 (an editor's "Unicode"); UnicodeDecodeError and
    JSONDecodeError for the caller to word."""
    return json.loads(config_text(raw, f"the saved conversation {path}", "JSON"))


def checked_messages(saved: Any, path: Path) -> list[Message]:
    """A saved file's messages, a first entry that is a system message (system_entry) left out; a LocalgenError
    naming the file and the first entry that is not a message (a conversation loaded without it would be saved
    without it: the file is reported, and left as it is)."""
    why = malformed(saved)
    if why is not None:
        raise LocalgenError(f"the saved conversation {path} has a malformed message: {why}",
                            hint="fix or remove it in the file; the file was left as it is")
    return [_message(m) for m in saved[1 if system_entry(saved) is not None else 0:]]


def system_entry(saved: list[Any]) -> str | None:
    """The system prompt of a file written by hand or by another tool in OpenAI's shape, a first entry of
    "messages" with the role "system" (checked by malformed), else None. localgen keeps it apart (a save writes it
    as "system"), so trimming never drops it."""
    if not saved or not isinstance(saved[0], dict) or saved[0].get("role") != "system":
        return None
    return text_of(saved[0].get("content"))  # text parts joined, as a listing shows them


def malformed(saved: Any) -> str | None:
    """The first entry of a saved file's messages that is not a message, in words (None when all are); BadField
    when they are not a list."""
    if not isinstance(saved, list):
        raise BadField('its "messages" are not a list')
    for i, m in enumerate(saved, 1):
        why = _malformed_system(m, i) if isinstance(m, dict) and m.get("role") == "system" else _malformed(m)
        if why is not None:
            return f'entry {i} of "messages" {why}'
    return None


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


def _malformed_system(m: dict[str, Any], i: int) -> str | None:
    """What keeps entry `i`, a system message, from being read as the system prompt (None when it can be): only a
    first entry can (a conversation has one system prompt, sent before it, never trimmed), holding text alone (a save
    writes it as "system": another field would be lost)."""
    if i > 1:
        return ("is a system message after the first entry: localgen keeps one system prompt, sent before the "
                'conversation (move its text to "system")')
    content = m.get("content")
    if not (isinstance(content, str) or (isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content))):
        return "is a system message whose content is not text"
    if others := [k for k in m if k not in ("role", "content")]:
        return (f'is a system message with {", ".join(json.dumps(k, ensure_ascii=False)[:40] for k in others)}: '
                'localgen keeps a system prompt as text alone (put it in "system")')
    return None


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


def saved_form(m: Message) -> Message:
    """A message as a save writes it: a loaded one with the fields localgen did not use, as they were."""
    extra = getattr(m, "extra", None)
    if not extra:
        return m
    return {**m, **{k: v for k, v in extra.items() if k not in m}}


def saved_flag(value: Any) -> bool | None:
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
    try:  # not glob(), which takes a folder it cannot read for an empty one ("no saved conversations")
        found = [p for p in d.iterdir() if p.name.endswith(".json")]
    except OSError as e:
        raise LocalgenError(f"cannot read the saved conversations in {d}: {e.strerror or e}",
                            hint="check the folder's owner and permissions (a chat run with sudo can leave it root's)"
                            ) from None
    for p in found:
        try:
            raw = read_regular(p, LIST_READ)  # a FIFO, a device or a folder of that name: skipped, never opened
            if len(raw) <= LIST_READ:
                data = saved_json(raw, p)  # a byte order mark (an editor's) dropped; UTF-16: Utf16File
                if not isinstance(data, dict):
                    raise TypeError
                check_depth(data)
                msgs = data["messages"]  # checked as a load checks them: what --resume refuses is not listed
                if (why := malformed(msgs)) is not None:
                    raise BadField(f"it has a malformed message: {why}")
                first = next((m.get("content", "") for m in msgs if m.get("role") == "user"), "")
                turns = sum(1 for m in msgs if m.get("role") == "user")
            else:
                if (text := utf16(raw[:LIST_READ])) is not None:  # read as a smaller one is (saved_json)
                    raise Utf16File(p, "JSON", text)
                data, first = _head(raw)
                turns = data["turns"]
                if not isinstance(turns, int):
                    raise TypeError
            out.append(SessionInfo(
                name=p.stem, model=str(data.get("model", "")), turns=turns,
                updated=saved_time(data, "updated", p.stat().st_mtime),  # a time `chat --list` can write
                preview=" ".join(mended(str(asked(text_of(first)))).split())[:60],  # a JSON "\udce8": U+FFFD
            ))
        except _TooBig:
            if skipped is not None:
                skipped.append((p, f"it is larger than {LIST_READ >> 20} MiB and does not begin with the fields "
                                   "`chat --list` shows; its next save writes them"))
        except (OSError, ValueError, AttributeError, TypeError, KeyError, Unreadable, RecursionError, Utf16File) as e:
            if skipped is not None:
                skipped.append((p, why_unreadable(e)))
            continue
    return sorted(out, key=lambda s: s.updated, reverse=True)


class _TooBig(Exception):
    """A saved file larger than LIST_READ whose head does not hold what its line shows."""


def _head(raw: bytes) -> tuple[dict[str, Any], Any]:
    """The fields before "messages" of a saved file's first LIST_READ bytes, and its first user message's
    content ("" when there is none); _TooBig when these are not all within them."""
    import codecs

    text = codecs.getincrementaldecoder("utf-8-sig")().decode(raw[:LIST_READ])  # a character cut at the end: held
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


def why_unreadable(e: Exception) -> str:
    """Why a saved conversation's file could not be read, in words."""
    if isinstance(e, (Unreadable, BadField)):
        return str(e)
    if isinstance(e, Utf16File):  # as a file of settings says it (text.config_text)
        return f"it is UTF-16 text, not UTF-8 as JSON is; {SAVE_AS_UTF8}"
    if isinstance(e, RecursionError):  # JSON's reader: far deeper than DEPTH
        return f"it nests more than {DEPTH} levels deep"
    if isinstance(e, UnicodeDecodeError):
        return "it is not UTF-8 text"
    if isinstance(e, json.JSONDecodeError):
        return "it is not JSON"
    if isinstance(e, OSError):
        return (e.strerror or str(e)).lower()
    return "it is not a saved conversation"


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # a conversation's name (session.check_name's rule)


def valid_name(name: str) -> bool:
    """Whether `name` is one a conversation may have."""
    return bool(_NAME.fullmatch(name))


def latest() -> str | None:
    """The most recently updated conversation's name: a file `chat --list` skips (too big to list, damaged) counts
    too, by its modification time, so `--resume` loads it (or says what is wrong with it), never an older one."""
    skipped: list[tuple[Path, str]] = []
    sessions = list_sessions(skipped=skipped)
    best = (sessions[0].updated, sessions[0].name) if sessions else None
    for p, _ in skipped:
        if not valid_name(p.stem):  # another tool's file (`x (copy).json`): no conversation's, never resumed
            continue
        try:
            when = p.stat().st_mtime
        except OSError:  # removed this instant
            continue
        if best is None or when > best[0]:
            best = (when, p.stem)
    return best[1] if best else None
