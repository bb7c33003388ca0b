"""`localgen launch AGENT`: a coding agent (Claude Code, Codex, OpenCode) on a local model in one command: a
localgen server found running or started for it, the agent run in the foreground with its settings, the server
stopped when the agent ends. The agents' table: localgen/agents.py; the child server: localgen/childserver.py."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localgen.cli.inputfile import env_source, input_path
from localgen.cli.output import aligned
from localgen.errors import LocalgenError, UsageError
from localgen.types import MAX_CTX, MIN_CTX_FLAG

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable

    from localgen.agents import Agent, Endpoint

AGENT_CTX = 32768  # an agent's first request alone (instructions and tool schemas) is many thousands of tokens
TERM_WAIT_S = 10.0  # an agent told to stop (SIGTERM) that is still running after this is killed
# what launch passes on to the agent, then cleans up (SIGHUP: the terminal closed; none on Windows)
WATCHED = {getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)}
ENDING = WATCHED - {signal.SIGINT}
SI_KERNEL = 0x80  # siginfo's si_code of a signal the kernel sent: a Ctrl-C typed at the terminal (Linux)


def launch(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Argument(metavar="AGENT", show_default=False,
                                                help="The agent: claude, codex or opencode "
                                                     "(--list shows them).")] = None,
    agent_args: Annotated[list[str] | None, typer.Argument(
        show_default=False, metavar="-- AGENT-ARGS",
        help="Passed to the agent as they are (after --: `localgen launch claude -- -p 'hi'`).")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", "-m", envvar="LOCALGEN_MODEL", show_default=False,
        help="The model the agent uses (default: the running server's default model, or serve's).")] = None,
    n_ctx: Annotated[int | None, typer.Option(
        "--ctx", "--ctx-size", "-c", envvar="LOCALGEN_CTX", min=0, max=MAX_CTX, show_default=False,
        help=f"The started server's window in tokens, 16 or more (default: {AGENT_CTX:,}, or the model's trained "
             "context if less; 0: the trained context).")] = None,
    gpu_layers: Annotated[int | None, typer.Option(
        "--gpu-layers", "--n-gpu-layers", "-ngl", min=-1, max=MAX_CTX, show_default=False,
        help="Layers the started server offloads to the GPU (as serve's -ngl).")] = None,
    offline: Annotated[bool, typer.Option("--offline", envvar="LOCALGEN_OFFLINE",
                                          help="The started server never downloads anything.")] = False,
    host: Annotated[str, typer.Option("--host", envvar="LOCALGEN_HOST",
                                      help="Where to look for a running server.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", envvar="LOCALGEN_PORT", min=1, max=65535,
                                      help="The running server's port.")] = 11435,
    api_key_file: Annotated[Path | None, typer.Option(
        "--api-key-file", path_type=str, callback=input_path, show_default=False,
        help="The running server's API key, from a file (else LOCALGEN_API_KEY).")] = None,
    own_server: Annotated[bool, typer.Option(
        "--own-server", help="Start a server for the agent even when one is running at --host/--port.")] = False,
    print_env: Annotated[bool, typer.Option(
        "--print-env", help="Print the shell lines that point the agent at the running server, and the command "
                            "that starts it with the AGENT-ARGS (the key as $(tr -d '[:space:]' < FILE) or "
                            "$LOCALGEN_API_KEY); start nothing. An agent not on PATH draws a warning with how to "
                            "install it.")] = False,
    list_agents: Annotated[bool, typer.Option("--list", help="List the agents, and whether each is on PATH.")] = False,
) -> None:
    """Run a coding agent (Claude Code, Codex, OpenCode) on a local model. It uses the localgen server running
    at --host/--port, or starts one for the agent (a free loopback port, a fresh API key, --parallel 1,
    --keep-alive -1, a window of 32,768 tokens), runs the agent with its settings in this terminal, then stops
    that server. Exits with the agent's status."""
    from localgen.agents import AGENTS

    if list_agents or agent is None:
        _list(AGENTS)
        return
    a = AGENTS.get(agent)
    if a is None:
        raise UsageError(f"no agent is called {agent!r}: launch knows {', '.join(AGENTS)}")
    from localgen.cli.options import refuse_empty

    refuse_empty(("-m", model))  # as run's and logs' (it said "empty model name", once the server was found)
    if n_ctx is not None and 0 < n_ctx < MIN_CTX_FLAG:  # as serve says it (LOCALGEN_CTX's named), before anything
        raise UsageError(f"{env_source(ctx, 'n_ctx') or '--ctx'} takes 0 (the model's trained context) or "
                         f"{MIN_CTX_FLAG} tokens or more, not {n_ctx}")
    if print_env and own_server:
        raise UsageError("--print-env and --own-server cannot be combined: --print-env starts nothing",
                         hint="start a server first: localgen serve -m MODEL --ctx 32768; then give --print-env")
    if not print_env and a.path() is None:
        raise UsageError(f"{a.program} is not on PATH", hint=f"install {a.title.split(',')[0]}: {a.install}")
    _run(ctx, a, agent_args or [], model, n_ctx, gpu_layers, offline, host, port, api_key_file, own_server,
         print_env)


