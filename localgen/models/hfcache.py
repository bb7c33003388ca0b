"""The Hugging Face hub cache layout, shared with huggingface_hub and llama.cpp's `-hf`:
models--OWNER--REPO/{blobs/SHA256, snapshots/COMMIT/FILE -> ../../blobs/SHA256, refs/REVISION}; localgen's pins
are refs too: refs/localgen-pins/COMMIT/FILE (record_pin)."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from localgen import paths
from localgen.errors import LocalgenError

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def hub_cache() -> Path:
    """The cache directory, from the same variables huggingface_hub reads (read now, not at import)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "huggingface" / "hub"
    if (home := paths.user_home()) is None:
        raise paths.no_home("the Hugging Face cache is under ~/.cache", "HF_HUB_CACHE to the folder it is in")
    return home / ".cache" / "huggingface" / "hub"


def offline_env() -> bool:
    """HF_HUB_OFFLINE set to a true value."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def without_offline(flag: bool) -> str:
    """How to be online again, said as the user made localgen offline: `flag` (--offline, or LOCALGEN_OFFLINE,
    its environment variable), HF_HUB_OFFLINE, or both."""
    ways = []
    if flag:
        given = os.environ.get("LOCALGEN_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on", "t", "y")
        ways.append("with LOCALGEN_OFFLINE unset" if given else "without --offline")
    if offline_env():
        ways.append("with HF_HUB_OFFLINE unset")
    return " and ".join(ways) or "without --offline"


def check_repo_id(repo: str) -> str:
    """owner/name with safe characters only; never a path trick."""
    if not REPO_ID.match(repo) or ".." in repo:
        raise LocalgenError(f"{repo!r} is not a valid Hugging Face repo id (owner/name)")
    return repo


def safe_filename(name: str) -> str:
    """A file name from the network, accepted only if it stays inside its snapshot folder."""
    parts = name.split("/")
    if (
        not name or name.startswith("/") or "\\" in name or "\0" in name
        or any(p in ("", ".", "..") for p in parts) or len(name) > 512
    ):
        raise LocalgenError(f"the Hub listed an unsafe file name {name!r}; refusing to use it")
    return name


def repo_dir(repo: str) -> Path:
    """models--OWNER--REPO."""
    return hub_cache() / ("models--" + check_repo_id(repo).replace("/", "--"))


def blob_path(repo: str, sha256: str) -> Path:
    """Where a verified file's bytes live."""
    if not SHA256.match(sha256):
        raise LocalgenError(f"the Hub gave a malformed SHA-256 {sha256!r}")
    return repo_dir(repo) / "blobs" / sha256


def lock_path(repo: str, sha256: str) -> Path:
    """The lock huggingface_hub also takes for this blob, so the tools never write it at once."""
    return hub_cache() / ".locks" / repo_dir(repo).name / f"{sha256}.lock"


def snapshot_path(repo: str, commit: str, filename: str) -> Path:
    """snapshots/COMMIT/FILE."""
    if not COMMIT.match(commit):
        raise LocalgenError(f"the Hub gave a malformed commit id {commit!r}")
    return repo_dir(repo) / "snapshots" / commit / safe_filename(filename)


def link_snapshot(repo: str, commit: str, filename: str, sha256: str) -> Path:
    """Point snapshots/COMMIT/FILE at the blob (relative link); a link that is so already is not written again (a
    read-only cache that holds the model is left as it is). The ref is record_ref's, once every file of a pull is
    whole. A write that fails is an error naming the path in the cache."""
    link = snapshot_path(repo, commit, filename)
    blob = blob_path(repo, sha256)
    rel = os.path.relpath(blob, link.parent)
    tmp = None
    try:
        if not (link.is_symlink() and os.readlink(link) == rel) and not _same_file(link, blob):
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f".{link.name}.{_writer()}.lnk")  # (its failure is the link's: named so)
            tmp.unlink(missing_ok=True)
            _link(blob, rel, tmp)
            os.replace(tmp, link)
            tmp = None
            paths.fsync_dir(link.parent)
    except OSError as e:
        if tmp is not None:
            with contextlib.suppress(OSError):  # a half-made link (a read-only disk has none to remove)
                tmp.unlink()
        raise LocalgenError(f"cannot write {link} in the Hugging Face cache: {e.strerror or e}") from None
    return link


