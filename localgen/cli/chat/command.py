"""`localgen chat`: the REPL on a terminal; one message per line when stdin is not a terminal. This module is
the Typer signature: its options become ChatArgs, which plan.py checks into the ChatPlan that loop.py carries
out (slash.py holds the slash commands)."""

from __future__ import annotations

from typing import Annotated

import typer

from localgen.cli import options as o
from localgen.cli.options.knobs import Knobs


@o.with_knobs()
def chat(
    ctx_: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(metavar="NAME", show_default=False,
                       help="Conversation name (default: one from the clock). With --resume: the one to go on with."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", "-r", help="Continue the last conversation, or NAME (a saved chat, or a "
                                                  "conversation id from `localgen logs`).")
    ] = False,
    list_: Annotated[bool, typer.Option("--list", "-l", help="List saved conversations and exit.")] = False,
    plain: Annotated[
        bool, typer.Option("--plain", rich_help_panel=o.OUTPUT_PANEL,
                           help="No Markdown rendering or colour (also with NO_COLOR).")
    ] = False,
    stats: Annotated[
        bool, typer.Option("--stats", rich_help_panel=o.OUTPUT_PANEL,
                           help="When scripted (stdin not a terminal): print each answer's stats to stderr.")
    ] = False,
    compact: Annotated[
        bool | None,
        typer.Option("--compact/--no-compact", show_default=False,
                     help="When the conversation outgrows the context window, have the model summarize the oldest "
                          "turns instead of leaving them out (saved with the conversation; /compact does it now). "
                          "Default: as the conversation was saved, else off.")
    ] = None,
    prompt_cache: o.PromptCache = True,
    model: o.Model = None,
    offline: o.Offline = False,
    chat_template_file: o.ChatTemplateFile = None,
    mmproj: o.MmProj = None,
    system: o.System = None,
    no_log: o.NoLog = False,
    verbose: o.Verbose = False,
    think: o.Think = None,
    *,
    tools: o.ToolOptions,
    output: o.OutputFormat,
    remote: o.RemoteOptions,
    rag: o.RagOptions,
    knobs: Knobs,
) -> None:
    """Chat with a model. Type /help inside for commands.

    Every conversation is saved as it goes; --resume continues one. With --functions or --mcp the model
    may call tools; each call is shown and runs only once you approve it (y / n / always), unless --yes.
    --grammar, --json-schema and --json-schema-file constrain every answer.
    With stdin not a terminal, each line is a message (a block between two \"\"\" lines is one message;
    lines starting with / are commands) and answers are printed plainly.
    """
    from localgen.cli.chat.loop import print_list, start
    from localgen.cli.chat.plan import ChatArgs, check

    args = ChatArgs(context=ctx_, name=name, resume=resume, list_=list_, plain=plain, stats=stats, compact=compact,
                    prompt_cache=prompt_cache, model=model, offline=offline, chat_template_file=chat_template_file,
                    mmproj=mmproj, system=system, no_log=no_log, verbose=verbose, think=think, tools=tools,
                    output=output, remote=remote, rag=rag, knobs=knobs)
    if args.list_:
        print_list()
        return
    start(check(args))
