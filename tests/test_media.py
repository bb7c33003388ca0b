"""Images and audio through libmtmd: the real SmolLM2 with seeded random-weight projectors, one for images and
one for audio (scripts/make_mmproj.py), compared with llama-mtmd-cli's texts (tests/data/llama_mtmd_cli.json, written by
scripts/mtmd_reference.py --write); run, chat and serve; the bad-input corpus."""

from __future__ import annotations

import base64
import json
import re
import struct
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CLI, NO_GPU, ROOT, InProcessCLI, assert_same_greedy_text, same_text_as_reference

sys.path.insert(0, str(ROOT / "scripts"))
from make_mmproj import png, write_audio_mmproj, write_mmproj
from mtmd_reference import is_audio, is_video, video_fps, write_media

REFERENCE = json.loads((ROOT / "tests" / "data" / "llama_mtmd_cli.json").read_text())
FIXTURE = REFERENCE["cases"]
REFERENCE_THREADS = REFERENCE["threads"]  # llama-mtmd-cli's: the projectors' sums change with the thread count


@pytest.fixture(scope="module")
def mm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The projectors the fixture was made with, a projector for a wider model, the pictures and sounds."""
    d = tmp_path_factory.mktemp("mm")
    out = {"proj": write_mmproj(d / "proj.gguf"), "audio": write_audio_mmproj(d / "audio.gguf"),
           "wide": write_mmproj(d / "wide.gguf", n_embd_text=640)}
    for case in FIXTURE:
        for name in case["media"]:
            out[name] = write_media(d, name)
    return out


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _png_header(w: int, h: int, idat: bytes = b"") -> bytes:
    body = _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + body + (_chunk(b"IDAT", idat) + _chunk(b"IEND", b"") if idat else b"")


def _wav(seconds: float, rate: int = 8000) -> bytes:
    n = int(seconds * rate)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate, 1, 8)
    return b"RIFF" + struct.pack("<I", 36 + n) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + \
        struct.pack("<I", n) + b"\x80" * n


BAD = {
    "empty": (b"", "is empty"),
    "truncated PNG": (b"\x89PNG\r\n\x1a\n\0\0", "truncated or corrupt PNG"),
    "enormous PNG": (_png_header(100_000, 100_000), "100000×100000 pixels"),
    "zero-size PNG": (_png_header(0, 10), "size of 0×10"),
    "JPEG with no frame": (b"\xff\xd8\xff\xe0\x00\x10JFIF\0" + b"\0" * 20, "truncated or corrupt JPEG"),
    "TIFF": (b"II*\x00" + b"\0" * 16, "is TIFF"),
    "text": (b"hello, this is not a picture", "not an image, audio or video file"),
    "HEIF picture": (b"\0\0\0\x18ftypheic" + b"\0" * 20, "is HEIF, which localgen cannot read"),
    "M4A audio": (b"\0\0\0\x18ftypM4A " + b"\0" * 20, "is M4A audio, which localgen cannot read"),
    "eleven minutes of WAV": (_wav(660), "11.0 minutes of audio"),
    # `ftyp` at byte 4 of text is no ISO-BMFF box: it was called MP4 video
    "text holding ftyp at byte 4": (b"abcdftypXYZWhello" * 4, "is not an image, audio or video file"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_media_is_one_clear_error(name: str) -> None:
    from localgen import media

    data, words = BAD[name]
    with pytest.raises(media.MediaError) as e:
        media.sniff(data, "x")
    assert words in e.value.message


@pytest.mark.parametrize("data", [
    b"RIFF\x10\0\0\0WEBPVP8 " + b"\0" * 16,  # a VP8 chunk without its frame's start code
    b"RIFF\x0c\0\0\0WEBPVP8 \0\0\0\0",  # an empty VP8 chunk
    b"RIFF\x1a\0\0\0WEBPVP8L\x0e\0\0\0\x2f\x05\x40\0",  # cut at 24 bytes, inside its VP8L header
], ids=["no start code", "empty VP8 chunk", "truncated VP8L"])
def test_a_damaged_webp_is_said_to_be_damaged_and_one_without_ffmpeg_unreadable(
        monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    """With ffmpeg at hand a WebP is read, so a damaged one is said to be damaged, as a PNG or JPEG is (it was
    "is WebP, which localgen cannot read", its hint leaving WebP out); without ffmpeg, WebP is not read at all.
    ffmpeg_dir stands in for the folder: a header this short never reaches ffmpeg."""
    from localgen import media

    monkeypatch.setattr(media, "ffmpeg_dir", lambda: "/ffmpeg")
    with pytest.raises(media.MediaError) as e:
        media.sniff(data, "x.webp")
    assert (e.value.message, e.value.hint) == ("x.webp is a truncated or corrupt WebP", None)
    monkeypatch.setattr(media, "ffmpeg_dir", lambda: None)
    with pytest.raises(media.MediaError) as e:
        media.sniff(data, "x.webp")
    assert e.value.message == "x.webp is WebP, which localgen cannot read"
    assert str(e.value.hint).startswith("images: PNG, JPEG, GIF, BMP; audio: ")


def test_media_sources_and_parts(tmp_path: Path) -> None:
    from localgen import media

    pic = png(40, 30)
    m = media.read("-", stdin=_Bytes(pic))
    assert (m.kind, m.format, m.width, m.height, m.source) == ("image", "PNG", 40, 30, "stdin")
    part = m.part()
    assert part["image_url"]["url"].startswith("data:image/png;base64,")
    assert media.part_media(part).data == m.data
    assert media.from_url(base64.b64encode(pic).decode(), allow_http=False).data == pic  # Ollama: bare base64
    with pytest.raises(media.MediaError, match="--allow-image-urls"):
        media.from_url("http://127.0.0.1:9/x.png", allow_http=False)
    with pytest.raises(media.MediaError, match="not valid base64"):
        media.from_url("data:image/png;base64,@@@@", allow_http=False)
    shouted = "DATA:image/png;base64," + base64.b64encode(pic).decode()  # a scheme in capitals is one still
    assert media.read(shouted).data == pic
    with pytest.raises(media.MediaError, match=r"^cannot read x{60}\.\.\. \(5,004 characters\): "):
        media.read("x" * 5000 + ".png")  # a blob pasted as a name is not repeated whole in the error
    wav = media.sniff(_wav(2.5), "clip.wav")
    assert (wav.kind, wav.seconds) == ("audio", 2.5)
    with pytest.raises(media.MediaError, match=r"is WAV audio, where an image goes$"):
        media.part_media({"type": "image_url", "image_url": {"url": "data:audio/wav;base64,"
                                                             + base64.b64encode(_wav(1)).decode()}})
    messages, found = media.split([{"role": "user", "content": media.content("Describe.", [m])}], "<M>")
    assert messages[0]["content"] == "<M>Describe."  # llama-mtmd-cli puts the marker first
    assert [f.data for f in found] == [m.data]
    assert media.text_of(media.content("Describe.", [m])) == "[image] Describe."
    f = tmp_path / "my photo.png"
    f.write_bytes(pic)
    assert media.dropped_path(f"'{f}'") == f
    assert media.dropped_path(str(f).replace(" ", "\\ ")) == f
    assert media.dropped_path(f"look at {f}") is None


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, n: int) -> bytes:
        return self.data[:n]


@pytest.mark.parametrize("case", FIXTURE, ids=[f"{c['media']} {c['prompt']}" for c in FIXTURE])
def test_run_writes_what_llama_mtmd_cli_writes(cli: CLI, mm: dict[str, Path], case: dict[str, Any]) -> None:
    sound = is_audio(case["media"][0])
    args = ["run", "--mmproj", str(mm["audio" if sound else "proj"]), "--temp", "0", "-n", str(case["max_tokens"]),
            "--ignore-eos", "-p", case["prompt"], "--threads", str(REFERENCE_THREADS)]
    for name in case["media"]:
        args += ["-a" if sound else "--video" if is_video(name) else "--image", str(mm[name])]
        args += ["--video-fps", fps] if (fps := video_fps(name)) else []
    r = CLI({**cli.env, **NO_GPU})(*args)  # llama-mtmd-cli wrote the reference on a CPU
    assert r.returncode == 0, r.stderr
    same_text_as_reference(r.stdout.strip(), case["text"], made_on=case.get("cpu"))


def test_run_attach_stdin_json_stats_and_show(cli: CLI, mm: dict[str, Path]) -> None:
    case = FIXTURE[0]
    pic = mm[case["media"][0]].read_bytes()
    import subprocess

    r = subprocess.run(cli.argv("run", "--mmproj", str(mm["proj"]), "--temp", "0", "-n", str(case["max_tokens"]),
                                "-a", "-", "-p", case["prompt"], "--json", "--threads", str(REFERENCE_THREADS)),
                       input=pic, capture_output=True, env=cli.env, cwd=ROOT, timeout=120)  # the picture's bytes
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    same_text_as_reference(doc["text"], case["text"])
    assert doc["stats"]["media_tokens"] == 16 and doc["stats"]["encode_s"] > 0
    s = cli("show", "smollm2:135m", "--mmproj", str(mm["proj"]), "--json")
    assert json.loads(s.stdout)["modalities"] == ["text", "image"]
    d = cli("doctor", "--no-check")
    assert "images and audio: yes" in d.stdout


def test_bad_input_at_the_command_line(cli: CLI, mm: dict[str, Path], tmp_path: Path, smollm2_path: Path) -> None:
    pic = str(mm["96x64"])
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(_png_header(64, 64, b"garbage" * 10))
    clip = tmp_path / "clip.wav"
    clip.write_bytes(_wav(1.0))
    notes = tmp_path / "notes.txt"
    notes.write_text("not a projector\n")
    cases = [
        (["--image", pic], "reads text only: it has no multimodal projector"),
        (["--mmproj", str(mm["wide"]), "--image", pic], "makes embeddings of 640 values, but smollm2:135m takes 576"),
        (["--mmproj", str(smollm2_path), "--image", pic], "not a multimodal projector"),
        (["--mmproj", str(mm["proj"]), "--image", str(corrupt)], "corrupt or unreadable PNG"),
        (["--mmproj", str(mm["proj"]), "-a", str(clip)], "reads images, not audio"),
        (["--mmproj", str(mm["proj"]), "--image", str(clip)], "is WAV audio: attach it with -a"),
        (["--mmproj", str(mm["proj"]), "--image", str(tmp_path / "missing.png")], "no such file"),
        (["--mmproj", str(mm["proj"]), "--image", "http://127.0.0.1:9/pic.png"],
         "no such file (--image takes a file; -a takes an http(s) URL)"),
        (["--mmproj", str(mm["proj"]), "--image", pic, "--raw"], "cannot be combined with --raw"),
        (["--mmproj", "/dev/null", "--image", pic], "the projector /dev/null is not a regular file"),  # (it said
        # "no such projector file" of a path that is there)
        (["--mmproj", str(notes), "--image", pic], "is not a GGUF file (wrong magic bytes) (give --mmproj the mmproj"),
    ]
    not_a_projector = {str(smollm2_path), str(notes)}  # no projector's GGUF: exit 1, as a model file's (ci.md)
    for extra, words in cases:
        r = cli("run", "-p", "Describe it.", "-n", "4", *extra)
        assert r.returncode == (1 if not_a_projector & set(extra) else 2), (extra, r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (extra, r.stderr)
        assert "Traceback" not in r.stderr


def test_a_picture_for_a_model_without_a_chat_template_is_a_usage_error(cli: CLI, mm: dict[str, Path]) -> None:
    """media.md: bad input is one line and exit 2. Gemma 3 270M (a base model, no template) with a projector of its
    width: a picture needs the template (it was exit 1, and `which images and audio needs`)."""
    r = cli("run", "-m", "gemma3:270m", "--mmproj", str(mm["wide"]), "--image", str(mm["96x64"]), "-p", "hi", "-n", "2")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "gemma3:270m has no chat template (it may be a base model), which images and audio need (" in r.stderr


def test_attach_stdin_on_a_terminal_is_refused_at_once(cli_env: dict[str, str], mm: dict[str, Path]) -> None:
    """`-a -` with stdin a terminal: one line and exit 2 before anything loads, not a wait for a picture typed in."""
    import pexpect

    from tests import terminal

    child = terminal.spawn(dict(cli_env), ["run", "--mmproj", str(mm["proj"]), "-a", "-", "-p", "hi", "-n", "4"],
                           timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2, child.before
    assert "-a - reads a picture or clip from stdin, but stdin is this terminal" in child.before
    assert child.before.strip().count("\n") == 0, child.before


def test_an_attachment_over_the_bound_says_how_much(tmp_path: Path) -> None:
    """stdin is read only up to one byte past the bound: it is "larger than 64 MiB", never "64 MiB; at most 64"; a
    file's size is known, to a tenth of a MiB."""
    from localgen import media

    with pytest.raises(media.MediaError) as e:
        media.read("-", stdin=_Bytes(bytes(media.MAX_BYTES + 2)))
    assert e.value.message == "stdin is larger than 64 MiB; an attachment may be at most 64 MiB", e.value.message
    big = tmp_path / "big.png"
    with big.open("wb") as f:
        f.truncate(media.MAX_BYTES + 300 * 1024)  # sparse: 64.3 MiB on paper, nothing on disk
    with pytest.raises(media.MediaError) as e:
        media.read(str(big))
    assert e.value.message == f"{big} is 64.3 MiB; an attachment may be at most 64 MiB", e.value.message


