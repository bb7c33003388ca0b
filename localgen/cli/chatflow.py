"""What `localgen chat` does: pick or resume the conversation, load the model, then the REPL (on a
terminal) or the scripted loop (stdin not a terminal), streaming each answer and saving after each turn."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from localgen.cli import flagfiles, presetflow
from localgen.cli import options as o
from localgen.cli.chatturn import restore_state, stream
from localgen.cli.knobs import Knobs
from localgen.cli.output import ErrWriter
from localgen.cli.toolflow import open_toolbox
from localgen.errors import LocalgenError, UsageError
from localgen.text import checked


@dataclass
class ChatView:
    """Where a chat's notices go: the Rich console on a terminal, stderr when scripted (stdout carries
    only answers then)."""

    interactive: bool
    plain: bool
    stats: bool
    think: bool = True
    footer: bool = True
    markdown: bool = True
    console: Any = None
    loader: Any = None  # name -> backend, for /model and /load
    flags: o.ChatArgs | None = None
    attachments: list[str] = field(default_factory=list)
    media: list[Any] = field(default_factory=list)  # images and audio for the next message (/image, /audio)
    err: ErrWriter = field(default_factory=ErrWriter)
    yes: bool = False  # tool calls run without asking (--yes)
    always: set[str] = field(default_factory=set)  # tools the user allowed for the rest of the chat

    def ask(self, question: str) -> str:
        """A question to the user on the terminal (scripted chats never ask: they need --yes)."""
        if self.console is None:
            raise EOFError
        return str(self.console.input(question, markup=False))

    def __post_init__(self) -> None:
        if self.interactive:
            from rich.console import Console

            self.console = Console(highlight=False, no_color=self.plain, soft_wrap=False)

    def info(self, text: str) -> None:
        """A notice: dim on the terminal; stderr when scripted."""
        if self.console is not None:
            self.console.print(text, style="dim", markup=False)
        else:
            self.err.line(text)

    def error(self, message: str, hint: str | None = None) -> None:
        """An error the chat survives (on a terminal) or ends with (scripted)."""
        if self.console is not None:
            self.console.print(f"error: {message}" + (f" ({hint})" if hint else ""), style="red", markup=False)
        else:
            self.err.error(message, hint)


def start(f: o.ChatArgs) -> None:
    """The command: list, or open the conversation and chat."""
    from localgen.chat import session as sessions
    from localgen.chat.runner import ChatRunner

    if f.list_:
        _print_list(sessions.list_sessions())
        return
    endpoints, f = _endpoints(f)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    _check_tools(f, bool(endpoints), interactive)
    session = _open_session(f)
    f.knobs.sampling()  # the flags alone are valid, before anything loads
    grammar, schema = flagfiles.output_grammar(f.output)
    load = f.knobs.load()
    view = ChatView(interactive=interactive, plain=f.plain or bool(os.environ.get("NO_COLOR")), stats=f.stats,
                    flags=f, yes=f.tools.yes)
    view.loader = (lambda name: remote_backend(endpoints, name, f.knobs, view)) if endpoints else (
        lambda name: load_backend(name, load, f, view))
    toolbox = open_toolbox(f.tools)
    try:
        backend = view.loader(session.model)
    except BaseException:
        if toolbox is not None:
            toolbox.close()
        raise
    presetflow.adopt(session, backend)
    # A resumed chat keeps its /set values; the catalogue's defaults apply below them; flags win. The grammar
    # constrains every answer: locally as a sampling setting, remotely as the schema a server takes.
    remote_schema = bool(endpoints) and schema is not None
    runner = ChatRunner(session, backend, f.knobs.sampling(backend.defaults, session.settings,
                                                           grammar=None if remote_schema else grammar))
    runner.json_schema = schema if remote_schema else None
    runner.on_answer = lambda request, gen, text: _log_turn(f, view, runner, request, gen, text,
                                                            remote=bool(endpoints))
    runner.toolbox, runner.tool_steps, runner.tool_timeout = toolbox, f.tools.tool_steps, f.tools.tool_timeout
    runner.tool_choice = f.tools.tool_choice
    runner.thinking = f.think
    runner.prompt_cache = f.prompt_cache and not endpoints
    try:
        if grammar is not None and not endpoints:
            backend.engine.check_grammar(grammar)  # a grammar that does not parse fails now, not at the first turn
        if toolbox is not None:
            runner.plan(runner.tool_choice)  # a tool_choice naming no tool is refused now
            if interactive:
                names = ", ".join(t.name for t in toolbox.specs)
                view.info(f"tools: {names} · " + ("calls run without asking (--yes)" if f.tools.yes else
                                                     "each call asks first (y / n / always)"))
        backend.render(runner.request([{"role": "user", "content": "hi"}]))  # no usable chat template: say so now
        if f.resume:
            restore_state(runner, view)
        if interactive:
            _repl(runner, view, endpoints)
        else:
            _scripted(runner, view)
    finally:
        with contextlib.suppress(OSError):  # a cache: losing it costs time, never data
            runner.backend.save_conversation(runner.session.name)
        runner.backend.close()
        if toolbox is not None:
            toolbox.close()


def _endpoints(f: o.ChatArgs) -> tuple[list[Any], o.ChatArgs]:
    """The remote endpoints chat sends to (none: the model loads here), and the chat with their model: the one
    named, else the endpoint's. The flags they cannot honour are refused."""
    from localgen.remote.endpoints import choose

    endpoints, remote_model = choose(f.remote.endpoint, f.remote.api_key_env, f.model)
    if endpoints:
        bad = o.remote_conflicts(f, {"grammar": ("--grammar (GBNF; --json-schema works)", f.output.grammar),
                                     "prompt_cache": ("--prompt-cache", f.prompt_cache)})
        if bad:
            raise UsageError(f"{', '.join(bad)} cannot be used with a remote endpoint (the server loads and runs "
                             "the model)")
        if not remote_model and not f.resume:
            from localgen.remote.backend import pick_model

            remote_model = pick_model(endpoints)
        if remote_model:
            f = replace(f, model=remote_model)
    return list(endpoints), f


