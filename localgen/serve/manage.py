"""Model management over HTTP (#43 items 4 and 5), as Ollama's clients and llama-server's router call it:
/api/pull (the same resumable, verified download as `localgen pull`, its progress as NDJSON lines),
/api/delete, /api/copy, /api/create (presets, as `localgen rm | cp | create`), /api/show (without loading the
model), and the router's POST /models/load and /models/unload (its GET /models is /v1/models: serve/listings.py).
Names are those `localgen list` prints: a request never names a file path to read, copy or delete."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen.errors import LocalgenError, ModelNotFoundError
from localgen.serve import pulls
from localgen.serve.apierror import HTTPError
from localgen.serve.ask import flag
from localgen.serve.describe import modelfile_text, show_doc
from localgen.serve.jsonbody import read_json
from localgen.serve.loadnow import load_now
from localgen.serve.pulls import answer, pulled_here
from localgen.serve.servelog import named
from localgen.serve.state import ServeState
from localgen.serve.worker import ModelWorker
from localgen.types import ModelRef

UNLOAD_WAIT_S = 30.0


def routes(state: ServeState) -> list[Route]:
    """The model-management routes."""
    return [*_model_routes(state), *_preset_routes(state)]


def _model_routes(state: ServeState) -> list[Route]:
    """Pull and delete (Ollama's), and llama-server's router routes: load, unload."""

    async def pull(request: Request) -> Response:
        body = await read_json(request)
        name = _name(body)
        return await pulls.pull(state, name, flag(body, "stream", default=True), request.app.state.front.log.error)

    async def delete(request: Request) -> Response:
        name = _name(await read_json(request))
        await _delete(state, name)
        return JSONResponse({})

    async def router_load(request: Request) -> Response:
        worker = state.worker(_name(await read_json(request)))
        await load_now(worker, request)
        return JSONResponse({"success": True})

    async def router_unload(request: Request) -> Response:
        worker = state.worker(_name(await read_json(request)))
        if worker.busy:
            raise HTTPError(409, f"{worker.name} is answering requests; unload it once they end")
        if not worker.loaded:  # llama-server's router answers so, in these words
            raise HTTPError(400, "model is not running", param="model")
        await asyncio.to_thread(worker.request_unload().wait, UNLOAD_WAIT_S)
        return JSONResponse({"success": True})

    return [Route("/api/pull", pull, methods=["POST"]), Route("/api/delete", delete, methods=["DELETE"]),
            Route("/models/load", router_load, methods=["POST"]),
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

        if len(text.encode("utf-8", "surrogatepass")) > modelfile.MAX_MODELFILE:  # what `create -f` would refuse
            from localgen.text import too_long

            raise HTTPError(400, too_long("the request's Modelfile", modelfile.MAX_MODELFILE).message)

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
        return answer(lines, flag(body, "stream", default=True))

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
    if not force and any(n == preset.name for n, _ in state.retiring):  # another request is writing it: it exists
        raise _exists(preset.name)
    why = "replaced" if presets.exists(preset.name) else "created"
    async with _retired(state, [w for w in list(state.workers.values()) if w.name == preset.name], why,
                        preset.name):
        try:  # without `force`, the write itself refuses a name taken meanwhile (a racing create, copy or CLI)
            await asyncio.to_thread(presets.save, preset, force)
        except presets.PresetExists:
            raise _exists(preset.name) from None
        except LocalgenError as e:
            raise HTTPError(400, e.message) from None


def _refuse_existing(name: str, force: bool) -> None:
    """A 409 when a preset of that name exists and `force` was not given (as the CLI asks for --force), or when
    it is in the two files an older localgen kept NAME and NAME:latest in (replacing it would lose the other)."""
    from localgen.models import presets

    if not force and presets.exists(name):
        raise _exists(name)
    if force:
        try:
            presets.check_one_file(name)
        except LocalgenError as e:
            raise HTTPError(409, f"{e.message} ({e.hint})" if e.hint else e.message) from None


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
    raise HTTPError(404, state.not_served(name), "not_found_error", "model")


def _lookup(state: ServeState, assemble: bool = False) -> Any:
    """The base lookup for presets, /api/show and /api/delete: a model offered here, found offline; never a path
    or a Hub repo. What its header says is all they need: an embedded model in chunks is not assembled for it
    (models/resolve.py), but for `quantize`, which reads the whole file (`assemble`)."""
    from localgen.models.resolve import resolve

    def lookup(name: str) -> ModelRef:
        name = _meant(state, name)
        why = next((why for n, why in state.retiring if n == name), None)
        if why is not None:  # /api/show of it, or a preset made FROM it, while its files change
            raise HTTPError(409, f"model {name!r} is being {why}: try again once that ends", param="model")
        if name not in state.workers and name not in state.names():
            raise ModelNotFoundError(state.not_served(name))
        return resolve(name, offline=True, pull_missing=False, assemble=assemble)

    return lookup


def _meant(state: ServeState, name: str) -> str:
    """The model a name means here, as for a generation (ServeState.meant): NAME for Ollama's NAME:latest where
    no model has that tagged name, an Ollama model's name in any of its spellings."""
    meant = state.meant(name) if name else name
    return meant if isinstance(meant, str) else name


def _ref(state: ServeState, name: str) -> ModelRef:
    """An offered model's ModelRef, without loading it (a 404 for any other name)."""
    name = _meant(state, name)
    if name in state.workers and state.current(state.workers[name]):
        return state.workers[name].ref
    held = state.on_demand.aliases.get(name) if state.on_demand is not None else None
    if held is not None and held in state.workers and state.current(state.workers[held]):
        return state.workers[held].ref
    _offered(state, name)
    try:
        ref: ModelRef = _lookup(state)(name)
    except ModelNotFoundError as e:
        raise HTTPError(404, e.message, "not_found_error", "model") from None
    except LocalgenError as e:
        raise HTTPError(400, e.message) from None
    return ref


# ---- delete, and a model's workers retired -----------------------------------------------------------------


@contextlib.asynccontextmanager
async def _retired(state: ServeState, workers: list[ModelWorker], why: str, *names: str) -> AsyncIterator[None]:
    """These workers' models taken away for the block (a preset replaced or deleted, a model's files deleted): a
    409 when one is busy or pinned by serve -m. Else, at once, they are no longer offered, and they take no job
    (a request that already holds one is a 409 too), nor does a request naming them or `names` make a worker
    for them until the block has ended (a 409 saying they are being `why`); they are unloaded and stopped, then
    the block runs."""
    for w in workers:
        if w.pinned:
            raise HTTPError(409, f"{w.name} was named by serve -m: it stays for the server's life")
        if w.busy:
            raise HTTPError(409, f"{w.name} is answering requests; try again once they end")
    taken = [*names, *(w.name for w in workers)]
    busy = next(((n, was) for n, was in state.retiring if n in taken), None)
    if busy is not None:  # a second delete, copy or create of the same model while the first one runs
        raise HTTPError(409, f"model {busy[0]!r} is being {busy[1]}: try again once that ends")
    for w in workers:  # no await before this: no request reaches them from here on
        w.close(f"{w.name} is being {why}")
        state.workers.pop(w.name, None)
        state.stopping.append(w)
        if state.on_demand is not None:
            for alias, held in list(state.on_demand.aliases.items()):
                if held == w.name:
                    del state.on_demand.aliases[alias]
                    taken.append(alias)
    marks = [(name, why) for name in dict.fromkeys(taken)]
    state.retiring += marks
    try:
        for w in workers:
            await asyncio.to_thread(w.request_unload().wait, UNLOAD_WAIT_S)
            await asyncio.to_thread(w.stop)
            state.stopping.remove(w)
        yield
    finally:
        for mark in marks:
            state.retiring.remove(mark)


async def _delete(state: ServeState, name: str) -> None:
    from localgen.models import presets

    if presets.exists(name):  # only the preset goes, never its base model's files (NAME:latest is NAME)
        try:
            presets.check_one_file(name)  # kept as two presets by an older localgen: neither goes
        except LocalgenError as e:
            raise HTTPError(409, f"{e.message} ({e.hint})" if e.hint else e.message) from None
        async with _retired(state, [w for w in list(state.workers.values())
                                    if presets.canonical(w.name) == presets.canonical(name)], "deleted",
                            presets.canonical(name)):
            presets.remove(name)
        return
    ref = await asyncio.to_thread(_ref, state, name)
    if ref.source == "embedded":
        raise HTTPError(400, f"{ref.name} ships inside a Python package, which localgen does not remove")
    if ref.source == "quantized":  # made here by `localgen quantize`: its one file goes
        from localgen.models import quantized

        async with _retired(state, [w for w in list(state.workers.values()) if w.ref.path == ref.path], "deleted",
                            ref.name):
            await asyncio.to_thread(quantized.remove, ref.name)
        return
    if ref.source == "ollama" and await asyncio.to_thread(pulled_here, ref):  # localgen pulled it: it can go
        from localgen.models import ollamastore, registry

        async with _retired(state, [w for w in list(state.workers.values()) if w.ref.name == ref.name],  # not by blob
                            "deleted", ref.name):
            await asyncio.to_thread(registry.remove,
                                    ollamastore.parse_name(ref.name.removeprefix(ollamastore.PREFIX)))
        return
    if ref.source == "oci":  # localgen pulled it from an OCI registry: it can go
        from localgen.models import oci, ocipull

        async with _retired(state, [w for w in list(state.workers.values()) if w.ref.name == ref.name], "deleted",
                            ref.name):
            await asyncio.to_thread(ocipull.remove, oci.parse_name(ref.name.removeprefix(oci.PREFIX)))
        return
    if ref.source in ("ollama", "lmstudio"):  # another tool's store: never changed here
        from localgen.models import lmstudio, ollamastore

        store = ollamastore if ref.source == "ollama" else lmstudio
        raise HTTPError(400, store.refuse_removal(ref.name.partition(":")[2]).message)
    if ref.source != "hf":
        raise HTTPError(400, f"{ref.name} is a file localgen did not download; delete it yourself")
    # every worker on that file goes: the model's own, and its presets'
    async with _retired(state, [w for w in list(state.workers.values()) if w.ref.path == ref.path], "deleted",
                        ref.name):
        await asyncio.to_thread(_remove_files, ref)


def _remove_files(ref: ModelRef) -> None:
    from localgen.models import store

    files = [f for f in store.cached_files(ref.repo) if str(f.link) == ref.path]
    if not files:
        raise HTTPError(404, f"{ref.name} is not in the cache", "not_found_error", "model")
    store.remove(files)