def test_the_seeded_projectors_and_media_come_from_the_script_s_command_line(tmp_path: Path) -> None:
    """media.md: `scripts/make_mmproj.py` writes both projectors the tests use, the picture and the clip, the same
    bytes as the tests' own (seeded); a bad size is a usage error."""
    import subprocess

    from make_mmproj import wav

    page = (ROOT / "docs" / "media.md").read_text(encoding="utf-8")
    script = str(ROOT / "scripts" / "make_mmproj.py")
    made = {"vision": (["v.gguf"], write_mmproj(tmp_path / "v0.gguf").read_bytes()),
            "audio": (["--audio", "a.gguf"], write_audio_mmproj(tmp_path / "a0.gguf").read_bytes()),
            "png": (["--png", "p.png"], png(96, 64)), "wav": (["--wav", "c.wav"], wav(1.5))}
    for args, data in made.values():
        assert f"scripts/make_mmproj.py {' '.join(args[:-1]) + ' ' if args[:-1] else ''}" in page, args
        r = subprocess.run([sys.executable, script, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / args[-1]).read_bytes() == data, args
    r = subprocess.run([sys.executable, script, "--png", "x.png", "--size", "96"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--size takes WIDTHxHEIGHT" in r.stderr and "Traceback" not in r.stderr


def test_ultravox_s_own_stack_factor_is_one_line_from_llama_cpp(cli: CLI, mm: dict[str, Path], tmp_path: Path) -> None:
    """media.md: with Ultravox's own stack factor (8) this llama.cpp aborts on a 30-second window; localgen says so
    in one line (`llama.cpp stopped: Invalid number of output tokens`), no trace of the abort."""
    proj = write_audio_mmproj(tmp_path / "stack8.gguf", stack=8)
    r = cli("run", "--mmproj", str(proj), "-a", str(mm["1.5s"]), "-p", "hi", "-n", "2")
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == "localgen: error: llama.cpp stopped: Invalid number of output tokens", r.stderr
    assert "`llama.cpp stopped: Invalid number of output tokens`" in (ROOT / "docs" / "media.md").read_text()


def test_serve_refuses_one_projector_for_several_models_before_loading(cli_in_process: InProcessCLI,
                                                                        mm: dict[str, Path]) -> None:
    """`serve --mmproj` pairs a projector with *the* model: with two -m it is bad usage at once, not an error after
    the first model (which the projector fits) has loaded."""
    r = cli_in_process("serve", "--port", "9", "--mmproj", str(mm["proj"]), "-m", "smollm2:135m", "-m", "gemma3:270m")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("localgen: error: --mmproj pairs a projector with one model, and -m names 2")
    assert r.stderr.count("\n") == 1 and "loading" not in r.stderr and "loaded" not in r.stderr


def test_second_turn_does_not_encode_the_image_again(smollm2_engine: Any, mm: dict[str, Path]) -> None:
    import dataclasses

    from localgen import media
    from localgen.engine.local import LocalBackend
    from localgen.types import GenerationRequest, SamplingParams

    eng = smollm2_engine
    eng.model = dataclasses.replace(eng.model, mmproj=str(mm["proj"]))
    backend = LocalBackend(eng)
    try:
        pic = media.read(str(mm["96x64"]))
        turn1 = ({"role": "user", "content": media.content("What is in this picture?", [pic])},)
        req = GenerationRequest(messages=turn1, sampling=SamplingParams(temperature=0.0, max_tokens=8, seed=1))
        g1 = backend.generate(req)
        a1 = "".join(c.text for c in g1)
        turn2 = (*turn1, {"role": "assistant", "content": a1}, {"role": "user", "content": "And the colours?"})
        g2 = backend.generate(dataclasses.replace(req, messages=turn2))
        "".join(c.text for c in g2)
        assert g1.stats.media_tokens == g2.stats.media_tokens == 16
        assert g1.stats.encode_s > 0 and g2.stats.encode_s == 0  # turn 2 found the image in the KV cache
        assert g2.stats.cached_tokens >= g1.stats.prompt_tokens
        g3 = backend.generate(dataclasses.replace(req, messages=({**turn1[0], "content": media.content(
            "What is in this picture?", [media.read(str(mm["64x64"]))])},)))  # another picture: encoded
        "".join(c.text for c in g3)
        assert g3.stats.encode_s > 0 and g3.stats.cached_tokens < g3.stats.prompt_tokens - 16  # the text before it
    finally:
        if backend._projector is not None:
            backend._projector.close()
        eng.model = dataclasses.replace(eng.model, mmproj=None)
        eng.kv.clear()


# media.md: what a cache keeps of a picture is tied to the projector file (after `--mmproj` changed, the cached
# picture's positions were taken for the new projector's: serve's prefix store and `chat --resume` answered
# with the old one's embeddings)
def test_another_projector_encodes_the_cached_picture_again(smollm2_engine: Any, mm: dict[str, Path],
                                                            tmp_path: Path) -> None:
    import dataclasses

    from localgen import media
    from localgen.engine.local import LocalBackend
    from localgen.types import GenerationRequest, SamplingParams

    other = write_mmproj(tmp_path / "other.gguf", seed=7)
    pic = media.read(str(mm["96x64"]))
    req = GenerationRequest(messages=({"role": "user", "content": media.content("What is in this picture?", [pic])},),
                            sampling=SamplingParams(temperature=0.0, max_tokens=8, seed=1))
    eng = smollm2_engine

    def answer(projector: Path) -> tuple[str, Any]:
        eng.model = dataclasses.replace(eng.model, mmproj=str(projector))
        backend = LocalBackend(eng)
        try:
            g = backend.generate(req)
            return "".join(c.text for c in g), g.stats
        finally:
            if backend._projector is not None:
                backend._projector.close()

    try:
        eng.kv.clear()
        cold = answer(other)[0]
        eng.kv.clear()
        answer(mm["proj"])  # the picture's positions now in the cache, by the first projector
        text, stats = answer(other)
        assert stats.encode_s > 0 and stats.cached_tokens < stats.prompt_tokens - 16  # the text before it only
        assert text == cold
    finally:
        eng.model = dataclasses.replace(eng.model, mmproj=None)
        eng.kv.clear()


def test_a_projector_rewritten_with_its_old_mtime_is_another(tmp_path: Path) -> None:
    """media.md: a picture is never answered from another projector's encoding. A red team's: a file of the same
    size rewritten in place, its mtime set back (`cp -p`, `touch -d`, `rsync -t`), was taken for the old one; a
    sample of its bytes tells them apart (localgen/fileid.py: the model file's and a LoRA's identities likewise)."""
    import os
    import time

    from localgen.engine.adapters import identity
    from localgen.engine.llama import _file_identity
    from localgen.native.mtmd import _projector_identity

    path = tmp_path / "p.gguf"
    path.write_bytes(b"a" * 64)
    st = path.stat()
    before = _projector_identity(str(path)), _file_identity(path), identity(((str(path), 1.0),))
    time.sleep(0.01)
    path.write_bytes(b"b" * 64)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    after = _projector_identity(str(path)), _file_identity(path), identity(((str(path), 1.0),))
    assert all(a != b for a, b in zip(before, after, strict=True)), (before, after)


@pytest.fixture(scope="module")
def vserver(cli_env: dict[str, str], mm: dict[str, Path]) -> Iterator[Any]:
    from tests.test_serve import Server

    s = Server(cli_env, "--mmproj", str(mm["proj"]), "-np", "2", "--ctx", "1024", "--threads", str(REFERENCE_THREADS))
    yield s
    s.stop()


def test_a_projector_that_will_not_load_is_the_servers_500(cli_env: dict[str, str], mm: dict[str, Path],
                                                           tmp_path: Path) -> None:
    """serve's own projector removed (or replaced by another) after it started: the first picture is a 500, a
    server error (it was a 400 invalid_request_error with libmtmd's log line: no fault of the client's)."""
    import shutil

    from tests.test_serve import Server

    projector = shutil.copy(mm["proj"], tmp_path / "gone.gguf")
    s = Server(cli_env, "--mmproj", str(projector), "-np", "1", "--ctx", "1024", "--no-webui")
    try:
        Path(projector).unlink()
        url = "data:image/png;base64," + base64.b64encode(mm["96x64"].read_bytes()).decode()
        r = httpx.post(f"{s.url}/v1/chat/completions", timeout=120, json={
            "model": "smollm2:135m", "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is it?"}]}]})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text
        assert "could not load the projector" in r.json()["error"]["message"], r.text
    finally:
        s.stop()


