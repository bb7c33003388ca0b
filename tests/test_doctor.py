"""docs/doctor.md, the sentences no other test held: `--no-check` prints the machine and the build and loads
nothing, the GPU line says why it found none, the CPU line's thread counts are the ones the check's load used,
the `settings` line says where each setting came from (a tuning record, or the rule), and `doctor -m PRESET`
loads with the preset's placement, a flag over it. Elsewhere: the GPU lines (tests/test_promises.py), `--rpc`
(tests/test_rpc.py), `-m` and the placement flags (tests/test_fit.py, tests/test_audit_run_chat.py), the media
line (tests/test_media.py), the check on a GPU (tests/test_native.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, NO_GPU, ROOT
from tests.test_tune import _record, _ref


def _lines(stdout: str) -> dict[str, str]:
    """doctor's lines by their first word (`CPU`, `check`, `settings`, ...)."""
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1].strip() for line in stdout.splitlines() if " " in line}


def test_no_check_prints_the_machine_and_the_build_and_loads_nothing(cli_env: dict[str, str], tmp_path: Path) -> None:
    """doctor.md: "`--no-check` skips the test load and generation"; with no `nvidia-smi` the GPU line says so."""
    nothing = tmp_path / "bin"
    nothing.mkdir()
    r = subprocess.run([sys.executable, "-m", "localgen", "doctor", "--no-check"],
                       env={**cli_env, "PATH": str(nothing)}, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    said = _lines(r.stdout)
    assert list(said) == ["localgen", "CPU", "RAM", "GPU", "build", "features", "media"], r.stdout
    assert said["GPU"].startswith("none found (no nvidia-smi"), said["GPU"]
    assert re.fullmatch(r"llama-cpp-python [\d.]+ · GPU offload: (yes|no \(CPU-only build\)) · mmap: (yes|no) · "
                        r"RPC: (yes|no)", said["build"]), said["build"]
    assert "CPU :" in said["features"] and ("AVX" in said["features"] or "NEON" in said["features"]), said["features"]
    assert r.stderr == "", "nothing loaded, nothing to say: no check, placement or settings line either"


def _doctor_in(cli_env: dict[str, str], home: Path, blocked: str) -> subprocess.CompletedProcess[str]:
    """`doctor --no-check` in a home whose folder `blocked` is a file (a read-only disk, another user's folder,
    alike)."""
    home.mkdir()
    (home / blocked).write_text("x\n")
    return subprocess.run([sys.executable, "-m", "localgen", "doctor", "--no-check"],
                          env={**cli_env, "LOCALGEN_HOME": str(home)}, capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_a_home_localgen_cannot_write_is_a_problem(cli_env: dict[str, str], tmp_path: Path) -> None:
    """doctor said all was well (exit 0) where chats, the log, presets and Gemma's first use all fail."""
    home = tmp_path / "home"
    r = _doctor_in(cli_env, home, "data")
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"PROBLEM   localgen cannot write its files in {home / 'data'} ({home / 'data'} is a file, not a folder): "
            f"chats, the log, presets and models assembled on first use fail there (LOCALGEN_HOME is "
            f"{str(home)!r}: give a folder localgen can write, or unset it)") in r.stdout.splitlines(), r.stdout
    assert (home / "data").read_text() == "x\n"
    # the state folder holds what is kept where it can be (a prompt's history, tuning records): one that cannot be
    # written is no problem (it was one, exit 1, on a working install; so was a read-only config folder)
    r = _doctor_in(cli_env, tmp_path / "other", "state")
    assert r.returncode == 0 and "PROBLEM" not in r.stdout, r.stdout + r.stderr


def test_the_settings_line_says_where_each_setting_came_from(cli: CLI, tmp_path: Path, smollm2_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor.md: the `settings` line gives each tunable load setting of the test load and where it came from (a
    tuning record, or the rule), and the CPU line's thread counts are the ones generation and prompts use."""
    from localgen import tuning

    r = cli("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    said = _lines(r.stdout)
    threads = re.search(r"threads: (\d+) for generation \(physical performance cores\), (\d+) for prompts and "
                        r"batches \(logical CPUs usable\)", said["CPU"])
    assert threads, said["CPU"]
    assert (f"n_threads {threads[1]} (rule: physical cores) · n_threads_batch {threads[2]} (rule: usable cores)"
            in said["settings"]), said["settings"]
    assert "tuned on" not in said["settings"]

    home = tmp_path / "home"
    monkeypatch.setenv("LOCALGEN_HOME", str(home))
    tuning.save(_record(_ref(smollm2_path)))  # flash_attn off, repack off, 1 and 1 threads, n_ubatch 128
    # the record is the CPU's (a GPU's load has records of its own): doctor's test load on the CPU, on any machine
    r = CLI({**cli.env, "LOCALGEN_HOME": str(home), **NO_GPU})("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _lines(r.stdout)["settings"] == (
        "flash_attn off (tuned on 2026-11-25) · repack off (tuned on 2026-11-25) · n_threads 1 (tuned on 2026-11-25) "
        "· n_threads_batch 1 (tuned on 2026-11-25) · n_ubatch 128 (tuned on 2026-11-25)"), r.stdout


def test_a_record_made_on_a_busy_machine_is_said_once_on_the_settings_line() -> None:
    """doctor.md's settings line, of a record kept with --even-if-busy: its busy note was said in each of the five
    settings' origins (a newcomer's trial); it is said once, at the end."""
    from types import SimpleNamespace

    from localgen.cli.doctor import settings_line

    busy = " on a busy machine (62% of the CPU time just before measuring)"
    params = SimpleNamespace(flash_attn=True, repack=False, n_threads=1, n_threads_batch=1, n_ubatch=512)
    origins = {k: "tuned on 2026-11-25" + busy for k in ("flash_attn", "repack", "n_threads", "n_threads_batch")}
    assert settings_line(params, {**origins, "n_ubatch": "flag"}) == (
        "flash_attn on (tuned on 2026-11-25) · repack off (tuned on 2026-11-25) · n_threads 1 (tuned on 2026-11-25) · "
        "n_threads_batch 1 (tuned on 2026-11-25) · n_ubatch 512 (flag) · the record was made on a busy machine (62% "
        "of the CPU time just before measuring)")


def test_doctor_m_loads_a_presets_placement_and_a_flag_wins(cli: CLI, tmp_path: Path, moe_path: Path) -> None:
    """doctor.md: `doctor -m MODEL` loads it as `run` does, "with a preset's load settings, and with the placement
    flags"; the preset's n_cpu_moe puts two layers' experts in RAM, and `--n-cpu-moe 1` one."""
    lg = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")})
    r = lg("create", "moe-ram", "-f", "-", input=f"FROM {moe_path}\nPARAMETER n_cpu_moe 2\n")
    assert r.returncode == 0, r.stderr
    r = lg("doctor", "-m", "moe-ram")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    said = _lines(r.stdout)
    assert said["check"].startswith("moe-ram loaded in ") and said["check"].endswith(": ok"), said["check"]
    assert "6 tensors (6 of experts, 12.0 MiB) moved to CPU" in said["placement"], said["placement"]
    r = lg("doctor", "-m", "moe-ram", "--n-cpu-moe", "1")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "3 tensors (3 of experts, 6.0 MiB) moved to CPU" in _lines(r.stdout)["placement"], r.stdout


@pytest.mark.parametrize("variable", ["LOCALGEN_MODEL=smollm2:135m", "LOCALGEN_MODEL=/nowhere/gone.gguf",
                                      "LLAMA_ARG_N_CPU_MOE=2", "LLAMA_ARG_CPU_MOE=1",
                                      "LLAMA_ARG_OVERRIDE_TENSOR=exps=CPU"])
def test_no_check_under_an_exported_model_or_placement_variable_is_no_usage_error(cli_env: dict[str, str],
                                                                                  variable: str) -> None:
    """doctor.md: -m or a placement flag *typed* with --no-check is a usage error; LOCALGEN_MODEL and llama.cpp's
    LLAMA_ARG_* are defaults exported for every command (configuration.md), and were refused the same (exit 2)."""
    name, _, value = variable.partition("=")
    r = CLI({**cli_env, name: value})("doctor", "--no-check")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert list(_lines(r.stdout)) == ["localgen", "CPU", "RAM", "GPU", "build", "features", "media"], r.stdout
    r = CLI({**cli_env, name: value})("doctor", "--no-check", "-m", "smollm2:135m")
    assert r.returncode == 2 and r.stderr == (
        "localgen: error: -m says what --check loads; it means nothing with --no-check\n"), r.stderr


def test_doctor_reports_a_broken_catalogue_entry_and_goes_on(cli_env: dict[str, str], tmp_path: Path) -> None:
    """doctor.md: it reports everything, and "Exits 1 if anything needs fixing": a user models.toml whose entry of
    the model to check is not right is a PROBLEM line among the others, and the check is not run (it was one
    error, exit 2, and no CPU, RAM or build line). A typed -m of that name is its error still."""
    (tmp_path / "config").mkdir()
    path = tmp_path / "config" / "models.toml"
    path.write_text('[models."smollm2:135m"]\ncontext = "big"\n')
    lg = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path)})
    r = lg("doctor")
    assert r.returncode == 1 and r.stderr == "", r.stderr
    said = _lines(r.stdout)
    assert list(said) == ["localgen", "CPU", "RAM", "GPU", "build", "features", "media", "PROBLEM", "check"], r.stdout
    assert said["PROBLEM"] == (f"{path}: [models.\"smollm2:135m\"] context must be a whole number of tokens, not "
                               "'big' (smollm2:135m cannot be used until this is fixed)"), r.stdout
    assert said["check"] == "not run: smollm2:135m cannot be used until the catalogue is fixed", r.stdout
    r = lg("doctor", "-m", "smollm2:135m")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith(f"localgen: error: {path}: "), r.stderr
    r = lg("doctor", "--no-check")  # nothing loaded: the file needs fixing all the same (it said nothing, exit 0)
    assert r.returncode == 1 and list(_lines(r.stdout))[-1] == "PROBLEM", r.stdout
    r = CLI({**lg.env, "LOCALGEN_MODEL": "smollm2:135m@Q8_0"})("doctor")  # with its quantization: that entry still
    assert r.returncode == 1 and _lines(r.stdout)["check"].startswith("not run: smollm2:135m@Q8_0"), r.stdout


