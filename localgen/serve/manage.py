"""Model management over HTTP (#43 items 4 and 5), as Ollama's clients and llama-server's router call it:
/api/pull (the same resumable, verified download as `localgen pull`, its progress as NDJSON lines),
/api/delete, /api/copy, /api/create (presets, as `localgen rm | cp | create`), /api/show (without loading the
model), and the router's GET /models, POST /models/load and /models/unload. Names are those `localgen list`
prints: a request never names a file path to read, copy or delete."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localgen.errors import LocalgenError, ModelFormatError, ModelNotFoundError, Overloaded, ServeError, UsageError
from localgen.serve.apierror import HTTPError, without_paths
from localgen.serve.ask import flag
from localgen.serve.describe import modelfile_text, show_doc
from localgen.serve.jsonbody import read_json
from localgen.serve.loadnow import load_now
from localgen.serve.servelog import named
from localgen.serve.state import ServeState
from localgen.serve.worker import ModelWorker
from localgen.types import ModelRef

UNLOAD_WAIT_S = 30.0
PROGRESS_EVERY_S = 0.25  # at most this often a progress line per file while its bytes come


def routes(state: ServeState) -> list[Route]:
    """The model-management routes."""
    return [*_model_routes(state), *_preset_routes(state)]


def _model_routes(state: ServeState) -> list[Route]:
    """Pull and delete (Ollama's), and llama-server's router routes: list, load, unload."""

    async def pull(request: Request) -> Response:
        body = await read_json(request)
        name = _name(body)
        return await _pull(state, name, flag(body, "stream", default=True))

    async def delete(request: Request) -> Response:
        name = _name(await read_json(request))
        await _delete(state, name)
        return JSONResponse({})

    async def router_list(request: Request) -> Response:
        offered = await asyncio.to_thread(state.offered)  # reads GGUF headers
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "owned_by": "localgen", "path": ref.path,
             "status": {"value": "loaded" if w is not None and w.loaded else "unloaded"}}
            for name, ref, w in offered]})

    async def router_load(request: Request) -> Response:
        worker = state.worker(_name(await read_json(request)))
        await load_now(worker, request)
        return JSONResponse({"success": True})

    async def router_unload(request: Request) -> Response:
        worker = state.worker(_name(await read_json(request)))
        if worker.busy:
            raise HTTPError(409, f"{worker.name} is answering requests; unload it once they end")
        await asyncio.to_thread(worker.request_unload().wait, UNLOAD_WAIT_S)
        return JSONResponse({"success": True})

    return [Route("/api/pull", pull, methods=["POST"]), Route("/api/delete", delete, methods=["DELETE"]),
            Route("/models", router_list), Route("/models/load", router_load, methods=["POST"]),
            Route("/models/unload", router_unload, methods=["POST"])]


def _preset_routes(state: ServeState) -> list[Route]:
    """Ollama's copy, create and show."""

    async def copy(request: Request) -> Response:
        body = await read_json(request)
        src, dst = body.get("source"), body.get("destination")
        if not isinstance(src, str) or not src or not isinstance(dst, str) or not dst:
            raise HTTPError(400, "`source` and `destination` must be model names")
        from localgen.models import presets

        await asyncio.to_thread(_offered, state, src)  # the listing reads GGUF headers
        try:
            preset = await asyncio.to_thread(presets.copied, src, dst, _lookup(state))
        except ModelNotFoundError as e:
            raise HTTPError(404, e.message) from None
        except LocalgenError as e:
            raise HTTPError(400, e.message) from None
        await _replace(state, preset, _force(body))
        return JSONResponse({})

    async def create(request: Request) -> Response:
        body = await read_json(request)
        name = _name(body, new=True)
        text = modelfile_text(body)
        from localgen.models import modelfile, presets

        try:
            adapters = modelfile.parse(text, "the request").adapters
        except LocalgenError as e:
            raise HTTPError(400, e.message) from None
        if adapters:  # as FROM, never a path on this machine from a client
            raise HTTPError(400, "ADAPTER names a file on the server's machine: create that preset there, with "
                                 "localgen create (a preset made so is served by its name)")

        force = _force(body)
        _refuse_existing(name, force)  # before a quantization: a refused create costs nothing
        quantize = body.get("quantize")
        lines = [{"status": "reading model metadata"}]
        try:  # every check before anything changes: a refused create leaves a model of that name loaded
            if quantize:  # the FROM quantized first, into localgen's models (quant/quantize.py)
                if not isinstance(quantize, str):
                    raise HTTPError(400, "`quantize` must be a type name, such as q4_K_M")
                from localgen.quant.quantize import for_preset

                made, text = await asyncio.to_thread(for_preset, name, text, quantize, _lookup(state, assemble=True),
                                                     "the request", force=force)
                lines.append({"status": f"quantizing to {made.partition(':')[2].upper()}: {made}"})
            preset = await asyncio.to_thread(presets.made, name, text, _lookup(state), "the request")
        except LocalgenError as e:
            raise HTTPError(404 if isinstance(e, ModelNotFoundError) else 400, e.message) from None
        await _replace(state, preset, force)
        lines += [{"status": f"writing the preset {name}"}, {"status": "success"}]
        return _answer(lines, flag(body, "stream", default=True))

    async def show(request: Request) -> Response:
        body = await read_json(request)
        name = _name(body)
        ref = await asyncio.to_thread(_ref, state, name)
        return JSONResponse(await asyncio.to_thread(show_doc, name, ref))

    return [Route("/api/copy", copy, methods=["POST"]), Route("/api/create", create, methods=["POST"]),
            Route("/api/show", show, methods=["POST"])]


def _force(body: dict[str, Any]) -> bool:
    """localgen's extension `force` (as `localgen create --force`): replace a preset of that name."""
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise HTTPError(400, "`force` must be true or false", param="force")
    return force


async def _replace(state: ServeState, preset: Any, force: bool) -> None:
    """Save a checked preset: a 409 when one of that name exists and `force` was not given (as the CLI asks
    for --force), else its workers are retired first (a 409 when one is busy or pinned)."""
    from localgen.models import presets

    _refuse_existing(preset.name, force)
    await _retire(state, [w for w in list(state.workers.values()) if w.name == preset.name])
    try:  # without `force`, the write itself refuses a name taken meanwhile (a racing create, copy or CLI)
        await asyncio.to_thread(presets.save, preset, force)
    except presets.PresetExists:
        raise _exists(preset.name) from None
    except LocalgenError as e:
        raise HTTPError(400, e.message) from None


def _refuse_existing(name: str, force: bool) -> None:
    """A 409 when a preset of that name exists and `force` was not given (as the CLI asks for --force)."""
    from localgen.models import presets

    if not force and presets.exists(name):
        raise _exists(name)


def _exists(name: str) -> HTTPError:
    return HTTPError(409, f"a preset named {name!r} exists: send \"force\": true to replace it (as "
                          "localgen create --force), or delete it first")


def _name(body: dict[str, Any], new: bool = False) -> str:
    """The request's model name (`model`, or the older `name`); a `new` one (a preset to create) is checked by
    the preset's own rule (models/presets.py), as on the command line."""
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise HTTPError(400, "`model` must be a model's name", param="model")
    # pull read " x\n" as x, the other routes found no such model
    if not new and (name != name.strip() or not name.isprintable()):
        raise HTTPError(400, f"`model` {name[:200]!r} has blanks around it or control characters in it",
                        param="model")
    named(name)  # the access line's model
    return name


def _offered(state: ServeState, name: str) -> None:
    """A 404 unless `name` is a model this server offers (or a preset)."""
    from localgen.models import presets

    if name in state.workers or presets.exists(name) or name in state.names():
        return
    raise HTTPError(404, f"model {name!r} is not here (localgen list shows what is)", "not_found_error", "model")


def _lookup(state: ServeState, assemble: bool = False) -> Any:
    """The base lookup for presets, /api/show and /api/delete: a model offered here, found offline; never a path
    or a Hub repo. What its header says is all they need: an embedded model in chunks is not assembled for it
    (models/resolve.py), but for `quantize`, which reads the whole file (`assemble`)."""
    from localgen.models.resolve import resolve

    def lookup(name: str) -> ModelRef:
        name = state.ollama_name(name)  # an Ollama model's name in any of its spellings
        if name not in state.workers and name not in state.names():
            raise ModelNotFoundError(f"model {name!r} is not here (localgen list shows what is)")
        return resolve(name, offline=True, pull_missing=False, assemble=assemble)

    return lookup


def _ref(state: ServeState, name: str) -> ModelRef:
    """An offered model's ModelRef, without loading it (a 404 for any other name)."""
    name = state.ollama_name(name)  # an Ollama model's name in any of its spellings
    if name in state.workers:
        return state.workers[name].ref
    if state.on_demand is not None and name in state.on_demand.aliases:
        return state.workers[state.on_demand.aliases[name]].ref
    _offered(state, name)
    try:
        ref: ModelRef = _lookup(state)(name)
    except ModelNotFoundError as e:
        raise HTTPError(404, e.message, "not_found_error", "model") from None
    except LocalgenError as e:
        raise HTTPError(400, e.message) from None
    return ref


# ---- pull -------------------------------------------------------------------------------------------------


class Stopped(Exception):
    """The client went away: the download stops where it is (the next pull resumes it)."""


class Lines:
    """A download.Progress that hands Ollama's progress objects to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, out: asyncio.Queue[Any], stop: threading.Event) -> None:
        self.loop, self.out, self.stop = loop, out, stop
        self.name, self.total, self.done, self.last = "", 0, 0, 0.0
        self.verified = False  # said "verifying sha256 digest" (a cached file hashed now)

    def put(self, item: Any) -> None:
        """Hand an item to the event loop; once the loop has closed (the server stopped while the download
        thread was still reading), nobody reads the lines any more, and the item is dropped."""
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)
        except RuntimeError:  # "Event loop is closed": asyncio says so with no type of its own
            if not self.loop.is_closed():
                raise

    def _line(self) -> None:
        self.last = time.monotonic()
        self.put({"status": f"pulling {self.name}", "digest": self.name, "total": self.total,
                  "completed": self.done})

    def start(self, name: str, total: int, done: int) -> None:
        if self.stop.is_set():
            raise Stopped
        if name.startswith("verifying "):
            self.name, self.verified = "", True
            self.put({"status": "verifying sha256 digest"})
            return
        self.name, self.total, self.done = name, total, done
        self._line()

    def advance(self, n: int) -> None:
        if self.stop.is_set():
            raise Stopped
        self.done += n
        if self.name and time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self._line()

    def finish(self) -> None:
        if self.name:
            self._line()

    def note(self, text: str) -> None:
        self.put({"status": without_paths(text)})


def _pull_error(e: BaseException) -> HTTPError:
    from localgen.models.download import DownloadError
    from localgen.models.hub import HubUnreachableError
    from localgen.models.registry import RegistryUnreachableError

    assert isinstance(e, LocalgenError)
    if isinstance(e, ServeError):  # the server is stopping (Pull.end)
        return HTTPError(e.status, e.message, "server_error")
    if isinstance(e, ModelNotFoundError):
        return HTTPError(404, e.message, "not_found_error", "model")
    if isinstance(e, UsageError):
        return HTTPError(400, e.message)
    if isinstance(e, ModelFormatError):  # the repo's file is not a model (pull removed it again)
        return HTTPError(422, e.message)
    if isinstance(e, (DownloadError, HubUnreachableError, RegistryUnreachableError)):
        return HTTPError(502, e.message, "server_error")
    return HTTPError(500, e.message, "server_error")


class Pull:
    """A pull under way, as the server sees it: the shutdown ends it (serve/app.py's Drain), and its client gets
    an error (the stream's last line) instead of a cut body."""

    def __init__(self, out: asyncio.Queue[Any], stop: threading.Event) -> None:
        self.out, self.stop = out, stop

    def end(self, message: str) -> None:
        """Stop the download where it is (the next pull resumes it); told on the event loop's thread, so the
        error comes before anything the download thread hands over later."""
        self.stop.set()
        self.out.put_nowait(Overloaded(message))


def _pulling(target: Any, strict: bool) -> tuple[asyncio.Queue[Any], threading.Event, Lines]:
    """Start the pull in a thread: its progress lines come on the queue, then None when done or the error; the
    event stops it (the client left); Lines says whether the download was verified. `strict`: the registry was
    checked to be public (no --allow-private-urls), and a redirect or token realm to a private address is refused
    without asking the registry's name again (which could answer otherwise the second time)."""
    from localgen.models import oci, ocipull, ollamastore, registry, resolve

    out: asyncio.Queue[Any] = asyncio.Queue()
    stop = threading.Event()
    lines = Lines(asyncio.get_running_loop(), out, stop)

    def work() -> None:
        try:
            if isinstance(target, ollamastore.OllamaName):
                registry.pull(target, lines, True if strict else None)
            elif isinstance(target, oci.OciName):
                ocipull.pull(target, lines, True if strict else None)
            else:
                resolve.pull(target, lines)
        except (LocalgenError, Stopped) as e:
            lines.put(e)
        except BaseException as e:  # a bug: its traceback goes to the server's log, the client gets a 500
            lines.put(e)
            raise
        else:
            lines.put(None)

    threading.Thread(target=work, name="localgen-pull", daemon=True).start()
    return out, stop, lines


async def _pull(state: ServeState, name: str, stream: bool) -> Response:
    from localgen.models import hfcache, ollamastore, resolve

    try:  # a name from a client: never a file here, and no file is looked for (names.parse's local=False)
        if resolve.embedded_model(name, local=False) is not None:  # it ships inside a Python package: here
            return _answer([{"status": "success"}], stream)
        from_registry = _from_registry(name)
        if from_registry is not None and not state.allow_private_urls:
            await asyncio.to_thread(_public_registry, getattr(from_registry, "api_host", from_registry.host))
        if isinstance(from_registry, ollamastore.OllamaName) and ollamastore.in_ollamas_store(from_registry):
            return _answer([{"status": "success"}], stream)  # Ollama's own store has it (a pulled copy: anew)
        target = from_registry if from_registry is not None else resolve.target(name, local=False)
    except ModelNotFoundError as e:
        raise HTTPError(404, e.message, "not_found_error", "model") from None
    except LocalgenError as e:
        raise HTTPError(400, e.message) from None
    if state.offline or hfcache.offline_env():
        raise HTTPError(403, "this server is offline (serve --offline, or HF_HUB_OFFLINE): it cannot pull")
    out, stop, lines = _pulling(target, not state.allow_private_urls)
    pull = Pull(out, stop)
    state.pulls.add(pull)
    if not stream:
        try:
            while (item := await out.get()) is not None and not isinstance(item, BaseException):
                pass
        finally:
            stop.set()
            state.pulls.discard(pull)
        if isinstance(item, BaseException):
            raise _pull_error(item) if isinstance(item, LocalgenError) else item
        return JSONResponse({"status": "success"})
    try:
        first = await out.get()  # the listing's errors (no such repo, no such quantization) before any line
    except BaseException:
        stop.set()
        state.pulls.discard(pull)
        raise
    if isinstance(first, BaseException):
        stop.set()
        state.pulls.discard(pull)
        raise _pull_error(first) if isinstance(first, LocalgenError) else first

    async def lines_out() -> AsyncIterator[bytes]:
        item = first
        try:
            yield b'{"status": "pulling manifest"}\n'
            while item is not None:
                if isinstance(item, LocalgenError):
                    yield (json.dumps({"error": without_paths(item.message)}) + "\n").encode()
                    return
                if isinstance(item, BaseException):
                    raise item
                yield (json.dumps(item) + "\n").encode()
                item = await out.get()
            if not lines.verified:  # a download is hashed as its bytes come, and checked at its end
                yield b'{"status": "verifying sha256 digest"}\n'
            yield b'{"status": "success"}\n'
        finally:
            stop.set()  # the client left (or the pull ended): a download still running stops
            state.pulls.discard(pull)

    return StreamingResponse(lines_out(), media_type="application/x-ndjson")


def _from_registry(name: str) -> Any:
    """An `ollama:` name's parts (pulled from its registry, models/registry.py), or an `oci:` name's (models/
    ocipull.py), else None; a UsageError for a name Ollama (or Docker) does not take."""
    from localgen.models import names, oci, ollamastore

    spec = names.parse(name, False)
    if isinstance(spec, names.StoreSpec) and spec.store == "ollama":
        return ollamastore.parse_name(spec.name)
    if isinstance(spec, names.StoreSpec) and spec.store == "oci":
        return oci.parse_name(spec.name)
    return None


def _public_registry(host: str) -> None:
    """A 403 for a registry host that resolves to a loopback, private, link-local or metadata address (a client
    of the server would otherwise reach what only the server can: `serve --allow-private-urls` allows it); a host
    that does not resolve is left to the pull (a 502 naming it)."""
    from localgen.fetch import FetchError, addresses

    hostname, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    try:
        addresses(hostname, int(port) if port.isdigit() else 443, private=False)
    except FetchError as e:
        if e.message.startswith("refused: "):
            raise HTTPError(403, f"the registry {host} is {e.message.removeprefix('refused: ')}: a client may "
                                 "not make this server pull from it (serve --allow-private-urls allows it)",
                            "permission_error", "model") from None


def _pulled_here(ref: Any) -> bool:
    """Whether an Ollama model's manifest is one `localgen pull` (or /api/pull) wrote, not Ollama's own."""
    from localgen.models import ollamastore

    return ollamastore.is_pulled(ollamastore.manifest(ollamastore.parse_name(ref.name.removeprefix(
        ollamastore.PREFIX))))


def _answer(lines: list[dict[str, Any]], stream: bool) -> Response:
    if not stream:
        return JSONResponse(lines[-1])
    return Response("".join(json.dumps(x) + "\n" for x in lines), media_type="application/x-ndjson")


# ---- delete, and a model's workers retired -----------------------------------------------------------------


async def _retire(state: ServeState, workers: list[ModelWorker]) -> None:
    """Unload and stop these workers and stop offering them (a 409 when one is busy or pinned by serve -m)."""
    for w in workers:
        if w.pinned:
            raise HTTPError(409, f"{w.name} was named by serve -m: it stays for the server's life")
        if w.busy:
            raise HTTPError(409, f"{w.name} is answering requests; try again once they end")
    for w in workers:
        await asyncio.to_thread(w.request_unload().wait, UNLOAD_WAIT_S)
        await asyncio.to_thread(w.stop)
        state.workers.pop(w.name, None)
        if state.on_demand is not None:
            for alias, held in list(state.on_demand.aliases.items()):
                if held == w.name:
                    del state.on_demand.aliases[alias]


async def _delete(state: ServeState, name: str) -> None:
    from localgen.models import presets

    if presets.exists(name):  # only the preset goes, never its base model's files (NAME:latest is NAME)
        await _retire(state, [w for w in list(state.workers.values())
                              if presets.canonical(w.name) == presets.canonical(name)])
        presets.remove(name)
        return
    ref = await asyncio.to_thread(_ref, state, name)
    if ref.source == "embedded":
        raise HTTPError(400, f"{ref.name} ships inside a Python package, which localgen does not remove")
    if ref.source == "quantized":  # made here by `localgen quantize`: its one file goes
        from localgen.models import quantized

        await _retire(state, [w for w in list(state.workers.values()) if w.ref.path == ref.path])
        await asyncio.to_thread(quantized.remove, ref.name)
        return
    if ref.source == "ollama" and await asyncio.to_thread(_pulled_here, ref):  # localgen pulled it: it can go
        from localgen.models import ollamastore, registry

        await _retire(state, [w for w in list(state.workers.values()) if w.ref.name == ref.name])  # not by blob
        await asyncio.to_thread(registry.remove, ollamastore.parse_name(ref.name.removeprefix(ollamastore.PREFIX)))
        return
    if ref.source == "oci":  # localgen pulled it from an OCI registry: it can go
        from localgen.models import oci, ocipull

        await _retire(state, [w for w in list(state.workers.values()) if w.ref.name == ref.name])
        await asyncio.to_thread(ocipull.remove, oci.parse_name(ref.name.removeprefix(oci.PREFIX)))
        return
    if ref.source in ("ollama", "lmstudio"):  # another tool's store: never changed here
        from localgen.models import lmstudio, ollamastore

        store = ollamastore if ref.source == "ollama" else lmstudio
        raise HTTPError(400, store.refuse_removal(ref.name.partition(":")[2]).message)
    if ref.source != "hf":
        raise HTTPError(400, f"{ref.name} is a file localgen did not download; delete it yourself")
    # every worker on that file goes: the model's own, and its presets'
    await _retire(state, [w for w in list(state.workers.values()) if w.ref.path == ref.path])
    await asyncio.to_thread(_remove_files, ref)


def _remove_files(ref: ModelRef) -> None:
    from localgen.models import store

    files = [f for f in store.cached_files(ref.repo) if str(f.link) == ref.path]
    if not files:
        raise HTTPError(404, f"{ref.name} is not in the cache", "not_found_error", "model")
    store.remove(files)
