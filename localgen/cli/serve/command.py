"""`localgen serve`: the models behind OpenAI's (chat completions, Responses), Anthropic's and Ollama's HTTP
APIs, on the continuous-batching engine.
This module is the Typer signature and the start-up (its flags checked by cli/serve/checks.py);
localgen/serve/ is the server."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localgen.childserver import url_of
from localgen.cli import options as o
from localgen.cli.inputfile import model_file
from localgen.cli.options import files, preset
from localgen.cli.options.knobs import Knobs
from localgen.cli.serve import checks, endpoints
from localgen.cli.serve.options import (
    FETCH_WAIT_S,
    MAX_FETCHES,
    SERVE,
    FetchOptions,
    ListenOptions,
    ModelSettings,
    ResidencyOptions,
    ServeArgs,
    ServeToolOptions,
    SlotOptions,
    UpstreamOptions,
    host_and_port,
)
from localgen.errors import LocalgenError, UsageError
from localgen.units import format_bytes

if TYPE_CHECKING:
    from localgen.cli.output import ErrWriter
    from localgen.engine.prefixstore import PrefixStore
    from localgen.serve.ondemand import OnDemand
    from localgen.serve.residency import Residency
    from localgen.serve.servelog import ServeLog
    from localgen.serve.upstream import Upstreams
    from localgen.serve.worker import ModelWorker
    from localgen.types import LoadParams, ModelRef


@o.with_knobs()
def serve(
    ctx_: typer.Context,
    models: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", envvar="LOCALGEN_MODEL", callback=model_file, rich_help_panel=SERVE,
                     show_default=False,
                     help="A model to load at start and pin: never unloaded to make room for another, only "
                          "after --keep-alive idle or when a client unloads it (repeatable; default: smollm2:135m, "
                          "loaded at start, unpinned; with --endpoint, none). Requests name a model in `model`; the "
                          "first -m is the model of a request that names none (or a claude-* model not here)."),
    ] = None,
    offline: o.Offline = False,
    chat_template_file: o.ChatTemplateFile = None,
    mmproj: o.MmProj = None,
    drain_timeout: Annotated[
        float, typer.Option("--drain-timeout", min=0, max=3600, rich_help_panel=SERVE,
                            help="Seconds the requests in flight may go on after Ctrl-C or SIGTERM; those still "
                                 "running then end with a 503 (a second signal ends them at once).")
    ] = 4.0,
    quiet: Annotated[
        bool, typer.Option("--quiet", rich_help_panel=o.OUTPUT_PANEL,
                           help="No access line per request on stderr (method, path, status, tokens, ms, id).")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", rich_help_panel=o.OUTPUT_PANEL,
                           help="Also show uvicorn's info lines on stderr.")
    ] = False,
    log_format: Annotated[
        str, typer.Option("--log-format", rich_help_panel=o.OUTPUT_PANEL, metavar="text|json",
                          help="The log on stderr: text lines, or json: one JSON object per line for each request "
                               "(time, request_id, route, model, status, tokens, cached tokens, TTFT, total time, "
                               "client) and each model load, unload and eviction.")
    ] = "text",
    *,
    listen: ListenOptions,
    residency: ResidencyOptions,
    batching: SlotOptions,
    fetching: FetchOptions,
    tools: ServeToolOptions,
    upstream: UpstreamOptions,
    knobs: Knobs,
) -> None:
    """Serve models over HTTP: OpenAI's API (chat completions, Responses) under /v1, Anthropic's Messages API
    at /v1/messages and Ollama's API under /api, from one process.

    Sampling flags set the defaults that requests override. Ctrl-C or SIGTERM (or SIGHUP) finish the requests
    in flight (for a few seconds) and exit 0. --endpoint URL also serves the models of another OpenAI-compatible
    server, sending their requests on to it.
    """
    start(ServeArgs(context=ctx_, models=models, offline=offline, chat_template_file=chat_template_file,
                    mmproj=mmproj, drain_timeout=drain_timeout, quiet=quiet, verbose=verbose, log_format=log_format,
                    listen=listen,
                    residency=residency, batching=batching, fetching=fetching, tools=tools, upstream=upstream,
                    knobs=knobs))


def start(f: ServeArgs) -> None:
    """Check everything, load the models, then listen until told to stop. With --log-format json, an error that
    stops serve is a JSON line too (an `error` event with its hint and exit status), not the CLI's plain one."""
    from localgen.serve.servelog import ServeLog

    if f.log_format not in ("text", "json"):
        raise UsageError(f"--log-format is text or json, not {f.log_format!r}")
    from localgen.cli.options.knobs import typed_by_user

    host, port = host_and_port(f.listen.host, f.listen.port, typed_by_user(f.context, "port"),
                            typed_by_user(f.context, "host"))
    f = dataclasses.replace(f, listen=dataclasses.replace(f.listen, host=host, port=port))
    log = ServeLog(json_lines=f.log_format == "json", access=not f.quiet)
    if log.json:  # llama.cpp's abort (it ends the process) is one of serve's JSON lines too
        from localgen.native.lib import abort_line
        from localgen.serve.servelog import fatal_line

        abort_line(fatal_line)
    try:
        _start(f, log)
    except KeyboardInterrupt:
        from localgen.cli.signals import stopped_by_term, term_line

        signum = stopped_by_term()  # a SIGTERM or SIGHUP before it listened (cli/signals.py's stop_serve_on_term)
        if not signum:
            raise
        log.event("stopped", None, term_line(signum), exit_code=128 + signum)
        raise typer.Exit(128 + signum) from None
    except LocalgenError as e:
        from localgen.cli.main import switch_on

        if not log.json or switch_on("LOCALGEN_DEBUG"):
            raise
        log.fatal(e.message, e.hint, e.exit_code)
        raise typer.Exit(e.exit_code) from None