def test_doctor_reports_tuning_records_that_cannot_be_read(cli_env: dict[str, str], tmp_path: Path) -> None:
    """doctor.md: damaged tuning records (which `run` warns of, and none of which is used) are a PROBLEM line, exit
    1; doctor said nothing and exited 0, its settings line saying "rule" with no word why."""
    (tmp_path / "state").mkdir()
    path = tmp_path / "state" / "tuning.json"
    path.write_text("{bad")
    r = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path)})("doctor", "--no-check")
    assert r.returncode == 1 and r.stderr == "", r.stderr
    assert _lines(r.stdout)["PROBLEM"] == (
        f"the tuning records {path} cannot be read: it is not JSON (Expecting property name enclosed in double "
        "quotes); none is used, and the file is never overwritten (move it aside to start anew)"), r.stdout
    assert path.read_text() == "{bad"


_VM_STAT = """Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                               65536.
Pages active:                            300000.
Pages inactive:                          131072.
Pages speculative:                        65536.
Pages throttled:                              0.
Pages wired down:                        200000.
Pages purgeable:                          20000.
File-backed pages:                       250000.
Anonymous pages:                         320000.
Pages occupied by compressor:             24288.
"""
_OLD_VM_STAT = "\n".join(_VM_STAT.splitlines()[:7]) + "\n"  # an older vm_stat: no anonymous pages line


