"""What bench, tune and doctor promise when things go wrong (docs/bench.md, docs/tune.md, docs/doctor.md): a second
Ctrl-C stops a bench's prompt where it is; tuning records that cannot be read are said in one warning line and
never overwritten, and a record of the wrong types is left out, never applied; a hand-edited bench result is left
out of history and compare with a warning; --request-rate has a floor; tune refuses up front what it could not
keep or hold (a full disk, a KV cache past memory) and says --even-if-busy right; doctor reads a bounded
nvidia-smi."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, InProcessCLI, knows_the_bandwidth
from tests.test_tune import SETTINGS, _record, _ref, _resolve


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_second_ctrl_c_stops_a_bench_prompt_where_it_is(smollm2_engine: Any) -> None:
    """bench.md: "A second Ctrl-C stops at once". It lands inside llama.cpp's decode of a prompt (seconds, for a
    long one), where Python runs no handler; bench's prompts now carry the abort check tune's carry, which stops
    the decode where it is (llama.cpp says ret = 2) and raises the interrupt. Before, the decode ran to its end
    (minutes for `-p 6000` on two cores) and no "ret = 2" was ever logged."""
    from localgen.cli.stopping import stop_on_sigint
    from localgen.engine.bench import BenchContext
    from localgen.native import context, logs

    bench = BenchContext(smollm2_engine)  # type: ignore[arg-type]
    try:
        with stop_on_sigint():
            bench.clear()
            assert bench.prompt(16) > 0  # no press: the check stops nothing
            logs.clear()
            with logs.unbroken(raising=False):  # a press noted inside llama.cpp's call, as the handler notes it
                assert logs.defer_interrupt(None)
            with pytest.raises(KeyboardInterrupt):
                bench.prompt(64)
        assert "failed to decode, ret = 2" in "\n".join(logs.lines(last=50))
        assert getattr(bench.ctx, "value", bench.ctx) not in context._thunks  # the check is taken off again
    finally:
        bench.clear()


def test_a_tuning_file_that_cannot_be_read_is_said_and_never_overwritten(
        cli_in_process: InProcessCLI, own_home: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tune.md: a records' file cut short (or of another version's format) is one warning line for --show, and no
    tune or --reset writes over it: they refuse in one line naming it, the file left byte for byte. Before, --show
    said "no tuning records" and the next tune replaced the file, every other record gone."""
    from localgen import tuning
    from localgen.cli import hints

    tuning.save(_record(_ref(smollm2_path)))
    path = tuning.store_path()
    whole = path.read_bytes()
    cli = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(own_home)})
    for damaged, why in ((whole[:-40], "it is not JSON ("),
                         (json.dumps({**json.loads(whole), "format": 2}).encode(), "its format is 2, not 1")):
        path.write_bytes(damaged)
        r = cli("tune", "--show")
        assert r.returncode == 0 and r.stdout == "", r.stdout
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(
            f"warning: the tuning records {path} cannot be read: {why}"), r.stderr
        assert "never overwritten" in r.stderr
        for args in (("--reset",), ("--reset", "-m", str(smollm2_path)),
                     ("-m", str(smollm2_path), "--depth", "0", "--prompt", "16")):
            r = cli("tune", *args)
            assert r.returncode == 1 and r.stderr.count("\n") == 1, (args, r.stderr)
            assert r.stderr.startswith(f"localgen: error: the tuning records {path} cannot be read: {why}"), r.stderr
        with pytest.raises(tuning.Unreadable):
            tuning.save(_record(_ref(smollm2_path)))
        tuning.file_sha256(smollm2_path)  # the remembered hash is not written either
        assert path.read_bytes() == damaged
        assert _resolve(_ref(smollm2_path))[1]["flash_attn"].startswith("rule")  # a load uses the rule meanwhile
        said: list[str] = []  # and says why, once (run, chat, embed, bench, serve)
        monkeypatch.setattr(hints, "_WARNED", [])
        hints.record_note(said.append, "smollm2:135m", str(smollm2_path), {}, {"flash_attn": "rule: on"})
        hints.record_note(said.append, "smollm2:135m", str(smollm2_path), {}, {"flash_attn": "rule: on"})
        assert len(said) == 1 and said[0].startswith(f"warning: the tuning records {path} cannot be read"), said


@pytest.mark.parametrize("field, value", [("n_threads", "two"), ("n_threads", -5), ("flash_attn", "yes"),
                                          ("streams", "1"), ("n_ubatch", None), ("exchange_s", "fast")])