def _check_tools(f: o.ChatArgs, remote: bool, interactive: bool) -> None:
    """The tool flags go together, and not with what cannot take them."""
    tools = f.tools.any
    if tools and remote:
        raise UsageError("tools (--functions, --mcp) cannot be used with a remote endpoint")
    if tools and (f.output.grammar or f.output.json_schema or f.output.json_schema_file):
        raise UsageError("tools (--functions, --mcp) cannot be combined with a grammar or JSON schema")
    if tools and not interactive and not f.tools.yes:
        raise UsageError("the model may call tools, and a scripted chat (stdin not a terminal) cannot ask first: "
                         "add --yes to let the calls run")
    if not tools and (f.given("tool_choice") or f.given("tool_steps") or f.given("tool_timeout")):
        raise UsageError(o.TOOL_FLAGS_WITHOUT_TOOLS)


def _open_session(f: o.ChatArgs) -> Any:
    from localgen.chat import session as sessions

    if f.resume:
        chosen = f.name or sessions.latest()
        if chosen is None:
            raise LocalgenError("there is no saved conversation to resume", hint="start one with `localgen chat`")
        if f.name and not (sessions.chats_dir() / f"{sessions.check_name(f.name)}.json").exists():
            from localgen.cli.logflow import chat_from_log

            session = chat_from_log(f.name, f.model)  # a conversation id from `localgen logs`
        else:
            session = sessions.ChatSession.load(chosen)
    else:
        if f.name and (sessions.chats_dir() / f"{sessions.check_name(f.name)}.json").exists():
            raise UsageError(f"a conversation named {f.name!r} exists", hint=f"continue it with --resume {f.name}")
        from localgen.models.embedded import DEFAULT_MODEL

        session = sessions.ChatSession(name=f.name or sessions.new_name(), model=f.model or DEFAULT_MODEL,
                                       fresh=True, auto_named=not f.name)
    if f.model:
        session.model = f.model
    if f.system is not None:
        session.system = checked(f.system, "--system")
    if session.log_id is None:  # its conversation in the log, saved with the chat from the first turn on
        from localgen.log.store import new_id

        session.log_id = new_id()
    return session


