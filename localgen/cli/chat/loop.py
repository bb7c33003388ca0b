"""What `localgen chat` does with its checked plan (plan.py): pick or resume the conversation, load the
model, then the REPL (on a terminal) or the scripted loop (stdin not a terminal), streaming each answer and
saving after each turn."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localgen.cli.chat.message import handle
from localgen.cli.chat.plan import ChatPlan
from localgen.cli.chat.turn import Hangup, restore_state, save_state
from localgen.cli.chat.view import ChatView, summarized
from localgen.cli.hints import model_gone
from localgen.cli.options import files, preset
from localgen.cli.options.plan import RAG_NEEDS, LoadPlan
from localgen.cli.options.tools import open_toolbox
from localgen.cli.output import plural
from localgen.errors import LocalgenError, ModelNotFoundError, UsageError, no_chat_template


def start(plan: ChatPlan) -> None:
    """Open the conversation, load the model and chat: the REPL on a terminal, else the scripted loop. What is
    opened is closed however it ends, the conversation saved first."""

    load, send = plan.load, plan.send
    endpoints = list(load.endpoints)
    model = load.model
    if endpoints and not model and not plan.resume:  # the endpoint's only model (a resumed chat has its own)
        from localgen.remote.backend import pick_model

        model = pick_model(endpoints)
    session = _open_session(plan.name, plan.resume, model, send.system, load.model_typed)
    if plan.resume and session.model != model:  # its own model, not LOCALGEN_MODEL's: gone, it is model_gone's error
        load = dataclasses.replace(load, model_given=False)
        plan = dataclasses.replace(plan, load=load)
    tools = send.tools
    view = ChatView(interactive=plan.interactive, plain=plan.plain, stats=plan.stats, sampling=send.sampling,
                    model_given=load.model_typed, yes=tools is not None and tools.yes, compact=plan.compact,
                    tools=tools is not None)
    view.loader = (lambda name: remote_backend(endpoints, name, load.assumed_ctx, view, switching=True)
                   ) if endpoints else (lambda name: load_backend(name, load, view))
    with contextlib.ExitStack() as opened:
        if send.rag is not None:  # its embedding model loads first, and stays for the chat
            from localgen.cli.options.rag import Rag

            if not endpoints:  # but a chat model that is not there is said before it loads
                _chat_model_there(plan, session)
            view.rag = Rag(send.rag, load, view.warning)
            opened.callback(view.rag.close)
            view.rag.retriever.load()
        toolbox = open_toolbox(tools)
        if toolbox is not None:
            opened.callback(toolbox.close)
        if not endpoints and load.model_given:  # a model path typed that is not there: a usage error
            from localgen.cli.inputfile import check_model

            check_model("-m/--model", model)
        try:
            backend = remote_backend(endpoints, session.model, load.assumed_ctx, view) if endpoints else \
                view.loader(session.model)
        except ModelNotFoundError as e:
            if plan.resume and not load.model_given:  # the resumed conversation's model is gone
                raise model_gone(session.name, session.model, e, "resume") from None
            raise
        try:
            runner = _runner(plan, session, backend, view, toolbox)
        except BaseException:
            backend.close()
            raise
        opened.callback(lambda: runner.backend.close())  # the model a /model switch left, when it ends
        opened.callback(save_state, runner)  # first: the conversation is saved before anything closes
        _check(runner, view, toolbox, plan)
        if plan.resume:
            restore_state(runner, view)
        opened.enter_context(Hangup(runner))
        if plan.interactive:
            _repl(runner, view, endpoints)
        else:
            _scripted(runner, view)
        if runner.unsaved is not None:  # every answer was given; the exit status says the file is behind them
            raise LocalgenError(f"the conversation was not saved: {runner.unsaved}", hint=_unsaved_hint(runner, plan))


def _unsaved_hint(runner: Any, plan: ChatPlan) -> str:
    """How to keep a conversation whose file is behind it. One whose chosen name another chat took first goes on
    from the log, where its turns are under its own id (not a resumed log id: the file of that name is the other's)."""
    if not runner.unsaved_taken:
        return "its answers are above; to keep chats, free space there or make it writable"
    from localgen.log import store

    cid = runner.session.log_id
    if plan.no_log or not store.enabled() or cid is None or cid == runner.session.name:
        return "its answers are above; /save NAME keeps a chat under a name of its own"
    return f"its answers are above and in the log: `localgen chat --resume {cid}` goes on with them"


def _runner(plan: ChatPlan, session: Any, backend: Any, view: ChatView, toolbox: Any) -> Any:
    """The ChatRunner of the conversation on the loaded model, with the plan's sampling, tools, thinking,
    compaction and prompt cache, and its answers logged."""
    from localgen.chat.runner import ChatRunner

    send, tools = plan.send, plan.send.tools
    preset.adopt(session, backend)
    # A resumed chat keeps its /set values; the catalogue's defaults apply below them; flags win. The grammar
    # constrains every answer: locally as a sampling setting, remotely as the schema a server takes.
    runner = ChatRunner(session, backend, send.sampling.params(backend.defaults, session.settings,
                                                               grammar=send.grammar))
    runner.json_schema = send.json_schema
    log_warn = _Warn(view)
    runner.warn = log_warn.warn  # a conversation that cannot be saved: a warning, and the chat goes on
    remote = bool(plan.load.endpoints)
    # logged under the model that answered (the conversation's, or /model's), never LOCALGEN_MODEL's in its place
    runner.on_answer = lambda request, gen, text: _log_turn(log_warn, runner, request, gen, text,
                                                            model=runner.session.model, no_log=plan.no_log,
                                                            remote=remote)
    if tools is not None:
        runner.toolbox, runner.tool_steps, runner.tool_timeout = toolbox, tools.tool_steps, tools.tool_timeout
        runner.tool_choice = tools.tool_choice
    runner.thinking = send.think
    runner.compact = view.compaction(session)
    runner.note, runner.alert = view.info, view.warning
    runner.prompt_cache = send.prompt_cache
    return runner


def _check(runner: Any, view: ChatView, toolbox: Any, plan: ChatPlan) -> None:
    """What would fail at the first turn fails now: a grammar that does not parse, a tool_choice naming no tool,
    a model with no usable chat template (and, for --rag, none at all)."""
    from localgen.chat.runner import has_template

    backend = runner.backend
    if plan.send.grammar is not None:
        backend.engine.check_grammar(plan.send.grammar)
    if toolbox is not None:
        runner.plan(runner.tool_choice)
        if plan.interactive:
            names = ", ".join(t.name for t in toolbox.specs)
            view.info(f"tools: {names} · " + ("calls run without asking (--yes)" if view.yes else
                                                 "each call asks first (y / n / always)"))
    backend.render(runner.request([{"role": "user", "content": "hi"}]))
    if view.rag is not None and not has_template(backend):
        raise no_chat_template(backend.name, RAG_NEEDS, hint="use a chat model, or give --chat-template-file")


def _open_session(name: str | None, resume: bool, model: str | None, system: str | None, typed: bool) -> Any:
    """The conversation: a saved chat or a logged one to go on with (resume), else a new one; with -m's model
    and --system's prompt (already checked) where given. A resumed one keeps its own model unless -m is `typed`
    (LOCALGEN_MODEL is a default: it serves only one that names none)."""
    from localgen.chat import saved
    from localgen.chat import session as sessions

    if resume:
        chosen = name or saved.latest()
        if chosen is None:
            raise LocalgenError("there is no saved conversation to resume", hint="start one with `localgen chat`")
        if name and not (saved.chats_dir() / f"{sessions.check_name(name)}.json").exists():
            from localgen.cli.log.conversation import chat_from_log

            session = chat_from_log(name, model)  # a conversation id from `localgen logs`
        else:
            try:
                session = sessions.ChatSession.load(chosen)
            except LocalgenError as e:
                if not name:  # the newest, taken unasked: an older one may be the one meant
                    e.hint = (f"{e.hint}; " if e.hint else "") + ("resume another by name, `localgen chat --resume "
                                                                  "NAME`, as `localgen chat --list` names them")
                raise
    else:
        if name and (saved.chats_dir() / f"{sessions.check_name(name)}.json").exists():
            raise UsageError(f"a conversation named {name!r} exists", hint=f"continue it with --resume {name}")
        from localgen.models.embedded import DEFAULT_MODEL

        session = sessions.ChatSession(name=name or sessions.new_name(), model=model or DEFAULT_MODEL,
                                       fresh=True, auto_named=not name)
    if model and (typed or not resume or not session.model):
        session.model = model
    if not session.model:  # a saved file without "model", and no -m
        raise LocalgenError(f"the saved conversation {session.path} names no model",
                            hint=f"give one: localgen chat --resume {session.name} -m MODEL")
    if system is not None:
        session.system = system
    if session.log_id is None:  # its conversation in the log, saved with the chat from the first turn on
        from localgen.log.store import new_id

        session.log_id = new_id()
    return session


def _log_turn(warn: _Warn, runner: Any, request: Any, gen: Any, text: str, *, model: str | None, no_log: bool,
               remote: bool) -> None:
    """Each answer goes to the log, in the chat's own conversation there, with its turn's stats."""
    from localgen.cli.log import conversation

    # a turn a broken remote stream cut off has no reason of its own: "error"
    finish = str(gen.finish_reason) if gen.finish_reason is not None else "error"
    conversation.record(warn, runner.backend, request, runner.session.log_id, text, runner.last_stats, finish,
                        model=model, no_log=no_log, source="chat", remote=remote, seed=gen.seed,
                        system=runner.session.system)  # (the request's first system message may be the summary)


class _Warn:
    """ErrWriter's warn() for the log and the conversation's file, as a chat notice: a warning (the chat goes on),
    once a chat for each thing that went wrong, not once a turn."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.said: set[str] = set()

    def warn(self, text: str) -> None:
        if text in self.said:
            return
        self.said.add(text)
        self.view.warning(text)


def _chat_model_there(plan: ChatPlan, session: Any) -> None:
    """The chat's model found (a path's file, a name's model; nothing loaded or downloaded), or its error: a path
    to nothing, a name that is no model. A model that would be downloaded as it loads is no mistake."""
    from localgen.cli.inputfile import check_model
    from localgen.cli.options.rag import answering_model_there

    if plan.load.model_given:
        check_model("-m/--model", session.model)
    try:
        answering_model_there(session.model)
    except ModelNotFoundError as e:
        if plan.resume and not plan.load.model_given:  # the resumed conversation's model is gone
            raise model_gone(session.name, session.model, e, "resume") from None
        raise


def load_backend(name: str, load: LoadPlan, view: ChatView) -> Any:
    """Resolve and load a model for the chat."""
    from localgen.cli.progress import make_progress
    from localgen.engine.local import LocalBackend
    from localgen.models.load import open_engine
    from localgen.models.resolve import resolve

    ref = files.with_template(resolve(name, offline=load.offline, progress=make_progress()), load.mmproj,
                                  load.template_file)
    params = preset.load_params(ref, load.params, load.load_given.__contains__)
    if view.interactive:
        view.info(f"loading {ref.name} ({ref.quantization or '?'}) ...")
    engine = open_engine(ref, params, verbose=load.verbose, warn=lambda text: view.info(f"warning: {text}"))
    if view.interactive:
        view.info(f"{ref.name} ready in {engine.load_s:.2f} s · context {engine.n_ctx:,} tokens · /help for commands")
    from localgen.cli.hints import record_note, tune_tip

    record_note(view.info, ref.name, ref.path, vars(engine.params), engine.origins)
    tune_tip(view.interactive, view.info, ref.name, ref.path, engine.origins)
    backend = LocalBackend(engine, warn=lambda text: view.info(f"warning: {text}"))
    try:
        backend.check_generates()  # an encoder model cannot chat
    except BaseException:
        backend.close()
        raise
    if not ref.summary.chat_template and view.rag is None and not view.tools:  # with either, refused: one error
        view.info(f"{ref.name} has no chat template (it may be a base model): the conversation goes to it as plain "
                  "text, which it continues")
    return backend


def remote_backend(endpoints: list[Any], name: str, assumed_ctx: int | None, view: ChatView,
                   switching: bool = False) -> Any:
    """The chat's model on a remote endpoint (nothing loads here); --ctx, where given, is its window. `switching`
    (/model, /load): a name the endpoint does not serve is refused (a typo was taken, saved, and failed every turn
    after, --resume's too). A chat's first model is taken at its word: a server may answer a name it does not list
    (llama-server answers any with its one model)."""
    from localgen.remote.backend import RemoteBackend, check_served

    if switching:
        check_served(endpoints[0], name)
    backend = RemoteBackend(endpoints, name, assumed_ctx=assumed_ctx, warn=view.warning)
    if view.interactive:
        view.info(f"{name} on {', '.join(e.label for e in endpoints)} · context {backend.n_ctx:,} tokens · /help for "
                  "commands")
    return backend


# ---- the two loops ------------------------------------------------------------------------------------


def _repl(runner: Any, view: ChatView, endpoints: list[Any]) -> None:
    from localgen import paths
    from localgen.chat import saved
    from localgen.chat.runner import SETTABLE
    from localgen.cli.chat.repl import LineInput, make_completer

    def saved_names() -> list[str]:  # what /load completes: none from a folder that cannot be read
        try:
            return [s.name for s in saved.list_sessions()]
        except (LocalgenError, OSError):
            return []

    completer = make_completer(SETTABLE, saved_names,
                               _model_names(endpoints))
    line_input = LineInput(paths.state_dir() / "chat_history", completer)
    # what a first message would import between Enter and its answer, where Ctrl-C would end the chat instead of
    # stopping the answer (handle catches it only while the request is prepared; stream, once it streams)
    import localgen.cli.chat.slash
    import localgen.tools.loop  # noqa: F401
    if runner.session.messages or not runner.session.fresh:  # (one saved before its first exchange: 0 messages)
        view.info(f"resumed {runner.session.name}: {plural(len(runner.session.messages), 'message')}"
                  + summarized(runner.session))
    from localgen.cli.chat.repl import Between
    from localgen.native.lib import last_words

    # the terminal held between prompts, put back however the chat ends (llama.cpp's abort included)
    with Between() as between, last_words(between.terminal.restore):
        view.held = between
        try:
            _lines(line_input, runner, view, between)
        finally:
            view.held = None


def _lines(line_input: Any, runner: Any, view: ChatView, between: Any) -> None:
    """Read and handle lines until Ctrl-D or /exit. Ctrl-C at the prompt says how to leave, once until a line is
    entered: the later presses of a flood (or of a burst that stopped an answer) leave nothing on an empty prompt
    (LineInput drops them), not a screen of prompts or of the same notice."""
    said = False
    while True:
        try:
            text = line_input.read()  # a Ctrl-C once Enter is taken is held for what the line starts (give_press)
        except KeyboardInterrupt:
            if not said:
                view.info("(Ctrl-C stops an answer; to leave, press Ctrl-D or type /exit)")
                said = True
            continue
        except EOFError:
            return
        said = False
        try:
            between.begin()
            going = handle(text, runner, view, press=line_input.give_press)
        except KeyboardInterrupt:  # a press past the turn's own handler (before a /command's began): the chat goes on
            words = text.split()
            view.info(f"(Ctrl-C stopped {words[0]} before it finished)" if words and words[0].startswith("/") else
                      "(Ctrl-C stops an answer; to leave, press Ctrl-D or type /exit)")  # as the command's own says
            going = True
        finally:
            between.end()
            line_input.release()  # a blank line, a dropped file: nothing ran that the press could stop
        if not going:
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
    from localgen.text import MAX_PROMPT_TEXT, too_long

    block: list[str] | None = None
    held = 0  # characters of the block so far: a message is bounded as run's prompt is
    while raw := sys.stdin.readline(MAX_PROMPT_TEXT + 1):  # a line never read past the bound (/dev/zero)
        if len(raw) > MAX_PROMPT_TEXT or held + len(raw) > MAX_PROMPT_TEXT:
            raise too_long("a message on stdin")
        line = raw.rstrip("\n")
        if block is not None:
            if line.strip() == '"""':
                text, block, held = "\n".join(block), None, 0
                if not handle(text, runner, view, command_ok=False):
                    return
            else:
                block.append(line)
                held += len(raw)
            continue
        if line.strip() == '"""':
            block = []
            continue
        if line.strip() and not handle(line, runner, view):
            return
    if block:
        handle("\n".join(block), runner, view, command_ok=False)


def print_list() -> None:
    """`chat --list`: the saved conversations, newest first."""
    import time

    from localgen.chat import saved
    from localgen.cli.output import for_terminal
    from localgen.embeddings.retrieve import asked
    from localgen.types import shown_path

    skipped: list[tuple[Path, str]] = []
    items = saved.list_sessions(asked, skipped)  # a --rag chat by its question, not the excerpts it begins with
    if skipped:
        from localgen.cli.output import ErrWriter

        for path, why in sorted(skipped):
            ErrWriter().warn(f"the saved conversation {path} cannot be read ({why}): it is left as it is")
    if not items:
        print("no saved conversations")
        return
    import shutil

    from rich.cells import cell_len

    rows = []
    for s in items:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.updated))
        turns = f"{s.turns:3} turn{'' if s.turns == 1 else 's'}"
        # a saved prompt's ESC shows as \x1b on a terminal (it would set the title, write the clipboard)
        model = shown_path(s.model)  # a path that is not UTF-8 shown escaped (\xe8), never a UnicodeEncodeError
        name, model = for_terminal(shown_path(s.name), sys.stdout), for_terminal(model, sys.stdout)  # escaped, padded
        rows.append((name, when, turns, model, for_terminal(s.preview, sys.stdout)))
    width, names, models = None, 30, 16
    if sys.stdout.isatty():  # each row fits the terminal (a row that wrapped broke the columns), its columns no
        width = shutil.get_terminal_size().columns  # wider than what they hold, to leave the preview room
        names = min(names, max(cell_len(row[0]) for row in rows))
        models = min(models, max(cell_len(row[3]) for row in rows))
    for name, when, turns, model, preview in rows:  # into a pipe, whole rows
        row = f"{_padded(name, names)} {when}  {turns:9}  {_padded(model, models)} {preview}"
        print(row if width is None else _fitted(row, width))


def _fitted(row: str, cells: int) -> str:
    """`row` cut to `cells` terminal cells, its end an ellipsis where it was cut (the preview, the last column; on a
    terminal too narrow for the others, them too)."""
    from rich.cells import cell_len, set_cell_size

    if cell_len(row) <= cells:
        return row
    return set_cell_size(row, max(0, cells - 1)).rstrip() + "…"  # (a wide character cut in two: a space, dropped)


def _padded(text: str, cells: int) -> str:
    """`text` padded with spaces to `cells` terminal cells: a wide character (CJK, most emoji) takes two, so a
    column of names in Chinese lines up with one in English."""
    from rich.cells import cell_len

    return text + " " * max(0, cells - cell_len(text))