def test_serve_images_through_the_openai_and_ollama_clients(vserver: Any, mm: dict[str, Path]) -> None:
    import ollama
    import openai

    case = FIXTURE[0]
    pic = mm[case["media"][0]].read_bytes()
    url = "data:image/png;base64," + base64.b64encode(pic).decode()
    client = openai.OpenAI(base_url=f"{vserver.url}/v1", api_key="none")
    out = client.chat.completions.create(
        model="smollm2:135m", temperature=0, max_tokens=case["max_tokens"], extra_body={"exact": True},
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                {"type": "text", "text": case["prompt"]}]}])
    first = str(out.choices[0].message.content)
    same_text_as_reference(first, case["text"])  # `run`'s answer, which is llama-mtmd-cli's
    o = ollama.Client(host=vserver.url).chat(
        model="smollm2:135m", options={"temperature": 0, "num_predict": case["max_tokens"], "exact": True},
        messages=[{"role": "user", "content": case["prompt"], "images": [pic]}])
    g = httpx.post(f"{vserver.url}/api/generate", timeout=60, json={
        "model": "smollm2:135m", "prompt": case["prompt"], "images": [base64.b64encode(pic).decode()],
        "stream": False, "options": {"temperature": 0, "num_predict": case["max_tokens"], "exact": True}})
    b64 = base64.b64encode(pic).decode()
    r = client.responses.create(  # the Responses API's input_image, and Anthropic's image block: the same answer
        model="smollm2:135m", temperature=0, max_output_tokens=case["max_tokens"], extra_body={"exact": True},
        input=[{"role": "user", "content": [{"type": "input_image", "image_url": url, "detail": "auto"},
                                            {"type": "input_text", "text": case["prompt"]}]}])
    a = httpx.post(f"{vserver.url}/v1/messages", timeout=60, json={
        "model": "smollm2:135m", "max_tokens": case["max_tokens"], "temperature": 0, "exact": True,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
            {"type": "text", "text": case["prompt"]}]}]})
    assert a.status_code == 200, a.text
    # the same answer from each API (on a GPU, within its near ties: an H200's Ollama chat parted from the OpenAI
    # one after 40 characters, each request alone but its prompt's cached prefix evaluated in other shapes)
    assert_same_greedy_text([str(o.message.content), g.json()["response"], r.output_text,
                             a.json()["content"][0]["text"]], [first] * 4, "each API's answer to the same image")
    # two at once, batched (the throughput scheduler evaluates each slot's image into its own sequence)
    import concurrent.futures

    def ask(_: int) -> str:
        r = client.chat.completions.create(
            model="smollm2:135m", temperature=0, max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                    {"type": "text", "text": case["prompt"]}]}])
        return str(r.choices[0].message.content)

    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        answers = list(ex.map(ask, range(2)))
    assert answers[0] == answers[1] and answers[0]


