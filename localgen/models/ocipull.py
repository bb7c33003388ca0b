"""`localgen pull oci:NAME`: a model from an OCI registry as Docker Model Runner packages it (models/oci.py names
the layout and the media types). GET /v2/REPO/manifests/REF with Accept for an OCI image manifest, a Docker v2
manifest and an image index (an index's entry whose artifactType is Docker's model config is taken); a 401 with a
`WWW-Authenticate: Bearer realm=...,service=...,scope=...` challenge is answered with an anonymous token from the
realm (the distribution spec's token flow), sent to the registry's host alone (a blob's redirect to a CDN goes
without it). Then each layer localgen uses (GGUF parts, projector, chat template, license, config), resumable and
checked against its digest (models/download.py), into blobs/; the manifest last. A redirect or realm that takes a
public registry's pull to this machine or its LAN is refused (registry.redirect_guard)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localgen import paths, proxies
from localgen.errors import LocalgenError, ModelNotFoundError
from localgen.models import oci, registry
from localgen.models.oci import OciName

if TYPE_CHECKING:
    from localgen.models.download import Progress

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT = ", ".join((OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST))
MAX_TOKEN = 1 << 16  # a token answer: Docker Hub's are a few kilobytes
TOKEN_TTL = 60  # seconds a token lasts when its answer gives no expires_in (the token spec's default)
UNFINISHED = ".unfinished"
KINDS = {oci.GGUF: "model", oci.MMPROJ: "projector", oci.TEMPLATE: "chat template", oci.LICENSE: "license"}
_PARAM = re.compile(r'([A-Za-z_]+)="([^"]*)"')


class TokenRefused(LocalgenError):
    """The token service refused a new token after an earlier one of the same pull was taken (`code`: 401, 403)."""

    def __init__(self, message: str, host: str, code: int) -> None:
        super().__init__(message)
        self.host, self.code = host, code


class Session:
    """One pull's conversation with a registry: its base URL, the token its realm gave (and when it runs out)."""

    def __init__(self, name: OciName, public: bool | None = None) -> None:
        self.name = name
        self.base = registry.base_url(name.api_host)
        self.guard = registry.redirect_guard(name.api_host, public)
        self.challenge: dict[str, str] | None = None
        self.token: str | None = None
        self.expires = 0.0

    def url(self, what: str) -> str:
        return f"{self.base}/v2/{self.name.repo}/{what}"

    def headers(self) -> dict[str, str]:
        """Authorization for the registry's host (a token fetched again once it has run out), where it asked."""
        if self.challenge is not None and time.monotonic() >= self.expires:
            self._fetch_token()
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def renew(self) -> None:
        """A new token now (a blob refused the one held: revoked, or run out early); TokenRefused when the token
        service refuses it."""
        if self.challenge is not None:
            self._fetch_token()

    def answer(self, header: str | None) -> None:
        """Read a 401's challenge and get a token for it; a LocalgenError for one localgen cannot answer."""
        params = dict(_PARAM.findall(header or "")) if (header or "").strip().lower().startswith("bearer") else {}
        if "realm" not in params:
            raise LocalgenError(f"{self.name.host} refused the manifest of {self.name.short} (401) without a bearer "
                                "token challenge: the model is private or needs a login, which localgen cannot give")
        params.setdefault("scope", f"repository:{self.name.repo}:pull")
        self.challenge = params
        self._fetch_token()

    def _fetch_token(self) -> None:
        import http.client
        import urllib.error
        from urllib.parse import urlencode, urlsplit

        from localgen.models import hub

        assert self.challenge is not None
        realm = self.challenge["realm"]
        parts = urlsplit(realm)
        host = parts.hostname or ""
        if parts.scheme.lower() not in ("http", "https") or not host or (
                parts.scheme.lower() == "http" and not registry.base_url(host).startswith("http:")):
            raise LocalgenError(f"{self.name.host} names the token realm {realm[:100]!r}: localgen gets tokens over "
                                "https only (http for a loopback host)")
        self.guard(self.base, realm)  # a public registry's realm on this machine or its LAN is refused
        query = urlencode({k: v for k, v in self.challenge.items() if k in ("service", "scope")})
        url = realm + ("&" if parts.query else "?") + query
        try:
            with hub.open_url(url, {"Accept": "application/json"}, registry.TIMEOUT_S, self.guard) as resp:
                raw: bytes = resp.read(MAX_TOKEN + 1)
        except urllib.error.HTTPError as e:
            if self.token is not None and e.code in (401, 403):  # it gave this pull a token before: no login issue
                raise TokenRefused(f"{self.name.host}'s token service {host} refused a new token mid-pull "
                                   f"({e.code}) for {self.name.display}", host, e.code) from None
            raise LocalgenError(f"the token service {host} answered {e.code} for {self.name.short}: the model is "
                                "private or needs a login, which localgen cannot give") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", None)
            raise registry.RegistryUnreachableError(
                f"cannot reach the token service {host}: "
                f"{proxies.connection_reason(reason if isinstance(reason, BaseException) else e)}") from None
        try:
            doc = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_TOKEN else None
        except (UnicodeDecodeError, ValueError):
            doc = None
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token or len(raw) > MAX_TOKEN or any(c in token for c in "\r\n"):
            raise LocalgenError(f"the token service {host} sent no token localgen can use for {self.name.short}")
        ttl = doc.get("expires_in") if isinstance(doc, dict) else None
        ttl = ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0 else TOKEN_TTL
        self.token, self.expires = token, time.monotonic() + max(ttl - 10, 5)

    def get(self, what: str, label: str) -> tuple[bytes, str]:
        """A manifest's bytes (at most registry.MAX_MANIFEST) and Content-Type; a 401 is answered with a token
        once; one-line errors for a missing one (404), a refusal, a registry that does not answer."""
        import http.client
        import urllib.error

        from localgen.models import hub

        answered = False
        for attempt in range(registry.RETRIES):
            try:
                with hub.open_url(self.url(what), {**self.headers(), "Accept": ACCEPT}, registry.TIMEOUT_S,
                                  self.guard) as resp:
                    length = resp.headers.get("Content-Length") or ""
                    if length.isascii() and length.strip().isdigit() and int(length) > registry.MAX_MANIFEST:
                        raise self._too_big(f"{int(length):,}")
                    raw: bytes = resp.read(registry.MAX_MANIFEST + 1)
                    if len(raw) > registry.MAX_MANIFEST:
                        raise self._too_big(f"over {registry.MAX_MANIFEST:,}")
                    return raw, (resp.headers.get("Content-Type") or "").split(";")[0].strip()
            except urllib.error.HTTPError as e:
                if e.code == 401 and not answered:
                    answered = True
                    self.answer(e.headers.get("WWW-Authenticate") if e.headers is not None else None)
                    continue
                if e.code == 404:
                    raise ModelNotFoundError(f"{self.name.host} has no model {self.name.repo} with the "
                                             f"{label} (404)") from None
                if e.code in (401, 403):
                    raise LocalgenError(f"{self.name.host} refused the manifest of {self.name.short} ({e.code}): the "
                                        "model is private or needs a login, which localgen cannot give") from None
                if (e.code < 500 and e.code != 429) or attempt + 1 == registry.RETRIES:
                    raise LocalgenError(f"{self.name.host} answered {e.code} for the manifest of "
                                        f"{self.name.short}") from None
                wait = hub.retry_after(e.headers.get("Retry-After") if e.headers is not None else None,
                                       registry.MAX_RETRY_AFTER)
                if wait is not None:
                    time.sleep(wait)
                    continue
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                if attempt + 1 == registry.RETRIES:
                    reason = getattr(e, "reason", None)
                    raise registry.RegistryUnreachableError(
                        f"cannot reach the registry {self.name.host}: "
                        f"{proxies.connection_reason(reason if isinstance(reason, BaseException) else e)}",
                        hint="`localgen list` shows the models already here, which --offline uses without a network",
                    ) from None
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def _too_big(self, size: str) -> LocalgenError:
        return LocalgenError(f"the manifest {self.name.host} sent for {self.name.short} is {size} bytes; a manifest "
                             f"over {registry.MAX_MANIFEST:,} bytes is refused")


