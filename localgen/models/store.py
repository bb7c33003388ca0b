"""What is on disk: GGUFs in the HF cache (ours and other tools'), found offline; safe removal."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from localgen.models import hfcache
from localgen.models.quant import SPLIT_RE, is_model_gguf, quant_tag


@dataclass(frozen=True)
class CachedFile:
    """A model GGUF in the cache: repo, commit, name in the repo, the snapshot link and its blob."""

    repo: str
    commit: str
    filename: str
    link: Path
    blob: Path

    @property
    def quant(self) -> str | None:
        """Quantization tag from the file name."""
        return quant_tag(self.filename)

    @property
    def sha256(self) -> str | None:
        """The blob's name is its SHA-256 for LFS files."""
        return self.blob.name if hfcache.SHA256.match(self.blob.name) else None


def _repo_from_dir(name: str) -> str | None:
    if not name.startswith("models--"):
        return None
    parts = name[len("models--"):].split("--")
    return "/".join(parts) if len(parts) == 2 else None


def cached_files(repo: str | None = None) -> Iterator[CachedFile]:
    """Every model GGUF (first split part only) in every snapshot; unreadable entries are skipped."""
    root = hfcache.hub_cache()
    seen: dict[Path, list[tuple[Path, os.stat_result]]] = {}
    dirs = [hfcache.repo_dir(repo)] if repo else sorted(root.glob("models--*"))
    for d in dirs:
        name = _repo_from_dir(d.name)
        snaps = d / "snapshots"
        if name is None or not snaps.is_dir():
            continue
        for commit_dir in sorted(snaps.iterdir()):
            for path in sorted(commit_dir.rglob("*.gguf")):
                rel = path.relative_to(commit_dir).as_posix()
                m = SPLIT_RE.search(rel)
                if not is_model_gguf(rel) or (m and m.group(1) != "00001"):
                    continue
                try:
                    blob = blob_of(path, seen)
                except OSError:
                    continue
                yield CachedFile(repo=name, commit=commit_dir.name, filename=rel, link=path, blob=blob)


def blob_of(path: Path, seen: dict[Path, list[tuple[Path, os.stat_result]]] | None = None) -> Path:
    """The blob a snapshot file's bytes are, as a resolved path (so the same blob reached by a symlink and by a
    hard link is one path, also under a cache behind a symlink): where its symlink points, or, for a hard link
    (made where the system makes no symlinks), the file of its repo's blobs/ that is the same file; a copy is its
    own. `seen`: the blobs/ folders already read, for a caller that asks of many files. OSError when it is gone."""
    blob = path.resolve(strict=True)
    if path.is_symlink():
        return blob
    st = os.stat(path)
    if st.st_nlink > 1:
        repo = next((d for d in path.parents if d.name.startswith("models--")), None)
        for b, bst in _blobs(repo / "blobs", {} if seen is None else seen) if repo is not None else []:
            if bst.st_size == st.st_size and os.path.samestat(st, bst):
                return b
    return blob


def _blobs(folder: Path, seen: dict[Path, list[tuple[Path, os.stat_result]]]) -> list[tuple[Path, os.stat_result]]:
    """The files of a blobs/ folder (resolved) and their stat, read once per `seen`."""
    if folder not in seen:
        found = []
        try:
            real = folder.resolve(strict=True)
            for b in real.iterdir():
                try:
                    found.append((b, b.stat()))
                except OSError:
                    continue
        except OSError:
            pass
        seen[folder] = found
    return seen[folder]


def split_parts(f: CachedFile) -> list[Path]:
    """All snapshot links of a (possibly split) model, in order."""
    m = SPLIT_RE.search(f.filename)
    if not m:
        return [f.link]
    n = int(m.group(2))
    return [f.link.with_name(SPLIT_RE.sub(f"-{i:05d}-of-{n:05d}.gguf", f.link.name)) for i in range(1, n + 1)]


def total_size(f: CachedFile) -> int:
    """Bytes of all parts."""
    return sum(p.stat().st_size for p in split_parts(f) if p.exists())


