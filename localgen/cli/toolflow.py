"""How `run` shows an answer that may think and call tools: the answer streams to stdout, the thinking to
stderr with --show-thinking, each call and its result on stderr; and `run --functions/--mcp`, whose --json
lists the calls with their results."""

from __future__ import annotations

import sys
import time
from typing import Any

import typer

from localgen.cli import options as o
from localgen.cli.output import ErrWriter, TextWriter
from localgen.types import GenerationRequest

RESULT_PREVIEW = 300  # characters of a tool's result shown


def call_line(call: Any) -> str:
    """How a call is shown: name(arguments)."""
    return f"tool call: {call.name}({call.arguments})"


def result_line(result: Any) -> str:
    """How a result is shown, cut to RESULT_PREVIEW characters."""
    if result.declined:
        return f"tool {result.call.name}: declined"
    text = " ".join(result.text.split())
    return f"tool result: {text[:RESULT_PREVIEW]}{'…' if len(text) > RESULT_PREVIEW else ''}"


def open_toolbox(f: o.Flags) -> Any:
    """The tools of --functions and --mcp, loaded and started (None without them)."""
    if not (f.functions or f.mcp):
        return None
    from localgen.tools.loop import Toolbox

    return Toolbox.open(list(f.functions or []), list(f.mcp or []))


class ThinkingWriter:
    """A reasoning model's thinking on stderr, dimmed, under a "thinking:" line (or nothing when off)."""

    def __init__(self, err: ErrWriter, on: bool) -> None:
        self.err, self.on, self.open = err, on, False

    def write(self, text: str) -> None:
        if not self.on or not text:
            return
        if not self.open:
            self.err.line("thinking:")
            self.open = True
        self.err.raw(text)

    def end(self) -> None:
        if self.open:
            self.err.raw("\n")
            self.err.line("answer:")
            self.open = False


class AnswerWriter:
    """The answer stage's events, where a person reads them: content to stdout, thinking (when shown),
    calls and results to stderr."""

    def __init__(self, f: o.Flags, err: ErrWriter) -> None:
        self.err = err
        self.out = TextWriter(sys.stdout, enabled=not f.json_out)
        self.thinking = ThinkingWriter(err, on=bool(f.get("show_thinking")) and not f.json_out)

    def show(self, events: list[Any]) -> bool:
        """Write the events; False once the reader of stdout has gone away (`| head -1`)."""
        from localgen.tools.loop import ToolResult
        from localgen.tools.stream import Piece

        for event in events:
            if isinstance(event, Piece) and event.kind == "reasoning":
                self.thinking.write(event.text)
                continue
            self.thinking.end()
            if isinstance(event, Piece):
                if not self.out.write(event.text):
                    return False
            elif isinstance(event, ToolResult):
                self.err.line(result_line(event))
            else:
                self.err.line(call_line(event))
        return True

    def end(self) -> None:
        """The answer is over: close the thinking and the line."""
        self.thinking.end()
        self.out.end()


def run_with_tools(f: o.Flags, backend: Any, request: GenerationRequest, toolbox: Any, err: ErrWriter,
                   cid: str | None) -> tuple[str, Any, str]:
    """`run --functions/--mcp --yes`: the loop, the answer on stdout; returns text, stats, finish reason."""
    from localgen.tools.loop import plan_for, run_turn
    from localgen.tools.plan import template_of

    writer = AnswerWriter(f, err)
    template = template_of(backend)

    def show(event: Any) -> None:
        if not writer.show([event]):
            raise typer.Exit(0)

    t0 = time.perf_counter()
    try:
        turn = run_turn(backend, request, plan_for(template, toolbox), toolbox, lambda call: True, show,
                        f.tool_steps, f.tool_timeout, template, first=first_plan(f, template, toolbox))
    except KeyboardInterrupt:
        writer.end()
        err.interrupted()
        raise typer.Exit(130) from None
    writer.end()
    gen = turn.generations[-1]
    if f.stats:
        err.stats(gen.stats)
    if f.json_out:
        from localgen.cli.output import answer_json

        calls = [{"id": r.call.id, "name": r.call.name, "arguments": r.call.args, "result": r.text,
                  **({"declined": True} if r.declined else {})} for r in turn.results]
        extra = {"text": turn.text, "reasoning": turn.reasoning or None, "tool_calls": calls,
                 "steps": len(turn.generations), "total_s": round(time.perf_counter() - t0, 4)}
        TextWriter(sys.stdout).write(answer_json(backend, gen, request.sampling, cid, extra) + "\n")
    return turn.text, gen.stats, str(gen.finish_reason)


def first_plan(f: o.Flags, template: str | None, toolbox: Any) -> Any:
    """--tool-choice's plan for the first round (None: auto); later rounds are auto, so the loop can end."""
    from localgen.tools.loop import plan_for

    choice = f.get("tool_choice") or "auto"
    return None if choice == "auto" else plan_for(template, toolbox, choice)