def _list(agents: dict[str, Agent]) -> None:
    rows = [["AGENT", "WHAT", "ON PATH", "INSTALL"]]
    rows += [[a.name, a.title, a.path() or "no", a.install] for a in agents.values()]
    print("\n".join(aligned(rows)))


def _run(ctx: typer.Context, a: Agent, extra: list[str], model: str | None, n_ctx: int | None,
         gpu_layers: int | None, offline: bool, host: str, port: int, api_key_file: Path | None, own_server: bool,
         print_env: bool) -> None:
    from localgen.agents import Endpoint
    from localgen.childserver import ChildServer, ServeExited, default_model, running_at
    from localgen.cli.optionorder import typed_as
    from localgen.cli.options.knobs import typed_by_user
    from localgen.cli.output import ErrWriter

    err = ErrWriter()
    url, key, api_key_file = _target(ctx, host, port, api_key_file, print_env)
    found = False if own_server else running_at(url)
    reuse = found is True
    other = f"something other than localgen serve answers at {url}"
    # --ctx and -ngl typed (not from LOCALGEN_CTX) cannot change a running server: said, as they were spelled
    given = [typed_as(ctx, name) for name in ("n_ctx", "gpu_layers") if typed_by_user(ctx, name)]
    if reuse and given:
        err.warn(f"using the server running at {url}: {', '.join(given)} left as it has "
                 f"{'them' if len(given) > 1 else 'it'} (--own-server starts one for the agent)")
    if print_env:
        if not reuse:
            raise LocalgenError(other if found is None else f"no localgen serve is running at {url}",
                                hint="start one: localgen serve -m MODEL --ctx 32768; or run localgen launch without "
                                "--print-env, which starts one for the agent")
        _print_env(a, url, key, api_key_file, model, extra)
        return
    if found is None:
        err.warn(f"{other}: launch starts one for the agent on another port")
    server = None
    # a SIGTERM or SIGHUP (the terminal closed) while the server starts: it is stopped too
    previous = {sig: signal.signal(sig, _exit_signalled) for sig in ENDING}
    try:
        if reuse:
            endpoint = Endpoint(url, key or "localgen", _model_there(a, url, key, model))
        else:
            server = ChildServer(_serve_args(model, n_ctx, gpu_layers, offline, a.name))
            err.status(f"starting localgen serve {' '.join(server.args)} for {a.name} ...")
            server.start()
            try:
                server.wait_ready()
            except ServeExited as e:
                err.line(e.tail)
                raise
            endpoint = Endpoint(server.url, server.key, default_model(server.url, server.key))
            err.status(f"{endpoint.model} is ready at {server.url}")
        rc = _run_agent(a, endpoint, extra)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        blocked = _block_signals()  # stopping the server is not cut short
        try:
            if server is not None:
                server.stop()
        finally:
            _unblock_signals(blocked)
    raise typer.Exit(rc)


