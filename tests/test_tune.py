"""`localgen tune` and tuning records: a record sets a model's load defaults only for its file, llama.cpp build
and device; a flag wins over it; without one the rule decides; tune keeps what it measured on Ctrl-C."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import terminal
from tests.conftest import CLI, NO_GPU, ROOT, InProcessCLI

SETTINGS = {"flash_attn": False, "repack": False, "n_threads": 1, "n_threads_batch": 1, "n_ubatch": 128}


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Records of this test only (the session's home keeps none, so other tests load with the rule)."""
    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _ref(path: Path) -> Any:
    from localgen.models.resolve import resolve

    return resolve(str(path))


def _record(ref: Any, settings: dict[str, Any] = SETTINGS, streams: int = 1, **key: str) -> Any:
    from localgen import tuning
    from localgen.engine.defaults import build_id, device_id

    k = tuning.Key(tuning.file_sha256(ref.path), build_id(), device_id(False), streams)
    return tuning.Record(key=dataclasses.replace(k, **key), model=ref.name, size=os.stat(ref.path).st_size,
                         date="2026-11-25T10:00:00Z", settings=dict(settings), depth=1500, exchange_s=1.0)


def _resolve(ref: Any, **params: Any) -> tuple[Any, dict[str, str]]:
    from localgen.engine.defaults import resolve
    from localgen.types import LoadParams

    return resolve(ref, LoadParams(**params), cpu_only=True)


def test_a_record_for_this_file_build_and_device_sets_the_defaults(own_home: Path, smollm2_path: Path) -> None:
    from localgen import tuning

    ref = _ref(smollm2_path)
    tuning.save(_record(ref))
    params, origins = _resolve(ref)
    assert (params.flash_attn, params.repack, params.n_threads, params.n_threads_batch, params.n_ubatch) == (
        False, False, 1, 1, 128)
    assert set(origins.values()) == {"tuned on 2026-11-25"}


@pytest.mark.parametrize("field", ["build", "device"])
def test_a_record_made_with_another_build_or_device_is_not_used(own_home: Path, smollm2_path: Path,
                                                                field: str) -> None:
    from localgen import tuning

    ref = _ref(smollm2_path)
    tuning.save(_record(ref, **{field: "something else"}))
    params, origins = _resolve(ref)
    assert all(v.startswith("rule") for v in origins.values()), origins
    assert params.flash_attn is True and params.n_ubatch == 512  # the rule's


def test_a_record_made_for_another_file_of_the_same_size_is_not_used(own_home: Path, smollm2_path: Path,
                                                                     tmp_path: Path) -> None:
    from localgen import tuning

    other = tmp_path / "other.gguf"
    shutil.copyfile(smollm2_path, other)
    with open(other, "r+b") as f:  # one byte of the last tensor's data: same size, same header, another file
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    tuning.save(_record(_ref(other)))
    _, origins = _resolve(_ref(smollm2_path))
    assert all(v.startswith("rule") for v in origins.values()), origins
    assert _resolve(_ref(other))[1]["n_ubatch"] == "tuned on 2026-11-25"


def test_flags_win_over_the_record(own_home: Path, smollm2_path: Path) -> None:
    from localgen import tuning

    ref = _ref(smollm2_path)
    tuning.save(_record(ref))
    params, origins = _resolve(ref, flash_attn=True, n_threads=2)
    assert params.flash_attn is True and params.n_threads == 2 and params.n_ubatch == 128
    assert origins["flash_attn"] == origins["n_threads"] == "flag"
    assert origins["n_ubatch"] == "tuned on 2026-11-25"


def test_serve_uses_the_record_for_its_streams_else_the_single_stream_one(own_home: Path,
                                                                          smollm2_path: Path) -> None:
    from localgen import tuning

    ref = _ref(smollm2_path)
    tuning.save(_record(ref))
    tuning.save(_record(ref, {**SETTINGS, "n_ubatch": 256, "n_threads": 2}, streams=4))
    assert _resolve(ref, streams=4)[0].n_ubatch == 256
    assert _resolve(ref, streams=2)[0].n_ubatch == 128
    assert _resolve(ref)[0].n_ubatch == 128
    assert tuning.reset() == 2 and tuning.records() == []


def test_the_rule_without_a_record(own_home: Path, smollm2_path: Path, gemma_path: Path) -> None:
    from localgen import hardware, tuning

    for path in (smollm2_path, gemma_path):
        params, why = _resolve(_ref(path))
        assert (params.flash_attn, params.n_ubatch) == (True, 512) and why["flash_attn"] == "rule: on"
        assert (params.n_threads, params.n_threads_batch) == (hardware.physical_cores(), hardware.usable_cores())
    gemma, why = _resolve(_ref(gemma_path))
    assert gemma.repack is False and "5% of the weights repackable" in why["repack"]
    # a record that turns flash attention off still gets it with a quantized V cache, which cannot do without
    tuning.save(_record(_ref(smollm2_path)))
    quantized, why = _resolve(_ref(smollm2_path), cache_type_v="q8_0")
    assert quantized.flash_attn is True and why["flash_attn"] == "needed by the q8_0 V cache"
    assert _resolve(_ref(smollm2_path))[0].flash_attn is False