def test_a_record_of_the_wrong_types_is_left_out_and_the_others_used(
        cli_in_process: InProcessCLI, own_home: Path, smollm2_path: Path, field: str, value: Any) -> None:
    """tune.md: a record whose fields have the wrong types (or a thread count below 1) is left out with one warning
    line, and the others are used. Before, "two" threads was listed and crashed `run`, -5 reached the load, and a
    streams of "1" crashed --show."""
    from localgen import tuning

    ref = _ref(smollm2_path)
    good = _record(ref, streams=2)
    tuning.save(good)
    bad = _record(ref).to_json()
    if field == "streams":
        bad["key"]["streams"] = value
    elif field == "exchange_s":
        bad["exchange_s"] = value
    else:
        bad["settings"][field] = value
    path = tuning.store_path()
    doc = json.loads(path.read_text())
    doc["records"].append(bad)
    path.write_text(json.dumps(doc))
    assert tuning.records() == [good]
    assert not _resolve(ref)[1]["n_threads"].startswith("tuned")  # the bad single-stream record is never applied
    assert _resolve(ref, streams=2)[1]["n_threads"].startswith("tuned"), "the good one still is"
    tuning.first_sight(path.parent / "another.gguf")  # a write of a load's: the hand edit stays in the file
    assert bad in json.loads(path.read_text())["records"], "only tune --reset removes it"
    r = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(own_home)})("tune", "--show")
    assert r.returncode == 0 and r.stdout.count("\n") == 1 and "· 2 streams ·" in r.stdout, r.stdout
    assert r.stderr == (f"warning: 1 tuning record in {path} cannot be read (wrong fields or types): it is left "
                        "out\n"), r.stderr


def _bench_home(cli: CLI, tmp_path: Path) -> tuple[CLI, Path]:
    home = knows_the_bandwidth(tmp_path / "home")
    return CLI({**cli.env, "LOCALGEN_HOME": str(home)}), home / "data" / "bench.sqlite"


def test_a_hand_edited_result_is_left_out_of_history_and_compare(cli: CLI, tmp_path: Path) -> None:
    """bench.md: a result that no longer reads as a record is left out of history and compare with a warning; a
    run whose machine and build no longer read is shown without its header, with a warning. Before: KeyError
    'model_type' for `{}`, a ValueError for "avg_ts": "fast" (and "fast" in compare --json), KeyError
    'localgen_version' for a system that is not JSON."""
    c, db = _bench_home(cli, tmp_path)
    tiny = ("-p", "8,16", "-n", "0", "-r", "1", "-t", "1", "--no-e2e")
    for _ in range(2):
        assert c("bench", *tiny).returncode == 0
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE results SET record = '{}' WHERE run_id = 1 AND seq = 0")
        rec = json.loads(conn.execute("SELECT record FROM results WHERE run_id = 1 AND seq = 1").fetchone()[0])
        conn.execute("UPDATE results SET record = ? WHERE run_id = 1 AND seq = 1",
                     (json.dumps({**rec, "avg_ts": "fast"}),))
        conn.execute("UPDATE runs SET system = 'notjson' WHERE id = 2")
    warned = "warning: run 1: 2 results in the history no longer read as a record (damaged): left out\n"
    shown = c("bench", "history", "1")
    assert shown.returncode == 0 and shown.stdout == "" and shown.stderr == warned, shown.stderr
    compared = c("bench", "compare", "1", "2", "--json")
    assert compared.returncode == 0 and "Traceback" not in compared.stderr, compared.stderr
    assert [(x["test"], x["a_ts"], type(x["b_ts"])) for x in json.loads(compared.stdout)["results"]] == [
        ("pp8", None, float), ("pp16", None, float)]
    assert compared.stderr.startswith(warned), compared.stderr
    assert c("bench", "compare", "1", "2").returncode == 0
    header = c("bench", "history", "2")
    assert header.returncode == 0 and "| pp16 " in header.stdout, header.stdout + header.stderr
    assert header.stdout.startswith("<!-- machine and build unknown (damaged in the history) -->\n"), header.stdout
    assert header.stderr == ("warning: run 2: its machine and build in the history no longer read as such "
                             "(damaged): left out of its header\n"), header.stderr


def test_a_request_rate_below_one_a_day_is_a_usage_error(cli_in_process: InProcessCLI) -> None:
    """--request-rate 1e-300 waited so long between requests that time.sleep overflowed (a traceback); a rate below
    one request a day is now a usage error before any request, and the sweep's own check refuses it too."""
    from localgen.bench import serving

    for rate in ("1e-300", "0.00001"):
        r = cli_in_process("bench", "--endpoint", "http://127.0.0.1:9", "--request-rate", rate, "--num-prompts",
                           "2", "-p", "2", "-n", "1")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert f"--request-rate {rate} is below one request a day" in r.stderr, r.stderr
    with pytest.raises(ValueError):
        serving.measure(None, 1, 1e-300, 2, 2, 1, 1)


