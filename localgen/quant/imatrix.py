"""Importance matrices (llama-imatrix's output) read as llama-quantize reads them: the GGUF format (`NAME.in_sum2`
and `NAME.counts` tensors, normalised by each expert's count) or the older binary one (sums already averaged per
call, divided by the call count). Every length is checked against the file before it is read."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localgen.errors import UsageError

KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE = "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"


@dataclass(frozen=True)
class Imatrix:
    """Per-tensor importance (name → float32 numpy array, as llama_model_quantize takes it), the datasets it was
    computed on, and its chunk count (0 when the file does not say)."""

    entries: dict[str, Any]
    datasets: tuple[str, ...]
    chunk_count: int


def read(path: Path) -> Imatrix:
    """The importance matrix in `path`; a file that is not one is a UsageError naming it."""
    import stat

    try:
        # stat before the open: opening a FIFO waits for a writer; /dev/zero has no size to check lengths by
        regular = stat.S_ISREG(os.stat(path).st_mode)
        if regular:
            with open(path, "rb") as f:
                regular = stat.S_ISREG(os.fstat(f.fileno()).st_mode)  # replaced since the stat
                magic = f.read(4)
    except OSError as e:
        raise UsageError(f"cannot read the importance matrix {path}: {e.strerror or e}") from None
    if not regular:
        raise UsageError(f"the importance matrix {path} is not a regular file (a device or a pipe): "
                         "give the file llama-imatrix wrote")
    try:
        return _gguf(path) if magic == b"GGUF" else _legacy(path)
    except (ValueError, KeyError, IndexError, struct.error, OSError) as e:
        raise UsageError(f"{path} is not an importance matrix llama-imatrix wrote ({e})") from None


def _gguf(path: Path) -> Imatrix:
    import numpy as np

    from localgen.errors import ModelFormatError
    from localgen.models.gguf_meta import read_gguf

    try:
        meta, tensors, data_offset = read_gguf(str(path))
    except ModelFormatError as e:
        raise ValueError(e.message) from None
    if not {KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE} <= set(meta):
        raise ValueError("missing imatrix metadata")
    listed = meta[KEY_DATASETS]
    datasets = tuple(str(x) for x in listed) if isinstance(listed, list) else ()
    chunk_count = int(meta[KEY_CHUNK_COUNT])
    size = path.stat().st_size
    sums: dict[str, Any] = {}
    counts: dict[str, Any] = {}
    for name, dims, ttype, offset in tensors:
        for suffix, into in ((".in_sum2", sums), (".counts", counts)):
            if not name.endswith(suffix):
                continue
            if ttype != 0:  # F32
                raise ValueError(f"{name} is not F32")
            n = int(np.prod(dims)) if dims else 1
            if data_offset + offset + 4 * n > size:
                raise ValueError(f"{name} runs past the end of the file")
            into[name[: -len(suffix)]] = np.fromfile(path, dtype="<f4", count=n, offset=data_offset + offset)
    if not sums:
        raise ValueError("no data")
    entries = {}
    for name, s in sums.items():
        if name not in counts:
            raise ValueError(f"mismatched sums and counts for {name}")
        c = np.rint(counts[name]).astype(np.float32)
        per = s.reshape(len(c), -1)
        out = np.ones_like(per)  # an expert never counted: 1, as llama-quantize sets it
        seen = c > 0
        out[seen] = per[seen] / c[seen, None]
        entries[name] = np.ascontiguousarray(out.reshape(-1), dtype=np.float32)
    return Imatrix(entries, datasets, chunk_count)


def _legacy(path: Path) -> Imatrix:
    import mmap

    import numpy as np

    with open(path, "rb") as f:  # mapped, not read: only what the lengths checked against it point at is touched
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError("the file is empty")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    at = 0

    def take(fmt: str) -> Any:
        nonlocal at
        size = struct.calcsize(fmt)
        if at + size > len(data):
            raise ValueError("the file ends early")
        (v,) = struct.unpack_from(fmt, data, at)
        at += size
        return v

    n = take("<i")
    if n < 1:
        raise ValueError("no data")
    entries = {}
    for _ in range(n):
        length = take("<i")
        if length < 0 or at + length > len(data):
            raise ValueError("a name runs past the end")
        name = data[at:at + length].decode("utf-8")
        at += length
        ncall, nval = take("<i"), take("<i")
        if nval < 1 or at + 4 * nval > len(data):
            raise ValueError(f"bad value count for {name}")
        values = np.frombuffer(data, dtype="<f4", count=nval, offset=at).astype(np.float32)
        at += 4 * nval
        entries[name] = np.ascontiguousarray(values / ncall if ncall > 0 else values, dtype=np.float32)
    chunks = 0
    datasets: tuple[str, ...] = ()
    if at + 4 <= len(data):  # optional: the chunk count and the dataset's name
        chunks = take("<i")
        if at + 4 <= len(data):
            length = take("<i")
            if 0 < length <= len(data) - at:
                datasets = (data[at:at + length].decode("utf-8", errors="replace"),)
    return Imatrix(entries, datasets, chunks)


def write_legacy(path: Path, entries: dict[str, Any], ncall: int = 1, chunks: int = 1,
                 dataset: str = "") -> None:
    """An importance matrix in the older binary format (llama-quantize reads it too): for tests and tools."""
    import numpy as np

    out = bytearray(struct.pack("<i", len(entries)))
    for name, values in entries.items():
        b = name.encode()
        arr = np.asarray(values, dtype="<f4") * ncall
        out += struct.pack("<i", len(b)) + b + struct.pack("<ii", ncall, arr.size) + arr.tobytes()
    d = dataset.encode()
    out += struct.pack("<i", chunks) + struct.pack("<i", len(d)) + d
    path.write_bytes(bytes(out))