def _log_turn(f: o.ChatArgs, view: Any, runner: Any, request: Any, gen: Any, text: str, remote: bool) -> None:
    """Each answer goes to the log, in the chat's own conversation there, with its turn's stats."""
    from localgen.cli import logflow

    logflow.record(_Warn(view), runner.backend, request, runner.session.log_id, text, runner.last_stats,
                   str(gen.finish_reason), model=f.model, no_log=f.no_log, source="chat", remote=remote)


class _Warn:
    """ErrWriter's warn() for logflow, as a chat notice."""

    def __init__(self, view: Any) -> None:
        self.view = view

    def warn(self, text: str) -> None:
        self.view.error(text)


def load_backend(name: str, load: Any, f: o.ChatArgs, view: ChatView) -> Any:
    """Resolve and load a model for the chat."""
    from localgen.cli.progress import make_progress
    from localgen.engine.local import LocalBackend
    from localgen.models.load import open_engine
    from localgen.models.resolve import resolve

    ref = flagfiles.with_template(resolve(name, offline=f.offline, progress=make_progress()), f.mmproj,
                                  f.chat_template_file)
    load = presetflow.load_params(ref, load, f.given("ctx"))
    if view.interactive:
        view.info(f"loading {ref.name} ({ref.quantization or '?'}) ...")
    engine = open_engine(ref, load, verbose=f.verbose, warn=lambda text: view.info(f"warning: {text}"))
    if view.interactive:
        view.info(f"{ref.name} ready in {engine.load_s:.2f} s · context {engine.n_ctx:,} tokens · /help for commands")
    from localgen.cli.hints import tune_tip

    tune_tip(view.interactive, view.info, ref.name, ref.path, engine.origins)
    backend = LocalBackend(engine, warn=lambda text: view.info(f"warning: {text}"))
    try:
        backend.check_generates()  # an encoder model cannot chat
    except BaseException:
        backend.close()
        raise
    return backend


def remote_backend(endpoints: list[Any], name: str, knobs: Knobs, view: ChatView) -> Any:
    """The chat's model on a remote endpoint (nothing loads here); --ctx, where given, is its window."""
    from localgen.remote.backend import RemoteBackend

    backend = RemoteBackend(endpoints, name, assumed_ctx=knobs.get("ctx") if knobs.given("ctx") else None)
    if view.interactive:
        view.info(f"{name} on {', '.join(e.label for e in endpoints)} · context {backend.n_ctx:,} tokens · /help for "
                  "commands")
    return backend


# ---- the two loops ------------------------------------------------------------------------------------


def _repl(runner: Any, view: ChatView, endpoints: list[Any]) -> None:
    from localgen import paths
    from localgen.chat import session as sessions
    from localgen.chat.runner import SETTABLE
    from localgen.cli.repl import LineInput, make_completer

    completer = make_completer(SETTABLE, lambda: [s.name for s in sessions.list_sessions()],
                               _model_names(endpoints))
    line_input = LineInput(paths.state_dir() / "chat_history", completer)
    # what a first message would import between Enter and its answer, where Ctrl-C would end the chat instead of
    # stopping the answer (handle catches it only while the request is prepared; stream, once it streams)
    import localgen.cli.slash
    import localgen.tools.loop  # noqa: F401
    if runner.session.messages:
        view.info(f"resumed {runner.session.name}: {len(runner.session.messages)} messages")
    while True:
        try:
            text = line_input.read()
        except KeyboardInterrupt:
            view.info("(Ctrl-C stops an answer; to leave, press Ctrl-D or type /exit)")
            continue
        except EOFError:
            return
        if not handle(text, runner, view):
            return