def test_tune_on_a_full_disk_refuses_before_measuring(cli_env: dict[str, str], tmp_path: Path,
                                                      smollm2_path: Path) -> None:
    """tune.md: a state dir that cannot keep the record (a full disk) is one line naming the file before anything is
    measured, as bench's history is; before, tune measured every configuration, then said only "No space left on
    device", printed no table and left a temporary file."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("mounting needs unshare and the right to use it (root)")
    state = tmp_path / "home" / "state"
    state.mkdir(parents=True)
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home"), "F": str(state), "PY": sys.executable}
    full = 'mount -t tmpfs -o size=64k tmpfs "$F" && "$PY" -m localgen "$@"; rc=$?; ls -A "$F"; exit $rc'
    r = subprocess.run(["unshare", "-m", "sh", "-c", full, "sh", "tune", "-m", str(smollm2_path), "--depth",
                        "0", "--prompt", "16"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert (r.returncode, r.stdout) == (1, ""), (r.returncode, r.stdout, r.stderr)
    assert r.stderr == (f"localgen: error: the tuning records {state / 'tuning.json'} cannot be written: no space "
                        "is left on its disk (free some space, or set LOCALGEN_HOME to a state dir that can be "
                        "written)\n"), r.stderr
    # a write that fails all the same (the disk filled while measuring): the file named, no temporary left
    save = ("import dataclasses; from localgen import tuning; "
            "k = tuning.Key('0' * 64, 'b', 'd'); "
            "r = tuning.Record(k, 'm', 1, '2026-11-25T10:00:00Z', {'flash_attn': True, 'repack': False, "
            "'n_threads': 1, 'n_threads_batch': 1, 'n_ubatch': 512}, 0, 1.0, table=[{'x': 'y' * 9000}] * 16)\n"
            "try:\n  tuning.save(r)\nexcept tuning.LocalgenError as e:\n  print(e.message)")
    fill = ('mount -t tmpfs -o size=64k tmpfs "$F" && "$PY" -c "$SAVE"; ls -A "$F"')
    r = subprocess.run(["unshare", "-m", "sh", "-c", fill], env={**env, "SAVE": save}, capture_output=True, text=True,
                       timeout=120)
    lines = r.stdout.splitlines()
    assert lines[0] == f"the tuning records {state / 'tuning.json'} cannot be written: no space left on device", (
        r.stdout, r.stderr)
    assert not [name for name in lines[1:] if name.endswith(".tmp")], lines


def test_a_file_where_the_state_dir_goes_or_a_read_only_one_is_not_called_damaged_records_nor_full(
        cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    """A newcomer's trial: a file where the state dir goes was "tuning.json cannot be read ... move it aside, or mend
    it" (there is no such file), a place that cannot be written said "free some space", and `tune --reset` with no
    record at all failed there. The one line says what is in the way; --reset forgets nothing, exit 0."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "state").write_text("")
    own = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(home)})
    r = own("tune", "--depth", "0", "--prompt", "16")  # refused before a model loads
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr == (f"localgen: error: the tuning records {home / 'state' / 'tuning.json'} cannot be written: "
                        f"{home / 'state'} is a file, not a folder (set LOCALGEN_HOME to a state dir that can be "
                        "written)\n"), r.stderr
    shown = own("tune", "--show")
    assert shown.returncode == 0 and shown.stderr == "no tuning records (localgen tune -m MODEL makes one)\n"
    for where in (home, Path("/proc/self/localgen-home")):  # (/proc: written by no one, root included)
        reset = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(where)})("tune", "--reset")
        assert (reset.returncode, reset.stderr) == (0, "forgot 0 tuning records\n"), (where, reset.stderr)
    no = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": "/proc/self/localgen-home"})(
        "tune", "--depth", "0", "--prompt", "16")
    assert no.returncode == 1 and "free some space" not in no.stderr and no.stderr.endswith(
        "(set LOCALGEN_HOME to a state dir that can be written)\n"), no.stderr


