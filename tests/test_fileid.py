"""localgen/fileid.py: a file as saved KV states depend on it (the model's, a projector's, a LoRA's)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from localgen import fileid
from localgen.engine.adapters import identity as lora_identity
from localgen.engine.llama import _file_identity
from localgen.native.mtmd import _projector_identity


def _all(path: Path) -> tuple[str, str, list[str]]:
    return _projector_identity(str(path)), _file_identity(path), lora_identity(((str(path), 1.0),))


def test_a_new_hard_link_or_a_chmod_is_the_same_file(tmp_path: Path) -> None:
    """run.md, serve.md: a model file given a new hard link or new permissions keeps its prefixes (its change time
    moved, and was part of the identity: a store that links its files, or a test suite, cost every saved state)."""
    for size in (64, 6 << 20):  # read whole, and sampled
        path = tmp_path / f"m{size}.gguf"
        path.write_bytes(os.urandom(size))
        before = _all(path)
        time.sleep(0.01)
        os.link(path, tmp_path / f"other{size}.gguf")
        path.chmod(0o600)
        assert _all(path) == before


def test_a_file_rewritten_with_its_mtime_set_back_is_another(tmp_path: Path) -> None:
    """A large file (its bytes sampled) rewritten in place, the same size, its mtime set back (`cp -p`): another
    file, for each of the three identities."""
    path = tmp_path / "m.gguf"
    data = bytearray(os.urandom(40 << 20))
    path.write_bytes(data)
    st = path.stat()
    before = _all(path)
    data[len(data) // 2:len(data) // 2 + (1 << 20)] = os.urandom(1 << 20)  # a MiB in the middle, as a new tensor's
    time.sleep(0.01)
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    after = _all(path)
    assert all(a != b for a, b in zip(before, after, strict=True)), (before, after)


def test_the_sample_is_read_again_only_when_the_file_changes(tmp_path: Path, monkeypatch) -> None:
    """Asked often (serve asks before it keeps each prefix on disk), the identity costs a stat: the bytes are read
    again only once the file's stat moved, or at a load (`fresh`: Windows' change time is the creation time, which
    a rewrite in place does not move)."""
    path = tmp_path / "m.gguf"
    path.write_bytes(os.urandom(8 << 20))
    reads = []
    real = fileid._sample
    monkeypatch.setattr(fileid, "_sample", lambda p, n: reads.append(p) or real(p, n))
    first = fileid.identity(path)
    assert fileid.identity(path) == first and len(reads) == 1
    path.chmod(0o600)
    assert fileid.identity(path) == first and len(reads) == 2
    assert fileid.identity(path, fresh=True) == first and len(reads) == 3, "a load reads it afresh (Windows' ctime)"