PINS = "localgen-pins"  # refs/localgen-pins/COMMIT/FILE: a file pulled by its commit's name


def record_ref(repo: str, revision: str, commit: str) -> None:
    """refs/REVISION names `commit` (a revision that is a commit has no ref: record_pin's); written only when it
    names another, and only once every file of the pull is whole and verified: a pull cut short leaves the ref, and
    with it what an offline run picks, at the older commit."""
    if COMMIT.match(revision) or cached_commit(repo, revision) == commit:
        return
    if ".." in Path(revision).parts:
        raise LocalgenError(f"unsafe revision name {revision!r}")
    _write_ref(repo_dir(repo) / "refs" / revision, commit)


def pin_path(repo: str, commit: str, filename: str) -> Path:
    """refs/localgen-pins/COMMIT/FILE."""
    if not COMMIT.match(commit):
        raise LocalgenError(f"the Hub gave a malformed commit id {commit!r}")
    return repo_dir(repo) / "refs" / PINS / commit / safe_filename(filename)


def record_pin(repo: str, commit: str, filename: str) -> None:
    """Pin the file pulled by its commit's name (owner/repo/resolve/COMMIT/FILE): a ref holding the commit, so a
    pull that moves main off that commit keeps this copy (store.replace_older), and huggingface_hub's tools see the
    revision as named (`hf cache prune` removes only revisions no ref names). Written once, after the pull's files
    are whole; its folder names the file, so a pin keeps that file alone, not the commit's others."""
    ref = pin_path(repo, commit, filename)
    if not pinned(repo, commit, filename):
        _write_ref(ref, commit)


def pinned(repo: str, commit: str, filename: str) -> bool:
    """Whether a pull by the commit's name pinned this file (record_pin)."""
    try:
        return pin_path(repo, commit, filename).read_text().strip() == commit
    except (OSError, LocalgenError):
        return False


def unpin_gone(repo: str) -> None:
    """Remove the pins whose file the cache no longer holds (rm took it, or another tool did), and the folders
    that leaves empty: a ref naming a commit whose snapshot is gone makes huggingface_hub's scan_cache_dir call the
    whole repo corrupted. One that cannot be removed stays (it keeps nothing that is not there)."""
    base = repo_dir(repo)
    pins = base / "refs" / PINS
    if not pins.is_dir():
        return
    for ref in sorted(pins.rglob("*"), key=lambda p: len(p.parts), reverse=True):  # files, then their folders
        with contextlib.suppress(OSError):
            if ref.is_dir():
                if not any(ref.iterdir()):
                    ref.rmdir()
                continue
            link = base / "snapshots" / ref.relative_to(pins)
            if not ref.name.startswith(".") and not (link.is_symlink() or link.exists()):
                ref.unlink()
    with contextlib.suppress(OSError):
        pins.rmdir()  # (only where empty)


def forget_gone(repo: str, commits: set[str]) -> None:
    """After a removal of files at these commits: the pins whose file went (unpin_gone), then each ref, at any depth
    (refs/main, refs/refs/pr/1), naming one of the commits whose snapshot went, as huggingface_hub's delete strategy
    drops the refs of the revisions it deletes (a ref naming a commit with no snapshot makes its scan_cache_dir call
    the whole repo corrupted: `hf cache ls` leaves it out); then the repo's folder where nothing is left in it
    (drop_empty). Only these commits' refs: huggingface_hub writes a ref before its download's snapshot, so a ref
    to another missing commit may be a download under way. One that cannot be removed stays."""
    unpin_gone(repo)
    base = repo_dir(repo)
    refs, snaps = base / "refs", base / "snapshots"
    gone = {c for c in commits if COMMIT.match(c) and not (snaps / c).is_dir()}
    if gone and refs.is_dir() and not _linked_out(base, refs):
        with contextlib.suppress(OSError):
            found = sorted(refs.rglob("*"), key=lambda p: len(p.parts), reverse=True)  # files, then their folders
            for ref in found:
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    if ref.is_symlink() or _linked_out(refs, ref.parent):  # no ref huggingface_hub writes: kept
                        continue
                    if ref.is_dir():
                        if not any(ref.iterdir()):
                            ref.rmdir()
                    elif ref.is_file() and not ref.name.startswith(".") and _ref_text(ref) in gone:
                        ref.unlink()  # (a FIFO or a device is no ref: read, it held rm for ever)
    drop_empty(repo)


