#!/usr/bin/env python3
"""localgen against llama.cpp's llama-mtmd-cli on the same files: SmolLM2-135M with the seeded random-weight
projector of scripts/make_mmproj.py, greedy, so both must write the same text for the same picture and
prompt (the plumbing: preprocessing, encode, positions, decoding). Build llama-mtmd-cli from the same
vendored sources with `../shared/tools/build-llama-bench --with llama-mtmd-cli`.

    scripts/mtmd_reference.py --cli PATH            compare, case by case
    scripts/mtmd_reference.py --cli PATH --write    store llama-mtmd-cli's texts in tests/data (CI compares
                                                    localgen with that file; it does not build the CLI)
    scripts/mtmd_reference.py --cli PATH --bench    end-to-end time, one image and 64 tokens, each tool
                                                    started afresh (-r runs each), with a larger projector
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "llama_mtmd_cli.json"
sys.path.insert(0, str(ROOT / "scripts"))

from make_mmproj import png, write_mmproj  # noqa: E402

# (pictures by size, prompt, tokens)
CASES = [
    (["96x64"], "What is in this picture?", 32),
    (["200x120"], "Describe the colours.", 24),
    (["96x64", "64x64"], "Compare the two pictures.", 24),
]


def smollm2() -> str:
    from localgen.models import embedded

    return str(embedded.locate(embedded.EMBEDDED["smollm2:135m"]))


def materials(folder: Path) -> tuple[Path, dict[str, Path]]:
    """The projector and the pictures every case uses."""
    proj = write_mmproj(folder / "proj.gguf")
    pics = {}
    for size in sorted({s for c in CASES for s in c[0]}):
        w, h = (int(v) for v in size.split("x"))
        pics[size] = folder / f"pic-{size}.png"
        pics[size].write_bytes(png(w, h))
    return proj, pics


def cli_text(cli: str, proj: Path, images: list[Path], prompt: str, n: int) -> str:
    args = [cli, "-m", smollm2(), "--mmproj", str(proj), "--jinja", "--temp", "0", "-n", str(n), "-p", prompt]
    for img in images:
        args += ["--image", str(img)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=300)
    return out.stdout.strip()


def localgen_cmd(proj: Path, images: list[Path], prompt: str, n: int) -> list[str]:
    args = [sys.executable, "-m", "localgen", "run", "--mmproj", str(proj), "--temp", "0", "-n", str(n), "-p", prompt]
    for img in images:
        args += ["--image", str(img)]
    return args


def localgen_text(proj: Path, images: list[Path], prompt: str, n: int) -> str:
    out = subprocess.run(localgen_cmd(proj, images, prompt, n), capture_output=True, text=True, check=True,
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
        ours = [*localgen_cmd(proj, [pic], prompt, 64), "--ignore-eos"]
        times: dict[str, list[float]] = {"llama-mtmd-cli": [], "localgen": []}
        for _ in range(runs):
            for name, args in (("llama-mtmd-cli", cli_args), ("localgen", ours)):
                t0 = time.perf_counter()
                subprocess.run(args, capture_output=True, check=True, timeout=300)
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in med.items():
            print(f"{k:15} median {v:.3f} s over {runs} runs (min {min(times[k]):.3f} s)")
        print(f"localgen is {med['llama-mtmd-cli'] / med['localgen']:.3f}x llama-mtmd-cli's speed, end to end "
              "(one 640x480 image, 64 tokens, process start included)")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", required=True, help="llama-mtmd-cli built from the same sources")
    ap.add_argument("--write", action="store_true", help="store llama-mtmd-cli's texts as the test fixture")
    ap.add_argument("--bench", action="store_true", help="time one image and 64 tokens end to end")
    ap.add_argument("-r", "--runs", type=int, default=5)
    a = ap.parse_args(argv)
    if a.bench:
        bench(a.cli, a.runs)
        return 0
    rows, same = [], 0
    with tempfile.TemporaryDirectory() as d:
        proj, pics = materials(Path(d))
        for sizes, prompt, n in CASES:
            images = [pics[s] for s in sizes]
            theirs = cli_text(a.cli, proj, images, prompt, n)
            ours = localgen_text(proj, images, prompt, n)
            same += theirs == ours
            print(f"{'same' if theirs == ours else 'DIFFERENT'}: {sizes} {prompt!r}\n  llama-mtmd-cli: {theirs!r}\n"
                  f"  localgen:       {ours!r}")
            rows.append({"images": sizes, "prompt": prompt, "max_tokens": n, "text": theirs})
    print(f"{same} of {len(CASES)} cases the same")
    if a.write:
        FIXTURE.write_text(json.dumps({"generated_by": "scripts/mtmd_reference.py --write", "cases": rows},
                                      indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {FIXTURE}")
    return 0 if same == len(CASES) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
