"""Build bad GGUF files for tests: copy a real model with some string metadata replaced."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from localgen.models.gguf_meta import DEFAULT_ALIGNMENT, _Reader


def _kv_string(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(v)) + v


def _kv(key: str, value: str | float | list[int]) -> bytes:
    if isinstance(value, str):
        return _kv_string(key, value)
    k = key.encode()
    if isinstance(value, list):  # an array of uint32 (a per-layer count)
        return (struct.pack("<Q", len(k)) + k + struct.pack("<I", 9) + struct.pack("<I", 4)
                + struct.pack("<Q", len(value)) + b"".join(struct.pack("<I", v) for v in value))
    if isinstance(value, int) and not isinstance(value, bool):
        return struct.pack("<Q", len(k)) + k + struct.pack("<I", 4) + struct.pack("<I", value)  # uint32
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", 6) + struct.pack("<f", value)  # float32


def rewrite_strings(src: Path, dst: Path, changes: dict[str, str | float | list[int] | None]) -> Path:
    """Copy src to dst with keys set to strings, uint32 (an int), float32 values or uint32 arrays (a list), or
    removed (None); tensor data is copied unchanged."""
    size = src.stat().st_size
    with open(src, "rb") as f:
        r = _Reader(f, size, str(src))
        head = f.read(4) + r.read(4)
        n_tensors = r.scalar("<Q")
        n_kv = r.scalar("<Q")
        kept: list[bytes] = []
        align = DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            start = f.tell()
            key = r.string()
            vtype = r.scalar("<I")
            value = r.value(vtype)
            end = f.tell()
            if key == "general.alignment":
                align = int(value)
            if key in changes:
                continue
            f.seek(start)
            kept.append(f.read(end - start))
        for key, value in changes.items():
            if value is not None:
                kept.append(_kv(key, value))
        tensors_start = f.tell()
        for _ in range(n_tensors):
            r.string()
            n_dims = r.scalar("<I")
            for _ in range(n_dims):
                r.scalar("<Q")
            r.scalar("<I")
            r.scalar("<Q")
        tensors_end = f.tell()
        f.seek(tensors_start)
        tensor_info = f.read(tensors_end - tensors_start)
        data_offset = tensors_end + (-tensors_end % align)
        header = head + struct.pack("<QQ", n_tensors, len(kept)) + b"".join(kept) + tensor_info
        header += b"\0" * (-len(header) % align)
        with open(dst, "wb") as out:
            out.write(header)
            f.seek(data_offset)
            shutil.copyfileobj(f, out, 1 << 20)
    return dst


def retype_tensor(src: Path, dst: Path, ggml_type: int) -> Path:
    """Copy src to dst with its first tensor's ggml type set to `ggml_type` (the bytes of its tensor info)."""
    data = bytearray(src.read_bytes())
    with open(src, "rb") as f:
        r = _Reader(f, len(data), str(src))
        r.read(8)
        n_tensors = r.scalar("<Q")
        n_kv = r.scalar("<Q")
        for _ in range(n_kv):
            r.string()
            r.value(r.scalar("<I"))
        assert n_tensors
        r.string()
        for _ in range(r.scalar("<I")):
            r.scalar("<Q")
        struct.pack_into("<I", data, f.tell(), ggml_type)
    dst.write_bytes(bytes(data))
    return dst