def _target(ctx: typer.Context, host: str, port: int, api_key_file: Path | None,
            print_env: bool) -> tuple[str, str | None, Path | None]:
    """The server's URL, the API key (its file's, or LOCALGEN_API_KEY) and the key file as --print-env's lines
    name it, each checked: usage errors for a host that is no host, a key no HTTP header carries as given, and a
    key file no later shell can open."""
    from localgen.childserver import url_of
    from localgen.cli.options.knobs import typed_by_user
    from localgen.cli.serve.options import check_host, check_host_name, host_and_port, key_fault, key_file

    host, port = host_and_port(host, port, typed_by_user(ctx, "port"), typed_by_user(ctx, "host"))
    source = "--host" if typed_by_user(ctx, "host") else "LOCALGEN_HOST"
    check_host(host, source, client=True)
    check_host_name(host, source)
    if print_env and api_key_file is not None and _is_fifo(api_key_file):  # refused unread: one nobody writes to
        _lasting(api_key_file)  # was waited on for ever
    key = key_file(api_key_file, None) if api_key_file is not None else os.environ.get("LOCALGEN_API_KEY") or None
    if print_env and api_key_file is not None:  # read first: a file past its bound is said so, as everywhere
        api_key_file = _lasting(api_key_file)
    fault = key_fault(key) if key else None
    if fault:  # as ps: no HTTP header carries it as given
        raise UsageError(f"{'the API key file' if api_key_file else 'LOCALGEN_API_KEY'} {fault}: no HTTP header "
                         "carries it as given")
    url = url_of(host, port)
    try:
        import httpx

        httpx.URL(url)
    except httpx.InvalidURL as e:  # as ps says it
        raise UsageError(f"{source} {host[:100]!r} is not a host name or address: {str(e)[:100]}") from None
    return url, key, api_key_file


def _print_env(a: Agent, url: str, key: str | None, api_key_file: Path | None, model: str | None,
               extra: list[str]) -> None:
    """--print-env: the shell lines that start the agent on the server running at url."""
    import shlex

    from localgen.agents import OPENCODE_KEY_CHARS, Endpoint, shell_lines
    from localgen.cli.output import ErrWriter

    if a.name == "opencode" and key and any(c in key for c in OPENCODE_KEY_CHARS):
        raise UsageError("the API key has \" or \\ inside, which the shell would put into OpenCode's JSON as it "
                         "is", hint="run localgen launch opencode, which passes it on itself")
    name = _model_there(a, url, key, model)
    # the file's key with the spaces, tabs, CRs and newlines around it removed, as serve reads it (a key
    # with any inside is refused by _target)
    expr = (f"$(tr -d '[:space:]' < {shlex.quote(str(api_key_file))})" if api_key_file is not None
            else "$LOCALGEN_API_KEY" if key else "localgen")  # the clients insist on some key
    print("\n".join(shell_lines(a, Endpoint(url, "", name), expr, extra, os.environ)))
    if a.path() is None:  # the lines are for a shell where it may be (another PATH): said, not refused
        ErrWriter().warn(f"{a.program} is not on PATH (install {a.title.split(',')[0]}: {a.install})")


def _exit_signalled(signum: int, frame: Any) -> None:
    raise typer.Exit(128 + signum)


def _model_there(a: Agent, url: str, key: str | None, model: str | None) -> str:
    """-m, checked against the server at url, or that server's default model. A serve --endpoint model is
    reached only through chat completions (serve/remotemodels.py): an agent on another API is refused it."""
    from localgen.childserver import check_model, default_model
    from localgen.serve.remotemodels import ROUTES

    if model is None:
        name = default_model(url, key)
        _chats_there(a, url, key, name)
        return name
    entry = check_model(url, key, model)
    if "upstream" not in entry:
        _chats_there(a, url, key, model)
    if "upstream" in entry and a.route not in ROUTES:
        raise LocalgenError(f"the server at {url} does not offer {model} on {a.route}, which {a.name} uses: it runs "
                            f"on {entry.get('owned_by', 'another server')} (serve --endpoint), which only "
                            f"{', '.join(ROUTES)} reach",
                            hint="give -m a model the server runs itself (localgen list), or use localgen launch "
                                 "opencode, which asks by chat completions")
    return model


def _chats_there(a: Agent, url: str, key: str | None, model: str) -> None:
    """The refusal _serve_args gives a model that cannot chat, for a server already running, as its /api/show
    describes the model (localgen serve's and Ollama's: its capabilities, its template); a server without that
    route, or that says nothing of them, is taken at its word."""
    import httpx

    from localgen import proxies

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = proxies.request("POST", f"{url}/api/show", json={"model": model}, headers=headers, timeout=30)
        doc = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return
    if not isinstance(doc, dict):
        return
    capabilities = doc.get("capabilities")
    _refuse_what_cannot_chat(model, a.name, embeds=isinstance(capabilities, list) and "embedding" in capabilities
                             and "completion" not in capabilities, template=doc.get("template") != "")


