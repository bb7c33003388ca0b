"""`localgen stop MODEL`: a running `localgen serve` unloads a model now, as `ollama stop` asks Ollama's server;
over llama-server's router route POST /models/unload, which says whether the model was loaded at all."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from localgen.cli.serve.ps import (
    ApiKeyFileOption,
    ApiKeyOption,
    HostOption,
    NoAnswer,
    PortOption,
    Server,
    loaded,
    said,
    server_of,
)
from localgen.errors import LocalgenError, UsageError
from localgen.text import mended

# how long a model's unload may take in all, its requests together: the server waits up to 30 s for a model to
# unload before it answers (serve/manage.py), and up to 10 s for keep_alive 0's (serve/loadnow.py)
UNLOAD_TIMEOUT_S = 60


class NotRunning(LocalgenError):
    """The server has the model, and it is not loaded."""


class Gone(LocalgenError):
    """The server has no model of that name (removed, or never one of its)."""


def stop(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Argument(metavar="MODEL", show_default=False,
                                                help="The model to unload, as `localgen ps` names it.")] = None,
    every: Annotated[bool, typer.Option("--all", help="Unload every model the server has loaded.")] = False,
    host: HostOption = "127.0.0.1",
    port: PortOption = 11435,
    api_key: ApiKeyOption = None,
    api_key_file: ApiKeyFileOption = None,
) -> None:
    """Unload a model from a running server now, freeing its memory. The next request that names it loads it
    again. Quiet when done; a model answering requests unloads once they end (a line says so)."""
    if model is not None and every:
        raise UsageError("give a model or --all, not both")
    if model is None and not every:
        raise UsageError("name the model to stop (localgen ps lists those loaded), or give --all")
    if model is not None and (not model or model != model.strip() or not model.isprintable()):
        raise UsageError(f"{mended(model[:100])!r} is not a model's name: it is empty, or has blanks around it or "
                         "control characters in it")
    server = server_of(ctx, host, port, api_key, api_key_file)
    if model is not None:
        _unload(server, model)
        return
    # one already unloading (a preset changed on disk: its old worker) frees its memory once its requests end
    names = dict.fromkeys(m["name"] for m in loaded(server) if not m.get("unloading"))
    failed: list[LocalgenError] = []
    for name in names:  # each in turn: one that fails leaves the others to be unloaded all the same
        try:
            _unload(server, name)
        except (NotRunning, Gone):  # it unloaded (idle, or for another model), or went, since /api/ps listed it
            continue
        except LocalgenError as e:
            failed.append(e)
    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise LocalgenError(failed[0].message + more, hint=failed[0].hint)


def _unload(server: Server, name: str) -> None:
    """Ask the server to unload `name` now, within UNLOAD_TIMEOUT_S in all; one answering requests is asked as
    Ollama's `keep_alive: 0`, so it unloads once they end (said on stderr)."""
    deadline = time.monotonic() + UNLOAD_TIMEOUT_S
    r = _asked(server, "/models/unload", {"model": name}, name, deadline)
    if r.status_code == 200:
        return
    if r.status_code == 400 and "not running" in said(r):  # llama-server's router's words
        raise NotRunning(f"{name} is not running at {server.url}", hint="localgen ps lists the models loaded")
    if r.status_code == 404 and "is not served here" in said(r):  # not a route missing (another kind of server)
        raise Gone(f"the server at {server.url} has no model {name!r}", hint="localgen ps lists the models loaded")
    if r.status_code == 409:  # answering requests (or being deleted or replaced: /api/generate says so too)
        later = _asked(server, "/api/generate", {"model": name, "keep_alive": 0}, name, deadline)
        if later.status_code == 200:  # unloaded now if its requests ended since the 409, else once they do
            typer.echo(f"{name} was answering requests: it unloads as soon as they have ended", err=True)
            return
        r = later
    raise LocalgenError(f"the server at {server.url} did not unload {name}: it answered {r.status_code}: {said(r)}")


def _asked(server: Server, path: str, body: dict[str, Any], name: str, deadline: float) -> Any:
    """The server's answer to POST `body` to `path`, whole by `deadline` (time.monotonic()'s): a server that sent a
    byte now and then held stop for ever (Server.ask bounds the whole answer)."""
    left = deadline - time.monotonic()
    try:
        if left <= 0:
            raise NoAnswer("out of time")
        return server.ask(path, body, timeout=left)
    except NoAnswer:
        raise LocalgenError(f"the server at {server.url} did not unload {name} within {UNLOAD_TIMEOUT_S:g} s",
                            hint="localgen ps shows whether it is still loaded") from None