def _json(cli: CLI | InProcessCLI, *args: str) -> Any:
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_tune_makes_the_record_that_run_then_uses(cli_env: dict[str, str], cli_in_process: InProcessCLI,
                                                 tmp_path: Path) -> None:
    # the CPU's tune, on any machine (with layers on a GPU, tune measures one micro-batch size: tune.md)
    cli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path), **NO_GPU})
    records = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(tmp_path)})  # --show loads no model
    # a 16-token prompt (the least tune takes) and a 32-token depth: the figures cost little, and the exchange is
    # what was asked for (three distinct sizes, so none can stand in for another in the record)
    # --even-if-busy: the suite's other workers keep the cores busy, and this test is about what a record does
    done = cli("tune", "--depth", "32", "--prompt", "16", "--answer", "64", "--even-if-busy")
    assert done.returncode == 0, done.stderr
    assert "(16-token prompt, 64-token answer)" in done.stdout and "fastest first" in done.stdout
    rec = _json(records, "tune", "--show", "--json")
    assert (rec["prompt"], rec["answer"], rec["depth"]) == (16, 64, 32)
    table = rec["table"]
    assert rec["settings"] == {k: table[0][k] for k in SETTINGS} and not rec["partial"]
    assert {(r["flash_attn"]) for r in table} == {True, False}  # both measured
    assert {r["n_ubatch"] for r in table} == {512, 256, 128}  # on the winner
    assert all(set(r["by_depth_s"]) == {"0", "32"} and r["total_s"] > 0 for r in table)
    assert min(r["total_s"] for r in table) >= table[0]["total_s"] / 1.021  # the winner is within the tie band
    shown = records("tune", "--show")
    assert "smollm2:135m" in shown.stdout and "tuned 20" in shown.stdout and "16+64 tokens" in shown.stdout
    ran = cli("run", "hi", "-n", "1", "--json")
    load = json.loads(ran.stdout)["load"]
    assert all(v.startswith("tuned on") for v in load["origins"].values()), load["origins"]
    # said once on stderr, even in a pipe: a record is never a silent default
    assert ran.stderr.count("from its tuning record (tuned on ") == 1, ran.stderr
    assert load["flash_attn"] == rec["settings"]["flash_attn"] and load["n_ubatch"] == rec["settings"]["n_ubatch"]
    flagged = _json(cli, "run", "hi", "-n", "1", "--json", "-fa", "on", "-t", "2")["load"]
    assert flagged["origins"]["flash_attn"] == flagged["origins"]["n_threads"] == "flag"
    assert flagged["flash_attn"] is True and flagged["n_threads"] == 2
    assert "forgot 1 tuning record" in cli("tune", "--reset").stderr
    assert all(v.startswith("rule") for v in _json(cli, "run", "hi", "-n", "1", "--json")["load"]["origins"].values())


def test_serve_tunes_for_its_streams_and_health_says_where_settings_came_from(cli_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    from tests.test_serve import Server

    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path)}
    # depth 0 and a 16-token prompt: one depth, the least tune measures; nothing is pruned there, so every thread
    # count is in the table
    rec = _json(CLI(env), "tune", "--parallel", "2", "--depth", "0", "--prompt", "16", "--json", "--even-if-busy")
    assert rec["key"]["streams"] == 2 and all(r["n_threads"] == r["n_threads_batch"] for r in rec["table"])
    server = Server(env, "-np", "2", "--ctx", "1024", "-ub", "256")
    try:
        settings = httpx.get(f"{server.url}/health").json()["models"]["smollm2:135m"]["settings"]
    finally:
        assert server.stop() == 0
    assert settings["n_ubatch"] == {"value": 256, "from": "flag"}
    assert settings["flash_attn"]["value"] == rec["settings"]["flash_attn"]
    assert settings["flash_attn"]["from"].startswith(f"tuned on {rec['date'][:10]}")
    assert settings["n_threads_batch"]["value"] == rec["settings"]["n_threads_batch"]


