"""The one stage between a model's streamed text and what a client sees: reasoning (a `<think>` block at
the start of the answer, or one the prompt already opened) goes apart from the content, and tool calls are
cut out of the content and parsed. `serve` (both APIs), `run` and `chat` all put their text through it.

Text that could be the beginning of a tag or a call marker is held back until the next piece decides, as
stop strings are; a call is given out as soon as its closing marker arrives (else at the end)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from localgen.engine.budget import THINK_TAGS  # the ways a reasoning block opens, with their closing tags

if TYPE_CHECKING:  # a plain answer (no tools) needs neither: `run -p` imports this module alone of tools/
    from localgen.tools.formats import Format
    from localgen.tools.spec import ToolCall, ToolSpec


class Plan(Protocol):
    """What the answer stream reads of a request's tool plan (tools/plan.py's ToolPlan, which imports this
    module): the format calls come in, the tools a call may name, and whether the answer must be a call."""

    @property
    def fmt(self) -> Format | None: ...

    @property
    def tools(self) -> tuple[ToolSpec, ...]: ...

    @property
    def forced(self) -> bool: ...



@dataclass(frozen=True)
class Piece:
    """Streamed text of one kind: "content" or "reasoning"."""

    kind: str
    text: str


Event: TypeAlias = "Piece | ToolCall"


def template_of(backend: Any) -> str | None:
    """The chat template a backend renders with (None for a remote one, whose server renders)."""
    engine = getattr(backend, "engine", None)
    return engine.model.summary.chat_template if engine is not None else None


def answer_stream(plan: Plan | None, template: str | None, template_args: tuple[tuple[str, Any], ...] = (),
                  split_reasoning: bool = True, prefill: str | None = None) -> AnswerStream:
    """The stage that reads this request's answer: calls in the plan's format, reasoning apart (also when
    the template's generation prompt leaves a thinking block open). `prefill`: the text of a final assistant
    message the answer continues, which has begun the answer: inside a thinking block if it left one open."""
    names = frozenset(t.name for t in plan.tools) if plan else None
    if prefill and prefill.strip():
        opened = left_open(prefill) if split_reasoning else None
        return AnswerStream(plan.fmt if plan else None, opened, split_reasoning, names, begun=True,
                            forced=bool(plan and plan.forced))
    opened = thinking_opened_by(template, template_args) if split_reasoning else None
    return AnswerStream(plan.fmt if plan else None, opened, split_reasoning, names, forced=bool(plan and plan.forced))


@functools.lru_cache(maxsize=32)
def thinking_opened_by(template: str | None, template_args: tuple[tuple[str, Any], ...] = ()) -> tuple[str, str] | None:
    """Whether the template's generation prompt opens a thinking block itself (Qwen3, DeepSeek-R1 style), so
    the answer starts inside it: found by rendering a one-line conversation."""
    from localgen.engine.template import ChatTemplate
    from localgen.errors import TemplateError

    if not template:
        return None
    try:
        prompt = ChatTemplate(template, "", "").render([{"role": "user", "content": "hi"}], **dict(template_args))
    except TemplateError:
        return None
    return opened_thinking(prompt)


def opened_thinking(prompt: str) -> tuple[str, str] | None:
    """The reasoning tags whose block the rendered prompt leaves open (the template started the thinking)."""
    tail = prompt.rstrip()
    for open_tag, close_tag in THINK_TAGS:
        if tail.endswith(open_tag):
            return open_tag, close_tag
    return None


def left_open(text: str) -> tuple[str, str] | None:
    """The reasoning tags of a block `text` opens and does not close."""
    for open_tag, close_tag in THINK_TAGS:
        at = text.rfind(open_tag)
        if at >= 0 and text.find(close_tag, at) < 0:
            return open_tag, close_tag
    return None


def _held(text: str, markers: tuple[str, ...]) -> int:
    """How many trailing characters of `text` could begin one of `markers`."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


@dataclass
class AnswerStream:
    """Feed it the answer's text piece by piece; it gives back Pieces and ToolCalls. `fmt` None: no tools
    (calls are not looked for). `thinking`: the tags of a block the prompt opened, if any. A call that names
    no tool in `names` stays text, as llama-server's parser leaves it. A call identical to one already given
    (same name and arguments) is not given again, and counts in `repeats`: a small model writes its call
    again and again until the tokens run out, and whoever generates may stop there."""

    fmt: Format | None = None
    thinking: tuple[str, str] | None = None
    split_reasoning: bool = True
    names: frozenset[str] | None = None  # the tools that may be called (None: any name)
    begun: bool = False  # a prefill began the answer: no reasoning block or start-only call marker opens it
    forced: bool = False  # the answer must be a call (tool_choice required, or a tool named): one cut is no text
    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    repeats: int = 0
    _seen: int = 0  # calls read from the answer so far, repeats included (a whole-document format's count)
    _scan: int = 0  # where reading the document's next call begins (-1: read at the end only)
    _buf: str = ""
    _state: str = "start"  # start | think | content | call
    _close: str = ""
    _strip: bool = False  # drop the whitespace that follows a closed reasoning block
    _said: bool = False  # content has been given out
    _gap: str = ""  # whitespace before a call marker
    _repeated: bool = False  # a repeat seen inside the open block
    _cut: bool = False  # the answer ended cut (max_tokens, the window) or had to be a call: a marker held is no text

    def __post_init__(self) -> None:
        if self.begun:
            self._said = True
            self._state = "call" if self.fmt is not None and self.fmt.whole else "content"
        if self.thinking and self.split_reasoning:
            self._state, self._close = "think", self.thinking[1]

    def feed(self, text: str) -> list[Event]:
        """Take the next piece of the answer."""
        self._buf += text
        return self._advance(final=False)

    def finish(self, reason: str | None = None) -> list[Event]:
        """The answer has ended (`reason`: its finish reason): give out what was held back, and the calls not yet
        given. Held text that is the start of a call marker, where the answer was cut inside it (`length`,
        `context`) or had to be a call, is the call it cut: left out, never text."""
        self._cut = self.forced or reason in ("length", "context")
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while True:
            before = (self._state, len(self._buf))
            getattr(self, "_" + self._state)(out, final)
            if (self._state, len(self._buf)) == before:
                return out

    def _emit(self, out: list[Event], kind: str, text: str) -> None:
        if kind == "content" and self._strip:
            text = text.lstrip()
            self._strip = not text
        if not text:
            return
        if kind == "content":
            self.content += text
            self._said = True
        else:
            self.reasoning += text
        if out and isinstance(out[-1], Piece) and out[-1].kind == kind:
            out[-1] = Piece(kind, out[-1].text + text)
        else:
            out.append(Piece(kind, text))

    def _start(self, out: list[Event], final: bool) -> None:
        lead = self._buf.lstrip()
        if self.split_reasoning:
            for open_tag, close_tag in THINK_TAGS:
                if lead.startswith(open_tag):
                    self._buf, self._state, self._close = lead[len(open_tag):], "think", close_tag
                    return
                if open_tag.startswith(lead) and not final:
                    return  # "" or "<thi": wait for more
        self._state = "call" if self.fmt is not None and self.fmt.whole else "content"

    def _think(self, out: list[Event], final: bool) -> None:
        at = self._buf.find(self._close)
        if at >= 0:
            self._emit(out, "reasoning", self._buf[:at])
            self._buf = self._buf[at + len(self._close):]
            self._state, self._strip = ("call" if self.fmt is not None and self.fmt.whole else "content"), True
            return
        keep = 0 if final else _held(self._buf, (self._close,))
        self._emit(out, "reasoning", self._buf[:len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep:]

    def _content(self, out: list[Event], final: bool) -> None:
        fmt = self.fmt
        if fmt is None or not fmt.triggers:
            self._emit(out, "content", self._buf)
            self._buf = ""
            return
        if fmt.start_only:
            lead = self._buf.lstrip()
            if not self._said and any(lead.startswith(t) for t in fmt.triggers):
                self._state, self._buf = "call", lead
                return
            if not self._said and any(t.startswith(lead) for t in fmt.triggers):
                if not final:
                    return
                if lead and self._cut:  # "[TOOL_CA" cut: the call it cut
                    self._buf = ""
                    return
            self._emit(out, "content", self._buf)
            self._buf = ""
            return
        hits = [i for i in (self._buf.find(t) for t in fmt.triggers) if i >= 0]
        if hits:
            at = min(hits)
            said = self._buf[:at].rstrip()
            self._emit(out, "content", said)
            self._gap = self._buf[len(said):at]  # given back if what follows is no call after all
            self._state, self._buf = "call", self._buf[at:]
            return
        keep = _held(self._buf, fmt.triggers)
        if final and not (keep and (self.calls or self._cut)):  # a marker cut off: no text
            keep = 0
        self._emit(out, "content", self._buf[:len(self._buf) - keep])
        self._buf = "" if final else self._buf[len(self._buf) - keep:]

    def _call(self, out: list[Event], final: bool) -> None:
        fmt = self.fmt
        assert fmt is not None
        if fmt.whole and not final:  # one document: each call as its item closes (a repeat is seen at once)
            if self._scan >= 0:
                done, self._scan = fmt.complete_calls(self._buf, self._scan)
                if self.names is None or all(c.name in self.names for c in done):
                    self._add(out, done)
                    self._seen += len(done)
                else:
                    self._scan = -1  # a call to no tool given: the end decides, as text
            return
        if fmt.closes and not final:
            at = self._buf.find(fmt.closes)
            if at < 0:
                self._open_repeat(fmt)
                return
            block, self._buf = self._buf[:at + len(fmt.closes)], self._buf[at + len(fmt.closes):]
            self._give(out, block)
            self._state, self._strip = "content", True
            return
        if final and self._buf:
            block, self._buf = self._buf, ""
            self._give(out, block)

    def _open_repeat(self, fmt: Format) -> None:
        """A small model may write its call again and again inside one block (`{call}, {call}, ...`, which a
        parallel grammar allows) and never close it: the first complete repeat counts in `repeats` at once,
        so whoever generates can stop there; the block's calls are given when it ends."""
        if self._repeated or "}" not in self._buf[-16:]:  # no object closed by the last piece
            return
        seen = [(c.name, c.arguments) for c in self.calls]
        for call in fmt.open_block_calls(self._buf):
            if (call.name, call.arguments) in seen:
                self._repeated = True
                self.repeats += 1
                return
            seen.append((call.name, call.arguments))

    def _give(self, out: list[Event], block: str) -> None:
        assert self.fmt is not None
        text, calls = self.fmt.parse(block)
        if self.names is not None and any(c.name not in self.names for c in calls):
            text, calls = block, []  # a call to no tool that was given is no call: the text stays content
        if self.fmt.whole and self._seen:  # given as they closed
            text, calls = "", calls[self._seen:]
        if not calls and self.fmt.closes and not block.rstrip().endswith(self.fmt.closes) and (
                self.calls or self.forced):
            text = ""  # a call cut off by max_tokens (after whole ones, or the first, forced one): no text for the user
            # (an answer that may be prose keeps a marker it writes unclosed: "the tag <tool_call> marks ...")
        if text:
            self._emit(out, "content", (self._gap if not calls else "") + text)
        self._gap = ""
        self._add(out, calls)

    def _add(self, out: list[Event], calls: list[ToolCall]) -> None:
        for call in calls:
            if any((c.name, c.arguments) == (call.name, call.arguments) for c in self.calls):
                self.repeats += 1
                continue
            self.calls.append(call)
            out.append(call)
