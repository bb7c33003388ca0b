"""Where localgen keeps its files. LOCALGEN_HOME, when set, overrides every location (tests use it)."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from localgen.errors import UsageError

APP = "localgen"


def _home() -> Path | None:
    value = os.environ.get("LOCALGEN_HOME")
    return _expanded(value) if value else None


def _expanded(value: str) -> Path:
    """LOCALGEN_HOME with its `~` or `~USER` expanded; one that cannot be is a usage error."""
    try:
        home = Path(value).expanduser()
    except RuntimeError:  # ~USER with no such user, or ~ with no HOME and no password entry
        home = Path(value)
    if home.parts and home.parts[0].startswith("~"):
        user = home.parts[0]
        if user == "~":
            raise no_home(f"LOCALGEN_HOME is {value!r}, but ~ names no folder")
        raise UsageError(f"LOCALGEN_HOME is {value!r}, but there is no user {user[1:]!r} for {user} to name "
                         "(give an absolute path, or unset it)")
    return home


def user_home() -> Path | None:
    """The user's home folder, or None where there is none to find (HOME unset and no password entry)."""
    try:
        home = Path("~").expanduser()
    except RuntimeError:
        return None
    return home if home.is_absolute() else None


def no_home(what: str, instead: str = "LOCALGEN_HOME to a folder for localgen's files") -> UsageError:
    """The usage error for a folder that needs the user's home folder when there is none to find."""
    return UsageError(f"{what}: HOME is not set and this user has no home folder in the password database (set "
                      f"HOME, or {instead})")


def home_hint() -> str:
    """What to do about a folder of localgen's own that cannot be made or written: LOCALGEN_HOME's, where it is
    set (it names that folder), else the rights of the folders localgen keeps its files in."""
    value = os.environ.get("LOCALGEN_HOME")
    if value:
        return f"LOCALGEN_HOME is {value!r}: give a folder localgen can write, or unset it"
    return "fix the rights of localgen's folders, or set LOCALGEN_HOME to a folder localgen can write"


def within_home(path: str | os.PathLike[str]) -> bool:
    """Whether a path is LOCALGEN_HOME or inside it (False where it is not set)."""
    try:
        home = _home()
        return home is not None and Path(os.path.abspath(path)).is_relative_to(Path(os.path.abspath(home)))
    except (OSError, ValueError, UsageError):
        return False


def _platform(kind: str) -> Path:
    """platformdirs' folder of this `kind` (user_config_dir ...) for localgen; a usage error where it needs the home
    folder and there is none."""
    import platformdirs

    try:
        folder = Path(getattr(platformdirs, kind)(APP))
    except RuntimeError:  # "could not determine the home directory"
        folder = Path("~")
    if not folder.is_absolute():  # older platformdirs leave the ~ as it was
        raise no_home("localgen cannot find where to keep its files")
    return folder


def check_home() -> None:
    """A LOCALGEN_HOME that cannot hold localgen's folders is a usage error, said before anything is written:
    a file, a symbolic link loop or a link to nothing (every save would fail, or be skipped with a warning) or a
    relative path (chats, presets and the log would land under whatever folder each command starts in, and seem
    lost from any other)."""
    value = os.environ.get("LOCALGEN_HOME")
    if not value:
        return
    home = _expanded(value)
    if not home.is_absolute():
        raise UsageError(f"LOCALGEN_HOME must be an absolute path, not {value!r}: a relative one would move with "
                         f"the current directory (try {str(Path.cwd() / home)!r})")
    import stat

    try:
        mode = os.stat(home).st_mode
    except FileNotFoundError:  # made when first needed, unless it is a link to nothing (no folder can be made there)
        if home.is_symlink():
            raise UsageError(f"LOCALGEN_HOME is {value!r}, a symbolic link to nothing (make the folder it names, "
                             "give another, or unset it)") from None
        return
    except OSError as e:  # a symbolic link loop (exists() says False), a folder above it that cannot be entered
        raise UsageError(f"LOCALGEN_HOME is {value!r}, which cannot be reached: {(e.strerror or str(e)).lower()} "
                         "(give a folder, or unset it)") from None
    if not stat.S_ISDIR(mode):
        raise UsageError(f"LOCALGEN_HOME is {value!r}, which is not a directory (give a folder, or unset it)")


def config_dir() -> Path:
    """User configuration (models.toml overrides)."""
    home = _home()
    if home:
        return home / "config"
    return _platform("user_config_dir")


def data_dir() -> Path:
    """Durable data: saved chats, benchmark history, assembled embedded models."""
    home = _home()
    if home:
        return home / "data"
    return _platform("user_data_dir")


