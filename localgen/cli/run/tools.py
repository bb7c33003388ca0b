"""`run --functions/--mcp`: the loop run with its answer on stdout (each call and its result on stderr, through
output.AnswerWriter), and --json listing the calls with their results (the tools are opened by
options/tools.py, as chat's are)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any

import typer

from localgen.cli.echo import EchoOff
from localgen.cli.options import ToolOptions
from localgen.cli.options.tools import call_cut_note
from localgen.cli.output import AnswerWriter, ErrWriter, TextWriter
from localgen.cli.run.options import ReportOptions
from localgen.cli.signals import ended_by_term, ignoring_ctrl_c, term_as_interrupt, writable
from localgen.types import GenerationRequest


def run_with_tools(tools: ToolOptions, report: ReportOptions, backend: Any, request: GenerationRequest, toolbox: Any,
                   err: ErrWriter, cid: str | None,
                   on_partial: Callable[[Any, str, str], None] | None = None) -> tuple[str, Any, str, int]:
    """`run --functions/--mcp --yes`: the loop, the answer on stdout; returns text, stats, finish reason and the
    seed of the last round (the one that wrote the answer, as --json's "seed"). An answer Ctrl-C stopped, or whose
    reader went away, is told to `on_partial` as far as it came (its last round, what it said, "cancelled")."""
    from localgen.tools.loop import Turn, plan_for, run_turn
    from localgen.tools.stream import template_of

    writer = AnswerWriter(err, json_out=report.json_out, show_thinking=report.show_thinking)
    template = template_of(backend)

    def show(event: Any) -> None:
        if not writer.show([event]):
            raise typer.Exit(0)

    def cut_off() -> None:  # as far as it came, as run's stream logs one (execute.py _cut_off)
        if on_partial is not None and turn.generations and (turn.text or turn.results):  # (a word said, or a call)
            gen = turn.generations[-1]
            gen.close()  # settled: its stats as far as it came
            on_partial(gen, turn.text, str(gen.finish_reason or "cancelled"))

    t0 = time.perf_counter()
    turn = Turn()
    # a SIGTERM or SIGHUP stops the turn as Ctrl-C does (logged as far as it came), then ends the process by it
    from localgen.native.lib import last_words

    # EchoOff: to the end of the "interrupted" line; llama.cpp aborting (an RPC server gone) ends the answer's line
    # and puts the echo back before its error line, as run's stream does
    with term_as_interrupt(), EchoOff(sys.stdout) as terminal, last_words(terminal.restore), \
            last_words(writer.end):
        try:
            run_turn(backend, request, plan_for(template, toolbox), toolbox, lambda call: True, show,
                     tools.tool_steps, tools.tool_timeout, template, first=first_plan(tools, template, toolbox),
                     turn=turn)
        except KeyboardInterrupt:
            terminal.drop_typed()
            if ended_by_term():  # logged before anything is written: a closed terminal may fail the writes
                with ignoring_ctrl_c():
                    cut_off()
                with contextlib.suppress(OSError):
                    if writable(sys.stdout):  # (a stalled reader would hold the exit up)
                        writer.end()
                raise typer.Exit(128 + ended_by_term()) from None
            writer.end()
            err.interrupted()
            with ignoring_ctrl_c():
                cut_off()
            raise typer.Exit(130) from None
        except typer.Exit:  # the reader went away
            with ignoring_ctrl_c():
                cut_off()
            raise
        writer.end()
    gen, stats = turn.generations[-1], turn.stats()
    assert stats is not None  # the loop returns once a round has ended
    note = call_cut_note(gen.finish_reason, turn, request.sampling.max_tokens)
    if note is not None:
        err.warn(note)
    steps = len(turn.generations)
    if report.stats:
        err.stats(stats, lead=f"{steps} steps · " if steps > 1 else "")
    if report.json_out:
        from localgen.cli.output import answer_json

        calls = [{"id": r.call.id, "name": r.call.name, "arguments": r.call.args, "result": r.text,
                  **({"declined": True} if r.declined else {})} for r in turn.results]
        extra = {"text": turn.text, "reasoning": turn.reasoning or None, "tool_calls": calls, "steps": steps,
                 "prompt_cache": turn.generations[0].prompt_cache,  # the run's prompt met the cache in its first step
                 "stats": stats.to_dict(), "step_stats": [g.stats.to_dict() for g in turn.generations],
                 "total_s": round(time.perf_counter() - t0, 4)}
        TextWriter(sys.stdout).write(answer_json(backend, gen, request.sampling, cid, extra) + "\n")
    return turn.text, stats, str(gen.finish_reason), gen.seed


def first_plan(tools: ToolOptions, template: str | None, toolbox: Any) -> Any:
    """--tool-choice's plan for the first round (None: auto); later rounds are auto, so the loop can end."""
    from localgen.tools.loop import plan_for

    choice = tools.tool_choice or "auto"
    return None if choice == "auto" else plan_for(template, toolbox, choice)