def find_cached(repo: str, revision: str, want: str | None, filename: str | None) -> list[CachedFile]:
    """Cached files of a repo for a quant tag or file name, preferring the revision's commit; only that commit's
    where the revision is a commit (owner/repo/resolve/COMMIT/FILE names those bytes, never another commit's)."""
    commit = hfcache.cached_commit(repo, revision)
    pinned = hfcache.COMMIT.match(revision) is not None
    found = [f for f in cached_files(repo)
             if (not pinned or f.commit == commit)
             and ((filename and f.filename == filename)
                  or (not filename and (want is None or (f.quant or "").upper() == want.upper())))]
    found.sort(key=lambda f: f.commit != commit)
    return found


def removal(files: list[CachedFile]) -> list[Path]:
    """The snapshot links `remove` takes away for these models: every part, and the projector pulled with them
    (mmproj-*.gguf in the same snapshot) where no model that stays in that snapshot uses it."""
    targets: list[Path] = []
    for f in files:
        targets.extend(p for p in split_parts(f) if p.is_symlink() or p.exists())
    going = {p.absolute() for p in targets}
    staying = {o.link.parent for repo in {f.repo for f in files} for o in cached_files(repo)
               if o.link.absolute() not in going}
    for folder in dict.fromkeys(f.link.parent for f in files):
        if folder not in staying:
            targets.extend(projectors(folder))
    return targets


def superseded(repo: str, old: str | None, new: str, filename: str) -> list[Path]:
    """The links at commit `old` that a pull of the model `filename` at `new` replaced (`old`: the commit the
    pulled revision's ref named before): every part of it, and the projector beside it where no other model
    there uses it, each only where `new` holds the same file. None when `old` is `new`, when another ref (a tag
    or branch pulled by name) still names `old`, or when any part is missing at `new`; other files stay. A pin
    (refs/localgen-pins/: the file pulled by its commit's name) is replace_older's to weigh, as a preset is."""
    if old is None or old == new or not (hfcache.COMMIT.match(old) and hfcache.COMMIT.match(new)):
        return []
    base = hfcache.repo_dir(repo)
    pins = base / "refs" / hfcache.PINS
    if any(names_commit(ref, old) for ref in (base / "refs").rglob("*") if pins not in ref.parents):
        return []
    olds = [f for f in cached_files(repo) if f.commit == old and f.filename == filename]
    if not olds:
        return []
    before, after = base / "snapshots" / old, base / "snapshots" / new

    def there(p: Path) -> bool:
        return (after / p.relative_to(before)).exists()

    if not all(there(p) for p in split_parts(olds[0])):
        return []
    return [p for p in removal(olds) if there(p)]


@dataclass(frozen=True)
class Replaced:
    """What replace_older did with the older commit's copy of a model: removed (`freed` bytes), or kept for the
    presets (`pinned_by`) that name that commit or one of its files, or for the name it was pulled by (`pulled_as`,
    owner/repo/resolve/COMMIT/FILE: record_pin's)."""

    filename: str
    freed: int = 0
    pinned_by: tuple[str, ...] = ()
    pulled_as: str | None = None

    @property
    def kept(self) -> bool:
        """Whether the copy stayed for a preset or for its pin."""
        return bool(self.pinned_by) or self.pulled_as is not None


def replace_older(repo: str, revision: str, before: str | None, path: str) -> Replaced | None:
    """After a pull of `revision` that moved it from commit `before` to a new one, whole and verified: remove the
    older commit's copy of the model at `path` (superseded) and its blobs no other link uses, unless a preset pins
    that copy (pinned_by) or it was pulled by that commit's name (hfcache.pinned): it is kept, and said. Returns
    what was done, or None where nothing is to be said: no older copy, or one whose every file is the same blob as
    the new one's (the repo moved for another file, a README: its links go unsaid, or stay unsaid where pinned).
    An OSError where the copy cannot go (remove's: nothing of it removed)."""
    new = hfcache.cached_commit(repo, revision)
    if before is None or new is None or before == new:
        return None
    snaps = hfcache.repo_dir(repo) / "snapshots"
    try:
        filename = Path(path).relative_to(snaps / new).as_posix()
    except ValueError:
        return None
    going = superseded(repo, before, new, filename)
    if not going:
        return None
    same = all(_same_blob(p, snaps / new / p.relative_to(snaps / before)) for p in going)
    users = pinned_by(repo, before, going)
    pin = f"{repo}/resolve/{before}/{filename}" if hfcache.pinned(repo, before, filename) else None
    if users or pin:
        return None if same else Replaced(filename, pinned_by=tuple(users), pulled_as=pin)
    sizes = {(b := blob_of(p)): b.stat().st_size for p in going if p.exists()}
    _, blobs = remove([], going)
    return None if same else Replaced(filename, sum(sizes.get(b, 0) for b in blobs))