def _start(f: ServeArgs, log: ServeLog) -> None:
    checked = checks.checked(f, log)  # every flag, before the port and before any load
    checks.check_port(f.listen.host, f.listen.port)
    from localgen.serve.descriptors import raise_limit

    raise_limit()  # a connection holds a descriptor: 1,024 of them is a flood's worth (serve/descriptors.py)
    if checked.cache_ram == 0 and checked.cache_disk and f.batching.cache_disk.strip().lower() != "auto":
        log.warning("--cache-disk is off: it needs the prompt cache in RAM, and --cache-ram is 0")
    from localgen.cli.main import is_loopback

    if not is_loopback(f.listen.host) and not checked.key:
        log.warning(f"listening on {f.listen.host} with no API key: anyone who can reach this port can use the "
                    "models")
    upstreams = endpoints.upstreams(f, log)  # their models known (or one clear error) before any model loads
    toolbox = _toolbox(f.tools, log)  # its servers started (or one clear error) before any model loads
    try:
        _serve(f, log, checked, toolbox, upstreams)
    finally:
        if toolbox is not None:
            toolbox.close()


def _serve(f: ServeArgs, log: ServeLog, checked: checks.Checked, toolbox: Any, upstreams: Upstreams | None) -> None:
    from localgen.cli.output import ErrWriter
    from localgen.serve.app import build
    from localgen.serve.state import ServeState

    store = _prefix_store(checked.cache_disk, checked.cache_ram, log)
    make = _maker(f, checked.models, checked.keep, checked.cache_ram, checked.residency, store, log)
    workers = _workers(f, checked.models, make, ErrWriter(), log)
    state: ServeState | None = None
    try:  # every way out stops the workers: a worker's thread left in llama.cpp as the interpreter ends segfaults
        state = ServeState(workers={w.name: w for w in workers}, api_key=checked.key,
                           flag_sampling=checked.models.sampling,
                           allow_image_urls=f.fetching.allow_image_urls, allow_mcp_urls=f.fetching.allow_mcp_urls,
                           allow_private_urls=f.fetching.allow_private_urls,
                           default=workers[0].name if workers else None,  # the first -m, or the default model
                           on_demand=_on_demand(checked.models, make) if f.residency.on_demand else None,
                           residency=checked.residency, offline=f.offline, store=store,
                           batch_lines=f.batching.batch_lines, toolbox=toolbox, tool_timeout=f.tools.tool_timeout,
                           collections=list(dict.fromkeys(f.tools.collections or [])), upstreams=upstreams)
        checks.check_collections(state)
        shadowed = [] if upstreams is None else \
            upstreams.check_names([*state.workers, *(state.on_demand.listing() if state.on_demand else [])])
        app = build(state, checked.policy, webui=f.listen.webui)
        server = _listener(app, f, log)
        started = state

        def listening() -> None:  # said once the port takes connections: a script may connect at the line
            log.event("start", None, _started_line(f, list(started.workers), checked.cache_ram, checked.residency,
                                                   store).removeprefix("localgen serve: "),
                      url=url_of(f.listen.host, f.listen.port), models=list(started.workers),
                      default_model=started.default)
            for w in workers:
                _ctx_warning(w, checked.models, log)
                _worker_lines(w, log)
            if toolbox is not None:
                _tool_lines(toolbox, log)
            if started.collections:
                log.line(f"  vector stores (--collection): {', '.join(started.collections)}")
            if upstreams is not None:
                endpoints.upstream_lines(upstreams, shadowed, log)

        server.on_listening = listening
        _sigterm(server.handle_exit)  # also outside uvicorn's own handling: see _sigterm
        server.run()
        if getattr(server, "stopped_early", 0):  # a signal before it listened: as stop_serve_on_term, or Ctrl-C
            from localgen.cli.signals import sigint_came, term_came

            if server.stopped_early != signal.SIGINT:
                term_came(server.stopped_early)
            else:
                sigint_came()
            raise KeyboardInterrupt
    finally:
        _sigterm(signal.SIG_IGN)  # on its way out: a repeated one changes nothing while the workers stop
        for w in [*state.workers.values(), *state.stopping] if state is not None else workers:
            w.stop(timeout=5)
    if getattr(server, "started", True) is False:
        raise LocalgenError(f"the server could not start on {f.listen.host}:{f.listen.port}")


