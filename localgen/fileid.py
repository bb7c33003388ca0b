"""A file as what was computed from it depends on it (a model's, a projector's or a LoRA's saved KV states): its
real path, size, modification time and a sample of its bytes. A file rewritten in place with its old mtime set
back (`cp -p`, `touch -d`, `rsync -t`) is another file; a new hard link or a chmod, which move only the change
time, leave it the same file (they cost its prefixes when the change time was part of the identity).

The sample is the first MiB (a GGUF's header and metadata) and 128 pieces of 32 KiB spread evenly over the rest
(the whole file up to 5 MiB): a change that spans the gap between two pieces is seen, which for a 4 GB model is
32 MB, less than a layer's weights; 128 reads, not a thousand, for a disk that seeks (docs/benchmarks.md, Costs
noted in the code). A load takes it afresh (`fresh`); asked again while the file's stat is unchanged (serve asks
before it keeps each prefix on disk), it costs a stat. Where the change time is no change time (Windows: the
creation time), only a load's fresh sample tells a file rewritten with its mtime set back."""

from __future__ import annotations

import hashlib
import os

HEAD = 1 << 20
PIECES = 128
PIECE = 32 << 10
_KEPT = 64  # samples remembered (a few files per loaded model)

_samples: dict[tuple[str, int, int, int, int, int], str] = {}


def identity(path: str | os.PathLike[str], fresh: bool = False) -> str:
    """`real|size|mtime_ns|sample`; OSError where the file cannot be read. `fresh`: the bytes read again (a load's)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    sample = None if fresh else _samples.get(key)
    if sample is None:
        sample = _sample(real, st.st_size)
        if len(_samples) >= _KEPT:
            _samples.clear()
        _samples[key] = sample
    return f"{real}|{st.st_size}|{st.st_mtime_ns}|{sample}"


def _sample(path: str, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= HEAD + PIECES * PIECE:
            while block := f.read(1 << 20):
                h.update(block)
            return h.hexdigest()
        h.update(f.read(HEAD))
        span = size - HEAD - PIECE
        offsets = [HEAD + span * i // (PIECES - 1) for i in range(PIECES)]
        if hasattr(os, "pread"):  # a third of seek and read's time; Windows has no pread
            h.update(b"".join(os.pread(f.fileno(), PIECE, at) for at in offsets))
        else:
            for at in offsets:
                f.seek(at)
                h.update(f.read(PIECE))
    return h.hexdigest()