def test_a_tune_whose_reader_went_away_keeps_its_record(cli_env: dict[str, str], cli_in_process: InProcessCLI,
                                                        tmp_path: Path) -> None:
    """`localgen tune ... | true`: the table met a closed pipe, and the record measured whole was lost, exit 0, with
    no word on stderr (a newcomer's trial). It is kept, and said, as in a terminal."""
    cli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path), **NO_GPU})
    p = cli.popen("tune", "--depth", "0", "--prompt", "16", "--answer", "1", "--even-if-busy",
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # what `| true` does
    err = p.stderr.read()
    assert p.wait(timeout=600) == 0 and "tuned smollm2:135m in " in err.decode(), err.decode()
    records = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(tmp_path)})
    rec = _json(records, "tune", "--show", "--json")
    assert (rec["prompt"], rec["answer"], rec["partial"]) == (16, 1, False), rec


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_tune_keeps_what_it_measured_on_ctrl_c(cli_env: dict[str, str], cli_in_process: InProcessCLI,
                                               tmp_path: Path, sig: int) -> None:
    """Ctrl-C, or a SIGTERM (`timeout`; the process then ends by it, where it kept nothing), keeps the best of the
    configurations measured whole."""
    cli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path)})
    p = cli.popen("tune", "--depth", "0", "--prompt", "16", "--even-if-busy",  # one depth, the shortest prompt
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = []
    assert p.stderr is not None
    for raw in p.stderr:
        seen.append(raw.decode())
        if raw.startswith(b"measured "):  # the first configuration is measured whole
            p.send_signal(sig)
            break
    out, rest = p.communicate(timeout=600)
    stderr = "".join(seen) + rest.decode()
    assert p.returncode == (130 if sig == signal.SIGINT else -sig), stderr
    assert "before the interrupt" in stderr and "Traceback" not in stderr
    assert b"fastest first" in out
    records = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(tmp_path)})  # no model: in this process
    rec = _json(records, "tune", "--show", "--json")
    assert rec["partial"] is True and rec["settings"]["flash_attn"] is True  # the rule's, measured first
    assert "(partial)" in records("tune", "--show").stdout


def test_ctrl_c_keeps_an_earlier_whole_tune_rather_than_the_partial_one(cli_env: dict[str, str], own_home: Path,
                                                                        smollm2_path: Path) -> None:
    """tune.md: an interrupted tune does not replace a whole tune made earlier for the same file, build, device and
    load: that record stays as it was, and one line says so, exit status 130."""
    from localgen import tuning

    whole = _record(_ref(smollm2_path))
    tuning.save(whole)
    cli = CLI({**cli_env, "LOCALGEN_HOME": str(own_home), **NO_GPU})  # the record is the CPU's
    p = cli.popen("tune", "--depth", "0", "--prompt", "16", "--even-if-busy", stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE)
    seen = []
    assert p.stderr is not None
    for raw in p.stderr:
        seen.append(raw.decode())
        if raw.startswith(b"measured "):
            p.send_signal(signal.SIGINT)
            break
    out, rest = p.communicate(timeout=600)
    stderr = "".join(seen) + rest.decode()
    assert p.returncode == 130 and b"fastest first" in out, stderr
    assert stderr.splitlines()[-1] == ("interrupted; nothing of this tune is kept: the whole tune of 2026-11-25 stays "
                                       "smollm2:135m's default here (localgen tune --show lists it)"), stderr
    assert tuning.records() == [whole]


def test_a_partial_record_replaces_a_partial_one_and_a_whole_one_replaces_either(own_home: Path,
                                                                                 smollm2_path: Path) -> None:
    from localgen import tuning

    ref = _ref(smollm2_path)
    first = dataclasses.replace(_record(ref), partial=True)
    assert tuning.save(first) is None and tuning.records() == [first]
    second = dataclasses.replace(first, exchange_s=2.0)
    assert tuning.save(second) is None and tuning.records() == [second]
    whole = _record(ref)
    assert tuning.save(whole) is None and tuning.records() == [whole]
    assert tuning.save(second) == whole and tuning.records() == [whole]