def _bad(name: OciName, why: str) -> LocalgenError:
    return LocalgenError(f"the manifest {name.host} sent for {name.short} is not one localgen can use: {why}")


def _json(name: OciName, raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _bad(name, "it is not JSON") from None
    if not isinstance(doc, dict):
        raise _bad(name, "it is not a JSON object")
    return doc


def fetch_manifest(session: Session, name: OciName) -> bytes:
    """The image manifest of `name` as the registry sent it (through an image index's model entry), its bytes
    checked against the digest that names it (the name's, or the index entry's)."""
    label = f"digest {name.digest}" if name.digest else f"tag {name.tag}"
    raw, media = session.get(f"manifests/{name.reference}", label)
    if name.digest and hashlib.sha256(raw).hexdigest() != name.digest.split(":", 1)[1]:
        raise _bad(name, f"its bytes are not the digest {name.digest}")
    doc = _json(name, raw)
    media = str(doc["mediaType"]) if isinstance(doc.get("mediaType"), str) else media
    if media in (OCI_INDEX, DOCKER_LIST) or (isinstance(doc.get("manifests"), list) and "layers" not in doc):
        entry = _model_entry(name, doc)
        raw, _ = session.get(f"manifests/{entry}", f"digest {entry}")
        if hashlib.sha256(raw).hexdigest() != entry.split(":", 1)[1]:
            raise _bad(name, f"the manifest its index names is not the digest {entry}")
    return raw


def _model_entry(name: OciName, doc: dict[str, Any]) -> str:
    """The digest of an image index's model: its entry whose artifactType is Docker's model config, or its one
    entry; a LocalgenError for an index with neither (an image for several platforms, say)."""
    entries = [x for x in doc.get("manifests") or [] if isinstance(x, dict)
               and isinstance(x.get("digest"), str) and oci.DIGEST.fullmatch(x["digest"])]
    models = [x for x in entries if str(x.get("artifactType", "")).startswith(oci.CONFIG_PREFIX)]
    if not models and len(entries) == 1 and entries[0].get("mediaType") in (OCI_MANIFEST, DOCKER_MANIFEST):
        models = entries
    if not models:
        raise LocalgenError(f"{name.display} is an image index with no model entry (none whose artifactType is "
                            f"{oci.CONFIG_PREFIX}...): localgen cannot run it (nothing was downloaded)")
    return str(models[0]["digest"])


def read_blobs(name: OciName, raw: bytes) -> list[registry.Blob]:
    """The blobs of an image manifest that localgen uses (config first, then its GGUF parts in order, projector,
    chat template, license), each checked (digest, size, its limit); a LocalgenError for a manifest that is not
    one or has no GGUF layer."""
    doc = _json(name, raw)
    if not isinstance(doc.get("layers"), list):
        raise _bad(name, "it has no list of layers")
    if len(doc["layers"]) > registry.MAX_LAYERS:  # a lock (an open file) a blob while the pull lasts, a request each
        raise _bad(name, f"it has {len(doc['layers']):,} layers, over the {registry.MAX_LAYERS:,} localgen takes")
    entries = ([("config", doc["config"])] if isinstance(doc.get("config"), dict) else []) + [
        ("layer", x) for x in doc["layers"]]
    blobs: list[registry.Blob] = []
    medias = []
    for kind, x in entries:
        if not isinstance(x, dict) or not isinstance(x.get("mediaType"), str):
            raise _bad(name, f"a {kind} without a mediaType")
        medias.append(x["mediaType"])
        if kind == "layer" and x["mediaType"] not in oci.USED:
            continue  # safetensors, archives: not what localgen runs, not downloaded
        digest, size = x.get("digest"), x.get("size")
        m = oci.DIGEST.fullmatch(digest) if isinstance(digest, str) else None
        if m is None:
            raise _bad(name, f"a {kind}'s digest is not sha256:HEX: {str(digest)[:80]!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise _bad(name, f"a {kind}'s size is not a byte count: {str(size)[:40]!r}")
        blobs.append(registry.Blob(m.group(0), size, "config" if kind == "config" else KINDS[x["mediaType"]]))
    if not any(b.media == "model" for b in blobs):
        what = sorted({x.rsplit("/", 1)[-1] for x in medias[1:]}) or ["no layers"]
        raise LocalgenError(f"{name.display} has no GGUF layer ({oci.GGUF}) in its manifest, only {', '.join(what)}: "
                            "localgen cannot run it (nothing was downloaded)")
    for b in blobs:
        limit = registry.MAX_WEIGHTS if b.media in ("model", "projector") else registry.MAX_SMALL
        if b.size > limit:
            raise _bad(name, f"its {b.media} layer is {b.size:,} bytes, over the {limit:,} localgen takes")
    return blobs


def _unfinished_path(root: Path, name: OciName) -> Path:
    return root / UNFINISHED / Path(*name.parts())


def _used(root: Path) -> set[str]:
    """The blob files the pulled manifests name, and those of the pulls that have not finished."""
    used: set[str] = set()
    for top in (root / "manifests", root / UNFINISHED):
        for path in top.rglob("@*") if top.is_dir() else ():
            if path.is_file():
                used |= registry._digests(path)
    return used


def pull(name: OciName, progress: Progress, public: bool | None = None) -> Path:
    """Download a model's manifest and the blobs localgen uses (those already here are hashed once and kept), and
    store the manifest last; returns its path. `public`: as registry.redirect_guard's.
    Nothing is downloaded for a manifest without a GGUF layer, with a
    layer over its size limit, or for which the disk has no room."""
    from localgen.models import download
    from localgen.models.quant import RemoteFile

    session = Session(name, public)
    raw = fetch_manifest(session, name)
    blobs = read_blobs(name, raw)
    root = oci.pulled_root()
    folder = root / "blobs"
    missing = {b.digest: b for b in blobs if registry._size(folder / b.filename) != b.size}
    need = sum(b.size - registry._size(download.partial_path(folder / b.filename)) for b in missing.values())
    download.check_space(folder, max(need, 0), name.display)
    source = download.Source(name.host, f"its digest in {name.display}'s manifest")  # a refusal: refused_mid_pull
    unfinished = _unfinished_path(root, name)
    paths.make_dirs(unfinished.parent)
    registry._write(unfinished, raw)
    unique = {b.digest: b for b in blobs}
    parts = sum(b.media == "model" for b in blobs)
    with contextlib.ExitStack() as held:
        for digest in sorted(unique):  # each blob's lock until the manifest names it (as registry.pull)
            held.enter_context(download.locked(registry._lock(root, unique[digest].filename),
                                               f"{name.short} {unique[digest].media}", progress))
        index = 0
        renewed = False
        for b in unique.values():
            index += b.media == "model"
            kind = b.media + (f" {index}/{parts}" if b.media == "model" and parts > 1 else "")
            label = f"{name.short} {kind}"
            shown = progress if b.media in ("model", "projector") else download.Quiet()
            while True:
                try:
                    download.fetch_held(session.url(f"blobs/{b.digest}"), session.headers, folder / b.filename,
                                        RemoteFile(label, b.size, b.digest.split(":")[1]), shown, source,
                                        session.guard)
                    break
                except download.RefusedError as e:
                    if e.code != 401 or session.token is None or renewed:
                        raise registry.refused_mid_pull(name.host, name.display, b, kind, e.code, folder, blobs,
                                                        session.token is not None) from None
                    renewed = True  # a token refused: a new one, once a pull (a second refusal is final)
                    try:
                        session.renew()
                    except TokenRefused as t:
                        raise _token_refused(t, name, b, kind, folder, blobs) from None
                except TokenRefused as t:  # the one fetched as the last ran out
                    raise _token_refused(t, name, b, kind, folder, blobs) from None
        # a split's links before its manifest: list and show read the store as it is, and write nothing in it
        oci.split_links(root, [folder / b.filename for b in blobs if b.media == "model"])
        path = oci.manifest_path(root, name)
        old = registry._digests(path)
        paths.make_dirs(path.parent)
        registry._write(path, raw)  # the manifest last: a model is listed only once every blob is whole
        unfinished.unlink(missing_ok=True)
        registry._prune(unfinished.parent, root / UNFINISHED)
    registry._sweep(root, old - {b.filename for b in blobs}, progress, _used)
    oci.prune_splits(root)
    return path


def _token_refused(e: TokenRefused, name: OciName, blob: registry.Blob, kind: str, folder: Path,
                   blobs: list[registry.Blob]) -> LocalgenError:
    """The token service that gave this pull a token refused a new one (for the `kind` blob `blob`), in one line:
    what was refused, and that what arrived is kept for the same command to resume."""
    from localgen.models import download
    from localgen.units import format_bytes

    return download.DownloadError(
        f"{e.message}, wanted for the {kind} blob {blob.digest} after the first token brought the manifest; the "
        f"{format_bytes(registry.kept_bytes(folder, blobs))} downloaded so far are kept",
        hint="the same command resumes the pull where it stopped")


def pulled(name: OciName) -> Path | None:
    path = oci.manifest_path(oci.pulled_root(), name)
    return path if path.is_file() else None


def remove(name: OciName, progress: Progress | None = None) -> tuple[int, int]:
    """Remove a pulled model: its manifest (and that of a pull of it that gave up), and the blobs no other pulled
    manifest or unfinished pull names. Returns the bytes freed and the number of blobs kept for other models; a
    ModelNotFoundError when localgen pulled no such model."""
    root = oci.pulled_root()
    path, part = pulled(name), _unfinished_path(root, name)
    if path is None and not part.is_file():
        raise ModelNotFoundError(f"localgen pulled no model {name.display}", hint="localgen list shows what is here")
    mine: set[str] = set()
    for done, top in ((path, root / "manifests"), (part if part.is_file() else None, root / UNFINISHED)):
        if done is not None:
            names = registry._digests(done)
            if not names:  # a damaged manifest: every blob nothing names goes
                names = {f.name.removesuffix(".incomplete") for f in (root / "blobs").glob("sha256-*")}
            mine |= names
            done.unlink()
            registry._prune(done.parent, top)
    freed, kept = registry._sweep(root, mine, progress, _used)
    oci.prune_splits(root)
    return freed, kept