def test_even_if_busy_says_the_record_is_kept(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    """`tune --even-if-busy` on a busy machine warned "the record is not kept unless --even-if-busy"; it now says the
    record is kept, marked. (The machine is made busy by its CPU sample; nothing is measured: the warning, said
    before the first configuration, is all this test reads.)"""
    import typer

    from localgen import hardware
    from localgen.cli import tune
    from localgen.cli.stopping import Stopped

    monkeypatch.setattr(hardware, "others_share", lambda a, b: 0.9)

    def stopped(*args: Any, **kwargs: Any) -> None:
        raise Stopped

    monkeypatch.setattr(tune, "_measure", stopped)
    plan = tune._Plan([(True, True)], (0,), (1,), (512,), 16, False, {}, 16, 16)
    for even_if_busy in (True, False):
        with pytest.raises(typer.Exit):  # interrupted before a configuration was measured
            tune._run(None, plan, 1, False, even_if_busy)
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert warned == [
        "warning: this machine is busy (other work takes 90% of the CPU time): the figures will reflect it, and the "
        "record is kept all the same (--even-if-busy), marked with what was seen",
        "warning: this machine is busy (other work takes 90% of the CPU time): the figures will reflect it, and the "
        "record is not kept unless --even-if-busy"], warned


def test_tune_refuses_streams_whose_kv_cache_the_memory_cannot_hold(cli_in_process: InProcessCLI,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`tune --parallel 64 --prompt 7000 --answer 1000` asked llama.cpp for 64 contexts of 7,424 tokens (GiBs of KV
    cache) with no check; the plan `run` loads by now weighs them against the memory first, and refuses in one
    line. The machine here is told to have 1 GiB available."""
    from localgen import hardware

    monkeypatch.setattr(hardware, "available_ram_bytes", lambda: 1 << 30)
    r = cli_in_process("tune", "--parallel", "64", "--prompt", "7000", "--answer", "1000")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("localgen: error: tuning smollm2:135m with 64 streams of 7,216 tokens needs "), r.stderr
    assert "of KV cache beside the weights: more than this machine's RAM holds" in r.stderr, r.stderr


def _gpu_lines(cli_env: dict[str, str], tmp_path: Path, lines: int) -> list[str]:
    """doctor --no-check's GPU lines with a stand-in nvidia-smi on PATH that lists `lines` GPUs."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nyes 'Fake GPU, 81920, 81000' | head -n {lines}\n")
    smi.chmod(0o755)
    r = subprocess.run([sys.executable, "-m", "localgen", "doctor", "--no-check"], capture_output=True, text=True,
                       env={**cli_env, "PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}"}, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr  # exit status 1 where this build cannot use a GPU
    return [line for line in r.stdout.splitlines() if line.startswith("GPU ")]


def test_doctor_reads_a_bounded_nvidia_smi(cli_env: dict[str, str], tmp_path: Path) -> None:
    """doctor.md: a stand-in nvidia-smi that writes megabytes (or lists more GPUs than llama.cpp's 16) gives at most
    16 GPU lines and one saying what was left out; before, `doctor --no-check` printed a line per line it wrote."""
    gpu = _gpu_lines(cli_env, tmp_path, 2_000_000)  # some 50 MB
    assert len(gpu) == 17 and gpu[0].startswith("GPU       Fake GPU · 80"), gpu[:2]
    assert re.fullmatch(r"GPU       [\d,]+ GPU lines past llama.cpp's 16 devices left out; nvidia-smi's output past "
                        r"64 KiB not read", gpu[-1]), gpu[-1]
    gpu = _gpu_lines(cli_env, tmp_path, 20)
    assert len(gpu) == 17 and gpu[-1] == "GPU       4 GPU lines past llama.cpp's 16 devices left out", gpu


def test_a_record_of_this_shape_is_what_tune_makes(own_home: Path, smollm2_path: Path) -> None:
    """The checks on a record's types accept every record tune makes (the test's SETTINGS are tune's shape)."""
    from localgen import tuning

    rec = dataclasses.replace(_record(_ref(smollm2_path)), busy="62% of the CPU time", partial=True,
                              table=[{"total_s": 1.0}])
    tuning.save(rec)
    assert tuning.records() == [rec] and tuning.records()[0].settings == SETTINGS and tuning.problem() is None


def test_the_history_checks_every_field_of_a_ladder_row() -> None:
    """bench/history.py names a ladder row's fields itself (bench does not import quant): they are quant/ladder.py
    Row's, so a quality run's rows are neither left out for a field they need not have nor let through without one
    the view needs."""
    from localgen.bench import history
    from localgen.quant.ladder import Row

    assert set(history._QUALITY) | {"reference"} == {f.name for f in dataclasses.fields(Row)}


def test_a_fifo_where_the_tuning_records_belong_is_said_never_opened(cli_env: dict[str, str], tmp_path: Path) -> None:
    """tune.md's records that cannot be read, said in one warning line: a FIFO there hung every `run` (the file was
    opened and read); it is never opened, and `run` answers with the rule's settings."""
    home = tmp_path / "home"
    (home / "state").mkdir(parents=True)
    path = home / "state" / "tuning.json"
    os.mkfifo(path)
    r = CLI({**cli_env, "LOCALGEN_HOME": str(home)})("run", "-p", "hi", "-n", "1", timeout=60)
    assert r.returncode == 0 and r.stdout, r.stderr
    assert r.stderr == (f"warning: the tuning records {path} cannot be read: it is a FIFO; none is used, and the file "
                        "is never overwritten (move it aside to start anew)\n"), r.stderr
