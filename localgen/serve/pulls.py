"""serve's /api/pull: the same resumable, verified download as `localgen pull` (Hugging Face, ollama: and oci:
names), its progress as Ollama's NDJSON lines, stopped where it is when the client leaves; a registry checked as
public unless --allow-private-urls."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from localgen.errors import LocalgenError, ModelFormatError, ModelNotFoundError, Overloaded, ServeError, UsageError
from localgen.serve.apierror import HTTPError, without_paths
from localgen.serve.state import ServeState

PROGRESS_EVERY_S = 0.25  # at most this often a progress line per file while its bytes come


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
        if text.endswith("; retrying"):  # FILE: REASON; retrying: the reason is the server's (for_client)
            text = f"{text.partition(': ')[0]}: the download failed; retrying"
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
        said = for_client(e)
        return HTTPError(502, said, "server_error", logged=f"/api/pull: {e.message}" if said != e.message else None)
    return HTTPError(500, e.message, "server_error")


def for_client(e: LocalgenError) -> str:
    """A pull's error as its client is told it: a connection's failure without the system's or TLS's reason
    (`cannot reach the registry HOST`, not `connection refused` or `[SSL: WRONG_VERSION_NUMBER]`, which would
    tell a client which ports answer where the registry's name leads); the server's log has the rest."""
    from localgen.models.download import DownloadError
    from localgen.models.hub import HubUnreachableError
    from localgen.models.registry import RegistryUnreachableError

    text = e.message
    unreachable = isinstance(e, (HubUnreachableError, RegistryUnreachableError)) and text.startswith("cannot reach ")
    retried = isinstance(e, DownloadError) and " tries: " in text  # downloading F failed after N tries: REASON
    if unreachable or retried:
        text = text.partition(": ")[0]
    return without_paths(text)


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
    from localgen.models import hub, oci, ocipull, ollamastore, registry, resolve

    out: asyncio.Queue[Any] = asyncio.Queue()
    stop = threading.Event()
    lines = Lines(asyncio.get_running_loop(), out, stop)

    def work() -> None:
        try:
            # strict: a registry's every connection checked where it lands, not only its name before (DNS
            # rebinding); the Hub (or the HF_ENDPOINT mirror) is the server's own choice, not a client's
            if isinstance(target, ollamastore.OllamaName | oci.OciName):
                with hub.public_peers_only() if strict else contextlib.nullcontext():
                    if isinstance(target, ollamastore.OllamaName):
                        registry.pull(target, lines, True if strict else None)
                    else:
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


async def pull(state: ServeState, name: str, stream: bool, log: Callable[[str], None] | None = None) -> Response:
    """/api/pull of `name`; `log`: the server's log, for what a client is not told of a failure (for_client)."""
    from localgen.models import hfcache, ollamastore, resolve

    try:  # a name from a client: never a file here, and no file is looked for (names.parse's local=False)
        if resolve.embedded_model(name, local=False) is not None:  # it ships inside a Python package: here
            return answer([{"status": "success"}], stream)
        from_registry = _from_registry(name)
        if from_registry is not None and not state.allow_private_urls:
            await asyncio.to_thread(_public_registry, getattr(from_registry, "api_host", from_registry.host))
        if isinstance(from_registry, ollamastore.OllamaName) and ollamastore.in_ollamas_store(from_registry):
            return answer([{"status": "success"}], stream)  # Ollama's own store has it (a pulled copy: anew)
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
                    said = for_client(item)
                    if said != item.message and log is not None:
                        log(f"/api/pull: {item.message}")
                    yield (json.dumps({"error": said}) + "\n").encode()
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
        addresses(hostname, int(port) if port.isascii() and port.isdigit() else 443, private=False)
    except FetchError as e:
        if e.message.startswith("refused: "):
            raise HTTPError(403, f"the registry {host} is {e.message.removeprefix('refused: ')}: a client may "
                                 "not make this server pull from it (serve --allow-private-urls allows it)",
                            "permission_error", "model") from None


def pulled_here(ref: Any) -> bool:
    """Whether an Ollama model's manifest is one `localgen pull` (or /api/pull) wrote, not Ollama's own."""
    from localgen.models import ollamastore

    return ollamastore.is_pulled(ollamastore.manifest(ollamastore.parse_name(ref.name.removeprefix(
        ollamastore.PREFIX))))


def answer(lines: list[dict[str, Any]], stream: bool) -> Response:
    if not stream:
        return JSONResponse(lines[-1])
    return Response("".join(json.dumps(x) + "\n" for x in lines), media_type="application/x-ndjson")