def state_dir() -> Path:
    """State that may be lost without harm: REPL input history."""
    home = _home()
    if home:
        return home / "state"
    return _platform("user_state_dir")


def cache_dir() -> Path:
    """Re-creatable caches (prompt KV states)."""
    home = _home()
    if home:
        return home / "cache"
    return _platform("user_cache_dir")


def endpoints_file() -> Path:
    """The user's named remote endpoints (remote/endpoints.py reads it; a run checks it exists first)."""
    return config_dir() / "endpoints.toml"


def make_dirs(path: Path) -> Path:
    """`path` as a directory, made if missing with each missing folder above it, every one made 0700 whatever the
    umask (in a folder others can write, what localgen keeps could be renamed away); folders that were there are
    left as they are. Errors are mkdir's own (parents=True, exist_ok=True)."""
    missing = []
    above = path
    while not os.path.lexists(above) and above.parent != above:
        missing.append(above)
        above = above.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile (another localgen): not this one's to change
            continue
        except OSError:  # a file in the way, a read-only disk: said as mkdir says it, below
            break
        if folder.stat().st_mode & 0o777 != 0o700:  # a umask that takes the owner's bits too
            folder.chmod(0o700)
    if not path.is_dir():
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except (FileExistsError, NotADirectoryError) as e:  # a file in the way: named, where mkdir said "File
            blocker = in_the_way_of(path)
            if blocker is None:  # exists" of the folder asked for, or "Not a directory" of it
                raise
            raise NotADirectoryError(errno.ENOTDIR, in_the_way(blocker), str(path)) from e
    return path


def in_the_way_of(path: Path) -> Path | None:
    """What is where a folder goes on the way to `path` (it, or one of its parents): a file, or a link that leads to
    no folder; None where there is none."""
    return next((p for p in (path, *path.parents) if os.path.lexists(p) and not p.is_dir()), None)


def in_the_way(blocker: Path) -> str:
    """Why `blocker`, found where a folder goes, is no folder: a file, or a symbolic link to nothing (named with the
    path it names, which a user may mean to make), a link loop, or a link to a file."""
    if not blocker.is_symlink():
        return f"{blocker} is a file, not a folder"
    try:
        target = Path(os.readlink(blocker))
    except OSError:  # removed or replaced meanwhile
        return f"{blocker} is not a folder"
    shown = target if target.is_absolute() else blocker.parent / target
    try:
        os.stat(blocker)
    except FileNotFoundError:
        return f"{blocker} is a broken link (to {shown}, which does not exist), not a folder"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{blocker} is a symbolic link loop (through {shown}), not a folder"
        return f"{blocker} is a link to {shown}, which cannot be reached: {(e.strerror or str(e)).lower()}"
    return f"{blocker} is a link to a file, {shown}, not a folder"


NO_ROOM = (errno.ENOSPC, errno.EDQUOT)  # a full disk, a quota reached: freeing space is what helps


def os_reason(e: OSError) -> str:
    """An OSError's reason in words, without Python's `[Errno N]` and path: where a file is in the way of a folder
    ("Not a directory"), which file that is."""
    if e.errno == errno.ENOTDIR and isinstance(e.filename, str):
        path = Path(e.filename)
        blocker = in_the_way_of(path)
        if blocker is not None:
            return in_the_way(blocker)
    return e.strerror or str(e)


def os_cause(e: OSError) -> str:
    """os_reason, begun in lower case as a clause after a colon: only its first letter (a path in it, a file in the
    way of a folder, keeps its case)."""
    reason = os_reason(e)
    return reason[:1].lower() + reason[1:]


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner can enter (0700), made if missing (as make_dirs makes it); chats,
    prompt states and the log hold what people typed and read. One made before this rule is tightened too."""
    make_dirs(path)
    try:
        if path.stat().st_mode & 0o077:
            path.chmod(0o700)
    except OSError:  # not ours to change (a shared mount): the files are still 0600
        pass
    return path


def private_file(path: Path) -> Path:
    """`path` as a file only its owner can read (0600, in a 0700 folder), made empty if missing; a file that
    exists is left as it is."""
    private_dir(path.parent)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return path


def replace_text(path: Path, text: str) -> None:
    """`text` as `path`'s content in one step (its folder made): written beside it and renamed into place, so a
    reader finds the old file or the new one; a failure (a full disk) leaves no temporary file behind."""
    import threading

    make_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # a name per writer
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (on filesystems that need it; a no-op where it cannot be done)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def no_room(path: Path) -> bool:
    """Whether the disk holding `path` has less than 1 MiB free (a failed write that says no cause: llama.cpp's)."""
    import shutil

    try:
        return shutil.disk_usage(path).free < 1 << 20
    except OSError:
        return False
