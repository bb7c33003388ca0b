"""`localgen chat`: the REPL on a terminal; one message per line when stdin is not a terminal."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.errors import LocalgenError, UsageError

MAX_ATTACHMENT = 1 << 20


def chat(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(show_default=False,
                       help="Conversation name (default: one from the clock). With --resume: the one to go on with."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", "-r", help="Continue the last conversation, or NAME.")
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
    model: o.Model = None,
    offline: o.Offline = False,
    system: o.System = None,
    verbose: o.Verbose = False,
    temperature: o.Temperature = o.DEFAULTS.temperature,
    top_k: o.TopK = o.DEFAULTS.top_k,
    top_p: o.TopP = o.DEFAULTS.top_p,
    min_p: o.MinP = o.DEFAULTS.min_p,
    typical_p: o.TypicalP = o.DEFAULTS.typical_p,
    repeat_penalty: o.RepeatPenalty = o.DEFAULTS.repeat_penalty,
    repeat_last_n: o.RepeatLastN = o.DEFAULTS.repeat_last_n,
    presence_penalty: o.PresencePenalty = o.DEFAULTS.presence_penalty,
    frequency_penalty: o.FrequencyPenalty = o.DEFAULTS.frequency_penalty,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = o.DEFAULTS.max_tokens,
    stop: o.Stop = None,
    ctx_size: o.Ctx = o.LOAD_DEFAULTS.n_ctx,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = None,
    batch_size: o.Batch = o.LOAD_DEFAULTS.n_batch,
    ubatch_size: o.UBatch = o.LOAD_DEFAULTS.n_ubatch,
    flash_attn: o.FlashAttn = o.LOAD_DEFAULTS.flash_attn,
    cache_type_k: o.CacheK = o.LOAD_DEFAULTS.cache_type_k,
    cache_type_v: o.CacheV = o.LOAD_DEFAULTS.cache_type_v,
    repack: o.Repack = o.LOAD_DEFAULTS.repack,
) -> None:
    """Chat with a model. Type /help inside for commands.

    Every conversation is saved as it goes; --resume continues one. With stdin not a terminal, each
    line is a message (a block between two \"\"\" lines is one message; lines starting with / are
    commands) and answers are printed plainly.
    """
    import os

    from localgen.chat import session as sessions
    from localgen.chat.runner import ChatRunner

    if list_:
        _print_list(sessions.list_sessions())
        return
    if resume:
        chosen = name or sessions.latest()
        if chosen is None:
            raise LocalgenError("there is no saved conversation to resume", hint="start one with `localgen chat`")
        session = sessions.ChatSession.load(chosen)
    else:
        if name and (sessions.chats_dir() / f"{sessions.check_name(name)}.json").exists():
            raise UsageError(f"a conversation named {name!r} exists", hint=f"continue it with --resume {name}")
        from localgen.models.embedded import DEFAULT_MODEL

        session = sessions.ChatSession(name=name or sessions.new_name(), model=model or DEFAULT_MODEL)
    if model:
        session.model = model
    if system is not None:
        session.system = system

    flags = o.sampling_flags(locals())
    load = o.load_params(ctx_size, threads, gpu_layers, batch_size, ubatch_size, flash_attn, cache_type_k,
                         cache_type_v, repack)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    ui = _UI(interactive=interactive, plain=plain or bool(os.environ.get("NO_COLOR")), stats=stats)
    engine = _load(session.model, load, verbose, offline, ui)
    # A resumed chat keeps its /set values; the catalogue's defaults apply below them; flags win.
    sampling = o.sampling_params(ctx, flags, engine.model.sampling_defaults, session.settings)
    runner = ChatRunner(session, engine, sampling)
    ui.loader = lambda name: _load(name, load, verbose, offline, ui)
    try:
        engine.template  # noqa: B018 (a model without a usable chat template cannot chat: say so now)
        if resume:
            _restore_state(runner, ui)
        if interactive:
            _repl(runner, ui)
        else:
            _scripted(runner, ui)
    finally:
        from localgen import promptcache

        with contextlib.suppress(OSError):  # a cache: losing it costs time, never data
            promptcache.save_chat(runner.engine, runner.session.name)
        runner.engine.close()


def _restore_state(runner: Any, ui: _UI) -> None:
    """Load the conversation's saved KV state, so the next turn does not re-read the history."""
    from localgen import promptcache

    conv = runner.session.conversation()
    if not conv:
        return
    reused = promptcache.restore_chat(runner.engine, runner.session.name, runner.engine.chat_tokens(conv))
    if reused:
        ui.info(f"restored the KV state of {reused:,} tokens; the history is not re-read")


