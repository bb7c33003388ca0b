"""A large file written whole or not at all (a quantized model, a logits file): where the system allows (Linux's
O_TMPFILE, on most of its filesystems), written as a file with no name in its folder and named only when whole,
so however the process ends before that (SIGKILL, the OOM killer, a crash) the kernel frees it and nothing is left.
Else a hidden `.NAME.PID.partial` beside the target, which the next write to that target removes once its process
is gone (drop_stale)."""

from __future__ import annotations

import os
from pathlib import Path


def open_unnamed(folder: Path) -> int | None:
    """A new file with no name in `folder`, open for writing, or None where the system or the folder's
    filesystem has none."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(folder, flag | os.O_WRONLY, 0o666)  # less the umask, as a named file would be
    except OSError:  # EOPNOTSUPP (a filesystem without them), EISDIR (a kernel before 3.11), ...
        return None


def name_it(fd: int, target: Path, replace: bool = True) -> None:
    """Give the unnamed file open as `fd` the name `target` in one step: replacing any file of that name, or, not
    `replace`, refused (FileExistsError) where one exists, however short a time before; `fd` stays open."""
    named = temp_path(target) if replace else target
    if replace:
        named.unlink(missing_ok=True)
    folder = os.open(target.parent, os.O_RDONLY)
    try:  # linkat with AT_SYMLINK_FOLLOW names the unnamed file (with no dir fd, os.link calls link(), which
        os.link(f"/proc/self/fd/{fd}", named.name, src_dir_fd=folder, dst_dir_fd=folder)  # links /proc's link)
    finally:
        os.close(folder)
    if replace:
        os.replace(named, target)


def rename_new(path: Path, target: Path) -> None:
    """Rename `path` to `target` where no file has that name; refused (FileExistsError, `path` left as it is) where
    one does, however short a time before: a hard link, whose check and naming are one step; where the filesystem
    has none, an exclusive create of the name, then the rename over that empty file."""
    try:
        os.link(path, target)
    except FileExistsError:
        raise
    except OSError:  # no hard links here (FAT, some network shares)
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            os.replace(path, target)
        except BaseException:  # the name held for nothing: let go, never left as an empty result
            target.unlink(missing_ok=True)
            raise
        return
    path.unlink(missing_ok=True)


def temp_path(target: Path) -> Path:
    """The hidden file written before it is renamed to `target` (where the folder takes no unnamed file), and the
    name an unnamed one is linked under for that rename."""
    return target.with_name(f".{target.name}.{os.getpid()}.partial")


def drop_stale(target: Path) -> None:
    """Remove what a write to `target` left behind in a process that ended without its cleanup (killed mid-way,
    where the folder takes no unnamed file): its temp file, named by a process no longer running."""
    for path in target.parent.glob(f".{target.name}.*.partial"):
        pid = path.name[len(target.name) + 2: -len(".partial")]
        if pid.isascii() and pid.isdigit() and int(pid) != os.getpid() and not running(int(pid)):
            path.unlink(missing_ok=True)


def running(pid: int) -> bool:
    """Whether a process of that id is running (one of another user's counts, as does a check that fails otherwise)."""
    import sys

    if pid <= 0 or pid >= 1 << 31:  # no process has such an id (os.kill would mean a group, or overflow)
        return False
    if sys.platform == "win32":  # where os.kill(pid, 0) would send a Ctrl-C (signal 0 is CTRL_C_EVENT)
        return _running_windows(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _running_windows(pid: int) -> bool:
    """running() on Windows: the process opened and asked for its exit code; running where that cannot be told."""
    import ctypes

    try:
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        kernel32.OpenProcess.restype = ctypes.c_void_p  # a HANDLE, not C's int
        kernel32.OpenProcess.argtypes = (ctypes.c_ulong, ctypes.c_int, ctypes.c_ulong)
        kernel32.GetExitCodeProcess.argtypes = (ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulong))
        kernel32.CloseHandle.argtypes = (ctypes.c_void_p,)
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            gone = ctypes.get_last_error() == 87  # type: ignore[attr-defined]  # ERROR_INVALID_PARAMETER: no such id
            return not gone
        try:
            code = ctypes.c_ulong()
            return not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)) or code.value == 259  # STILL_ACTIVE
        finally:
            kernel32.CloseHandle(handle)
    except (AttributeError, OSError, ctypes.ArgumentError):  # no kernel32 to ask; a pid it cannot take
        return True