def _refuse_what_cannot_chat(name: str, agent: str, embeds: bool, template: bool) -> None:
    """A usage error for a model an agent cannot chat with: one that makes embeddings, or has no chat template (the
    agent would start, and every request of it fail with a 400)."""
    from localgen.errors import no_chat_template

    chat_model = "give -m a chat model whose template renders tools, such as qwen2.5-coder:7b"
    if embeds:
        raise UsageError(f"{name} makes embeddings (or rerank scores), not text, which {agent} needs", hint=chat_model)
    if not template:
        raise no_chat_template(name, f"{agent} needs", hint=chat_model)


def _is_fifo(path: Path) -> bool:
    """Whether `path` is a named pipe (stat, never opened)."""
    import stat

    try:
        return stat.S_ISFIFO(path.expanduser().stat().st_mode)
    except OSError:
        return False


def _lasting(path: Path) -> Path:
    """--print-env's key file as a shell that runs the lines later opens it: absolute, `~` expanded; a usage error
    for one no later shell can open (a pipe, a process substitution's /dev/fd/N, /proc/self/fd/N)."""
    import stat

    full = Path(os.path.abspath(path.expanduser()))
    try:
        regular = stat.S_ISREG(full.stat().st_mode)
    except OSError:
        return full  # key_file says why it cannot be read
    fleeting = full.parts[1:3] in (("dev", "fd"), ("dev", "stdin")) or (full.parts[1:2] == ("proc",)
                                                                       and "fd" in full.parts)
    if not regular or fleeting:  # (a regular file under /dev/shm, a secret kept in memory, lasts)
        raise UsageError(f"--print-env: the API key file {str(path)[:100]} is not a file that the shell running the "
                         "lines can open later (a pipe, /dev/fd/N, a <(...))", hint="give a file that holds the key")
    return full


def _serve_args(model: str | None, n_ctx: int | None, gpu_layers: int | None, offline: bool,
                agent: str = "the agent") -> list[str]:
    """serve's flags for an agent: the model, a window large enough (capped at the trained context), one slot,
    never unloaded while the agent thinks. A model that cannot chat (an embedding model, a base model without a
    chat template) is refused first: the agent would start, and every request of it fail with a 400."""
    from localgen.errors import NotDownloadedError
    from localgen.models.resolve import resolve
    from localgen.serve.model import embeds

    try:  # the server would download a missing model where nobody sees its progress
        ref = resolve(model, offline=True, pull_missing=False)
    except NotDownloadedError as e:
        raise LocalgenError(f"{model} is not downloaded", hint=f"localgen pull {e.name} first") from None
    _refuse_what_cannot_chat(ref.name, agent, embeds=embeds(ref), template=bool(ref.summary.chat_template))
    trained = ref.summary.context_length
    window = n_ctx if n_ctx is not None else min(AGENT_CTX, trained) if trained else AGENT_CTX
    args = [*(["-m", model] if model else []), "--ctx", str(window), "--parallel", "1", "--keep-alive", "-1"]
    if gpu_layers is not None:
        args += ["-ngl", str(gpu_layers)]
    return args + (["--offline"] if offline else [])


def _block_signals() -> set[int | signal.Signals] | None:
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)