def pinned_by(repo: str, commit: str, links: list[Path]) -> list[str]:
    """The presets whose model is one of these files of `repo` at `commit`: named by that commit, as a pasted URL
    names it (owner/repo/resolve/COMMIT/FILE), or by the path of the file (create keeps a path resolved: a cache
    file's is its blob's). A pull that moves the ref keeps such a copy: the preset means those bytes."""
    from localgen.errors import LocalgenError
    from localgen.models import names, presets

    snap = hfcache.repo_dir(repo) / "snapshots" / commit
    files = {p.relative_to(snap).as_posix() for p in links if p.is_relative_to(snap)}
    paths = {os.path.realpath(p) for p in links} | {os.path.abspath(p) for p in links}
    users = []
    for preset in presets.all_presets():
        base = preset.base
        if names.looks_like_path(base) or os.path.isabs(base):  # C:\\...\\blobs\\HASH has no .gguf
            if os.path.realpath(os.path.expanduser(base)) in paths or os.path.abspath(base) in paths:
                users.append(preset.name)
            continue
        try:
            spec = names.parse(base, local=False)
        except LocalgenError:  # a name no longer read so: it pins nothing here
            continue
        if (isinstance(spec, names.HubSpec) and spec.repo.casefold() == repo.casefold() and spec.revision == commit
                and spec.filename in files):
            users.append(preset.name)
    return users


def _same_blob(a: Path, b: Path) -> bool:
    """Whether two snapshot files are one blob."""
    try:
        return blob_of(a) == blob_of(b)
    except OSError:
        return False


def names_commit(ref: Path, commit: str) -> bool:
    """Whether a refs/ file names this commit."""
    try:
        return ref.is_file() and ref.read_text().strip() == commit
    except OSError:
        return False


def projectors(folder: Path) -> list[Path]:
    """The projector links (mmproj-*.gguf) in one snapshot folder."""
    from localgen.models.mmproj import is_mmproj

    try:
        return sorted(p for p in folder.iterdir() if is_mmproj(p.name) and (p.is_symlink() or p.is_file()))
    except OSError:
        return []


def orphan_projectors(repo: str) -> list[Path]:
    """Projectors left in a repo's snapshots with no model beside them (an older localgen's rm kept them)."""
    snaps = hfcache.repo_dir(repo) / "snapshots"
    models = {f.link.parent for f in cached_files(repo)}
    found: list[Path] = []
    for folder in sorted({p.parent for p in snaps.rglob("*.gguf")} if snaps.is_dir() else set()):
        if folder not in models:
            found.extend(projectors(folder))
    return found


