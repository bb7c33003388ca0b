"""`localgen run`: one prompt in, the streamed answer out; built for shell pipelines. This module is the
Typer signature (the user's manual): its options, typed in groups, become RunArgs, which plan.py checks
into the RunPlan that execute.py carries out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from localgen.cli import options as o
from localgen.cli.inputfile import input_path
from localgen.cli.options.knobs import Knobs
from localgen.cli.run.options import DecodingOptions, LogOptions, ManyOptions, MediaOptions, ReportOptions, RunArgs


@o.with_knobs()
def run(
    ctx_: typer.Context,
    prompt_arg: Annotated[
        str | None, typer.Argument(metavar="PROMPT", show_default=False,
                                   help="The prompt (or use -p). Text piped on stdin comes first, a blank line "
                                        "between."),
    ] = None,
    prompt: Annotated[
        list[str] | None, typer.Option("--prompt", "-p", show_default=False, metavar="TEXT",
                                       help="The prompt (give it once).")
    ] = None,
    model: o.Model = None,
    offline: o.Offline = False,
    chat_template_file: o.ChatTemplateFile = None,
    mmproj: o.MmProj = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Send the prompt as a plain completion, without the chat template.")
    ] = False,
    no_stdin: Annotated[
        bool, typer.Option("--no-stdin", help="Do not read piped stdin (inside `while read` loops, which it would "
                                              "otherwise swallow).")
    ] = False,
    verbose: o.Verbose = False,
    system: o.System = None,
    think: o.Think = None,
    document: Annotated[
        list[Path] | None,
        typer.Option("--document", "-f", path_type=str, callback=input_path, show_default=False,
                     help="A text file before the prompt (repeatable; long ones are cached). A lone -f FILE with no "
                          "other prompt is the prompt, as in llama.cpp."),
    ] = None,
    prompt_cache: o.PromptCache = True,
    *,
    many: ManyOptions,
    decoding: DecodingOptions,
    media: MediaOptions,
    report: ReportOptions,
    log: LogOptions,
    tools: o.ToolOptions,
    output: o.OutputFormat,
    remote: o.RemoteOptions,
    rag: o.RagOptions,
    knobs: Knobs,
) -> None:
    """Generate from one prompt (or many) and stream the answer to stdout.

    stdout carries only the answer; loading messages, warnings and --stats go to stderr.

    Exit codes: 0 done, 1 error, 2 bad usage, 130 interrupted.
    """
    from localgen.cli.run.execute import execute
    from localgen.cli.run.plan import check
    from localgen.errors import UsageError

    if prompt is not None and len(prompt) > 1:  # (a list only to see this: a plain option keeps the last quietly)
        raise UsageError(f"give -p/--prompt once (it was given {len(prompt)} times)")

    execute(check(RunArgs(context=ctx_, prompt_arg=prompt_arg, prompt=prompt[0] if prompt else None, model=model,
                    offline=offline, chat_template_file=chat_template_file, mmproj=mmproj, raw=raw,
                    no_stdin=no_stdin, verbose=verbose,
                    system=system, think=think, document=document, prompt_cache=prompt_cache, many=many,
                    decoding=decoding, media=media, report=report, log=log, tools=tools, output=output,
                    remote=remote, rag=rag, knobs=knobs)))