def _as_a_mac(monkeypatch: pytest.MonkeyPatch, ram: int, answers: dict[str, str | None]) -> None:
    """This process as a 16 GiB Apple Silicon Mac as hardware.py sees it: platform.system() is Darwin, no /proc
    or /sys, and sysctl and vm_stat answer `answers` (None: the tool failed) where hardware.py runs them."""
    import builtins
    import platform

    from localgen import hardware

    real_open = builtins.open

    def no_proc(path: Any, *a: Any, **k: Any) -> Any:
        if str(path).startswith(("/proc", "/sys")):
            raise FileNotFoundError(path)
        return real_open(path, *a, **k)

    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    monkeypatch.setattr(platform, "processor", lambda: "arm")
    monkeypatch.setattr(hardware, "open", no_proc, raising=False)
    monkeypatch.setattr(hardware, "total_ram_bytes", lambda: ram)
    monkeypatch.setattr(hardware, "_darwin_output", lambda argv: answers.get(argv[-1]), raising=False)


def test_doctor_on_a_mac_names_the_cpu_the_available_ram_and_metals_share(
        cli_in_process: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor.md: on macOS the CPU's name comes from `sysctl`, the available RAM from `vm_stat` (what apps, the
    kernel and the compressor do not hold: the file cache, which a model read before fills, is available), and the
    Apple Silicon GPU line gives what Metal may use (two thirds of the RAM up to 32 GiB) and says its free memory
    is not reported, rather than "CPU arm", "(- available)" and a made-up free."""
    _as_a_mac(monkeypatch, 16 << 30, {"machdep.cpu.brand_string": "Apple M1 Pro\n", "vm_stat": _VM_STAT})
    r = cli_in_process("doctor", "--no-check")
    assert "Traceback" not in r.stderr  # exit 1 here: this CPU-only build cannot use the GPU it sees
    lines = _lines(r.stdout)
    assert lines["CPU"].startswith("Apple M1 Pro ·")
    assert lines["RAM"] == "16.0 GiB (8.0 GiB available)"  # 1,048,576 pages of 16 KiB less (320,000 - 20,000)
    # anonymous, 200,000 wired and 24,288 in the compressor; not the 4.0 GiB free, inactive and speculative
    _as_a_mac(monkeypatch, 16 << 30, {"vm_stat": _OLD_VM_STAT})
    assert _lines(cli_in_process("doctor", "--no-check").stdout)["RAM"] == "16.0 GiB (4.0 GiB available)"
    assert lines["GPU"] == ("Apple Silicon (unified memory) · Metal may use 10.7 GiB of the RAM (free: not "
                            "reported; the RAM line's available is what is free)")
    _as_a_mac(monkeypatch, 16 << 30, {})  # sysctl and vm_stat fail: what there is, quietly
    r = cli_in_process("doctor", "--no-check")
    assert "Traceback" not in r.stderr  # exit 1 here: this CPU-only build cannot use the GPU it sees
    assert _lines(r.stdout)["RAM"] == "16.0 GiB (available: not reported)"
    assert _lines(r.stdout)["CPU"].startswith("arm ·")


def test_metal_may_use_two_thirds_up_to_32_gib_and_three_quarters_above(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/models.md: Apple unified memory usable by Metal is two thirds of it up to 32 GiB and three quarters
    above (recommendedMaxWorkingSetSize: 10922.67 MiB on a 16 GB M1 Pro, 27 GiB on a 36 GB M4 Max), and the plan's
    memory on such a Mac is no more than that, nor more than is available now (models loaded already hold the rest)."""
    from localgen import hardware
    from localgen.models import fit

    for ram, metal in ((16 << 30, 10922 << 20), (32 << 30, 21845 << 20), (36 << 30, 27 << 30), (64 << 30, 48 << 30)):
        _as_a_mac(monkeypatch, ram, {"vm_stat": None})
        [gpu] = hardware.gpus()
        assert gpu.unified and gpu.free is None and abs((gpu.total or 0) - metal) < 1 << 20
        assert fit.this_machine(True).gpus == (gpu.total,)
    _as_a_mac(monkeypatch, 16 << 30, {"vm_stat": _OLD_VM_STAT})  # 4 GiB available: models loaded hold the rest
    assert fit.this_machine(True).gpus == (4 << 30,) and fit.this_machine(True).ram == 4 << 30