def test_with_layers_on_a_gpu_tune_measures_flash_attention_alone(smollm2_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """tune.md: with layers on a GPU, tune measures flash attention on and off; the threads, repacking and
    physical batch stay the rule's (the GPU does the work they set on a CPU)."""
    from localgen.cli.tune import _plan
    from localgen.native import devices
    from localgen.types import LoadParams

    ref = _ref(smollm2_path)
    monkeypatch.setattr(devices, "has_gpu", lambda: False)
    on_cpu = _plan(ref, 32, 16, 64, LoadParams())
    monkeypatch.setattr(devices, "has_gpu", lambda: True)
    on_gpu = _plan(ref, 32, 16, 64, LoadParams())
    assert not on_cpu.offloaded and on_cpu.ubatches == (512, 256, 128) and on_cpu.threads
    assert on_gpu.offloaded and on_gpu.ubatches == (512,) and on_gpu.threads == ()
    assert sorted(fa for _, fa in on_gpu.configs) == [False, True]
    assert {repack for repack, _ in on_gpu.configs} == {on_gpu.rule["repack"]}


def test_tune_refuses_a_depth_the_window_cannot_hold(cli_in_process: InProcessCLI) -> None:
    r = cli_in_process("tune", "--depth", "100000")  # refused before any model loads
    assert r.returncode == 2 and "leaves no room" in r.stderr and "Traceback" not in r.stderr
    r = cli_in_process("tune", "--prompt", "60000")  # SmolLM2's window is 8,192 tokens
    assert r.returncode == 2 and "--prompt 60000 leaves no room for a 256-token answer" in r.stderr, r.stderr
    assert "(use --prompt 7936 or less)" in r.stderr
    assert r.stderr.count("\n") <= 2 and "Traceback" not in r.stderr


def test_the_window_holds_the_prompt_and_the_answer_asked_for(home: Path) -> None:
    """Room is the exchange's own, a prompt and its --answer, so a 512-token window tunes a short exchange,
    and the largest prompt named fits."""
    import dataclasses

    from localgen.cli.tune import _plan
    from localgen.errors import UsageError
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    ref = resolve("smollm2:135m")
    small = dataclasses.replace(ref, summary=dataclasses.replace(ref.summary, context_length=512))
    assert _plan(small, 0, 16, 4, LoadParams()).depths == (0,)
    assert _plan(small, None, 16, 4, LoadParams()).depths == (0, 492)  # the room left beside the exchange
    with pytest.raises(UsageError) as e:
        _plan(small, None, 500, 16, LoadParams())
    assert "--prompt 500 leaves no room for a 16-token answer" in str(e.value) and e.value.hint == \
        "use --prompt 496 or less"
    assert _plan(small, 0, 496, 16, LoadParams()).prompt == 496
    with pytest.raises(UsageError) as e:
        _plan(small, None, 16, 600, LoadParams())
    assert e.value.hint == "use --answer 496 or less"


def test_tune_refuses_an_embedding_model_before_weighing_its_window(cli_in_process: InProcessCLI,
                                                                   tmp_path: Path) -> None:
    from tests.tiny_bert import build

    bert = build(tmp_path / "bert.gguf")  # a 512-token window
    for args in (("-p", "16", "-n", "4", "-d", "0"), ()):
        r = cli_in_process("tune", "-m", str(bert), *args)
        assert r.returncode == 1 and "does not generate (an embedding or reranking model)" in r.stderr, r.stderr
        assert "leaves no room" not in r.stderr and r.stderr.count("\n") == 1


def test_the_exchange_weighs_the_answer_by_its_tokens() -> None:
    """A longer answer counts the decoding steps more: the same figures rank by prompt + answer × step."""
    from localgen.engine.tune import Point, exchange

    pts = [Point("pp", 0, 2, 512, 1.0), Point("tg", 0, 2, 0, 0.01)]
    assert exchange(pts, (0,), 2, 2, 512) == pytest.approx(1.0 + 256 * 0.01)
    assert exchange(pts, (0,), 2, 2, 512, answer=64) == pytest.approx(1.0 + 64 * 0.01)
    assert exchange(pts, (0,), 2, 2, 512, streams=2, answer=64) == pytest.approx(2 * 1.0 + 64 * 0.01)


def test_the_tune_tip_is_said_once_per_model_and_only_on_a_terminal(own_home: Path, smollm2_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen.cli import output
    from localgen.cli.hints import tune_tip

    monkeypatch.setitem(output._cursor, "writes_at_press", -1)  # no Ctrl-C left by a command run in this process

    said: list[str] = []
    path = str(smollm2_path)
    tune_tip(False, said.append, "m", path, {"flash_attn": "rule: on"})  # a pipe: never
    tune_tip(True, said.append, "m", path, {"flash_attn": "tuned on 2026-11-25"})  # tuned already
    assert said == []
    tune_tip(True, said.append, "m", path, {"flash_attn": "rule: on"})
    tune_tip(True, said.append, "m", path, {"flash_attn": "rule: on"})
    assert len(said) == 1 and "`localgen tune -m m`" in said[0]


def test_no_tip_once_ctrl_c_was_pressed(own_home: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command on its way out gives no advice: the tip printed after a `^C` echo, on its line, before the
    "interrupted" line (a load that a Ctrl-C does not cut short ends first)."""
    from localgen.cli import output
    from localgen.cli.hints import tune_tip

    monkeypatch.setitem(output._cursor, "writes_at_press", -1)
    output.ctrl_c_pressed()
    said: list[str] = []
    tune_tip(True, said.append, "m", str(smollm2_path), {"flash_attn": "rule: on"})
    assert said == []


def test_run_on_a_terminal_tips_once_and_a_pipe_never(cli_env: dict[str, str], tmp_path: Path) -> None:
    import pexpect

    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path)}
    piped = CLI(env)("run", "hi", "-n", "1")
    assert piped.returncode == 0 and "tip:" not in piped.stderr
    outputs = []
    for _ in range(2):
        child = terminal.spawn(env, ["run", "hi", "-n", "1"], timeout=600)
        child.expect(pexpect.EOF)
        outputs.append(child.before)
    assert "tip: `localgen tune -m smollm2:135m`" in outputs[0]
    assert "tip:" not in outputs[1]


def _hogs() -> list[subprocess.Popen[bytes]]:
    """Other work: a busy loop on every CPU the suite may use. Under pytest-xdist at a lower priority (nice 10): it
    takes the CPU time the machine has spare and little from the process measured (kept to one CPU) and the tests
    beside it (at the default priority two loops took two thirds of a 2-core machine, for minutes of the suite).
    The machine is busy with them all the same: the loop on another CPU takes what no test uses, and where tests
    use it all, they are the other work. In one process (no worker keeps to a CPU), llama.cpp's threads take
    every CPU, and the loops keep the default priority to be seen."""
    import sys

    from tests.conftest import ALL_CPUS

    def lower() -> None:
        os.sched_setaffinity(0, ALL_CPUS)
        if os.environ.get("PYTEST_XDIST_WORKER"):
            os.nice(10)

    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lower)
            for _ in range(max(1, len(ALL_CPUS)))]


def test_a_tune_made_while_other_work_took_the_cpus_is_not_kept(cli_env: dict[str, str], tmp_path: Path,
                                                                 cli_in_process: InProcessCLI) -> None:
    """Other work starting after the first configuration was measured (busy loops on every CPU): the next
    configuration's span shows it, and the tune keeps nothing, saying why and what to do (interrupted after
    that configuration, to keep the test short: the rule is the same)."""
    cli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path)})
    p = cli.popen("tune", "--depth", "0", "--prompt", "16", "--answer", "16", stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE)
    hogs: list[subprocess.Popen[bytes]] = []
    seen = []
    assert p.stderr is not None
    try:
        for raw in p.stderr:
            seen.append(raw.decode())
            if raw.startswith(b"measured ") and not hogs:
                hogs = _hogs()
            elif raw.startswith(b"measured "):  # a configuration measured whole with the hogs running
                p.send_signal(signal.SIGINT)
                break
        out, rest = p.communicate(timeout=900)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    stderr = "".join(seen) + rest.decode()
    assert p.returncode == 130 and b"fastest first" in out, stderr
    assert "of the CPU time while that configuration was measured" in stderr, stderr
    line = next(ln for ln in stderr.splitlines() if ln.startswith("localgen: error: not kept: other work took"))
    # "up to N% of the CPU time while measuring", or after what the machine was just before: "... and up to N% ..."
    assert re.search(r"up to \d+%( of the CPU time)? while measuring", line) and "--even-if-busy" in line, line
    records = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(tmp_path)})
    assert "no tuning records" in records("tune", "--show").stderr


def test_every_command_says_once_that_a_record_set_its_load(cli_env: dict[str, str], tmp_path: Path, smollm2_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """run, chat, embed, bench and serve's start-up, each once on stderr: the settings a record gave, and that
    it was measured on a busy machine when it was (kept with --even-if-busy)."""
    from localgen import tuning
    from tests.test_serve import Server

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    busy = "71% of the CPU time just before measuring"
    tuning.save(dataclasses.replace(_record(_ref(smollm2_path)), busy=busy))
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path), **NO_GPU}  # the record is the CPU's: a GPU's load has its own
    said = (f"from its tuning record (tuned on 2026-11-25 on a busy machine ({busy}); `localgen tune --show` lists "
            "records, `tune --reset` forgets them)")
    r = CLI(env)("run", "hi", "-n", "1")
    assert r.returncode == 0 and r.stderr == ("smollm2:135m: flash_attn off · repack off · n_threads 1 · "
                                              f"n_threads_batch 1 · n_ubatch 128 {said}\n"), r.stderr
    for args, stdin in ((["chat", "-n", "1"], "hi\n"), (["embed", "hi"], None),  # embed sets repack itself
                        (["bench", "-p", "8", "-n", "0", "-r", "1", "--no-e2e", "-o", "jsonl"], None)):
        r = CLI(env)(*args, input=stdin)
        assert r.returncode == 0 and r.stderr.count(said) == 1 and "n_threads 1 · " in r.stderr, (args, r.stderr)
    server = Server(env, "-np", "1", "--ctx", "512")
    assert server.stop() == 0 and server.proc.stderr is not None
    assert server.proc.stderr.read().decode().count(said) == 1
    r = CLI(env)("run", "hi", "-n", "1", "-fa", "on", "-t", "2", "-tb", "2", "-ub", "512", "--repack")
    assert r.returncode == 0 and "tuning record" not in r.stderr, "flags for every setting: nothing from the record"


def test_a_machine_with_no_cpu_figures_and_no_load_average_is_not_known_as_busy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows has neither /proc/stat nor a load average: tune and quantize --ladder measure, the load unknown,
    where their check before measuring was an AttributeError traceback."""
    from localgen import hardware
    from localgen.cli.cpuload import CpuLoad

    monkeypatch.setattr(hardware, "cpu_sample", lambda: None)
    monkeypatch.delattr(os, "getloadavg")
    warned: list[str] = []
    load = CpuLoad.before(type("Err", (), {"warn": staticmethod(warned.append)})())
    assert (load.first, load.what, load.busy(), warned) == (None, None, None, [])


def test_other_works_share_leaves_this_process_own_time_out() -> None:
    from localgen.hardware import CpuSample, others_share

    assert others_share(CpuSample(100.0, 40.0, 5.0), CpuSample(110.0, 48.0, 8.0)) == 0.5  # 8 busy, 3 of them ours
    assert others_share(CpuSample(1.0, 1.0, 0.0), CpuSample(1.0, 1.0, 0.0)) is None


def test_without_proc_stat_only_the_load_average_before_measuring_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """tune.md: on macOS (no /proc/stat) the load average just before measuring is what is checked, and nothing is
    watched while measuring (the page said each configuration was watched there too)."""
    import builtins

    from localgen import hardware
    from localgen.cli.cpuload import CpuLoad

    real_open = builtins.open

    def no_proc(path: Any, *a: Any, **k: Any) -> Any:
        if str(path).startswith("/proc"):
            raise FileNotFoundError(path)
        return real_open(path, *a, **k)

    class Said:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def warn(self, text: str) -> None:
            self.lines.append(text)

        note = warn

    monkeypatch.setattr(hardware, "open", no_proc, raising=False)
    monkeypatch.setattr(hardware, "usable_cores", lambda: 8)
    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 6.0, 6.0))
    err = Said()
    load = CpuLoad.before(err)
    load.sample(err)  # a configuration measured: nothing to sample it by
    assert err.lines == ["this machine is busy (other work takes a load of 6.0 on 8 cores): the figures will "
                         "reflect it, and the record is not kept unless --even-if-busy"]
    assert load.busy() == "a load of 6.0 on 8 cores just before measuring"
    text = " ".join((ROOT / "docs" / "tune.md").read_text().split())
    assert ("Where there is no `/proc/stat` (macOS), only the load average just before measuring is checked (past "
            "half the cores is busy)") in text