@dataclass
class _UI:
    interactive: bool
    plain: bool
    stats: bool
    think: bool = True
    footer: bool = True
    markdown: bool = True
    console: Any = None
    loader: Any = None
    attachments: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.interactive:
            from rich.console import Console

            self.console = Console(highlight=False, no_color=self.plain, soft_wrap=False)

    def info(self, text: str) -> None:
        """A notice: dim on the terminal; stderr when scripted (stdout carries only answers)."""
        if self.console is not None:
            self.console.print(text, style="dim", markup=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def error(self, text: str) -> None:
        if self.console is not None:
            self.console.print(f"error: {text}", style="red", markup=False)
        else:
            print(f"localgen: error: {text}", file=sys.stderr, flush=True)


def _load(name: str, load: Any, verbose: bool, offline: bool, ui: _UI) -> Any:
    from localgen.cli.progress import make_progress
    from localgen.models.load import open_engine
    from localgen.models.resolve import resolve

    ref = resolve(name, offline=offline, progress=make_progress())
    if ui.interactive:
        ui.info(f"loading {ref.name} ({ref.quantization or '?'}) ...")
    engine: Any = open_engine(ref, load, verbose=verbose, warn=lambda text: ui.info(f"warning: {text}"))
    if ui.interactive:
        ui.info(f"{ref.name} ready in {engine.load_s:.2f} s · context {engine.n_ctx:,} tokens · /help for commands")
    return engine


# ---- the two loops ------------------------------------------------------------------------------------


def _repl(runner: Any, ui: _UI) -> None:
    from localgen import paths
    from localgen.chat import session as sessions
    from localgen.chat.runner import SETTABLE
    from localgen.cli.repl import LineInput, make_completer
    from localgen.models.embedded import EMBEDDED

    completer = make_completer(
        SETTABLE, lambda: [s.name for s in sessions.list_sessions()], lambda: sorted(EMBEDDED)
    )
    line_input = LineInput(paths.state_dir() / "chat_history", completer)
    if runner.session.messages:
        ui.info(f"resumed {runner.session.name}: {len(runner.session.messages)} messages")
    while True:
        try:
            text = line_input.read()
        except KeyboardInterrupt:
            ui.info("(Ctrl-C stops an answer; to leave, press Ctrl-D or type /exit)")
            continue
        except EOFError:
            return
        if not _handle(text, runner, ui):
            return


def _scripted(runner: Any, ui: _UI) -> None:
    block: list[str] | None = None
    for raw in sys.stdin:
        line = raw.rstrip("\n")
        if block is not None:
            if line.strip() == '"""':
                text, block = "\n".join(block), None
                if not _handle(text, runner, ui, command_ok=False):
                    return
            else:
                block.append(line)
            continue
        if line.strip() == '"""':
            block = []
            continue
        if line.strip() and not _handle(line, runner, ui):
            return
    if block:
        _handle("\n".join(block), runner, ui, command_ok=False)


def _handle(text: str, runner: Any, ui: _UI, command_ok: bool = True) -> bool:
    """One input: a /command or a message. False to leave."""
    if not text.strip():
        return True
    if command_ok and text.startswith("/"):
        try:
            return _command(text, runner, ui)
        except LocalgenError as e:
            ui.error(e.message + (f" ({e.hint})" if e.hint else ""))
            if not ui.interactive:
                raise
            return True
    if ui.attachments:
        text = "\n\n".join([*ui.attachments, text])
        ui.attachments.clear()
    try:
        gen, dropped = runner.start(text)
    except LocalgenError as e:
        runner.session.undo()
        ui.error(e.message + (f" ({e.hint})" if e.hint else ""))
        if not ui.interactive:
            raise
        return True
    _stream(gen, runner, ui, dropped)
    return True


def _stream(gen: Any, runner: Any, ui: _UI, dropped: int) -> None:
    from localgen.cli.render import make_view

    if dropped and not runner.trim_noticed:
        ui.info(f"(the conversation outgrew the {runner.engine.n_ctx:,}-token context: the oldest turns are "
                "dropped from now on; the system prompt stays)")
        runner.trim_noticed = True
    view = make_view(ui.console if ui.markdown else None, ui.plain or not ui.interactive, ui.think)
    interrupted = False
    with _cancel_on_sigint(gen) as pressed:
        try:
            for chunk in gen:
                view.feed(chunk.text)
        except KeyboardInterrupt:  # a second Ctrl-C: stop even inside a long prompt evaluation
            gen.close()
        except BrokenPipeError:
            gen.close()
            raise
        finally:
            view.finish()
        interrupted = pressed()
    runner.finish(gen)
    s = gen.stats
    if interrupted:
        ui.info("(stopped; the partial answer is kept)")
    if s is None:
        return
    footer = _footer(s, runner.engine.n_ctx)
    if ui.interactive and ui.footer:
        ui.info(footer)
    elif not ui.interactive and ui.stats:
        print(footer, file=sys.stderr, flush=True)
    if s.finish_reason == "context":
        ui.info("(the answer filled the context window)")


@contextlib.contextmanager
def _cancel_on_sigint(gen: Any) -> Iterator[Callable[[], bool]]:
    """First Ctrl-C cancels the answer between two tokens (the screen stays whole); a second raises."""
    presses = 0
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal presses
        presses += 1
        gen.cancel()
        if presses > 1:
            raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: keep the default behaviour
        yield lambda: False
        return
    try:
        yield lambda: presses > 0
    finally:
        signal.signal(signal.SIGINT, previous)


def _footer(s: Any, n_ctx: int) -> str:
    parts = [f"{s.completion_tokens} tokens"]
    if s.decode_tps:
        parts.append(f"{s.decode_tps:.1f} tok/s")
    if s.ttft_s is not None:
        parts.append(f"first token {s.ttft_s:.2f} s")
    parts.append(f"context {s.prompt_tokens + s.completion_tokens:,}/{n_ctx:,}")
    return " · ".join(parts)


# ---- slash commands -----------------------------------------------------------------------------------


def _command(text: str, runner: Any, ui: _UI) -> bool:
    from localgen.chat import session as sessions
    from localgen.cli.output import format_stats
    from localgen.cli.repl import COMMANDS, KEYS_HELP

    cmd, _, arg = text.strip().partition(" ")
    arg = arg.strip()
    session = runner.session
    if cmd in ("/exit", "/bye", "/quit"):
        return False
    if cmd in ("/help", "/?"):
        for name, meta in COMMANDS.items():
            ui.info(f"{name:9} {meta}")
        ui.info(KEYS_HELP)
    elif cmd == "/set":
        key, _, value = arg.partition(" ")
        value = value.strip()
        if not key or (not value and key != "system"):
            raise UsageError("usage: /set PARAM VALUE (see /show for the current values)")
        if key == "system":
            session.system = value or None
            ui.info("system prompt set" if value else "system prompt removed")
        elif key in ("think", "verbose", "markdown"):
            if value not in ("on", "off"):
                raise UsageError(f"/set {key} takes on or off")
            attr = {"think": "think", "verbose": "footer", "markdown": "markdown"}[key]
            setattr(ui, attr, value == "on")
            ui.info(f"{key} {value}")
        else:
            ui.info(runner.set(key, value))
        session.save()
    elif cmd == "/show":
        ref = runner.engine.model
        ui.info(f"model {ref.name} ({ref.quantization}) · {ref.path}")
        ui.info(f"conversation {session.name} · {len(session.messages)} messages · saved at {session.path}")
        ui.info(f"system: {session.system!r}")
        ui.info(" · ".join(f"{k}={v!r}" for k, v in runner.sampling.to_dict().items() if k != "grammar"))
        ui.info(f"think {'on' if ui.think else 'off'} · verbose {'on' if ui.footer else 'off'} · "
                f"markdown {'on' if ui.markdown else 'off'}")
    elif cmd == "/system":
        if arg:
            session.system = arg
            session.save()
            ui.info("system prompt set")
        else:
            ui.info(f"system: {session.system!r}")
    elif cmd == "/clear":
        session.messages.clear()
        session.save()
        ui.info("conversation cleared")
    elif cmd == "/undo":
        ui.info("last exchange dropped" if session.undo() else "nothing to undo")
        session.save()
    elif cmd == "/retry":
        if session.pop_answer() is None:
            raise UsageError("nothing to retry")
        gen, dropped = runner.answer()
        _stream(gen, runner, ui, dropped)
    elif cmd == "/read":
        if not arg:
            raise UsageError("usage: /read FILE")
        ui.attachments.append(_read_attachment(Path(arg).expanduser()))
        ui.info(f"{arg} will be sent with your next message")
    elif cmd == "/save":
        if not arg:
            raise UsageError("usage: /save NAME")
        session.name = sessions.check_name(arg)
        ui.info(f"saved to {session.save()}")
    elif cmd == "/load":
        if not arg:
            raise UsageError("usage: /load NAME")
        loaded = sessions.ChatSession.load(arg)
        from localgen import promptcache

        with contextlib.suppress(OSError):
            promptcache.save_chat(runner.engine, session.name)
        runner.session = loaded
        if loaded.messages:
            promptcache.restore_chat(runner.engine, loaded.name, runner.engine.chat_tokens(loaded.conversation()))
        ui.info(f"continuing {loaded.name}: {len(loaded.messages)} messages")
    elif cmd == "/model":
        if not arg:
            raise UsageError("usage: /model NAME")
        runner.switch(ui.loader(arg), arg)
        runner.engine.template  # noqa: B018 (fails early for a model without a chat template)
        session.save()
    elif cmd == "/stats":
        ui.info(format_stats(runner.last_stats) if runner.last_stats else "no answer yet")
    elif cmd == "/context":
        used, n_ctx = runner.context_used()
        ui.info(f"{used:,} of {n_ctx:,} tokens used ({used * 100 // n_ctx} %) · {len(session.messages)} messages")
    else:
        raise UsageError(f"unknown command {cmd}; /help lists them")
    return True


def _read_attachment(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LocalgenError(f"cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_ATTACHMENT:
        raise LocalgenError(f"{path} is larger than {MAX_ATTACHMENT >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise LocalgenError(f"{path} is not UTF-8 text") from None
    return f"Contents of {path.name}:\n\n{text}"


def _print_list(items: list[Any]) -> None:
    if not items:
        print("no saved conversations")
        return
    for s in items:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.updated))
        print(f"{s.name:30} {when}  {s.turns:3} turns  {s.model:16} {s.preview}")