def test_serve_refuses_bad_media_and_stays_up(vserver: Any) -> None:
    def part(url: str) -> dict[str, Any]:
        return {"model": "smollm2:135m", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is it?"}]}]}

    b64 = lambda data: "data:image/png;base64," + base64.b64encode(data).decode()  # noqa: E731
    cases = [
        (part("http://127.0.0.1:9/cat.png"), "--allow-image-urls"),
        (part(b64(_png_header(100_000, 100_000))), "megapixels"),
        (part(b64(_png_header(64, 64, b"garbage" * 10))), "corrupt or unreadable PNG"),
        (part("data:image/png;base64,!!!"), "not valid base64"),
        (part(b64(b"II*\x00" + b"\0" * 16)), "TIFF"),
        ({"model": "smollm2:135m", "messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": base64.b64encode(_wav(1)).decode(), "format": "wav"}}]}]},
         "reads images, not audio"),
        ({"model": "smollm2:135m", "messages": [{"role": "user", "content": [{"type": "video", "x": 1}]}]},
         "unsupported content part type"),
    ]
    for body, words in cases:
        r = httpx.post(f"{vserver.url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, (words, r.text)
        assert words in r.json()["error"]["message"]
    r = httpx.post(f"{vserver.url}/api/chat", json={"model": "smollm2:135m", "stream": False, "messages": [
        {"role": "user", "content": "hi", "images": ["not base64!"]}]}, timeout=60)
    assert r.status_code == 400 and "base64" in r.text
    r = httpx.post(f"{vserver.url}/api/chat", json={"model": "smollm2:135m", "stream": False, "messages": [
        {"role": "user", "content": "hi", "images": [base64.b64encode(_wav(1)).decode()]}]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"].endswith("is WAV audio, where an image goes"), r.text
    assert "image_url" not in r.text  # an Ollama client sent no image_url part
    small = base64.b64encode(png(8, 8)).decode()
    r = httpx.post(f"{vserver.url}/api/generate", json={"model": "smollm2:135m", "stream": False, "raw": True,
                                                        "prompt": "hi", "images": [small]},
                   timeout=60)  # a raw prompt has no place for the picture: refused, not silently dropped
    assert r.status_code == 400 and "cannot go with a raw prompt" in r.text
    assert httpx.get(f"{vserver.url}/health", timeout=5).status_code == 200


def wrappable(words: str) -> str:
    """A pattern for `words` where the terminal may have wrapped the line between any two (the message holds a
    path, as long as the temporary folder's): the break, and the colour codes around it."""
    return r"(?:\s|\x1b\[[0-9;]*m)+".join(re.escape(w) for w in words.split())


def test_chat_attaches_images_and_keeps_them_in_the_cache(cli_env: dict[str, str], home: Path,
                                                          mm: dict[str, Path]) -> None:
    from tests.test_chat import PROMPT, send, spawn

    child = spawn(cli_env, "picchat", "--mmproj", str(mm["proj"]), "-n", "8", "--temp", "0")
    send(child, f"/image {mm['96x64']}", "will be sent with your next message")
    send(child, "What is in this picture?", r"tok/s")
    send(child, f"'{mm['64x64']}'", r"attached pic-64x64\.png \(image, 64×64\)")  # a file dropped on the terminal
    send(child, "And this one?", r"tok/s")
    out = send(child, "/stats", r"stop: ")
    assert "media 32 tokens" in out and "cached)" in out  # the first picture came from the KV cache
    send(child, "/audio " + str(mm["96x64"]), wrappable("is an image: use /image"))
    spaced = mm["96x64"].with_name("my photo.png")
    spaced.write_bytes(mm["96x64"].read_bytes())
    send(child, "/image " + str(spaced).replace(" ", "\\ "), r"my photo\.png \(image, 96×64\) will be sent")
    gone = str(mm["96x64"].with_name("gone.png"))
    child.sendline(gone)  # a dropped file that is not there: not an unknown /command, nor text for the model
    assert child.expect(["no such file", "unknown command", "tok/s"]) == 0, child.before
    child.expect_exact(PROMPT)
    send(child, "/detach", "dropped 1 attachment")
    child.sendline("/exit")
    child.expect(pexpect_eof())
    saved = json.loads((home / "data" / "chats" / "picchat.json").read_text())
    kinds = [p["type"] for m in saved["messages"] if isinstance(m["content"], list) for p in m["content"]]
    assert kinds.count("image_url") == 2
    child = spawn(cli_env, "--resume", "picchat", "--mmproj", str(mm["proj"]), "-n", "8", "--temp", "0")
    send(child, "Which was brighter?", r"tok/s")  # the resumed history still holds both pictures
    out = send(child, "/stats", r"stop: ")
    assert "media 32 tokens" in out
    child.sendline("/exit")
    child.expect(pexpect_eof())


def test_audio_through_serve_and_chat(cli_env: dict[str, str], home: Path, mm: dict[str, Path]) -> None:
    import openai

    from tests.test_chat import send, spawn
    from tests.test_serve import Server

    case = next(c for c in FIXTURE if c["media"] == ["1.5s"])
    sound = mm["1.5s"].read_bytes()
    server = Server(cli_env, "--mmproj", str(mm["audio"]), "--ctx", "1024", "--threads", str(REFERENCE_THREADS))
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
        out = client.chat.completions.create(
            model="smollm2:135m", temperature=0, max_tokens=case["max_tokens"],
            extra_body={"exact": True, "ignore_eos": True},
            messages=[{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(sound).decode(), "format": "wav"}},
                {"type": "text", "text": case["prompt"]}]}])
        same_text_as_reference(out.choices[0].message.content.strip(), case["text"])  # llama-mtmd-cli's (stripped)
        url = "data:image/png;base64," + base64.b64encode(mm["96x64"].read_bytes()).decode()
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": "smollm2:135m", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}]}]})
        assert r.status_code == 400 and "reads audio, not images" in r.json()["error"]["message"]
    finally:
        server.stop()
    child = spawn(cli_env, "soundchat", "--mmproj", str(mm["audio"]), "-n", "4", "--temp", "0", "--ignore-eos")
    send(child, f"/image {mm['1.5s']}", wrappable("is audio: use /audio"))
    send(child, f"/image {mm['96x64']}", r"reads audio, not images")  # said at once, not when the message goes
    send(child, f"{mm['96x64']}", r"reads audio, not images")  # dropped on the terminal
    send(child, f"/audio {mm['1.5s']}", r"will be sent with your next message")
    send(child, "What do you hear?", r"tok/s")
    out = send(child, "/stats", r"stop: ")
    assert "media 375 tokens" in out and "encoded in" in out
    child.sendline("/exit")
    child.expect(pexpect_eof())
    saved = json.loads((home / "data" / "chats" / "soundchat.json").read_text())
    assert [p["type"] for p in saved["messages"][0]["content"]] == ["input_audio", "text"]