def test_tune_measures_with_the_placement_and_keeps_the_record_for_it(cli_env: dict[str, str], tmp_path: Path,
                                                                      moe_path: Path) -> None:
    """tune --n-cpu-moe N measures with those experts in RAM, and its record applies to loads placed so (flags or
    a preset's), never to another placement: experts on the CPU are other work, and a CPU buffer is not repacked."""
    from localgen import placement
    from localgen.engine.tune import Probe

    probe = Probe(_ref(moe_path), False, True, 64, 1, cpu_only=True, placement=placement.n_cpu_moe(2))
    try:
        assert probe.engine.load_report.record()["moved"]["CPU"]["experts"] == 2 * 3
    finally:
        probe.close()
    cli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path)})
    done = cli("tune", "-m", str(moe_path), "--n-cpu-moe", "2", "--depth", "0", "--prompt", "16", "--answer", "8",
               "--json", "--even-if-busy")
    assert done.returncode == 0, done.stderr[-2000:]
    rec = json.loads(done.stdout)
    assert rec["key"]["placement"] == "--n-cpu-moe 2" and "for run, chat and bench with --n-cpu-moe 2" in done.stderr
    assert "tiny-moe.gguf · --n-cpu-moe 2 · tuned" in cli("tune", "--show").stdout

    def origins(*args: str) -> set[str]:
        doc = _json(cli, "run", *args, "--raw", "-p", "hi", "-n", "1", "--json")
        return {v.split(" ")[0].rstrip(":") for v in doc["load"]["origins"].values()}

    assert origins("-m", str(moe_path), "--n-cpu-moe", "2") == {"tuned"}
    assert origins("-m", str(moe_path)) == {"rule"} and origins("-m", str(moe_path), "--n-cpu-moe", "1") == {"rule"}
    assert cli("create", "moe2", "-f", "-", input=f"FROM {moe_path}\nPARAMETER n_cpu_moe 2\n").returncode == 0
    assert origins("-m", "moe2") == {"tuned"}
    bad = cli("tune", "-m", str(moe_path), "-ot", "exps=NOPE0")
    assert bad.returncode == 2 and "no buffer type 'NOPE0'" in bad.stderr