def _sigterm(handler: Any) -> None:
    """SIGTERM's and SIGHUP's handler set (not from the main thread, a test's server: left as they are; a SIGHUP
    ignored, `nohup`, stays so). serve keeps SIGTERM as "stop" outside uvicorn's own handling (installed while it
    serves), and SIGHUP (the terminal closed) as SIGTERM, and ignores both while the workers stop: a repeated one (a
    service manager's, a script's) that came in between killed the process half-way through its stopping (-15),
    the prefixes not yet written."""
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        with contextlib.suppress(ValueError, TypeError):
            if sig is not None and (sig == signal.SIGTERM or signal.getsignal(sig) is not signal.SIG_IGN):
                signal.signal(sig, handler)


def _listener(app: Any, f: ServeArgs, log: ServeLog) -> Any:
    """uvicorn's server for `app`, with its fetch pool, our access line and the read deadlines; drained on exit."""
    import uvicorn

    from localgen.fetch import Fetcher, FetchPool
    from localgen.serve.connection import with_header_deadline
    from localgen.serve.descriptors import connection_cap, low_cap_line, raise_limit

    listen, fetching = f.listen, f.fetching
    app.state.front.pool = FetchPool(Fetcher(private=fetching.allow_private_urls, timeout=fetching.fetch_timeout),
                                     size=MAX_FETCHES, wait=FETCH_WAIT_S)
    app.state.front.log = log  # our access line (serve/app.py's FrontDoor) replaces uvicorn's, off even with -v
    # a connection that sends no request, or half its headers, is closed after --read-timeout (uvicorn would
    # wait forever); so is one idle between requests (uvicorn's keep-alive timeout is no shorter: serve.md); one
    # whose request line and headers pass 64 KiB gets a 431 (httptools, a dependency, is the parser:
    # serve/connection.py);
    # past the cap of connections open at once, the one idle longest is closed (serve/descriptors.py)
    limit = raise_limit()
    cap = connection_cap(limit)  # counted once the models have loaded: their descriptors are taken
    low = low_cap_line(cap, limit)
    if low:
        log.warning(low)

    config = uvicorn.Config(app, host=listen.host, port=listen.port, log_level="warning" if not f.verbose else "info",
                            http=with_header_deadline(listen.read_timeout, cap), ws="none",
                            timeout_keep_alive=math.ceil(listen.read_timeout),
                            timeout_graceful_shutdown=math.ceil(f.drain_timeout) + 1, access_log=False,
                            lifespan="on", **_uvicorn_logging(log.json))
    server = _Server(config)
    server.on_exit = app.state.drain.signal
    app.state.drain.seconds = f.drain_timeout
    return server