def test_chat_drops_a_picture_the_decoder_cannot_read(cli_env: dict[str, str], home: Path, mm: dict[str, Path],
                                                      tmp_path: Path) -> None:
    """A PNG whose header is sound and whose rows carry a filter byte PNG lacks fails its message when it goes:
    it is dropped (said, with what stays attached), so the next message is not refused for it again."""
    from tests.test_chat import send, spawn

    bad = tmp_path / "badfilter.png"
    bad.write_bytes(_png_header(96, 64, zlib.compress((b"\x09" + bytes(288)) * 64)))
    child = spawn(cli_env, "badpic", "--mmproj", str(mm["proj"]), "-n", "4", "--temp", "0")
    send(child, f"/image {mm['64x64']}", "will be sent with your next message")
    send(child, f"/image {bad}", "will be sent with your next message")
    out = send(child, "What is in it?", wrappable("1 other attachment stays attached"))
    assert re.search(wrappable("is a corrupt or unreadable PNG image"), out), out  # the path's length may wrap it
    assert re.search(wrappable("dropped badfilter.png"), out), out
    send(child, "And now?", r"tok/s")  # the good picture went with it
    out = send(child, "/stats", r"stop: ")
    assert "media 16 tokens" in out, out
    child.sendline("/exit")
    child.expect(pexpect_eof())