def _model_names(endpoints: list[Any]) -> Callable[[], list[str]]:
    """What /model completes, found the first time Tab needs it and kept for the chat: the models of a remote
    chat's endpoint; else what `localgen list` shows (embedded models, GGUFs in the Hugging Face cache) and
    the catalogue's names."""
    found: list[list[str]] = []  # empty until the first Tab after /model

    def names() -> list[str]:
        if not found:
            found.append(sorted(set(_remote_names(endpoints[0]) if endpoints else _local_names())))
        return found[0]

    return names


def _remote_names(endpoint: Any) -> list[str]:
    from localgen.remote.backend import served_models

    try:
        return served_models(endpoint)
    except LocalgenError:  # the server went away: nothing to offer, and the chat says so at the next turn
        return []


def _local_names() -> list[str]:
    from localgen.models import catalogue, store
    from localgen.models.embedded import EMBEDDED

    names = list(EMBEDDED)
    try:
        entries = catalogue.load()
    except LocalgenError:  # a broken user models.toml: the chat reports it where a name is resolved
        entries = {}
    names.extend(entries)
    by_repo = {(e.repo, e.default_quant.upper()): e.name for e in entries.values() if e.repo}
    for cached in store.cached_files():  # named as `localgen list` names them
        quant = (cached.quant or "?").upper()
        names.append(by_repo.get((cached.repo, quant), f"{cached.repo}:{quant}"))
    return names


def _scripted(runner: Any, view: ChatView) -> None:
    block: list[str] | None = None
    for raw in sys.stdin:
        line = raw.rstrip("\n")
        if block is not None:
            if line.strip() == '"""':
                text, block = "\n".join(block), None
                if not handle(text, runner, view, command_ok=False):
                    return
            else:
                block.append(line)
            continue
        if line.strip() == '"""':
            block = []
            continue
        if line.strip() and not handle(line, runner, view):
            return
    if block:
        handle("\n".join(block), runner, view, command_ok=False)


def handle(text: str, runner: Any, view: ChatView, command_ok: bool = True) -> bool:
    """One input: a /command or a message. False to leave. Scripted, an error ends the script."""
    from localgen.cli.slash import run_command

    if not text.strip():
        return True
    try:
        if view.interactive and attach_dropped(text, runner, view):  # before commands: a path starts with /
            return True
        if command_ok and text.startswith("/"):
            return run_command(text, runner, view)
        if view.attachments:
            text = "\n\n".join([*view.attachments, text])
            view.attachments.clear()
        first = runner.start(checked(text, "the message"), view.media)
        view.media.clear()
    except KeyboardInterrupt:  # Ctrl-C between Enter and the answer (fitting a long history to the window)
        if not view.interactive:
            raise
        view.info("(stopped before the answer began; the message was taken back)")
        return True
    except LocalgenError as e:
        if not view.interactive:
            raise
        view.error(e.message, e.hint)
        return True
    stream(runner, view, first)
    return True


def attach_dropped(text: str, runner: Any, view: ChatView) -> bool:
    """A line that is only the path of an image or audio file (a file dropped on the terminal) attaches it to
    the next message instead of sending the path as text."""
    from localgen import media
    from localgen.cli.slash import attach_media

    path = media.dropped_path(text)
    if path is None:
        return False
    found = media.read(str(path))
    attach_media(runner, view, found)
    view.info(f"attached {found.label()}: it goes with your next message (/detach drops it)")
    return True


def _print_list(items: list[Any]) -> None:
    import time

    if not items:
        print("no saved conversations")
        return
    for s in items:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.updated))
        print(f"{s.name:30} {when}  {s.turns:3} turns  {s.model:16} {s.preview}")
