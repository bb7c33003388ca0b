"""An F16 GGUF made from a quantized one, with the `gguf` package: every quantized tensor dequantized to F16,
F32 tensors (norms) kept, the metadata copied with general.file_type set to MOSTLY_F16. The models shipped are
already quantized; quantizing from this F16 measures the degradation of real weights (the suite's fixture
`smollm2_f16`, and the how-to's ladder in docs/quantize-choose.md, whose reader makes it with this command).

    python -m tests.dequant SRC DST.gguf      # SRC: a GGUF file, or a model's name as `run -m` takes it
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

FILE_TYPE_KEY = "general.file_type"
MOSTLY_F16 = 1
GGML_F32, GGML_F16 = 0, 1


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def dequantize_to_f16(src: Path, dst: Path) -> Path:
    """Write dst: src's metadata and tensors, each quantized tensor as F16 (written to a temp file, renamed)."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(src))
    align = 32
    kv = bytearray()
    n_kv = 0
    with open(src, "rb") as f:
        raw = f.read(reader.tensors[0].data_offset if reader.tensors else 0)
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        if name == "general.alignment":
            align = int(field.parts[field.data[0]][0])
        if name == FILE_TYPE_KEY:
            kv += _string(name) + struct.pack("<I", 4) + struct.pack("<I", MOSTLY_F16)  # uint32
        else:  # the field's bytes as the file has them
            start = field.offset
            end = start + sum(p.nbytes for p in field.parts)
            kv += raw[start:end]
        n_kv += 1
    infos = bytearray()
    blobs: list[np.ndarray] = []
    offset = 0
    for t in reader.tensors:
        if t.tensor_type.value in (GGML_F32, GGML_F16):
            data = np.asarray(t.data)
            out_type = t.tensor_type.value
        else:
            data = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float16)
            out_type = GGML_F16
        dims = [int(d) for d in t.shape]
        infos += _string(t.name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<I", out_type) + struct.pack("<Q", offset)
        blob = np.ascontiguousarray(data).tobytes()
        blobs.append(np.frombuffer(blob, dtype=np.uint8))
        offset += len(blob) + (-len(blob) % align)
    header = b"GGUF" + struct.pack("<I", 3) + struct.pack("<QQ", len(reader.tensors), n_kv) + bytes(kv) + bytes(infos)
    header += b"\0" * (-len(header) % align)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(header)
            for blob in blobs:
                out.write(blob.tobytes())
                out.write(b"\0" * (-len(blob) % align))
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def source(name: str) -> Path:
    """SRC: a file, else the file of the model that name means here (smollm2:135m: the embedded Q4_1)."""
    if Path(name).is_file():
        return Path(name)
    from localgen.models.resolve import resolve

    return Path(resolve(name, offline=True, pull_missing=False).path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m tests.dequant SRC DST.gguf  (SRC: a GGUF file or a model's name, as smollm2:135m)")
    from localgen.errors import LocalgenError

    try:
        src = source(sys.argv[1])
    except LocalgenError as e:
        sys.exit(f"tests.dequant: {e.message}")
    dequantize_to_f16(src, Path(sys.argv[2]))
    print(sys.argv[2])