def test_piped_chat_attaches_a_dropped_path_and_refuses_image_from_stdin(cli: CLI, mm: dict[str, Path]) -> None:
    """A piped script's line that is only a picture's path attaches it, as a terminal's does (it was an unknown
    command); `/image -` is one line saying why (it read the rest of the script as the picture's bytes)."""
    r = cli("chat", "--mmproj", str(mm["proj"]), "-n", "2", "--temp", "0",
            input=f"{mm['64x64']}\nWhat is it?\n/stats\n")
    assert r.returncode == 0 and "attached pic-64x64.png (image, 64×64)" in r.stderr, r.stderr
    assert "media 16 tokens" in r.stderr
    r = cli("chat", "--mmproj", str(mm["proj"]), "-n", "2", input="/image -\nhello there\n")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "localgen: error: /image takes a file path or an http(s) URL, not - (stdin): the chat reads your messages "
        "from there (save it to a file and give /image its path)"], r.stderr
    # a script's line that names no file is its text, and so is a path in a """ block (a review found both ended
    # the chat with "no such file")
    r = cli("chat", "notpaths", "-n", "2", input=f'./build made out.png\n"""\n{mm["64x64"]}\n"""\nhi\n')
    assert r.returncode == 0 and "attached" not in r.stderr, r.stderr
    saved = Path(cli.env["LOCALGEN_HOME"]) / "data" / "chats" / "notpaths.json"
    sent = [m["content"] for m in json.loads(saved.read_text())["messages"] if m["role"] == "user"]
    assert sent == ["./build made out.png", str(mm["64x64"]), "hi"], sent