def remove(files: list[CachedFile], links: list[Path] | None = None) -> tuple[list[Path], list[Path]]:
    """Remove the snapshot links of these models (`removal`'s, or `links`); delete a blob only when no other link in
    the whole cache still points at it, the pins and refs of a model that went, and its repo's folder where nothing
    is left in it (hfcache.forget_gone). All or nothing: each link and blob is first moved aside, and where one
    cannot be (a file in use on Windows) the others are put back and the OSError raised, so a split model never
    loses part 1 while a later part stays. Returns (links removed, blobs deleted)."""
    targets = removal(files) if links is None else links
    seen: dict[Path, list[tuple[Path, os.stat_result]]] = {}
    blobs = {blob_of(p, seen) for p in targets if p.exists()}
    removing = {p.absolute() for p in targets}
    still_used = set()
    for other in hfcache.hub_cache().glob("models--*/snapshots/*/**/*"):
        if other.absolute() in removing or not (other.is_symlink() or other.is_file()):
            continue
        try:
            still_used.add(blob_of(other, seen))
        except OSError:
            continue
    deleted = [b for b in sorted(blobs) if b not in still_used and b.parent.name == "blobs"]
    for repo in {b.parent.parent for b in deleted} | {p.parents[2] for p in targets if p.parent.parent.name ==
                                                       "snapshots"}:
        _sweep(repo)
    for p in _set_aside([p for p in targets if p.is_symlink() or p.exists()] + deleted):
        p.unlink(missing_ok=True)
    for folder in dict.fromkeys(p.parent for p in targets):  # (a folder the one before emptied is gone)
        if folder.is_dir():
            _prune_empty(folder)
    commits: dict[str, set[str]] = {}  # each repo's commits whose files went (snapshots/COMMIT/...)
    for p in targets:
        snap = next((d for d in p.parents if d.parent.name == "snapshots"), None)
        if snap is not None and (repo_name := _repo_of(p)) is not None:
            commits.setdefault(repo_name, set()).add(snap.name)
    for repo_name, gone in commits.items():
        hfcache.forget_gone(repo_name, gone)
    return targets, deleted


def _repo_of(link: Path) -> str | None:
    """owner/repo of a snapshot link (its models--OWNER--REPO folder), or None."""
    folder = next((d for d in link.parents if d.name.startswith("models--")), None)
    return _repo_from_dir(folder.name) if folder is not None else None


def _set_aside(paths: list[Path]) -> list[Path]:
    """Rename each file to a hidden name beside it (never a *.gguf, so no listing finds it); where one cannot be
    renamed, the ones before it take their names again and the OSError is raised. Returns the new names."""
    moved: list[tuple[Path, Path]] = []
    try:
        for p in paths:
            aside = p.with_name(f".{p.name}.{os.getpid()}.removing")
            try:
                os.replace(p, aside)
            except FileNotFoundError:  # gone meanwhile (another removal): nothing of it to remove
                continue
            moved.append((p, aside))
    except OSError:
        for p, aside in reversed(moved):
            with contextlib.suppress(OSError):  # each put back that can be: the first error is the one said
                os.replace(aside, p)
        raise
    return [aside for _, aside in moved]


STALE_S = 3600  # seconds after which what a removal set aside, its process gone, is swept


def _sweep(repo: Path) -> None:
    """Delete what an earlier removal set aside (`_set_aside`'s names) and left, its process gone before the
    unlinks (killed, a power cut): a blob's bytes no listing sees. Only what was set aside over an hour ago, by a
    process id not running here: a cache shared with another machine or container has removals this one cannot
    see, and none takes an hour between its renames and its unlinks."""
    import time

    for p in [*repo.glob("blobs/.*.removing"), *repo.glob("snapshots/**/.*.removing")]:
        pid = p.name.rsplit(".", 2)[-2]
        with contextlib.suppress(OSError):
            if pid.isdigit() and int(pid) != os.getpid() and time.time() - p.lstat().st_ctime > STALE_S \
                    and not _alive(int(pid)):
                p.unlink()


def _alive(pid: int) -> bool:
    """Whether a process of that id runs (one of another user's counts as running; on Windows, where os.kill would
    end it, every one)."""
    if os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it runs
        return True
    return True


def _prune_empty(d: Path) -> None:
    """Remove the folders a removal emptied, up to its commit's folder; one that cannot be removed (a snapshots/
    folder of a cache shared read-only, a file put there meanwhile) stays: the files are gone all the same."""
    with contextlib.suppress(OSError):
        while d.name and d.parent.name != "snapshots" and not any(d.iterdir()):
            d.rmdir()
            d = d.parent
        if d.parent.name == "snapshots" and d.exists() and not any(d.iterdir()):
            os.rmdir(d)