def _toolbox(tools: ServeToolOptions, log: ServeLog) -> Any:
    """The tools of --functions and --mcp, loaded and started (None without them), refused (exit 2) where no request
    could carry them, as run and chat refuse them: more than one request's `tools` holds (the chat page sends them
    all), or a schema that cannot become a grammar (every request with it would be a 400)."""
    if not tools.any:
        return None
    from localgen.serve.tooling import MAX_TOOLS
    from localgen.tools.loop import Toolbox, plan_for

    box = Toolbox.open(list(tools.functions or []), list(tools.mcp or []), log.warning)
    try:
        if len(box.specs) > MAX_TOOLS:
            raise UsageError(f"--functions and --mcp offer {len(box.specs):,} tools; a request takes at most "
                             f"{MAX_TOOLS:,}, and the chat page sends them all", hint="offer fewer tools")
        plan_for(None, box)  # each schema as a grammar: the tool and its server named (a GrammarError, exit 2)
    except BaseException:
        box.close()
        raise
    return box


def _tool_lines(toolbox: Any, log: ServeLog) -> None:
    """Under the start line, the tools /tools offers, by where they come from."""
    by_source: dict[str, list[str]] = {}
    for spec in toolbox.specs:
        by_source.setdefault(toolbox.source(spec.name), []).append(spec.name)
    for source, names in by_source.items():
        log.line(f"  tools ({source}): {', '.join(names)}")


def _ctx_warning(w: ModelWorker, models: ModelSettings, log: ServeLog) -> None:
    """A --ctx past what the model was trained on is capped at load, as run's is: said, as run says it."""
    from localgen.engine.defaults import past_training

    trained, load = w.ref.summary.context_length, models.load
    if models.ctx_given and past_training(load, trained):
        log.warning(f"--ctx {load.n_ctx:,} is past the {trained:,} tokens {w.name} was trained on: its window is "
                    f"{trained:,} (--rope-scaling linear or yarn stretches it)")


def _worker_lines(w: ModelWorker, log: ServeLog) -> None:
    """Under the start line, a model's batching mode and why, and where its settings came from."""
    mode = w.residence.mode
    if mode is not None and not w.ref.summary.encoder_only:  # an encoder (BERT) generates nothing to batch
        log.line(f"  {w.name}: {mode.name} batching: {mode.why}")
        if w.residence.pc is not None and w.residence.pc.one_pool:  # --kv-unified, or its default here
            log.line(f"  {w.name}: the slots share one pool of KV cells (--no-kv-unified: a stream each)")
    loaded = w.residence.settings()
    if loaded:
        from localgen.cli.hints import record_note

        record_note(lambda text: log.line(f"  {text}"), w.name, w.ref.path,
                    {k: v["value"] for k, v in loaded.items()}, {k: v["from"] for k, v in loaded.items()})