def pexpect_eof() -> Any:
    import pexpect

    return pexpect.EOF


def test_a_servers_requests_never_name_each_others_media() -> None:
    """serve reads media for many clients in one process: a name one request gave its bytes (Anthropic's
    source.data, a URL it fetched, which may be signed) never names the same bytes sent by another request."""
    from localgen import media
    from localgen.serve import anthropic
    from localgen.serve.apierror import HTTPError
    from localgen.serve.incoming import messages

    picture = png(8, 8)
    b64 = base64.b64encode(picture).decode()
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}}
    url = "https://example.com/signed.png?token=s3cret"
    messages([{"role": "user", "content": [image]}], inline=anthropic.INLINE)
    messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}], allow_urls=True,
             fetched={url: media.sniff(picture, url)})
    with pytest.raises(HTTPError) as e:  # the same bytes where audio goes: the error names them
        messages([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": b64}}]}])
    assert e.value.message.startswith("base64 data is a PNG image"), e.value.message


def test_a_picture_with_no_text_is_a_prompt(cli: CLI, mm: dict[str, Path]) -> None:
    """run.md: with --image, the text may be empty or left out: the picture is the prompt (it was "no prompt")."""
    for text in (["-p", ""], ["-p", "  "], []):
        r = cli("run", "--mmproj", str(mm["proj"]), "--image", str(mm["96x64"]), *text, "-n", "4", "--ignore-eos",
                "--temp", "0", "--json")
        assert r.returncode == 0, (text, r.stderr)
        doc = json.loads(r.stdout)
        assert doc["stats"]["media_tokens"] == 16 and doc["stats"]["completion_tokens"] == 4, doc


def test_a_final_assistant_image_closes_the_turn(vserver: Any) -> None:
    """api.md: a final assistant message with an image is a closed turn, not continued (an answer cannot go on
    from a picture, whose tokens give no logits): on each chat route, an answer, where it was a 500."""
    b64 = base64.b64encode(png(8, 8)).decode()
    url = "data:image/png;base64," + b64
    asks = [("/v1/chat/completions", {"model": "smollm2:135m", "max_tokens": 3, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}),
            ("/v1/messages", {"model": "smollm2:135m", "max_tokens": 3, "messages": [
                {"role": "user", "content": "hi"}, {"role": "assistant", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]}]}),
            ("/api/chat", {"model": "smollm2:135m", "stream": False, "options": {"num_predict": 3}, "messages": [
                {"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "images": [b64]}]}),
            ("/v1/responses", {"model": "smollm2:135m", "max_output_tokens": 16, "input": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "input_image", "image_url": url}]}]})]
    for path, body in asks:
        r = httpx.post(f"{vserver.url}{path}", json=body, timeout=60)
        assert r.status_code == 200, (path, r.text)


def test_an_anthropic_tool_results_image_reaches_the_model(vserver: Any) -> None:
    """api.md: a tool_result's image blocks go to the model with its text (a screenshot a tool returned), not
    dropped: the prompt is longer by the image's tokens, as a user's image block makes it."""
    b64 = base64.b64encode(png(8, 8)).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}

    def tokens(result: list[dict[str, Any]], user: list[dict[str, Any]] | None = None) -> int:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": user or "look"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result}]}]
        r = httpx.post(f"{vserver.url}/v1/messages", timeout=60,
                       json={"model": "smollm2:135m", "max_tokens": 1, "messages": messages})
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["input_tokens"])

    text = [{"type": "text", "text": "shot"}]
    plain = tokens(text)
    one_image = tokens(text, [image, {"type": "text", "text": "look"}]) - plain  # a user's image, counted
    assert one_image > 0
    assert tokens([image, *text]) - plain == one_image