def test_a_stop_is_asked_before_each_decode_and_inside_the_prompts_and_fills(smollm2_path: Path) -> None:
    """Ctrl-C during tune acts at once, as chat's prompt evaluation does: `check` (cli/stopping's, which raises once
    Ctrl-C was pressed) is asked before each decode, and inside the decodes of a measured prompt and of the fills
    (untimed) through llama.cpp's abort callback, which stops one where it is (llama.cpp says ret = 2); a decoding
    step, one token, is never asked inside (there the callback's cost would weigh on what is timed)."""
    from localgen.engine.tune import Probe
    from localgen.models.resolve import resolve
    from localgen.native import logs

    class Stop(Exception):
        pass

    calls = 0
    stop_at = 0

    def check() -> None:
        nonlocal calls
        calls += 1
        if stop_at and calls >= stop_at:
            raise Stop

    probe = Probe(resolve(str(smollm2_path)), repack=False, flash_attn=True, n_ctx_seq=2048, streams=1,
                  cpu_only=True, prompt=64, check=check)
    try:
        probe.step(1, 4)  # decoding steps: asked before each of the 4, never inside one
        assert calls == 4
        logs.clear()
        calls, stop_at = 0, 2  # a measured prompt, one decode: asked before it, then inside it, where it stops
        with pytest.raises(Stop):  # (and once more as llama.cpp returns 2)
            probe.prompt(1, 64)
        assert calls == 3 and "failed to decode, ret = 2" in "\n".join(logs.lines(last=50))
        logs.clear()
        calls, stop_at = 0, 3  # asked before the fill's first decode, then inside it: the second time there stops
        with pytest.raises(Stop):
            probe.fill(2048, 1)
        assert calls == 4 and "failed to decode, ret = 2" in "\n".join(logs.lines(last=50))
    finally:
        probe.close()


