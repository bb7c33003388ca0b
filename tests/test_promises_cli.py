"""README promises that no other test would notice breaking (issue #47): NO_COLOR and --plain on a terminal, the
chat REPL's keys, `pull` fetching a projector with the model, GIF/BMP pictures and MP3/FLAC clips, `rpc-server
--cache` and the RPC protocol-mismatch error."""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests import hub_server, terminal
from tests.conftest import CLI, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from make_mmproj import write_audio_mmproj, write_mmproj

PROMPT = ">>>"


def spawn(env: dict[str, str], *args: str) -> Any:
    """`localgen ARGS` in a real pseudo-terminal (stdin, stdout and stderr all a TTY)."""
    return terminal.spawn(env, list(args), timeout=120, dimensions=(40, 120))


def tty_env(cli_env: dict[str, str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in cli_env.items() if k not in ("NO_COLOR", "VISUAL", "EDITOR")}
    env.update(TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1", **extra)
    return env


def chat(env: dict[str, str], *args: str) -> Any:
    child = spawn(env, "chat", *args)
    child.expect("ready in")
    child.expect_exact(PROMPT)
    return child


def turn(child: Any, keys: str) -> None:
    """Type `keys` (Enter included) and wait for the answer's footer and the next prompt."""
    child.send(keys)
    child.expect("tok/s")
    child.expect_exact(PROMPT)


def leave(child: Any) -> None:
    time.sleep(0.3)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def user_messages(home: Path, name: str) -> list[str]:
    saved = json.loads((home / "data" / "chats" / f"{name}.json").read_text())
    return [m["content"] for m in saved["messages"] if m["role"] == "user"]


# ---- NO_COLOR and --plain ----------------------------------------------------------------------------------


def test_no_color_keeps_a_terminals_stderr_free_of_colour(cli_env: dict[str, str], tmp_path: Path) -> None:
    """README (Files and environment): `NO_COLOR` | no colour on stderr."""
    missing = str(tmp_path / "missing.gguf")

    def error_on_a_terminal(**extra: str) -> str:
        child = spawn(tty_env(cli_env, **extra), "run", "-m", missing, "-p", "hi")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 2  # the model path is not there: a usage error
        return str(child.before)

    styled = error_on_a_terminal()
    assert "localgen: error:" in styled and "\x1b[31m" in styled, "a terminal gets the error in red"
    plain = error_on_a_terminal(NO_COLOR="1")
    assert "localgen: error:" in plain and missing in plain
    assert "\x1b[" not in plain, repr(plain)


CODE_PROMPT = "Write a python hello world in a code block."


def chat_answer_on_a_terminal(cli_env: dict[str, str], name: str, *flags: str, **extra: str) -> str:
    child = chat(tty_env(cli_env, **extra), name, "-n", "12", "--temp", "0", *flags)
    child.sendline(CODE_PROMPT)
    child.expect_exact("block.")  # the echo
    child.expect("tok/s")
    answer = str(child.before)
    child.expect_exact(PROMPT)
    leave(child)
    return answer


def test_plain_and_no_color_turn_chat_rendering_off(cli_env: dict[str, str]) -> None:
    """README (chat, Display): Answers stream as Markdown on a terminal ... `--plain` or `NO_COLOR` turn
    rendering off."""
    rendered = chat_answer_on_a_terminal(cli_env, "rendered")
    assert "```" not in rendered and "print" in rendered, "on a terminal the code fence is rendered, not shown"
    assert "40m" in rendered, "and the code block is highlighted (on a dark background)"
    for name, flags, extra in (("plainflag", ("--plain",), {}), ("nocolor", (), {"NO_COLOR": "1"})):
        raw = chat_answer_on_a_terminal(cli_env, name, *flags, **extra)
        assert '```python\r\n# Hello World\r\nprint("Hello World")' in raw, (name, raw)
        assert "\x1b[2K" not in raw and "40m" not in raw, (name, "no live region, no highlighting")


# ---- the chat REPL's keys ----------------------------------------------------------------------------------


def test_chat_keys_as_the_readme_documents_them(cli_env: dict[str, str], home: Path, tmp_path: Path) -> None:
    """README (chat, Keys): Enter sends. Alt-Enter (or Esc then Enter) adds a line; a message that starts with
    `\"\"\"` goes on until a closing `\"\"\"`; a paste keeps its newlines. Ctrl-G opens `$EDITOR` on the
    message. Up/Down walk the input history, which is kept across runs ... Emacs keys (Ctrl-A/E, Ctrl-K/U/W,
    Alt-B/F) work. Tab completes slash commands and their arguments."""
    editor = tmp_path / "editor.sh"
    editor.write_text('#!/bin/sh\nprintf "written in the editor" > "$1"\n')
    editor.chmod(0o755)
    env = tty_env(cli_env, EDITOR=str(editor))
    child = chat(env, "keys1", "-n", "4", "--temp", "0")
    turn(child, "first line\x1b\rsecond line\r")  # Esc then Enter adds a line
    turn(child, '"""\ralpha\rbeta\r"""\r')
    child.send("world")
    child.sendcontrol("a")
    child.send("hello ")
    child.sendcontrol("e")
    turn(child, "!\r")  # Ctrl-A, Ctrl-E
    child.send("junk junk")
    child.sendcontrol("w")  # deletes the last word
    child.send("words")
    child.sendcontrol("a")
    child.sendcontrol("k")  # deletes to the end: nothing left
    child.send("gone")
    child.sendcontrol("u")  # deletes to the start
    turn(child, "kept\r")
    turn(child, "two three\x1bband \x1bf four\r")  # Alt-B back a word, Alt-F forward a word
    turn(child, "\x1b[200~pasted one\rpasted two\x1b[201~\r")  # a bracketed paste keeps its newline
    child.sendcontrol("g")
    child.expect_exact("written in the editor")
    time.sleep(0.5)
    turn(child, "\r")
    turn(child, "\x1b[A\r")  # Up: the last message again
    child.send("/set temp\t")  # Tab completes the command's argument (from a thread: drawn with the rest of the
    child.expect_exact("erature")  # line, or as only its new letters when "/set temp" was drawn first)
    child.send(" 0.5\r")
    child.expect(r"temperature = 0\.5")
    child.expect_exact(PROMPT)
    child.send("/sho\t")  # and the command (completions come from a thread: wait until it is drawn)
    child.expect_exact("w")
    child.send("\r")
    child.expect(r"temperature 0\.5")
    child.expect_exact(PROMPT)
    leave(child)
    assert user_messages(home, "keys1") == [
        "first line\nsecond line", "alpha\nbeta", "hello world!", "kept", "two and three four",
        "pasted one\npasted two", "written in the editor", "written in the editor"]
    child = chat(env, "keys2", "-n", "4", "--temp", "0")
    time.sleep(0.3)
    # the history of the last run, newest first: /show, /set ..., then the editor's message (twice)
    turn(child, "\x1b[A" * 4 + "\x1b[B\r")
    leave(child)
    assert user_messages(home, "keys2") == ["written in the editor"]


# ---- pull fetches the projector ---------------------------------------------------------------------------

VLM = "acme/TinyVLM-GGUF"
VLM_F16 = "acme/TinyVLM-F16-GGUF"
MODEL = "tinyvlm-Q4_1.gguf"


@pytest.fixture(scope="module")
def projectors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("proj")
    return {"a": write_mmproj(d / "a.gguf"), "b": write_mmproj(d / "b.gguf", seed=1),
            "c": write_mmproj(d / "c.gguf", seed=2), "audio": write_audio_mmproj(d / "audio.gguf")}


@pytest.fixture(scope="module")
def vlm_hub(smollm2_path: Path, projectors: dict[str, Path]) -> Iterator[hub_server.FakeHub]:
    hub, server = hub_server.start()
    model = hub_server.HubFile(smollm2_path)
    hub.repos[VLM] = hub_server.HubRepo(hashlib.sha1(b"vlm").hexdigest(), {
        MODEL: model,
        "mmproj-tinyvlm-f16.gguf": hub_server.HubFile(projectors["a"]),
        "mmproj-tinyvlm-Q8_0.gguf": hub_server.HubFile(projectors["b"]),
        "README.md": hub_server.HubFile(b"# readme\n"),
    })
    hub.repos[VLM_F16] = hub_server.HubRepo(hashlib.sha1(b"vlm16").hexdigest(), {
        MODEL: hub_server.HubFile(model.source, model.sha256),
        "mmproj-tinyvlm-bf16.gguf": hub_server.HubFile(projectors["c"]),
        "mmproj-tinyvlm-f16.gguf": hub_server.HubFile(projectors["a"]),
    })
    yield hub
    server.shutdown()
    server.cdn.shutdown()  # type: ignore[attr-defined]


def test_pull_fetches_the_projector_with_the_model(cli_env: dict[str, str], vlm_hub: hub_server.FakeHub,
                                                   tmp_path: Path) -> None:
    """README (Images and audio): `pull` of any repo that holds an `mmproj-*.gguf` fetches it with the model
    (Q8_0 if there is one, else F16, BF16, F32), verified like every Hub file. `localgen show NAME` lists the
    modalities (`text, image`)."""
    env = {k: v for k, v in cli_env.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=vlm_hub.url, HF_HUB_CACHE=str(tmp_path / "hf"))

    def lg(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "localgen", *args], env=env, capture_output=True, text=True,
                              timeout=600, cwd=ROOT, stdin=subprocess.DEVNULL)

    for repo, want, not_sent in ((VLM, "mmproj-tinyvlm-Q8_0.gguf", "mmproj-tinyvlm-f16.gguf"),
                                 (VLM_F16, "mmproj-tinyvlm-f16.gguf", "mmproj-tinyvlm-bf16.gguf")):
        vlm_hub.sent.clear()
        r = lg("pull", f"{repo}:Q4_1")
        assert r.returncode == 0, r.stderr
        assert vlm_hub.sent.get(want) == vlm_hub.repos[repo].files[want].size, (repo, vlm_hub.sent)
        assert not_sent not in vlm_hub.sent, (repo, vlm_hub.sent)
        snap = tmp_path / "hf" / ("models--" + repo.replace("/", "--")) / "snapshots" / vlm_hub.repos[repo].commit
        assert sorted(p.name for p in snap.iterdir()) == sorted([MODEL, want]), "one snapshot: model and projector"
        show = lg("show", f"{repo}:Q4_1", "--offline", "--json")
        assert show.returncode == 0, show.stderr
        assert json.loads(show.stdout)["modalities"] == ["text", "image"]


# ---- GIF, BMP, MP3 and FLAC ------------------------------------------------------------------------------


# the smallest GIF: one pixel, a two-colour palette
GIF = (b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00!\xf9\x04\x01\x00\x00\x00\x00"
       b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")


def bmp(width: int, height: int) -> bytes:
    """A 24-bit BMP of a colour ramp, rows padded to four bytes."""
    row = b"".join(bytes([x * 255 // width, 128, 255 - x * 255 // width]) for x in range(width))
    row += b"\0" * (-len(row) % 4)
    pixels = row * height
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info) + len(pixels), 0, 0, 14 + len(info)) + info + pixels


def mp3(frames: int = 40) -> bytes:
    """Silent MPEG-1 Layer III frames (128 kbit/s, 44.1 kHz, mono): a header, then zeros (empty side info)."""
    return (b"\xff\xfb\x90\xc0" + bytes(413)) * frames


def _crc8(data: bytes) -> int:
    c = 0
    for b in data:
        c ^= b
        for _ in range(8):
            c = ((c << 1) ^ 0x07) & 0xFF if c & 0x80 else (c << 1) & 0xFF
    return c


def _crc16(data: bytes) -> int:
    c = 0
    for b in data:
        c ^= b << 8
        for _ in range(8):
            c = ((c << 1) ^ 0x8005) & 0xFFFF if c & 0x8000 else (c << 1) & 0xFFFF
    return c


def flac(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A FLAC stream of a 440 Hz tone in verbatim subframes (16-bit mono, blocks of 4,096 samples)."""
    import math

    block, total = 4096, int(seconds * rate) // 4096 * 4096
    info = struct.pack(">HH", block, block) + bytes(6)  # block sizes; frame sizes unknown
    info += ((rate << 44) | (0 << 41) | (15 << 36) | total).to_bytes(8, "big") + bytes(16)
    out = b"fLaC" + b"\x80" + len(info).to_bytes(3, "big") + info
    for n in range(total // block):
        head = bytes([0xFF, 0xF8, 0xC5, 0x08, n])  # 4096 samples, 16 kHz, mono, 16 bits, frame n
        head += bytes([_crc8(head)])
        samples = b"".join(struct.pack(">h", int(8000 * math.sin(2 * math.pi * 440 * (n * block + i) / rate)))
                           for i in range(block))
        frame = head + b"\x02" + samples  # a verbatim subframe
        out += frame + struct.pack(">H", _crc16(frame))
    return out


def test_gif_bmp_pictures_and_mp3_flac_clips_are_read(cli: CLI, projectors: dict[str, Path],
                                                       tmp_path: Path) -> None:
    """README (Images and audio): `run --image PATH` (repeatable) takes PNG, JPEG, GIF and BMP. `-a/--attach`
    takes an image or an audio clip (WAV, MP3, FLAC) by its content."""
    files = {"pic.gif": GIF, "pic.bmp": bmp(40, 30), "clip.mp3": mp3(), "clip.flac": flac()}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    # one run per projector, every file attached to it: projector a makes 16 tokens of any picture and the
    # audio projector 375 of each of these clips (its window), so the count shows that each file was read
    cases = [("a", [("--image", "pic.gif"), ("--image", "pic.bmp"), ("-a", "pic.gif"), ("-a", "pic.bmp")], 16),
             ("audio", [("-a", "clip.mp3"), ("-a", "clip.flac")], 375)]
    for proj, attached, each in cases:
        r = cli("run", "--mmproj", str(projectors[proj]), *(a for flag, name in attached
                                                             for a in (flag, str(tmp_path / name))),
                "-p", "Describe it.", "-n", "4", "--temp", "0", "--ignore-eos", "--json")
        assert r.returncode == 0, (attached, r.stderr)
        doc = json.loads(r.stdout)
        assert doc["stats"]["media_tokens"] == each * len(attached) and doc["text"], (attached, doc)
    r = cli("run", "--mmproj", str(projectors["a"]), "--image", str(tmp_path / "clip.mp3"), "-p", "x", "-n", "4")
    assert r.returncode == 2 and "is MP3 audio: attach it with -a" in r.stderr, r.stderr


# ---- rpc-server --cache and the protocol check -----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("rpc-server did not start")


def test_rpc_server_cache_keeps_tensors_on_disk(cli: CLI, cli_env: dict[str, str], tmp_path: Path) -> None:
    """README (RPC): `--cache` keeps received tensors on disk, so the next load of the same model sends only
    hashes. (Files table: RPC tensor cache (`rpc-server --cache`) | `<cache dir>/rpc`.)"""
    server_home = tmp_path / "server-home"
    port = _free_port()
    proc = CLI({**cli_env, "LOCALGEN_HOME": str(server_home)}).popen(
        "rpc-server", "--port", str(port), "-t", "1", "--cache", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(port)
        args = ("run", "--raw", "-p", "The capital of Italy is", "-n", "4", "--temperature", "0",
                "--rpc", f"127.0.0.1:{port}")
        first = cli(*args)
        assert first.returncode == 0, first.stderr
        cache = server_home / "cache" / "rpc"
        kept = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
        assert kept, f"no tensors kept under {cache}"
        second = cli(*args)
        assert second.returncode == 0, second.stderr
        assert second.stdout == first.stdout
        assert {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()} == kept, \
            "the second load reuses the cached tensors"
    finally:
        proc.kill()
        proc.wait()


class OtherRPCServer:
    """Answers llama.cpp's RPC HELLO with another protocol version (or a reply of the wrong size)."""

    def __init__(self, reply: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(1 + 8 + 24)
                    conn.sendall(self.reply)
                    time.sleep(0.2)
                except OSError:
                    pass


def test_an_rpc_server_of_another_protocol_is_one_line_before_load(cli: CLI) -> None:
    """README (RPC): each server is connected to and asked its protocol version: a server that cannot be
    reached or speaks another version is a one-line error, and nothing is loaded."""
    old = OtherRPCServer(struct.pack("<Q", 28) + bytes([3, 0, 1]) + bytes(25))
    odd = OtherRPCServer(struct.pack("<Q", 4) + bytes([2, 0, 0, 0]))
    try:
        for server, words in ((old, "speaks protocol 3.0.1; this build speaks 7.x"),
                              (odd, "speaks another protocol")):
            r = cli("run", "-p", "hi", "-n", "4", "--rpc", f"127.0.0.1:{server.port}", "--verbose")
            assert r.returncode == 1, r.stderr
            errors = [line for line in r.stderr.splitlines() if "localgen: error" in line]
            assert len(errors) == 1 and words in errors[0] and f"127.0.0.1:{server.port}" in errors[0], r.stderr
            assert "load_tensors" not in r.stderr and "Traceback" not in r.stderr, "nothing was loaded"
    finally:
        old.sock.close()
        odd.sock.close()