def _started_line(f: ServeArgs, names: list[str], cache_ram: int, residency: Any, store: Any) -> str:
    """What serve says once its models are loaded: where it listens, its APIs, slots, caches and limits."""
    others = " (and every model here, on demand)" if f.residency.on_demand else ""
    default = f" (default {names[0]})" if len(names) > 1 else ""
    if not names:  # serve --endpoint without -m: its remote models (their lines follow), nothing loaded
        others = " (every model here on demand)" if f.residency.on_demand else ""
        names = ["remote models, no model loaded at start"]
    slots = f.batching.parallel
    disk = f"prompt cache on disk: up to {format_bytes(store.limit)}" if store else "no prompt cache on disk"
    return (f"localgen serve: {', '.join(names)}{default}{others} on {url_of(f.listen.host, f.listen.port)}"
            f" · {'chat page at /, ' if f.listen.webui else ''}OpenAI API at /v1, Anthropic's at "
            f"/v1/messages, Ollama's at /api · {slots} slot"
            f"{'s' if slots != 1 else ''} per model · {_cache_ram_label(cache_ram)} · {disk} · at most "
            f"{residency.max_models} model{'s' if residency.max_models != 1 else ''} or "
            f"{format_bytes(residency.budget)} loaded")


def _server_class() -> Any:
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that after a graceful shutdown on SIGTERM or Ctrl-C the process exits 0
        (uvicorn raises the signal again, which would end it with 143 or a KeyboardInterrupt)."""

        on_exit: Any = None  # serve/app.py's Drain.signal: our jobs end as 503s before uvicorn cancels them
        on_listening: Any = None  # the start line: said once the port takes connections
        first_signal = 0  # the first exit signal that came
        stopped_early = 0  # that signal, where it came before the server started to listen: it never does

        async def startup(self, sockets: Any = None) -> None:
            if self.should_exit:  # uvicorn would listen, skip its loop and end with exit 0, saying nothing
                self.stopped_early = self.first_signal
                return
            await super().startup(sockets)
            if self.should_exit:  # the signal came during uvicorn's own start-up: it listened, never served
                self.stopped_early = self.first_signal
            elif self.started and self.on_listening is not None:
                self.on_listening()

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.first_signal = self.first_signal or sig
            force = self.should_exit and sig == signal.SIGINT  # a second Ctrl-C: stop waiting for requests
            if force:
                self.force_exit = True
            else:
                self.should_exit = True  # a repeated SIGTERM (a service manager's) changes nothing
            if self.on_exit is not None:
                self.on_exit(force)

        async def shutdown(self, sockets: Any = None) -> None:
            await super().shutdown(sockets)
            if self.force_exit:
                # uvicorn skips the app's lifespan shutdown after a second Ctrl-C: its task, cancelled as the
                # loop closed, then printed Starlette's traceback of that CancelledError. Ours takes no time.
                await self.lifespan.shutdown()

    return Server


def _Server(config: Any) -> Any:
    return _server_class()(config)


def _prefix_store(limit: int, cache_ram: int, log: Any) -> Any:
    """The prompt cache on disk (engine/prefixstore.py), None when --cache-disk 0 (or with no prompt cache in
    RAM, where its prefixes come back to)."""
    if limit == 0 or cache_ram == 0:
        return None
    from localgen import paths
    from localgen.engine.prefixstore import PrefixStore
    from localgen.native.lib import build_id

    folder = paths.cache_dir() / "serve-prefixes"
    try:
        paths.private_dir(folder)
    except OSError as e:  # a file in its place, no permission, a read-only disk: served without it, as run does
        from localgen.cli.main import describe_os_error

        log.warning(f"no prompt cache on disk: {describe_os_error(e)} (--cache-disk 0 says so without trying)")
        return None
    return PrefixStore(folder, limit, build_id(),
                       say=lambda text: log.event("prefix-skipped", "", text, detail=text),
                       dropped=lambda text: log.event("prefix-evicted", "", text, detail=text))


def _uvicorn_logging(json_lines: bool) -> dict[str, Any]:
    """uvicorn's own lines as serve's JSON lines with --log-format json (serve/servelog.py)."""
    from localgen.serve.servelog import uvicorn_log_config

    config = uvicorn_log_config(json_lines)
    return {"log_config": config} if config is not None else {}


def _maker(f: ServeArgs, models: ModelSettings, keep: float, cache_ram: int, residency: Residency,
           store: PrefixStore | None, log: ServeLog) -> Callable[..., ModelWorker]:
    """make(ref, pinned, load, draft=None) → a ModelWorker with serve's settings (not started); `draft`: the
    model that drafts for it (--draft, the first -m's)."""
    from localgen.serve.worker import ModelWorker

    slots = f.batching

    def make(ref: ModelRef, pinned: bool, load: LoadParams, draft: ModelRef | None = None) -> ModelWorker:
        return ModelWorker(ref, preset.load_params(ref, load, models.given), slots.parallel, keep,
                           f.residency.max_queue, warn=log.warning, exact=slots.exact,
                           lookup=slots.draft_max if slots.lookup or draft is not None else 0,
                           share_prefixes=slots.share_prefix, cache_ram=cache_ram, residency=residency,
                           pinned=pinned, store=store, log=log, draft=draft)

    return make


def _on_demand(models: ModelSettings, make: Callable[..., ModelWorker]) -> OnDemand:
    """Every model on this machine, its worker made when a request first names it (serve/ondemand.py)."""
    from localgen.models.installed import installed
    from localgen.models.resolve import resolve
    from localgen.serve.ondemand import OnDemand

    # --lora is for the models loaded at start; one loaded on demand takes its preset's ADAPTER lines
    load = dataclasses.replace(models.load, lora=())

    def started(ref: ModelRef) -> ModelWorker:
        w = make(ref, False, load)
        w.start()
        return w

    def listing() -> list[str]:
        return [i["name"] for i in installed() if i.get("architecture") is not None]

    return OnDemand(started, lambda name: resolve(name, offline=True, pull_missing=False), listing, load,
                    models.ctx_given, peek=lambda name: resolve(name, offline=True, pull_missing=False,
                                                                    assemble=False))


def _workers(f: ServeArgs, models: ModelSettings, make: Callable[..., ModelWorker],
             err: ErrWriter, log: ServeLog) -> list[ModelWorker]:
    """The models named at start, loaded, the first with --draft's model (found with them, loaded with it: a draft
    that cannot draft for it is a usage error before the server listens). A download's progress is the log's lines
    with --log-format json, and the terminal's "loading ..." is left out there (the load's own event follows)."""
    from localgen.cli.progress import LineProgress, make_progress
    from localgen.models.resolve import resolve

    load = models.load  # the tuning record for this many streams, if one was made
    names = f.at_start
    # every name found (or fetched) before any model loads: a bad second -m costs no load of the first
    refs = [files.with_template(resolve(name, offline=f.offline,
                                        progress=LineProgress(log.line) if log.json else make_progress()),
                                f.mmproj, f.chat_template_file) for name in names]
    draft = f.batching.draft
    draft_ref = resolve(draft, offline=f.offline, progress=LineProgress(log.line) if log.json else make_progress()) \
        if draft is not None else None
    workers: list[ModelWorker] = []
    try:
        for i, ref in enumerate(refs):
            # -m pins; the default model, loaded at start, may make room
            drafting = draft_ref if i == 0 else None
            w = make(ref, bool(f.models), load, drafting)
            if not log.json:
                err.status(f"loading {ref.name}{f' and its draft model {drafting.name}' if drafting else ''} ...")
            w.preload()
            w.start()
            workers.append(w)
    except BaseException:
        for w in workers:  # a worker's thread left running in llama.cpp as the interpreter ends: a segfault
            w.stop(timeout=5)
        raise
    return workers


def _cache_ram_label(n: int) -> str:
    from localgen.units import format_bytes

    if not n:
        return "no prompt cache in RAM"
    return f"prompt cache in RAM: {'no limit' if n < 0 else 'up to ' + format_bytes(n)} per model"