def _in_a_container(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, version: int) -> None:
    """This process under `docker run --memory 4g` as hardware.py sees it: a cgroup (v2 or v1) limited to 4 GiB,
    with 1 GiB charged of which 0.5 GiB is inactive file cache (the kernel drops it before it runs out)."""
    from localgen import hardware

    gib = 1 << 30
    if version == 2:
        own = tmp_path / "system.slice" / "docker-1.scope"
        own.mkdir(parents=True)
        (tmp_path / "system.slice" / "memory.max").write_text("max\n")
        (own / "memory.max").write_text(f"{4 * gib}\n")
        (own / "memory.current").write_text(f"{gib}\n")
        (own / "memory.stat").write_text(f"anon {gib // 2}\nfile {gib // 2}\ninactive_file {gib // 2}\n")
        (tmp_path / "self").write_text("0::/system.slice/docker-1.scope\n")
    else:
        own = tmp_path / "memory" / "docker" / "1"
        own.mkdir(parents=True)
        (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
        (own / "memory.limit_in_bytes").write_text(f"{4 * gib}\n")
        (own / "memory.usage_in_bytes").write_text(f"{gib}\n")
        (own / "memory.stat").write_text(f"cache {gib // 2}\ntotal_inactive_file {gib // 2}\n")
        (tmp_path / "self").write_text("12:memory:/docker/1\n11:cpu,cpuacct:/docker/1\n0::/\n")
    monkeypatch.setattr(hardware, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(hardware, "PROC_CGROUP", str(tmp_path / "self"))


@pytest.mark.parametrize("version", [2, 1])
def test_a_containers_memory_limit_is_the_ram_plans_and_doctor_see(
        cli_in_process: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, version: int) -> None:
    """Under `docker run --memory 4g` (cgroup v2's memory.max, v1's memory.limit_in_bytes) the RAM is the limit and
    what is available is what the limit leaves (the host's RAM was taken: a load the plan allowed met the OOM
    killer), and doctor says where the figure comes from."""
    from localgen import hardware

    _in_a_container(monkeypatch, tmp_path, version)
    gib = 1 << 30
    assert hardware.memory_limit() == (4 * gib, 3.5 * gib)  # the limit, and the room it leaves
    assert hardware.total_ram_bytes() == 4 * gib
    assert (hardware.available_ram_bytes() or 0) <= 3.5 * gib
    if version == 2:  # a parent's near-full 8 GiB over the container's 4: RAM is the 4, room what the parent leaves
        (tmp_path / "system.slice" / "memory.max").write_text(f"{8 * gib}\n")
        (tmp_path / "system.slice" / "memory.current").write_text(f"{7 * gib}\n")
        (tmp_path / "system.slice" / "memory.stat").write_text("inactive_file 0\n")
        assert hardware.memory_limit() == (4 * gib, gib)
        assert hardware.total_ram_bytes() == 4 * gib and (hardware.available_ram_bytes() or 0) <= gib
    ram = _lines(cli_in_process("doctor", "--no-check").stdout)["RAM"]
    assert re.fullmatch(r"4\.0 GiB \([\d.]+ [KMG]iB available\) · the container's memory limit \(cgroup\): plans and "
                        r"serve's loads keep within it", ram), ram


def test_doctor_checks_an_encoder_by_what_it_makes(cli: CLI, tmp_path: Path) -> None:
    """doctor.md: an embedding model is checked by embedding a sentence, a reranker by scoring a pair. A red team's:
    `doctor -m bert.gguf` said it "generated 0 tokens at ? ... ok" (run refuses an encoder)."""
    from tests.tiny_bert import build

    for path, made in ((build(tmp_path / "bert.gguf"), r"embedded a sentence \(\d+ tokens, 64 dimensions\)"),
                       (build(tmp_path / "rr.gguf", rank=True), r"scored a pair \(\d+ tokens\)")):
        r = cli("doctor", "-m", str(path))
        assert r.returncode == 0, r.stdout + r.stderr
        check = _lines(r.stdout)["check"]
        # where it ran: the CPU, or beside a GPU the layers llama.cpp offloaded (check's `where`, as for run)
        assert re.fullmatch(rf"{path.name} loaded in [\d.]+ s and {made} on "
                            r"(CPU|offloaded (\d+)/\2 layers to GPU): ok", check), check
