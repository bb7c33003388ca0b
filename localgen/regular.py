"""Reading a file localgen keeps (a saved conversation, a preset, the user's models.toml) without trusting what is at
its path: anything but a regular file is refused before it is opened (a FIFO would block the read, /dev/zero never
end it), and the read is bounded. The stdlib and units.py only: every layer may import it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from localgen.units import format_bytes


class Unreadable(Exception):
    """A path that is not read, and why in words: not a regular file (a FIFO, a device, a folder: never opened), or
    larger than it may be."""


def read_regular(path: Path, limit: int, whole: bool = False, what: str = "such a file") -> bytes:
    """At most `limit` + 1 bytes of a regular file (`whole`: all of it, Unreadable when it is larger than `limit`,
    before a byte is read; `what` names the file's kind in that error). Anything but a regular file is Unreadable
    before it is opened; the open does not block either, and what it opened is checked again. OSError (a missing
    file, no permission) is the caller's."""
    if not stat.S_ISREG(mode := os.stat(path).st_mode):
        raise Unreadable(_kind(mode))
    flags = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)  # Windows: no \r\n
    fd = os.open(path, os.O_RDONLY | flags)
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced since the stat
            raise Unreadable(_kind(st.st_mode))
        if whole and st.st_size > limit:
            raise Unreadable(f"it is {st.st_size:,} bytes, more than the {format_bytes(limit)} {what} is read to")
        data = f.read(limit + 1)
    if whole and len(data) > limit:  # grew since the fstat
        raise Unreadable(f"it is more than the {format_bytes(limit)} {what} is read to")
    return data


def not_a_file(path: Path) -> str | None:
    """What is at `path`, in words ("is a folder"), where something other than a regular file is; else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else _kind(mode).removeprefix("it ")


def _kind(mode: int) -> str:
    return ("it is a folder" if stat.S_ISDIR(mode) else "it is a FIFO" if stat.S_ISFIFO(mode) else
            "it is a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "it is not a regular file")
