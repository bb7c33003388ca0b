"""Tools in `run` and `chat`: the answer streams to stdout, each call and its result are shown on stderr
(run) or in the conversation (chat), chat asks before each call (y / n / always for this tool), and
`run --json` lists the calls with their results."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
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


def run_with_tools(f: o.Flags, backend: Any, request: GenerationRequest, toolbox: Any, err: ErrWriter,
                   cid: str | None) -> tuple[str, Any, str]:
    """`run --functions/--mcp --yes`: the loop, the answer on stdout; returns text, stats, finish reason."""
    from localgen.cli.runflow import ThinkingWriter, template_of
    from localgen.tools.loop import ToolResult, plan_for, run_turn
    from localgen.tools.spec import ToolCall
    from localgen.tools.stream import Piece

    out = TextWriter(sys.stdout, enabled=not f.json_out)
    thinking = ThinkingWriter(err, on=bool(f.get("show_thinking")) and not f.json_out)
    template = template_of(backend)

    def show(event: Any) -> None:
        if isinstance(event, Piece) and event.kind == "reasoning":
            thinking.write(event.text)
        elif isinstance(event, Piece):
            thinking.end()
            if not out.write(event.text):
                raise typer.Exit(0)
        elif isinstance(event, ToolCall):
            thinking.end()
            err.line(call_line(event))
        elif isinstance(event, ToolResult):
            err.line(result_line(event))

    t0 = time.perf_counter()
    try:
        turn = run_turn(backend, request, plan_for(template, toolbox), toolbox, lambda call: True, show,
                        f.tool_steps, f.tool_timeout, template, first=first_plan(f, template, toolbox))
    except KeyboardInterrupt:
        out.end()
        err.interrupted()
        raise typer.Exit(130) from None
    out.end()
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
    if choice == "auto":
        return None
    name = choice if choice in ("required", "none") else {"type": "function", "function": {"name": choice}}
    return plan_for(template, toolbox, name)  # type: ignore[arg-type]


class Approver:
    """chat's question before each call: y (this once), n (not this one), a (always this tool, this chat)."""

    def __init__(self, ask: Callable[[str], str], yes: bool = False) -> None:
        self.ask = ask
        self.yes = yes
        self.always: set[str] = set()

    def __call__(self, call: Any) -> bool:
        if self.yes or call.name in self.always:
            return True
        while True:
            answer = self.ask(f"run {call.name}({call.arguments})? [y]es / [n]o / [a]lways for {call.name}: ")
            a = answer.strip().lower()
            if a in ("y", "yes"):
                return True
            if a in ("n", "no", ""):
                return False
            if a in ("a", "always"):
                self.always.add(call.name)
                return True