def test_show_and_reset_together_are_a_usage_error(cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    """--show lists and --reset forgets: both at once would silently do one of them, so neither is done."""
    cli = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(tmp_path)})
    r = cli("tune", "--show", "--reset")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--show" in r.stderr and "--reset" in r.stderr, r.stderr


def test_reset_of_a_model_not_here_forgets_its_records_by_name_and_asks_no_hub(
        cli_in_process: InProcessCLI, own_home: Path, smollm2_path: Path) -> None:
    """`tune --reset -m NAME` forgets that model's records even when its file is gone (by the name they were made
    under) and never downloads it to find its hash; a measuring flag with --reset or --show is a usage error,
    not silently ignored."""
    from localgen import tuning

    cli = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(own_home), "HF_ENDPOINT": "http://127.0.0.1:9"})
    kept = _record(_ref(smollm2_path))
    tuning.save(dataclasses.replace(kept, model="someone/gone-GGUF:Q4_K_M",
                                    key=dataclasses.replace(kept.key, sha256="0" * 64)))
    tuning.save(kept)
    r = cli("tune", "--reset", "-m", "someone/gone-GGUF:Q4_K_M")
    assert r.returncode == 0 and "forgot 1 tuning record of someone/gone-GGUF:Q4_K_M" in r.stderr, r.stderr
    assert [rec.model for rec in tuning.records()] == [kept.model]
    for args in (("--reset", "--prompt", "64"), ("--show", "-m", "smollm2:135m"), ("--reset", "--json")):
        r = cli("tune", *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "measures nothing" in r.stderr, (args, r.stderr)
    assert len(tuning.records()) == 1  # nothing forgotten by a refused command
    # another file of the same name, elsewhere: a file here is matched by its hash alone, a path gone by its name
    tuning.save(dataclasses.replace(kept, key=dataclasses.replace(kept.key, sha256="1" * 64)))
    r = cli("tune", "--reset", "-m", str(smollm2_path))
    assert r.returncode == 0 and "forgot 1 tuning record" in r.stderr, r.stderr
    assert [rec.key.sha256 for rec in tuning.records()] == ["1" * 64]
    r = cli("tune", "--reset", "-m", f"/gone/elsewhere/{smollm2_path.name}")
    assert r.returncode == 0 and "forgot 1 tuning record" in r.stderr and tuning.records() == [], r.stderr
    # tune.md: a file no record's size matches is never hashed (a model of many GB was read whole to forget nothing)
    other = own_home / "other.gguf"
    shutil.copyfile(smollm2_path, other)  # (no record is left: none of its size either)
    r = cli("tune", "--reset", "-m", str(other))
    assert r.returncode == 0 and "forgot 0 tuning records" in r.stderr, r.stderr
    assert not any(str(other) in str(e) for e in tuning._read()["hashes"]), "hashed"


def test_reset_of_a_name_that_is_no_model_and_no_record_is_an_error(
        cli_in_process: InProcessCLI, own_home: Path, smollm2_path: Path) -> None:
    """`tune --reset -m TYPO` is the unknown-model error every command gives, exit 1, not "forgot 0": a name the
    catalogue or the Hub knows but never tuned here says so; the records of other models stay."""
    from localgen import tuning

    cli = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(own_home), "HF_ENDPOINT": "http://127.0.0.1:9"})
    tuning.save(_record(_ref(smollm2_path)))
    for name, said in (("nosuchmodel", "unknown model 'nosuchmodel'"), ("/gone/x.gguf", "no such model file"),
                       ("someone/gone-GGUF:Q4_K_M", "no tuning record was made under that name")):
        r = cli("tune", "--reset", "-m", name)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and said in r.stderr, (name, r.stderr)
        assert "forgot" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(tuning.records()) == 1