def test_a_corrupt_images_error_names_the_requests_own_field(vserver: Any) -> None:
    """api.md: an image's faults are 400s naming the request's field: `messages` on chat completions, `input` on
    Responses (also for a fault found as the picture is decoded, in the model's thread), and Anthropic's
    `source.data` in the message."""
    bad = _png_header(96, 64, zlib.compress((b"\x09" + b"\0" * 288) * 64))  # a row filter PNG has not
    url = "data:image/png;base64," + base64.b64encode(bad).decode()
    r = httpx.post(f"{vserver.url}/v1/chat/completions", timeout=60, json={"model": "smollm2:135m", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    for part in ({"type": "input_image", "image_url": url},
                 {"type": "input_image", "image_url": "http://127.0.0.1:9/x.png"}):
        r = httpx.post(f"{vserver.url}/v1/responses", timeout=60, json={"model": "smollm2:135m", "input": [
            {"role": "user", "content": [part, {"type": "input_text", "text": "hi"}]}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
    r = httpx.post(f"{vserver.url}/v1/messages", timeout=60, json={"model": "smollm2:135m", "max_tokens": 4,
                                                                    "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(bad).decode()}}]}]})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("an image block's source.data "), r.text


def test_run_reads_attachments_in_the_order_given_whatever_their_flags(cli: CLI, mm: dict[str, Path]) -> None:
    """media.md: the pictures go to the model in the command line's order. `-a FIRST --image SECOND` is the
    reference's `--image FIRST --image SECOND` (every --image went first, then -a: the two were swapped)."""
    case = next(c for c in FIXTURE if len(c["media"]) == 2)
    first, second = (str(mm[name]) for name in case["media"])
    r = cli("run", "--mmproj", str(mm["proj"]), "--temp", "0", "-n", str(case["max_tokens"]), "--ignore-eos",
            "-p", case["prompt"], "--threads", str(REFERENCE_THREADS), "-a", first, "--image", second)
    assert r.returncode == 0, r.stderr
    same_text_as_reference(r.stdout.strip(), case["text"], made_on=case.get("cpu"))
