"""Models pulled from Ollama's library (registry.ollama.ai, or the registry a name's host part names) without
Ollama: GET /v2/NAMESPACE/MODEL/manifests/TAG (a Docker v2 manifest), then each layer's blob, resumable and
checked against its digest and size (models/download.py's transfer), into localgen's own copy of Ollama's layout
(ollamastore.pulled_root(): manifests/HOST/NAMESPACE/MODEL/TAG and blobs/sha256-HEX). ollamastore reads it after
Ollama's own store, which nothing here writes into. Blobs two models share are kept once; remove() takes a
model's manifest and the blobs no other pulled manifest uses."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localgen import paths, proxies
from localgen.errors import LocalgenError, ModelNotFoundError
from localgen.models import ollamastore
from localgen.models.ollamastore import DIGEST, MEDIA, OllamaName

if TYPE_CHECKING:  # the transfer code (urllib, http.client) loads only when a pull happens
    from localgen.models.download import Progress

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"  # what Ollama's pull asks for
MAX_MANIFEST = 1 << 20  # Ollama's are a few hundred bytes
MAX_SMALL = 1 << 20  # a layer that is not weights (params, system, template, license, ...), and the config
MAX_WEIGHTS = 2 << 40  # a model, projector or adapter layer: more than any GGUF published
WEIGHTS = ("model", "projector", "adapter")
RETRIES = 3
MAX_LAYERS = 256  # layers of a manifest (Ollama's: a model, a projector, adapters, a few settings)
MAX_RETRY_AFTER = 5  # seconds: the most a manifest's retry waits for a registry's Retry-After
UNFINISHED = ".unfinished"  # the manifests of pulls that have not finished (or gave up), in manifests/'s layout
TIMEOUT_S = 30


class RegistryUnreachableError(LocalgenError):
    """No answer from a registry."""


@dataclass(frozen=True)
class Blob:
    """A blob a manifest names: its digest (sha256:HEX, lower case), size and what it is."""

    digest: str
    size: int
    media: str

    @property
    def filename(self) -> str:
        """Its file in blobs/, as Ollama names it."""
        return self.digest.replace(":", "-", 1)


def base_url(host: str) -> str:
    """https://HOST, or http://HOST for a loopback host (localhost, 127.0.0.0/8, as Docker treats a local registry
    as insecure): a registry anywhere else is never spoken to in the clear."""
    hostname = host.rpartition(":")[0] if ":" in host else host
    try:
        loopback = hostname.lower() == "localhost" or ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        loopback = False
    return f"{'http' if loopback else 'https'}://{host}"


def redirect_guard(host: str, public: bool | None = None) -> Callable[[str, str], None]:
    """What a pull from the registry `host` asks about each redirect (hub.open_url's `redirect`) and each token
    realm: one to a loopback, private, link-local or metadata address is refused when the registry is public (a
    registry on the internet must not make localgen fetch from this machine or its LAN; one on the LAN may send it
    anywhere); a scheme other than http(s), and https to http, are always refused. `public`: whether the registry
    counts as public (serve, which refused a private registry for a client, says True); else the registry is public
    unless every address its host resolves to is private (a name that does not resolve counts as public)."""
    from urllib.parse import urlsplit

    from localgen.fetch import FetchError, refusal
    from localgen.fetch import resolve as lookup

    known: dict[str, bool] = {} if public is None else {"public": public}

    def is_public() -> bool:
        if "public" not in known:
            hostname = urlsplit("//" + host).hostname or host
            try:
                found = lookup(hostname, 443)
            except FetchError:
                found = []
            known["public"] = not found or not all(refusal(ip) for ip in found)
        return known["public"]

    def check(old: str, new: str) -> None:
        target = urlsplit(new)
        scheme = target.scheme.lower()
        if scheme not in ("http", "https") or not target.hostname:
            raise LocalgenError(f"{host} sent localgen to {new[:100]!r}, which is not an http(s) URL")
        if scheme == "http" and urlsplit(old).scheme.lower() == "https":
            raise LocalgenError(f"{host} sent localgen from https to {target.hostname} over http: refused, since "
                                "a download or a token must not leave https")
        if not is_public():
            return
        try:
            found = lookup(target.hostname, target.port or (443 if scheme == "https" else 80))
        except FetchError:
            return  # a name that does not resolve: the download says so
        why = next((r for r in map(refusal, found) if r), None)
        if why is not None:
            raise LocalgenError(f"{host} sent localgen to {target.hostname}, {why}: a public registry may not "
                                "send localgen to this machine or its network; nothing was fetched from there")

    return check


def _url(name: OllamaName, what: str) -> str:
    return f"{base_url(name.host)}/v2/{name.namespace}/{name.model}/{what}"


def pull(name: OllamaName, progress: Progress, public: bool | None = None) -> Path:
    """Download a model's manifest and every blob it names (those already here are hashed once and kept), and
    store the manifest last; returns its path. `public`: as redirect_guard's.
    Nothing is downloaded for a manifest without a GGUF model layer,
    with a layer over its size limit, or for which the disk has no room."""
    from localgen.models import download
    from localgen.models.quant import RemoteFile

    guard = redirect_guard(name.host, public)
    raw = fetch_manifest(name, guard)
    blobs = read_blobs(name, raw)
    root = ollamastore.pulled_root()
    folder = root / "blobs"
    missing = {b.digest: b for b in blobs if not _whole(folder / b.filename, b.size)}
    need = sum(b.size - _size(download.partial_path(folder / b.filename)) for b in missing.values())
    download.check_space(folder, max(need, 0), name.display)
    source = download.Source(name.host, f"its digest in {name.display}'s manifest")  # a refusal: refused_mid_pull
    unfinished = _unfinished_path(root, name)  # until the manifest is written: what rm of a pull that gave up takes
    paths.make_dirs(unfinished.parent)
    _write(unfinished, raw)
    unique = {b.digest: b for b in blobs}
    with contextlib.ExitStack() as held:
        # Each blob's lock from before its fetch until the manifest names it, so that no rm or other pull's prune
        # deletes a verified blob before then; taken in one order (by digest), so two pulls never wait in a circle.
        for digest in sorted(unique):
            held.enter_context(download.locked(_lock(root, unique[digest].filename),
                                               f"{name.ollama} {unique[digest].media}", progress))
        for b in unique.values():
            label = f"{name.ollama} {b.media}"
            shown = progress if b.media in WEIGHTS else download.Quiet()  # a few bytes of settings: no bar of its own
            try:
                download.fetch_held(_url(name, f"blobs/{b.digest}"), lambda: {}, folder / b.filename,
                                    RemoteFile(label, b.size, b.digest.split(":")[1]), shown, source, guard)
            except download.RefusedError as e:
                raise refused_mid_pull(name.host, name.display, b, b.media, e.code, folder, blobs, False) from None
        path = _manifest_path(root, name)
        old = _digests(path)  # an earlier pull's: the blobs of a tag that has moved since go once nothing names them
        paths.make_dirs(path.parent)
        _write(path, raw)  # the manifest last: a model is listed only once every blob is whole
        unfinished.unlink(missing_ok=True)
        _prune(unfinished.parent, root / UNFINISHED)
    _sweep(root, old - {b.filename for b in blobs}, progress)  # its locks released: the sweep takes one at a time
    return path


def refused_mid_pull(host: str, display: str, blob: Blob, kind: str, code: int, folder: Path, blobs: list[Blob],
                     token: bool) -> LocalgenError:
    """A registry that sent a model's manifest, then refused one of its blobs (401, 403: a token revoked or run
    out, a CDN's signed link gone stale), in one line: what was refused, and that what arrived is kept for the same
    command to resume (a blob's partial file, the blobs already whole, the unfinished pull's manifest)."""
    from localgen.models import download
    from localgen.units import format_bytes

    kept = kept_bytes(folder, blobs)
    what = "localgen's token" if token else "the download"
    return download.DownloadError(
        f"{host} refused {what} mid-pull: {code} for the {kind} blob {blob.digest} of {display}, after it sent "
        f"the manifest; the {format_bytes(kept)} downloaded so far are kept",
        hint="the same command resumes the pull where it stopped")


def kept_bytes(folder: Path, blobs: list[Blob]) -> int:
    """The bytes of a pull's blobs already here: those whole, and the partial files a resume goes on from."""
    from localgen.models import download

    return sum(_size(folder / b.filename) + _size(download.partial_path(folder / b.filename))
               for b in {b.digest: b for b in blobs}.values())


def _lock(root: Path, blob: str) -> Path:
    return root / ".locks" / f"{blob}.lock"


def _unfinished_path(root: Path, name: OllamaName) -> Path:
    """Where a pull keeps the manifest it is downloading the blobs of, until it writes it to manifests/."""
    return root / UNFINISHED / Path(*name.parts())


def _write(path: Path, raw: bytes) -> None:
    """Write `path` whole or not at all, through a temporary file of this call's own (serve's /api/pull pulls in
    threads of one process)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            if hasattr(os, "fchmod"):  # as the blobs are (mkstemp's file is 0600); Windows has os.fchmod from 3.13
                os.fchmod(out.fileno(), 0o644)
            else:
                os.chmod(tmp, 0o644)
            out.write(raw)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    paths.fsync_dir(path.parent)


def _whole(blob: Path, size: int) -> bool:
    return _size(blob) == size


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _manifest_path(root: Path, name: OllamaName) -> Path:
    """Where the name's manifest is (an earlier pull's, as its parts were spelt then), else where it goes."""
    found = ollamastore.find_manifest(root, name)
    return found if found is not None else root / "manifests" / Path(*name.parts())


def fetch_manifest(name: OllamaName, guard: Callable[[str, str], None] | None = None) -> bytes:
    """The name's manifest as the registry sends it (its bytes are kept as they are, so that its SHA-256 is the
    digest Ollama lists); a one-line error for an unknown name or tag, a refusal, a registry that does not answer,
    or a manifest over MAX_MANIFEST (refused by its Content-Length before its body is read)."""
    import http.client
    import urllib.error

    from localgen.models import hub

    url = _url(name, f"manifests/{name.tag}")
    for attempt in range(RETRIES):
        try:
            with hub.open_url(url, {"Accept": MANIFEST_TYPE}, TIMEOUT_S,
                               guard or redirect_guard(name.host)) as resp:
                length = resp.headers.get("Content-Length")
                if length is not None and length.isascii() and length.strip().isdigit() and int(length) > MAX_MANIFEST:
                    raise _too_big(name, f"{int(length):,}")
                raw: bytes = resp.read(MAX_MANIFEST + 1)
                if len(raw) > MAX_MANIFEST:
                    raise _too_big(name, f"over {MAX_MANIFEST:,}")
                return raw
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise ModelNotFoundError(f"{name.host} has no model {name.namespace}/{name.model} with the tag "
                                         f"{name.tag} (404)", hint=_library_hint(name)) from None
            if e.code in (401, 403):
                raise LocalgenError(f"{name.host} refused the manifest of {name.ollama} ({e.code}): the model is "
                                    "private or needs a login, which localgen cannot give") from None
            if (e.code < 500 and e.code != 429) or attempt + 1 == RETRIES:
                raise LocalgenError(f"{name.host} answered {e.code} for the manifest of {name.ollama}") from None
            wait = hub.retry_after(e.headers.get("Retry-After") if e.headers is not None else None, MAX_RETRY_AFTER)
            if wait is not None:  # a registry over its rate (429) or busy (503) says when to come back
                time.sleep(wait)
                continue
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            if attempt + 1 == RETRIES:
                reason = getattr(e, "reason", None)  # urllib's URLError: the socket's error inside it
                raise RegistryUnreachableError(
                    f"cannot reach the registry {name.host}: "
                    f"{proxies.connection_reason(reason if isinstance(reason, BaseException) else e)}",
                    hint="`localgen list` shows the models already here, which --offline uses without a network",
                ) from None
        time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")  # the loop returns or raises


def _too_big(name: OllamaName, size: str) -> LocalgenError:
    return LocalgenError(f"the manifest {name.host} sent for {name.ollama} is {size} bytes; a manifest over "
                         f"{MAX_MANIFEST:,} bytes is refused")


def _library_hint(name: OllamaName) -> str | None:
    """Where Ollama's library lists a model's tags (for its own registry only)."""
    if name.host.lower() != ollamastore.DEFAULT_HOST:
        return None
    page = f"library/{name.model}" if name.namespace.lower() == ollamastore.DEFAULT_NAMESPACE else (
        f"{name.namespace}/{name.model}")
    return f"https://ollama.com/{page}/tags lists its tags"


def read_blobs(name: OllamaName, raw: bytes) -> list[Blob]:
    """The blobs a manifest names, config first, each checked (digest, size, its limit); a LocalgenError for a
    manifest that is not one or has no GGUF model layer."""
    def bad(why: str) -> LocalgenError:
        return LocalgenError(f"the manifest {name.host} sent for {name.ollama} is not one localgen can use: {why}")

    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise bad("it is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
        raise bad("it has no list of layers")
    if len(doc["layers"]) > MAX_LAYERS:  # a lock (an open file) a blob while the pull lasts, a request each
        raise bad(f"it has {len(doc['layers']):,} layers, over the {MAX_LAYERS:,} localgen takes")
    entries = ([("config", doc["config"])] if isinstance(doc.get("config"), dict) else []) + [
        ("layer", x) for x in doc["layers"]]
    blobs = []
    for kind, raw_layer in entries:
        if not isinstance(raw_layer, dict) or not isinstance(raw_layer.get("mediaType"), str):
            raise bad(f"a {kind} without a mediaType")
        digest, size = raw_layer.get("digest"), raw_layer.get("size")
        m = DIGEST.fullmatch(digest) if isinstance(digest, str) and digest.startswith("sha256:") else None
        if m is None:
            raise bad(f"a {kind}'s digest is not sha256:HEX: {str(digest)[:80]!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise bad(f"a {kind}'s size is not a byte count: {str(size)[:40]!r}")
        media = "config" if kind == "config" else raw_layer["mediaType"].removeprefix(MEDIA)
        blobs.append(Blob(f"sha256:{m.group(1).lower()}", size, media))
    if not any(b.media == "model" for b in blobs):  # before the limits: an MLX tag's big tensor layers say this
        raise LocalgenError(f"{name.display} has no GGUF model layer in its manifest: localgen cannot run it "
                            "(nothing was downloaded)")
    for b in blobs:
        limit = MAX_WEIGHTS if b.media in WEIGHTS else MAX_SMALL
        if b.size > limit:
            raise bad(f"its {b.media} layer is {b.size:,} bytes, over the {limit:,} localgen takes")
    return blobs


def _digests(path: Path) -> set[str]:
    """The blob files a stored manifest names (a damaged one: none)."""
    try:
        doc = json.loads(path.read_bytes()[:MAX_MANIFEST + 1])
    except (OSError, ValueError, UnicodeDecodeError):
        return set()
    if not isinstance(doc, dict):
        return set()
    layers = doc.get("layers")
    found = set()
    for x in [doc.get("config"), *(layers if isinstance(layers, list) else [])]:
        m = DIGEST.fullmatch(x.get("digest", "")) if isinstance(x, dict) and isinstance(x.get("digest"), str) else None
        if m is not None:
            found.add(f"sha256-{m.group(1).lower()}")
    return found


def pulled(name: OllamaName) -> Path | None:
    """The manifest of a model localgen pulled, or None."""
    return ollamastore.find_manifest(ollamastore.pulled_root(), name)


def unfinished(name: OllamaName) -> int | None:
    """For a pull of `name` that has not finished (or gave up): the bytes on disk of the blobs its manifest names,
    whole or partial; None when there is none."""
    from localgen.models import download

    root = ollamastore.pulled_root()
    path = _unfinished_path(root, name)
    if not path.is_file():
        return None
    return sum(_size(f) + _size(download.partial_path(f)) for f in (root / "blobs" / b for b in _digests(path)))


def remove(name: OllamaName, progress: Progress | None = None) -> tuple[int, int]:
    """Remove a pulled model: its manifest (and that of a pull of it that gave up, whose partial blobs go too),
    and the blobs no other pulled manifest or unfinished pull names (each under its lock,
    waiting for a pull that holds it: `progress` says so). Returns the bytes freed and the number of blobs kept for
    other models; a ModelNotFoundError when localgen pulled no such model."""
    root = ollamastore.pulled_root()
    path, part = pulled(name), _unfinished_path(root, name)
    if path is None and not part.is_file():
        raise ModelNotFoundError(f"localgen pulled no model {name.ollama}", hint="localgen list shows what is here")
    mine: set[str] = set()
    for done, top in ((path, root / "manifests"), (part if part.is_file() else None, root / UNFINISHED)):
        if done is not None:
            names = _digests(done)
            if not names:  # a damaged manifest names none it can be trusted for: every blob nothing names goes
                names = {f.name.removesuffix(".incomplete") for f in (root / "blobs").glob("sha256-*")}
            mine |= names
            done.unlink()
            _prune(done.parent, top)
    return _sweep(root, mine, progress)


def _sweep(root: Path, candidates: set[str], progress: Progress | None = None,
           used: Callable[[Path], set[str]] | None = None) -> tuple[int, int]:
    """Delete the blob files in `candidates` (and their .incomplete partials) that no pulled manifest or unfinished
    pull names (as Ollama's pull and rm prune), each under its lock, and looking at the manifests once it holds it:
    a pull holds its blobs' locks until its manifest names them. The lock files stay (another process may hold
    one). `used`: what names blobs in the store (Ollama's layout's manifests, or models/ocipull.py's). Returns the
    bytes freed and the number kept because a manifest names them."""
    from localgen.models import download

    freed, kept = 0, 0
    for blob in sorted(candidates):
        with download.locked(_lock(root, blob), blob, progress or download.Quiet()):
            if blob in (used or _used)(root):
                kept += 1
                continue
            for file in (root / "blobs" / blob, download.partial_path(root / "blobs" / blob)):
                freed += _size(file)
                file.unlink(missing_ok=True)
    return freed, kept


def _used(root: Path) -> set[str]:
    """The blob files the pulled manifests name, and those of the pulls that have not finished."""
    used: set[str] = set()
    for top in (root / "manifests", root / UNFINISHED):
        for other in top.glob("*/*/*/*") if top.is_dir() else ():
            if other.is_file():
                used |= _digests(other)
    return used


def _prune(folder: Path, top: Path) -> None:
    """Remove empty folders from `folder` up to (not including) `top`."""
    while folder != top and folder.is_relative_to(top):
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