def _ref_text(ref: Path) -> str:
    """What a ref file names (a commit: 40 characters; its first 256 bytes only)."""
    with ref.open("rb") as f:
        return f.read(256).decode().strip()


def _linked_out(top: Path, inner: Path) -> bool:
    """Whether `inner` (at or below `top`) is reached through a symbolic link: what rm removes in it would be
    outside the cache."""
    p = inner
    while True:
        if p.is_symlink():
            return True
        if p == top or p == p.parent:
            return False
        p = p.parent


def drop_empty(repo: str) -> None:
    """Remove the repo's folder where nothing is left in it: no snapshot, ref or blob (an unfinished download's
    blobs/SHA.incomplete is one), as `hf cache rm` deletes a repo whose every revision goes (`hf cache ls` listed the
    empty folder as a repo of 0 bytes). huggingface_hub's .no_exist (the files a commit lacks) and OS helper files
    (.DS_Store) go with it. Empty folders only (rmdir): a file written meanwhile keeps its folder."""
    base = repo_dir(repo)
    if base.is_symlink():  # the repo's folder elsewhere: nothing of it is removed from here
        return
    try:
        entries = sorted(base.rglob("*"), key=lambda p: len(p.parts), reverse=True)  # files, then their folders
    except OSError:
        return
    disposable = {p for p in entries if not (p.is_dir() and not p.is_symlink())}
    if any(p.relative_to(base).parts[0] != ".no_exist" and p.name not in _OS_FILES for p in disposable):
        return
    try:
        for p in entries:
            if p in disposable:
                p.unlink()
            else:
                p.rmdir()
        base.rmdir()
    except OSError:  # a file written meanwhile (a pull of the repo begins), or one that cannot be removed: it stays
        return


_OS_FILES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})  # what huggingface_hub's scan also ignores


def _write_ref(ref: Path, commit: str) -> None:
    """A refs/ file that names `commit`, whole or not at all; a write that fails is an error naming its path."""
    tmp = ref.with_name(f".{ref.name}.{_writer()}.tmp")
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(commit)
        os.replace(tmp, ref)  # whole or not at all: an empty ref (a crash mid-write) names no commit
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise LocalgenError(f"cannot write {ref} in the Hugging Face cache: {e.strerror or e}") from None


def _writer() -> str:
    """This process and thread, for a temporary name: serve pulls in threads, and two pulls of one model wrote one
    ref's temporary file at once (the second's rename found it gone: "cannot write main ... No such file")."""
    import threading

    return f"{os.getpid()}.{threading.get_ident()}"


def _link(blob: Path, rel: str, tmp: Path) -> None:
    """`tmp` as the blob: a relative symlink; where the system allows or supports none (Windows without Developer
    Mode), a hard link to the blob instead (huggingface_hub copies there; a link costs no second copy of the
    bytes). Any other failure, and a failed hard link, is the OSError."""
    try:
        os.symlink(rel, tmp)
        return
    except (OSError, NotImplementedError) as e:
        if not _no_symlinks(e):
            raise
    os.link(blob, tmp)


def _no_symlinks(e: BaseException) -> bool:
    """Whether a failed symlink means the system allows or supports none (Windows' ERROR_PRIVILEGE_NOT_HELD without
    Developer Mode, EPERM on a disk without them), not a disk that is full, read-only or missing a folder."""
    import errno

    if isinstance(e, NotImplementedError):
        return True
    return isinstance(e, OSError) and (getattr(e, "winerror", None) == 1314
                                       or e.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP))


def _same_file(link: Path, blob: Path) -> bool:
    """Whether `link` is a hard link to `blob` (what _link made where no symlink can be)."""
    try:
        return not link.is_symlink() and os.path.samefile(link, blob)
    except OSError:
        return False


def cached_commit(repo: str, revision: str) -> str | None:
    """The commit a revision points at in the cache (refs/REVISION), or the revision if it is a commit."""
    if COMMIT.match(revision):
        return revision
    ref = repo_dir(repo) / "refs" / revision
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    return commit if COMMIT.match(commit) else None