def _unblock_signals(previous: set[int | signal.Signals] | None) -> None:
    if previous is None:
        return
    if hasattr(signal, "sigtimedwait"):  # what came while blocked is over: the server is stopped
        while signal.sigtimedwait(WATCHED, 0) is not None:
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _run_agent(a: Agent, endpoint: Endpoint, extra: list[str]) -> int:
    """The agent in the foreground (this terminal's stdin, stdout and stderr), with its settings: its exit
    status (128 + N when signal N ended it). A Ctrl-C typed at the terminal reaches the agent, which shares
    this process group, and is not sent again; a SIGINT, SIGTERM or SIGHUP sent to launch itself is passed on."""
    import subprocess
    import time

    from localgen.agents import set_up

    setup = set_up(a, endpoint, os.environ)
    env = {k: v for k, v in os.environ.items() if k not in setup.unset}
    env.update(setup.env)
    argv = [a.path() or a.program, *setup.argv, *extra]
    try:
        p = subprocess.Popen(argv, env=env, preexec_fn=_ends_with_launch())
    except OSError as e:
        raise LocalgenError(f"{a.program} could not start: {e.strerror or e}") from None
    if not hasattr(signal, "sigtimedwait"):  # no siginfo here (macOS, Windows): the terminal's Ctrl-C is the agent's
        told: list[float] = []  # when the agent was told to stop (SIGTERM, SIGHUP)

        def forward(signum: int, frame: Any) -> None:
            p.send_signal(signum)
            told.append(time.monotonic())

        typed = [signal.SIGINT, *([signal.SIGBREAK] if hasattr(signal, "SIGBREAK") else [])]  # Windows' Ctrl-Break
        before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in typed}  # the agent's, as the terminal's Ctrl-C
        before.update({sig: signal.signal(sig, forward) for sig in ENDING})
        try:
            killed = False
            while not _ended(p):
                time.sleep(0.05)
                if told and not killed and time.monotonic() > told[0] + TERM_WAIT_S:
                    p.kill()
                    killed = True
            return _status(p.returncode)
        finally:
            if p.poll() is None:  # launch itself failed: the agent goes too
                p.kill()
                p.wait()
            for sig, handler in before.items():  # once the agent is over: a signal meanwhile was still passed on
                signal.signal(sig, handler)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    deadline: float | None = None
    try:
        while not _ended(p):
            # never a timeout that can run out: CPython 3.11's sigtimedwait returns a garbage siginfo when a
            # SIGCONT (`fg` after Ctrl-Z) interrupts it past its timeout; the signals wait, blocked, meanwhile
            info = signal.sigtimedwait(WATCHED, 0)
            if info is None:
                time.sleep(0.05)
            elif info.si_signo in WATCHED and not (info.si_signo == signal.SIGINT and info.si_code == SI_KERNEL):
                p.send_signal(info.si_signo)
                if info.si_signo != signal.SIGINT and deadline is None:
                    deadline = time.monotonic() + TERM_WAIT_S
            if deadline is not None and time.monotonic() > deadline:
                p.kill()
                deadline = None
    finally:
        if p.poll() is None:  # launch itself failed: the agent goes too
            p.kill()
            p.wait()
        _unblock_signals(blocked)
    return _status(p.returncode)


def _ends_with_launch() -> Callable[[], None] | None:
    """Linux: what the agent's process runs before the agent starts, so that a SIGTERM reaches it when launch ends
    however it ends (a SIGKILL too, which launch cannot pass on): no agent is left talking to a server that stopped
    with launch. Elsewhere, None (no such request: an agent outlives a launch killed so)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    launch, pr_set_pdeathsig, term = os.getpid(), 1, int(signal.SIGTERM)

    def preexec() -> None:
        prctl(pr_set_pdeathsig, term)
        if os.getppid() != launch:  # launch ended before the request was made: its signal is not to come
            os.kill(os.getpid(), term)

    return preexec


def _ended(p: subprocess.Popen[bytes]) -> bool:
    """Whether the agent has exited (its status then in p.returncode). An agent that stopped itself (a TUI's
    Ctrl-Z: SIGTSTP) stops launch too, as sudo and script do, so that the shell takes the terminal back; when
    the shell's `fg` continues launch, launch continues the agent."""
    if p.returncode is not None:
        return True
    if not hasattr(os, "WNOHANG"):  # Windows: no waitpid flags, and no agent stops itself
        return p.poll() is not None
    try:
        pid, status = os.waitpid(p.pid, os.WNOHANG | os.WUNTRACED)
    except ChildProcessError:  # reaped already
        return p.poll() is not None
    if pid == 0:
        return False
    if os.WIFSTOPPED(status):
        stop = os.WSTOPSIG(status)
        # a SIGTSTP, SIGTTIN or SIGTTOU to launch is dropped where no shell could continue it (an orphaned
        # process group): then the agent just goes on
        os.kill(os.getpid(), stop if stop in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU) else signal.SIGTSTP)
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGCONT)
        return False
    p.returncode = os.waitstatus_to_exitcode(status)
    return True


def _status(code: int) -> int:
    return 128 - code if code < 0 else code
