"""Compaction: the oldest turns of a chat folded into a summary that the model writes, sent after the system
prompt in their place. Here: the summary's size, the transcript and the request the model summarizes, and
fold(), which folds turns too many for one request in pieces (each piece's summary folding in the one before).
No backend here: the runner (runner.py) counts and generates through callbacks."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from localgen.errors import LocalgenError
from localgen.media import text_of
from localgen.monotone import most
from localgen.types import Message

INSTRUCTION = (
    "You summarize conversations so that they can go on without them. Write a short summary of the "
    "conversation you are given: the facts, names, numbers, decisions and open questions needed to continue "
    "it. Write only the summary, in plain sentences."
)
HEADING = "Summary of the earlier conversation"
CUT = " [...]"
FOLD_WINDOWS = 2  # a compaction folds at most this many windows of transcript tokens, the newest (older ones: left out)
_THINK = re.compile(r"<think>.*?</think>", re.S)


class CompactionError(LocalgenError):
    """A summary could not be written (the chat falls back to leaving the oldest turns out)."""


class NotSmaller(CompactionError):
    """The summary would take as many tokens as what it folds, or more: it is not kept."""


def budget(n_ctx: int) -> int:
    """Tokens a summary may take: an eighth of the window, at least 32 and at most 512."""
    return max(32, min(n_ctx // 8, 512))


def line_of(m: Message) -> str:
    """One message of the transcript the model summarizes: who said it, then what (calls and results included)."""
    if m.get("tool_calls"):
        calls = "; ".join(f"{c['function']['name']}({_arguments(c['function'].get('arguments'))})"
                          for c in m["tool_calls"])
        said = text_of(m["content"])
        return f"Assistant: {said + ' ' if said else ''}[called {calls}]"
    if m["role"] == "tool":
        return f"Tool result ({m.get('name') or 'tool'}): {text_of(m['content'])}"
    return f"{'User' if m['role'] == 'user' else 'Assistant'}: {text_of(m['content'])}"


def request_messages(previous: str | None, lines: list[str]) -> list[Message]:
    """The summary request: the instruction, then the summary so far (if any) and the turns to fold into it."""
    body = "\n".join(lines)
    if previous:
        text = f"The summary so far:\n{previous}\n\nThe conversation then went on:\n{body}"
    else:
        text = f"The conversation:\n{body}"
    return [{"role": "system", "content": INSTRUCTION},
            {"role": "user", "content": text + "\n\nWrite the summary now."}]


def summary_text(messages: int, text: str) -> str:
    """The summary as it is sent to the model."""
    return f"{HEADING} ({messages} message{'s' if messages != 1 else ''}, summarized):\n{text}"


def cleaned(text: str) -> str:
    """A generated summary without its thinking (a reasoning model's <think> block) and outer blanks."""
    text = _THINK.sub("", text)
    if "</think>" in text:  # the block was opened by the template's generation prompt
        text = text.rsplit("</think>", 1)[1]
    return text.strip()


def fold(lines: list[str], previous: str | None, fits: Callable[[str | None, list[str]], bool],
         write: Callable[[str | None, list[str]], str]) -> tuple[str, int]:
    """Fold transcript lines into `previous` (or into a new summary): as many lines as one request can hold
    (`fits(summary so far, lines)`), summarized by `write`, then the next lines into that summary, until none
    is left. A line too long for a request alone is cut to fit. Returns the summary and the requests made."""
    summary = previous
    rest = list(lines)
    pieces = 0
    while rest:
        k = _piece(rest, summary, fits)
        summary = write(summary, rest[:k])
        pieces += 1
        rest = rest[k:]
    if summary is None:
        raise CompactionError("nothing to summarize")
    return summary, pieces


def _piece(rest: list[str], summary: str | None, fits: Callable[[str | None, list[str]], bool]) -> int:
    """How many of the first lines the next request holds (at least one: a line too long alone is cut)."""
    k = most(0, len(rest), lambda n: fits(summary, rest[:n]))
    if k == 0:
        rest[0] = _cut(rest[0], lambda text: fits(summary, [text]))
        k = 1
    return k


def _cut(text: str, ok: Callable[[str], bool]) -> str:
    """The longest beginning of `text` (marked as cut) that still fits a request."""
    k = most(0, len(text), lambda n: ok(text[:n] + CUT))
    if k == 0:
        raise CompactionError("the context window cannot hold a summary request")
    return text[:k] + CUT


def _arguments(raw: object) -> str:
    """A tool call's arguments as one line."""
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
