"""The process's resource limits in words, for an error they caused that reads as something else: out of
descriptors (`ulimit -n`) is not a full disk, and a file past `ulimit -f` is not a "disk I/O error"."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

NO_DESCRIPTORS = "too many open files (raise `ulimit -n`)"
FILE_SIZE = "the file size limit (`ulimit -f`) is reached"
NEAR = 1 << 20  # a file this close to the limit, or closer, may be what a failed write met


def limit_cause(e: BaseException, files: Iterable[Path] = ()) -> str | None:
    """The resource limit `e` met, in words (None: none it shows): an OSError says it by its errno; SQLite's
    errors do not, so one that cannot open a file is out of descriptors if none is left now, and one that
    cannot write (`disk I/O error`) met the file size limit if one of `files` is that close to it."""
    if isinstance(e, OSError):
        if e.errno in (errno.EMFILE, errno.ENFILE):
            return NO_DESCRIPTORS
        if e.errno == errno.EFBIG:
            return FILE_SIZE
        return None
    if out_of_descriptors():
        return NO_DESCRIPTORS
    if file_size_reached(files):
        return FILE_SIZE
    return None


def out_of_descriptors() -> bool:
    """Whether this process can open no file now."""
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
    except OSError as e:
        return e.errno in (errno.EMFILE, errno.ENFILE)
    os.close(fd)
    return False


def file_size_reached(files: Iterable[Path]) -> bool:
    """Whether a file size limit is set and one of `files` (those missing count as empty) is within NEAR of it."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return False
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft == resource.RLIM_INFINITY:
        return False
    sizes = [0]
    for f in files:
        try:
            sizes.append(f.stat().st_size)
        except OSError:
            continue
    return max(sizes) + NEAR >= soft


def sqlite_files(db: Path) -> list[Path]:
    """A SQLite database and the files beside it that a write grows."""
    return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-journal")]
