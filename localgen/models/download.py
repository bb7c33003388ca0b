"""Resumable, verified downloads: into the shared HF cache (fetch), and for models/registry.py's pulls from
Ollama's registry into localgen's pulled models (fetch_file, or fetch_held under locks the caller holds).

huggingface_hub no longer resumes across runs and checks only the size, so large files come through
our own ranged transfer: bytes go to blobs/SHA256.incomplete (the name huggingface_hub uses too; a registry's
blobs/sha256-HEX.incomplete), a later pull continues from where that file ends, transient errors are retried,
and the digest the source publishes is checked before the file takes its name. A mismatch deletes the bytes.
The blob lock (locked) is the one huggingface_hub takes, so two pulls (ours or theirs) never write the same
file at once; its lock files are never deleted, as another process may hold one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import json
import os
import re
import shutil
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from localgen import paths, proxies
from localgen.errors import LocalgenError
from localgen.models import hfcache, hub
from localgen.models.quant import RemoteFile
from localgen.units import format_amount, format_bytes

CHUNK = 1 << 20
ATTEMPTS = 6
TIMEOUT_S = 30
MARGIN = 64 << 20  # keep this much disk free beyond the file


class Progress(Protocol):
    """What a download reports, for a progress bar or plain lines."""

    def start(self, name: str, total: int, done: int) -> None: ...
    def advance(self, n: int) -> None: ...
    def finish(self) -> None: ...
    def note(self, text: str) -> None: ...


class Quiet:
    """A Progress that reports nothing."""

    def start(self, name: str, total: int, done: int) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def note(self, text: str) -> None:
        pass


class DownloadError(LocalgenError):
    """A transfer failed for good (after retries) or its bytes were wrong."""


class RefusedError(DownloadError):
    """The source refused a transfer (401 or 403): `code`. A registry's pull, which had its manifest, says it
    was refused mid-pull (registry.refused_mid_pull)."""

    def __init__(self, message: str, code: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.code = code


# Errors of the local disk (not the connection): retrying cannot help, so a pull stops at once.
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO}


@contextlib.contextmanager
def locked(path: Path, label: str, progress: Progress) -> Iterator[None]:
    """The blob lock huggingface_hub takes (filelock, portable); says so when another process holds it. The lock
    file stays: another process may hold it, and a lock file unlinked under it locks nothing."""
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress.note(f"{label}: another process is downloading it; waiting for it to finish")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


# ---- which blobs are known good ----------------------------------------------------------------------


def _verified_db() -> Path:
    return paths.data_dir() / "verified-blobs.json"


def _key(blob: Path) -> tuple[str, list[int]]:
    st = blob.stat()
    return str(blob), [st.st_size, st.st_mtime_ns]


def is_verified(blob: Path) -> bool:
    """True if we hashed this exact file (path, size, mtime) and it matched."""
    try:
        k, v = _key(blob)
    except OSError:
        return False
    return _load(_verified_db()).get(k) == v


def mark_verified(blob: Path) -> None:
    """Record a blob as checked. A record that cannot be written is skipped: the blob is hashed again when next
    used."""
    k, v = _key(blob)
    _record(_verified_db(), k, v)


def _record(target: Path, key: str, value: Any) -> None:
    """One entry of a small JSON record (which blobs are verified, which files' SHA-256 is known): the file read,
    changed and replaced whole under its lock, so writers at once (two processes, or two threads of a serve) each
    keep theirs. One that cannot be written is skipped (a record, never a reason for a command to fail)."""
    from filelock import FileLock, Timeout

    try:
        paths.make_dirs(target.parent)
        with FileLock(str(target) + ".lock", timeout=30):  # in a private folder (no mode: filelock would fchmod)
            db = _load(target)
            db[key] = value
            paths.replace_text(target, json.dumps(db))
    except (Timeout, OSError):  # held that long by a stuck process, or a full or read-only data folder: unrecorded
        return


def _load(target: Path) -> dict[str, Any]:
    """A small JSON record as a dict; {} where it is missing, damaged or not one (nested past Python's recursion
    limit: a traceback on every show)."""
    try:
        data = json.loads(target.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


# ---- the SHA-256s computed of files (`show --sha256`) ------------------------------------------------


def _hashes_db() -> Path:
    return paths.data_dir() / "file-sha256.json"


def _file_key(path: Path) -> tuple[str, list[int]]:
    """A file's real path, and what changes when its bytes do: size, modification time, and the inode's number
    and change time, which no tool sets back (`touch -d`, `cp -p`, `rsync -t` and `tar x` set a modification
    time back: a file written again so kept its old SHA-256)."""
    real = path.resolve()  # a link's file, by its own name
    st = real.stat()
    return str(real), [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def known_sha256(path: Path) -> str | None:
    """The SHA-256 computed earlier of this file (sha256_kept), while it is as it was then (_file_key); None
    otherwise."""
    try:
        k, v = _file_key(path)
    except OSError:
        return None
    entry = _load(_hashes_db()).get(k)
    if not isinstance(entry, list) or entry[:-1] != v or not isinstance(entry[-1], str):  # ([] is no [*v, sha])
        return None
    return entry[-1] if hfcache.SHA256.match(entry[-1]) else None


def sha256_kept(path: Path, progress: Progress | None = None) -> str:
    """A file's SHA-256, computed (the whole file read) and kept for known_sha256 by its real path and its
    state (_file_key), unless the file changed while it was read."""
    k, v = _file_key(path)
    sha = sha256_file(Path(k), progress)
    with contextlib.suppress(OSError):
        if _file_key(path) == (k, v):
            _record(_hashes_db(), k, [*v, sha])
    return sha


def sha256_file(path: Path, progress: Progress | None = None) -> str:
    """SHA-256 of a file, reporting progress."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK * 4):
            digest.update(block)
            if progress:
                progress.advance(len(block))
    return digest.hexdigest()


# ---- the transfer ------------------------------------------------------------------------------------


def fetch(repo: str, commit: str, f: RemoteFile, progress: Progress) -> Path:
    """Make one repo file present and verified in the cache; returns its snapshot path (the revision's ref is the
    caller's to move, once every file of the model is there: hfcache.record_ref)."""
    if not f.sha256:
        raise DownloadError(f"the Hub lists no SHA-256 for {f.name}, so it cannot be verified")
    blob = hfcache.blob_path(repo, f.sha256)
    hfcache.snapshot_path(repo, commit, f.name)  # validates the names before any write
    # a blob there is whole (it takes its name only once whole), so it is checked without its lock: a model the
    # cache holds whole needs no write there, and a read-only cache serves it
    if not (blob.is_file() and blob.stat().st_size == f.size and verify_blob(blob, f.sha256, f.name, progress)):
        fetch_file(hub.file_url(repo, commit, f.name), hub.auth_headers, blob, hfcache.lock_path(repo, f.sha256),
                   f, progress, HUB)
    return hfcache.link_snapshot(repo, commit, f.name, f.sha256)


@dataclass(frozen=True)
class Source:
    """Where a file comes from, as a transfer's errors name it: the Hub, or a model registry."""

    name: str
    digest: str  # what the bytes are checked against, in words
    refused: str | None = None  # why a 401 or 403 happens, where that is known
    refused_hint: str | None = None


HUB = Source("the Hub", "the SHA-256 the Hub publishes", "the repo is gated or private",
             "accept its terms on the Hub, then set HF_TOKEN (or `hf auth login`)")


def fetch_file(url: str, headers: Callable[[], dict[str, str]], blob: Path, lock: Path, f: RemoteFile,
               progress: Progress, source: Source) -> None:
    """Make one file present at `blob` and verified against `f.sha256`: a blob there already is hashed once (a
    bad one goes), a missing one comes from `url` through `blob`.incomplete, resumed where an earlier pull
    stopped, under the lock `lock` (a file) so that two pulls never write it at once."""
    with locked(lock, f.name, progress):
        fetch_held(url, headers, blob, f, progress, source)


def fetch_held(url: str, headers: Callable[[], dict[str, str]], blob: Path, f: RemoteFile, progress: Progress,
               source: Source, redirect: Callable[[str, str], None] | None = None) -> None:
    """fetch_file for a caller that holds the blob's lock already (a registry pull holds each of its blobs' until
    its manifest names them); `redirect`: as hub.open_url's, asked about each redirect."""
    assert f.sha256 is not None
    if blob.exists() and not _check_existing(blob, f, progress):
        blob.unlink()
    if not blob.exists():
        _transfer(url, headers, f, blob, progress, source, redirect)


def check_space(folder: Path, need: int, what: str) -> None:
    """A DownloadError when `folder`'s disk has less than `need` bytes free and MARGIN to spare."""
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need + MARGIN:
        raise DownloadError(
            f"not enough disk space for {what}: need {format_bytes(need + MARGIN)}, have "
            f"{format_amount(free)} in {folder}",
        )


def still_to_come(repo: str, files: list[RemoteFile]) -> int:
    """Bytes a pull of these repo files has yet to download: a file whose blob is there whole needs none, one with
    a partial download what it lacks."""
    need = 0
    for f in files:
        if not f.sha256:
            continue
        blob = hfcache.blob_path(repo, f.sha256)
        if blob.is_file() and blob.stat().st_size == f.size:
            continue
        partial = partial_path(blob)
        have = partial.stat().st_size if partial.is_file() else 0
        need += f.size - have if have <= f.size else f.size
    return need


def verify_blob(blob: Path, sha256: str, label: str, progress: Progress) -> bool:
    """Hash a blob once (recorded afterwards) and compare it with the SHA-256 it should have."""
    if is_verified(blob):
        return True
    progress.start(f"verifying {label}", blob.stat().st_size, 0)
    ok = sha256_file(blob, progress) == sha256
    progress.finish()
    if ok:
        mark_verified(blob)
    return ok


def _check_existing(blob: Path, f: RemoteFile, progress: Progress) -> bool:
    """A blob another tool wrote is hashed once before we use it; a bad one is removed."""
    assert f.sha256 is not None
    if blob.stat().st_size != f.size:
        progress.note(f"{f.name}: cached file has the wrong size; downloading it again")
        return False
    ok = verify_blob(blob, f.sha256, f.name, progress)
    if not ok:
        progress.note(f"{f.name}: cached file fails its SHA-256; downloading it again")
    return ok


def partial_path(blob: Path) -> Path:
    """Where a blob's bytes arrive until they are whole and verified."""
    return blob.with_name(blob.name + ".incomplete")


def _transfer(url: str, headers: Callable[[], dict[str, str]], f: RemoteFile, blob: Path, progress: Progress,
              source: Source, redirect: Callable[[str, str], None] | None = None) -> None:
    partial = partial_path(blob)
    blob.parent.mkdir(parents=True, exist_ok=True)
    have = partial.stat().st_size if partial.exists() else 0
    if have > f.size:
        partial.unlink()
        have = 0
    check_space(blob.parent, f.size - have, f.name)
    digest = hashlib.sha256()
    if have:
        progress.note(f"{f.name}: resuming at {format_bytes(have)} of {format_bytes(f.size)}")
        with open(partial, "rb") as existing:
            while block := existing.read(CHUNK * 4):
                digest.update(block)
    progress.start(f.name, f.size, have)
    try:
        failures = 0
        with _open_partial(partial) as out:
            while have < f.size:
                before = have
                try:
                    # headers() for each try: a registry's token that ran out while a try was streaming is renewed
                    have, restarted = _stream(url, headers(), have, f.size, out, digest, progress, source,
                                              redirect=redirect, name=f.name)
                    if restarted:
                        digest = hashlib.sha256()
                        have, _ = _stream(url, headers(), 0, f.size, out, digest, progress, source, truncate=True,
                                          redirect=redirect, name=f.name)
                    failures = 0
                except _Transient as e:
                    _flush(out, f.size)
                    have = out.tell()  # what arrived before the error is kept and hashed
                    failures = 1 if have > before else failures + 1  # a try that got bytes starts the count again
                    if failures >= ATTEMPTS:
                        if not have:  # nothing arrived: no empty .incomplete is left to resume from
                            partial.unlink(missing_ok=True)
                        raise DownloadError(
                            f"downloading {f.name} failed after {ATTEMPTS} tries: {e}",
                            hint="run the same command again: it resumes where it stopped",
                        ) from None
                    asked = hub.retry_after(e.retry_after) if e.status in (429, 503) else None
                    if asked is None:
                        progress.note(f"{f.name}: {e}; retrying")
                        time.sleep(min(8.0, 0.5 * 2 ** (failures - 1)))
                    else:  # a server over a user's rate (429) or busy (503) says when to come back: up to MAX_WAIT
                        wait = min(asked, hub.MAX_WAIT)
                        progress.note(f"{f.name}: {hub.waiting(source.name, asked, wait, e.status)}")
                        time.sleep(wait)
            try:
                out.flush()
                os.fsync(out.fileno())
            except OSError as e:
                raise _disk_error(e, partial) from None
    except BaseException:  # (a Ctrl-C, an error no retry mends): the bar ends, its SIGTERM handler goes
        progress.finish()
        raise
    progress.finish()
    if digest.hexdigest() != f.sha256:
        partial.unlink(missing_ok=True)
        raise DownloadError(
            f"{f.name} does not match {source.digest}; the bad download was deleted",
            hint="pull again; if it keeps failing the server or a proxy is corrupting it",
        )
    os.replace(partial, blob)
    paths.fsync_dir(blob.parent)
    mark_verified(blob)


class _Transient(Exception):
    """A failed try that another may mend: its HTTP status and Retry-After, where it was an HTTP error."""

    def __init__(self, message: str, status: int | None = None, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


@contextlib.contextmanager
def _open_partial(path: Path) -> Iterator[BinaryIO]:
    try:
        f = open(path, "ab")  # noqa: SIM115 (closed below)
    except OSError as e:
        raise _disk_error(e, path) from None
    with f:
        yield f


def _disk_error(e: OSError, path: Path) -> DownloadError:
    what = e.strerror or str(e)
    hint = "free some disk space, then pull again: it resumes" if e.errno in paths.NO_ROOM else None
    return DownloadError(f"cannot write {path}: {what}", hint=hint)


def _write(out: object, block: bytes) -> None:
    """Append to the partial file; a disk error is final (DownloadError), never retried."""
    try:
        out.write(block)  # type: ignore[attr-defined]
    except OSError as e:
        raise _disk_error(e, Path(str(getattr(out, "name", "the download")))) from None


def _stream(
    url: str, headers: dict[str, str], start: int, size: int, out: object, digest: object, progress: Progress,
    source: Source, truncate: bool = False, redirect: Callable[[str, str], None] | None = None, name: str = "",
) -> tuple[int, bool]:
    """Fetch bytes from `start`; returns (bytes now held, whether the server ignored the range). An answer that is
    not (the asked part of) the file is a failed try, nothing of it written: a 200 whose length is not the file's
    (a captive portal's page), a 206 whose Content-Range is missing or starts anywhere but `start`."""
    from io import BufferedWriter

    assert isinstance(out, BufferedWriter)
    try:
        resp = hub.open_url(url, {**headers, "Range": f"bytes={start}-"}, TIMEOUT_S, redirect)
    except urllib.error.HTTPError as e:
        if e.code == 416 and start >= size:
            return start, False
        if e.code in (401, 403):
            why = f": {source.refused}" if source.refused else ""
            raise RefusedError(f"{source.name} refused the download ({e.code}){why}", e.code,
                               hint=source.refused_hint) from None
        if e.code == 404:
            raise DownloadError(f"the file is gone from {source.name} (404)") from None
        if 300 <= e.code < 400:  # urllib gives up on a redirect that comes back to itself, or on too many
            raise DownloadError(f"{source.name} redirects the download of {name} in a loop (HTTP {e.code})") from None
        raise _Transient(f"HTTP {e.code}", e.code,
                         e.headers.get("Retry-After") if e.headers is not None else None) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise _Transient(_reason(e)) from None
    with resp:
        wrong = _not_the_file(resp, start, size)
        if wrong is not None:
            raise _Transient(wrong)
        if (resp.status == 200 and start > 0) or truncate:
            if not truncate:
                return start, True  # no range support: start again from 0
            out.seek(0)
            out.truncate()
            start = 0
        have = start
        try:
            while True:
                block = resp.read(CHUNK)
                if not block:
                    break
                if have + len(block) > size:
                    raise DownloadError(f"the server sent more bytes than {name} has ({format_bytes(size)})")
                _write(out, block)
                digest.update(block)  # type: ignore[attr-defined]
                have += len(block)
                progress.advance(len(block))
        except (TimeoutError, OSError, http.client.HTTPException) as e:
            _flush(out, size)
            raise _Transient(f"connection dropped at {format_bytes(have)}: {_reason(e, reading=True)}") from None
    _flush(out, size)
    if have < size:
        raise _Transient(f"connection closed at {format_bytes(have)} of {format_bytes(size)}")
    return have, False


def _reason(e: BaseException, reading: bool = False) -> str:
    """Why a try failed, in words: a wait of TIMEOUT_S with no byte says so, never the exception's class name
    (`reading`: the error cut the body short, where a class is all some errors say)."""
    reason = getattr(e, "reason", e)
    if isinstance(reason, TimeoutError) or isinstance(e, TimeoutError):
        return f"no byte came for {TIMEOUT_S} s"
    return proxies.connection_reason(e) if reading else str(reason)


def _not_the_file(resp: Any, start: int, size: int) -> str | None:
    """Why an answer to `Range: bytes=START-` is not the file (or its part from START), or None when it is."""
    length = resp.headers.get("Content-Length")
    what = f"{length} bytes" if length is not None else "a body of no stated length"
    kind = resp.headers.get("Content-Type")
    if kind:
        what += f" of {kind.split(';')[0].strip()}"
    if resp.status == 200:
        if length is None:  # streamed (chunked, or to the connection's close): the size and SHA-256 checks stay,
            if (kind or "").split(";")[0].strip().lower() not in ("text/html", "application/xhtml+xml"):
                return None  # and a page (a portal's, a proxy's) is no model file
            return f"the server answered 200 with {what}, not the file"
        if not length.strip().isdigit() or int(length) != size:
            return f"the server answered 200 with {what}, not the file's {format_bytes(size)}"
        return None
    if resp.status == 206:
        found = re.fullmatch(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", resp.headers.get("Content-Range") or "")
        if found is None:
            return "the server answered 206 with no byte range (Content-Range) it sent"
        first, last, total = int(found.group(1)), int(found.group(2)), found.group(3)
        if first != start or last < first or (total != "*" and int(total) != size) or last >= size:
            return f"the server sent bytes {first}-{last}/{total} when asked for bytes {start}- of {size}"
        return None
    return f"the server answered {resp.status}, not the file"


def _flush(out: BinaryIO, size: int) -> None:
    try:
        out.flush()
    except OSError as e:
        raise _disk_error(e, Path(str(getattr(out, "name", "the download")))) from None