def test_records_of_wrong_types_are_left_out_with_a_warning_and_reset_counts_as_show_does(
        cli_in_process: InProcessCLI, own_home: Path, smollm2_path: Path) -> None:
    """A tuning.json whose records have the wrong types (a hand edit) is read without them: --show and --reset say
    so in one warning line, --reset counts only what --show lists, and a load still uses the good record; `--reset
    -m` was an AttributeError traceback, and --reset counted "1 tuning record" where --show listed none."""
    from localgen import tuning

    tuning.save(_record(_ref(smollm2_path)))
    path = tuning.store_path()
    doc = json.loads(path.read_text())
    # (a date that is no time, "yesterday", was shown as `tuned yesterday`: a newcomer's trial; an ISO basic or
    # week form as `tuned 20261125T1`)
    for bad in ("20261125T101010", "2026-W48-3", "2026-11-25T10:00:00+05:30", "2026-13-01"):
        with pytest.raises(ValueError):
            tuning._date({"date": bad})
    doc["records"] += [5, {"key": [1]}, {**doc["records"][0], "date": "yesterday"}]
    doc["hashes"] += [[1], 7]
    path.write_text(json.dumps(doc))
    _, origins = _resolve(_ref(smollm2_path))
    assert origins["flash_attn"].startswith("tuned on"), origins
    cli = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(own_home)})
    warning = f"warning: 3 tuning records in {path} cannot be read (wrong fields or types): they are "
    r = cli("tune", "--show", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["settings"] == SETTINGS, r.stderr  # one JSON line
    assert r.stderr == warning + "left out\n", r.stderr
    r = cli("tune", "--reset", "-m", "smollm2:135m")
    assert r.returncode == 0 and r.stderr == f"forgot 1 tuning record of smollm2:135m\n{warning}removed\n", r.stderr
    assert json.loads(path.read_text())["records"] == []
    path.write_text(json.dumps({"format": 1, "records": [5], "hashes": []}))
    r = cli("tune", "--reset")
    assert r.returncode == 0 and r.stderr == ("forgot 0 tuning records\nwarning: 1 tuning record in "
                                              f"{path} cannot be read (wrong fields or types): it is removed\n")


def test_a_thread_count_clearly_slower_at_the_first_depth_is_not_measured_deeper_nor_listed() -> None:
    """tune.md: a thread count more than 1.25× slower than the best at the first depth is not measured deeper, and
    the table (and the record's) holds the combinations measured at every depth (a newcomer's trial counted the
    rows against "2 configurations × 2 thread counts" and found the slow thread count gone, unexplained)."""
    from types import SimpleNamespace

    from localgen.cli.tune import _rank
    from localgen.engine.tune import Job, Point, _lost

    first = [Point("tg", 0, 1, 512, 1.3), Point("tg", 0, 2, 512, 1.0)]
    assert _lost(first, Job("tg", 64, 1)) and not _lost(first, Job("tg", 64, 2))
    assert not _lost(first, Job("tg", 0, 1))  # the first depth itself is always measured
    assert not _lost([Point("tg", 0, 1, 512, 1.2), Point("tg", 0, 2, 512, 1.0)], Job("tg", 64, 1))  # within 1.25×
    points = [*first, Point("pp", 0, 1, 512, 0.5), Point("pp", 0, 2, 512, 0.4),
              Point("tg", 64, 2, 512, 1.1), Point("pp", 64, 2, 512, 0.45)]  # 1 thread: only the first depth
    plan = SimpleNamespace(depths=(0, 64), answer=8, rule={"flash_attn": True, "repack": False, "n_threads": 2,
                                                           "n_threads_batch": 2, "n_ubatch": 512})
    rows = _rank({(False, True): points}, plan, 1)  # type: ignore[arg-type]
    assert [(r["n_threads"], r["n_threads_batch"]) for r in rows] == [(2, 2)], rows


def test_tune_show_says_a_record_was_made_on_a_busy_machine(own_home: Path, smollm2_path: Path,
                                                            cli_in_process: InProcessCLI) -> None:
    """tune.md: a record kept with --even-if-busy is marked, and every use of it says so; `tune --show` did not (a
    newcomer's trial), where a user looks to learn why its threads are 1."""
    from localgen import tuning

    busy = "62% of the CPU time just before measuring"
    assert tuning.save(dataclasses.replace(_record(_ref(smollm2_path)), busy=busy)) is None
    shown = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(own_home)})("tune", "--show")
    assert shown.returncode == 0 and f"· tuned 2026-11-25 on a busy machine ({busy}) · " in shown.stdout, shown
