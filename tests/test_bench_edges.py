"""`localgen bench` at its edges (issue #42): a long sweep says how long it will take and how far it is, Ctrl-C
keeps what was measured (and never lands inside a model's freeing), `--endpoint` prompts that no prefix cache
can flatter, a table that fits 100 columns, `compare` with a figure missing, sizes and counts as labelled.
Real SmolLM2 runs with small sizes; the fake OpenAI server for `--endpoint`."""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from localgen.bench import sweep
from localgen.cli import app, params
from tests.conftest import CLI, ROOT, knows_the_bandwidth
from tests.fake_openai import FakeServer


def invoke(*args: str) -> Any:
    """`localgen ARGS` in this process (stdout and stderr apart, neither a terminal)."""
    params.install()
    return CliRunner().invoke(app.build(), list(args), env={"COLUMNS": "200"})


@pytest.fixture()
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A benchmark history of this test's own."""
    monkeypatch.setenv("LOCALGEN_HOME", str(knows_the_bandwidth(tmp_path)))
    return tmp_path


def _run_id(stderr: str) -> int:
    m = re.search(r"saved as run (\d+)", stderr)
    assert m, stderr
    return int(m.group(1))


# ---- a long sweep: its length first, then a line per row in a pipe, and Ctrl-C keeps the rows ------------

def _line(stream: Any, within: float = 120.0) -> str:
    """The next line from a child's unbuffered pipe (so nothing waits in a buffer the selector cannot see), or ""
    if none came in time: a safety net, so that a child which says nothing fails the test instead of hanging it."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(within):
            return ""
    return bytes(stream.readline()).decode()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_long_sweep_says_how_long_then_reports_each_row_and_ctrl_c_keeps_them(cli_env: dict[str, str],
                                                                                tmp_path: Path, sig: int) -> None:
    """Ctrl-C, or a SIGTERM (`timeout`: the process then ends by it; it ended there saying nothing), keeps the rows
    measured and says so."""
    env = {**cli_env, "LOCALGEN_HOME": str(knows_the_bandwidth(tmp_path))}
    # 1,000 generation tests, tg1 to tg1000: minutes of work even on a GPU, the first row within a second
    p = CLI(env).popen("bench", "-p", "0", "-n", "1-1000", "-r", "1", "--no-e2e", "-o", "jsonl",
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    assert p.stdout is not None and p.stderr is not None
    try:
        said = _line(p.stderr)
        assert re.fullmatch(r"bench: 1 configuration × 1,000 tests × 1 repetition: about (\d+ min|\d+ h \d+ min|\d+ s) "
                            r"\(Ctrl-C stops after the current repetition and keeps the rows measured\)\n", said), said
        first = json.loads(_line(p.stdout) or "null")
        assert first and first["test"] == "tg1"
        progress = _line(p.stderr)
        assert re.fullmatch(r"bench: 1/1,000 smollm2:135m tg1: [\d,.]+ t/s, about .+ left\n", progress), progress
        p.send_signal(sig)
        out_b, err_b = p.communicate(timeout=300)  # a safety net: it stops after the repetition under way
        out, err = out_b.decode(), err_b.decode()
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == (130 if sig == signal.SIGINT else -sig), err
    rows = [first, *map(json.loads, out.splitlines())]
    assert 1 <= len(rows) < 1000 and [r["test"] for r in rows] == [f"tg{i}" for i in range(1, len(rows) + 1)]
    assert err.rstrip().endswith("interrupted; the results above were measured and kept")
    assert "Traceback" not in err and err.count("interrupted") == 1
    kept = subprocess.run([sys.executable, "-m", "localgen", "bench", "history", str(_run_id(err)), "-o", "json"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert [r["test"] for r in json.loads(kept.stdout)] == [r["test"] for r in rows]


def test_on_a_terminal_it_says_how_long_and_draws_a_bar_on_stderr_only(cli_env: dict[str, str],
                                                                        tmp_path: Path) -> None:
    import pty

    env = {**cli_env, "LOCALGEN_HOME": str(knows_the_bandwidth(tmp_path)), "COLUMNS": "100", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    main, sub = pty.openpty()
    try:
        p = CLI(env).popen("bench", "-p", "8", "-n", "2", "-r", "2", "--no-e2e", "-o", "jsonl",
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=sub)
        os.close(sub)
        screen = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            screen += chunk
        out, _ = p.communicate(timeout=300)
    finally:
        os.close(main)
    assert p.returncode == 0
    assert [json.loads(x)["test"] for x in out.decode().splitlines()] == ["pp8", "tg2"], "stdout: results only"
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))
    assert re.search(r"bench: 1 configuration × 2 tests × 2 repetitions: about \d+ s", text), text
    assert "━" in text or "█" in text or "2/4" in text, f"a progress bar: {text!r}"


@pytest.mark.slow  # benchmarks SmolLM2 in this process
def test_a_short_sweep_in_a_pipe_keeps_stderr_to_one_line(own_home: Path) -> None:
    r = invoke("bench", "-p", "8", "-n", "2", "-r", "1", "--no-e2e", "-o", "jsonl")
    assert r.exit_code == 0, r.stderr
    assert [json.loads(x)["test"] for x in r.stdout.splitlines()] == ["pp8", "tg2"]
    assert re.fullmatch(r"saved as run \d+: localgen bench history \d+\n", r.stderr)


def test_the_foreseen_length_grows_with_the_work() -> None:
    def plan(configs: int = 1, reps: int = 5, depth: int = 0, parallel: list[int] | None = None) -> sweep.Plan:
        return sweep.build(["m"], list(range(1, configs + 1)), [0], [2048], [None], [None], ["f16"], ["f16"], [512],
                           [128], [], [depth], reps, e2e=True, parallel=parallel)

    rates = sweep.Rates(prompt_s=0.001, gen_s=0.01, load_s=0.5)
    one = plan().seconds(rates)
    # pp512 + tg128 + e2e128, 5 times, and a load: about 0.5 + 5 × (0.512 + 1.28 + 1.32) s
    assert 14 < one < 17
    assert plan(configs=3).seconds(rates) == pytest.approx(3 * one)
    assert plan(reps=10).seconds(rates) > 1.9 * one - 1
    assert plan(depth=4096).seconds(rates) > 2 * one
    assert plan(parallel=[8]).seconds(rates) > one + 5 * 8 * 0.512


@pytest.mark.slow  # benchmarks SmolLM2 in this process
def test_ctrl_c_inside_a_models_freeing_lets_it_finish_and_stops_before_the_next_load(
        own_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception raised inside a model load or a context's freeing crashed the process now and then
    (SIGSEGV, as `tune` did): a first Ctrl-C is acted on between two measurements only."""
    from localgen.engine.llama import Engine

    freed: list[int] = []
    loads: list[int] = []
    mine: set[int] = set()  # the engines this bench made: an earlier test's, freed by the garbage collector (its
    real_close, real_init = Engine.close, Engine.__init__  # __del__) while this one ran, sent the Ctrl-C then

    def close(self: Engine) -> None:
        if id(self) not in mine:
            return real_close(self)
        if not freed:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the first configuration's model is freed
            time.sleep(0.2)
        real_close(self)
        freed.append(1)
        return None

    def init(self: Engine, *a: Any, **kw: Any) -> None:
        loads.append(1)
        mine.add(id(self))
        real_init(self, *a, **kw)

    monkeypatch.setattr(Engine, "close", close)
    monkeypatch.setattr(Engine, "__init__", init)
    r = invoke("bench", "-p", "8", "-n", "0", "-r", "1", "-t", "1,2", "--no-e2e", "-o", "jsonl")
    assert freed and loads == [1], ("the freeing finished, and the second configuration was never loaded",
                                    freed, loads, r.exit_code, repr(r.exception), r.stderr[-2000:])
    assert r.exit_code == 130
    assert [json.loads(x)["n_threads"] for x in r.stdout.splitlines()] == [1]
    assert "interrupted; the results above were measured and kept" in r.stderr


# ---- bench --endpoint: prompts a prefix cache cannot flatter ----------------------------------------------

def _sweep(fake: FakeServer, *args: str) -> tuple[list[str], list[dict[str, Any]]]:
    """The prompts one `bench --endpoint` run sent (2 sweep points of 3 requests), and its records."""
    before = len(fake.requests)
    r = invoke("bench", "--endpoint", fake.url, "-m", "plain", "-npl", "1,2", "--num-prompts", "3", "-p", "6", "-n",
               "4", "-o", "json", *args)
    assert r.exit_code == 0, r.stderr
    recs: list[dict[str, Any]] = json.loads(r.stdout)
    assert [rec["same_prompt"] for rec in recs] == [bool(args)] * 2
    return [q["body"]["messages"][-1]["content"] for q in fake.requests[before:]], recs


def _prompts(fake: FakeServer, *args: str) -> list[str]:
    return _sweep(fake, *args)[0]


def test_endpoint_prompts_differ_per_request_across_points_and_runs(fake: FakeServer, own_home: Path) -> None:
    first, second = _prompts(fake), _prompts(fake)
    assert len(first) == len(second) == 6
    every = first + second
    assert len(set(every)) == len(every), "no request repeats an earlier one"
    # not even their openings: the first word is a nonce of each request's own
    assert len({p.split()[0] for p in every}) == len(every)
    assert all(len(p.split()) == 6 for p in every), "-p words, the nonce included"


def test_an_endpoint_sweep_foresees_its_length_from_its_first_point(fake: FakeServer, own_home: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen.bench import serving

    # 8 requests, 2 at a time, 1 s each: 4 s; arriving at 1 a second, the last at about 7 s, then 1 s more
    assert serving.seconds([(2, math.inf, 8, 64)], 1.0, 64) == 4.0
    assert serving.seconds([(2, 1.0, 8, 64)], 1.0, 64) == 8.0
    assert serving.seconds([(1, math.inf, 2, 128)], 1.0, 64) == 4.0, "twice the answer, twice the time"
    seen: list[tuple[Any, ...]] = []
    real = serving.seconds

    def foresee(points: Any, e2e_s: float, gen: int) -> float:
        seen.append((list(points), e2e_s, gen))
        return real(points, e2e_s, gen) + 600  # a long sweep, as a slow server's would be
    monkeypatch.setattr(serving, "seconds", foresee)
    r = invoke("bench", "--endpoint", fake.url, "-m", "plain", "-npl", "1,2", "--request-rate", "inf,50",
               "--num-prompts", "2", "-p", "6", "-n", "4", "-o", "jsonl")
    assert r.exit_code == 0, r.stderr
    assert len(r.stdout.splitlines()) == 4
    assert seen == [([(1, 50.0, 2, 4), (2, math.inf, 2, 4), (2, 50.0, 2, 4)], seen[0][1], 4)] and seen[0][1] > 0
    lines = r.stderr.splitlines()
    assert re.fullmatch(r"bench: 4 sweep points: about 10 min \(Ctrl-C keeps the rows measured\)", lines[0])
    assert re.fullmatch(r"bench: 1/4 plain serve c1 rinf: [\d,.]+ t/s, about .+ left", lines[1]), lines[1]
    assert re.fullmatch(r"bench: 4/4 plain serve c2 r50: [\d,.]+ t/s", lines[4]), lines[4]


def test_same_prompt_keeps_one_prompt_for_every_request(fake: FakeServer, own_home: Path) -> None:
    got = _prompts(fake, "--same-prompt")
    assert len(got) == 6 and len(set(got)) == 1
    from localgen.errors import UsageError

    r = invoke("bench", "--same-prompt", "-p", "8", "-n", "0", "--no-e2e")
    assert isinstance(r.exception, UsageError), r.exception  # exit status 2 at the command line
    assert "--same-prompt" in str(r.exception) and "--endpoint" in str(r.exception)


# ---- output: a table that fits, compare with a figure missing, sizes and parameters as llama-bench -----

@pytest.fixture(scope="module")
def swept_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """A real run with swept settings (their columns widen the table)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("LOCALGEN_HOME", str(tmp_path_factory.mktemp("swept")))
    try:
        r = invoke("bench", "-p", "16", "-n", "4", "-pg", "16,4", "-r", "1", "-t", "1,2", "-ub", "16", "--no-e2e",
                   "-o", "json")
    finally:
        mp.undo()
    assert r.exit_code == 0, r.stderr
    recs: list[dict[str, Any]] = json.loads(r.stdout)
    return recs


def _render(recs: list[dict[str, Any]], width: int) -> str:
    from rich.console import Console

    from localgen.bench import records
    from localgen.cli.bench.view import rich_table as _rich_table

    system = {**records.system_info(), "bandwidth": 12.3e9}
    buf = io.StringIO()
    _rich_table(recs, system, Console(file=buf, width=width, color_system=None, force_terminal=False))
    return buf.getvalue()


@pytest.mark.slow  # benchmarks SmolLM2 in this process
def test_the_table_fits_100_columns_with_every_number_whole(swept_run: list[dict[str, Any]]) -> None:
    from localgen.bench import records

    out = _render(swept_run, 100)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "…" not in out
    tokens = set(re.findall(r"[^\s│┃]+", out))
    _, cells = records.rows(swept_run)
    for row in cells:
        for cell in row:
            for word in cell.split():  # every figure whole: wrapped between words if at all, never inside one
                assert word in tokens, f"{word} (of {cell!r}) is cut or missing"
    # llama-bench's columns come first: t/s in the first table, with the test it belongs to
    first = next(line for line in lines if "┃" in line)
    assert "test" in first and "t/s" in first
    wide = _render(swept_run, 250)
    assert sum("┃" in line for line in wide.splitlines()) == 1, "one table where it fits"


def test_the_client_side_table_fits_100_columns(fake: FakeServer, own_home: Path) -> None:
    from rich.console import Console

    from localgen.bench import serving
    from localgen.cli.bench.view import emit_serving as _emit_serving

    _, recs = _sweep(fake)
    buf = io.StringIO()
    _emit_serving(recs, Console(file=buf, width=100, color_system=None))
    out = buf.getvalue()
    assert out.startswith(serving.LABEL) and max(len(line) for line in out.splitlines()) <= 100
    tokens = set(re.findall(r"[^\s│┃]+", out))
    for row in serving.table(recs)[1]:
        assert all(word in tokens for cell in row for word in cell.split()), row


@pytest.mark.slow  # benchmarks SmolLM2 in this process
def test_sizes_and_parameters_read_as_llama_bench_writes_them(swept_run: list[dict[str, Any]]) -> None:
    from localgen.bench import records

    headers, cells = records.rows(swept_run)
    row = dict(zip(headers, cells[0], strict=True))
    rec = swept_run[0]
    assert row["size"] == f"{rec['model_size'] / (1 << 20):.2f} MiB"
    rss = rec["peak_rss_bytes"]  # the whole test process's peak: over a GiB on some machines
    assert row["peak RSS"] == (f"{rss / (1 << 20):.2f} MiB" if rss < 1 << 30 else f"{rss / (1 << 30):.2f} GiB")
    assert row["params"] == f"{rec['model_n_params'] / 1e6:.2f} M"  # 134.52 M, not "0.13 B"
    assert records.params_b(7_241_732_096) == "7.24 B"
    # MiB up to a GiB, as llama-bench: a 303 MiB peak is not "0.30 GiB"
    assert records.size_gib(318_283_776) == "303.54 MiB" and records.size_gib(4_918_000_000) == "4.58 GiB"


@pytest.mark.slow  # benchmarks SmolLM2 in this process
def test_compare_leaves_a_missing_figure_empty(own_home: Path) -> None:
    a = invoke("bench", "-p", "8", "-n", "0", "-r", "1", "--no-e2e", "-t", "1", "-o", "json")
    b = invoke("bench", "-p", "8,16", "-n", "0", "-r", "1", "--no-e2e", "-t", "1", "-o", "json")
    assert a.exit_code == b.exit_code == 0
    ia, ib = _run_id(a.stderr), _run_id(b.stderr)
    doc = json.loads(invoke("bench", "compare", str(ia), str(ib), "--json").stdout)
    missing = next(r for r in doc["results"] if r["test"] == "pp16")
    assert missing["a_ts"] is None and missing["ratio"] is None and missing["b_ts"] > 0
    text = invoke("bench", "compare", str(ia), str(ib))
    assert text.exit_code == 0, text.stderr
    lines = text.stdout.splitlines()
    row = next(line for line in lines if " pp16 " in f" {line} " and "█" not in line)
    assert re.search(r"pp16\s+[\d.]+\s*$", row), f"run {ia}'s figure and B/A stay empty: {row!r}"
    bar = next(line for line in lines if f"pp16 run {ia}" in line)
    assert "█" not in bar and "t/s" not in bar and "0.0" not in bar
    assert "█" in next(line for line in lines if f"pp16 run {ib}" in line)


@pytest.mark.slow  # benchmarks SmolLM2 in this process
def test_compare_of_a_local_run_and_an_endpoint_run_shows_a_setting_it_lacks_as_a_dash(
        fake: FakeServer, own_home: Path) -> None:
    """bench.md: compare's labels name the settings that differ between the rows (`threads=2`); an --endpoint run
    has none of a local run's, and they read `threads=None ngl=None ... fa=None` in its labels and cells."""
    # -ngl 0: the label below names it on a GPU machine too (an H200's default was -1)
    local = invoke("bench", "-p", "8", "-n", "0", "-r", "1", "--no-e2e", "-t", "1", "-ngl", "0", "-o", "json")
    assert local.exit_code == 0, local.stderr
    _sweep(fake)
    text = invoke("bench", "compare", "1", "2")
    assert text.exit_code == 0, text.stderr
    assert "None" not in text.stdout, text.stdout
    lines = text.stdout.splitlines()
    served = next(line for line in lines if line.startswith("plain ") and "█" not in line and "run" not in line)
    assert served.split()[4:11] == ["-"] * 7, served  # threads to type_v: a server's own, not known here
    assert re.search(r"^plain serve c1 rinf run 2 +█", text.stdout, re.M), text.stdout  # its bar names none
    assert "smollm2:135m pp8 threads=1 ngl=0" in text.stdout, "a setting a row has is still named"


def test_bar_chart_fits_its_columns_and_draws_no_bar_for_a_missing_figure() -> None:
    from localgen.cli.bench.view import bar_chart

    chart = bar_chart([("short", 100.0), ("x" * 90, 50.0), ("gone", None)], columns=100).splitlines()
    assert max(len(line) for line in chart) <= 100
    assert "gone" in chart and not any(line.startswith("█") and "gone" in line for line in chart)
    assert chart[chart.index("x" * 90) + 1].count("█") > 0


def test_bar_charts_bars_start_in_one_terminal_column_whatever_the_labels_characters() -> None:
    """A label of wide (CJK) characters or with a combining accent: its bar starts in the same terminal column as
    the others' (padded by cells, not by len())."""
    from rich.cells import cell_len

    from localgen.cli.bench.view import bar_chart

    labels = ["模型の名前.gguf pp8", "cafe\u0301.gguf pp8", "plain.gguf pp8"]
    chart = bar_chart([(label, 100.0 - k) for k, label in enumerate(labels)], columns=100).splitlines()
    starts = {cell_len(line[:line.index("█")]) for line in chart}
    assert len(chart) == 3 and starts == {cell_len(labels[0]) + 2}, chart


# ---- count flags: one spelling ----------------------------------------------------------------------------

def test_every_how_many_option_is_spelled_n() -> None:
    """An option that says how many of a command's results (`similar`, `rerank`, `logs`) or tokens (`run`,
    `chat`, `serve`; bench's -n/--n-gen, as llama-bench) is -n. bench's other counts cannot be: -r/--repetitions
    and --num-prompts keep llama-bench's and vLLM's spellings, since -n is already --n-gen there."""
    import typer

    found: dict[str, Any] = {}

    def walk(command: Any, path: str) -> None:
        found[path] = command
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    params.install()
    walk(typer.main.get_command(app.build()), "")
    counts = {(path, o.name): [*o.opts, *o.secondary_opts] for path, c in found.items() for o in c.params
              if o.param_type_name == "option" and re.match(r"(How many|Only the best N|Most tokens to generate|"
                                                          r"Generation lengths)", o.help or "")}
    assert {path for path, _ in counts} >= {"run", "chat", "serve", "similar", "rerank", "logs", "bench"}
    assert all("-n" in names for names in counts.values()), counts
    bench = {n for o in found["bench"].params for n in o.opts}
    assert {"-r", "--repetitions", "--num-prompts"} <= bench


# ---- what a run measured: compare only like with like; Ctrl-C before a result; the model file's path ---------

def _a_quality_run_and_a_speed_run(home: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """Two runs in the history: a ladder's (bench --quality) and a speed run, of the same file."""
    from localgen.bench import history

    monkeypatch.setenv("LOCALGEN_HOME", str(home))
    system = {"build_commit": "x", "localgen_version": "0"}
    common = {"model_filename": "/m/model-Q8_0.gguf", "model_name": "model-Q8_0.gguf", "n_threads": 1,
              "n_gpu_layers": 0, "n_batch": 2048, "n_ubatch": 512, "type_k": "f16", "type_v": "f16"}
    quality = history.start("localgen bench --quality t.txt --reference f16.gguf -m model-Q8_0.gguf", system)
    history.add(quality, 0, {**common, "test": "quality", "flash_attn": None, "kld": 0.005, "ppl": 20.1,
                             "tg_ts": 40.0})
    speed = history.start("localgen bench -m model-Q8_0.gguf", system)
    for i, test in enumerate(("pp512", "tg128")):
        history.add(speed, i, {**common, "test": test, "flash_attn": True, "avg_ts": 100.0 + i})
    assert quality.id is not None and speed.id is not None
    return quality.id, speed.id


def test_compare_of_a_quality_run_and_a_speed_run_is_one_line_exit_2(cli: CLI, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    quality, speed = _a_quality_run_and_a_speed_run(tmp_path, monkeypatch)
    c = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path)})
    for a, b in ((quality, speed), (speed, quality)):
        for json_flag in ([], ["--json"]):
            r = c("bench", "compare", str(a), str(b), *json_flag)
            assert r.returncode == 2 and r.stdout == "", r.stdout
            line = r.stderr.strip()
            assert "\n" not in line and "Traceback" not in line
            kinds = {quality: "quality (PPL and KL divergence: bench --quality)", speed: "speed (t/s)"}
            assert line == (f"localgen: error: run {a} measured {kinds[a]} and run {b} measured {kinds[b]}: compare "
                            "two runs that measured the same thing")
    same = c("bench", "compare", str(speed), str(speed), "--json")  # like with like still compares
    assert same.returncode == 0 and [r["ratio"] for r in json.loads(same.stdout)["results"]] == [1.0, 1.0]


@pytest.mark.slow  # loads SmolLM2 in this process
def test_ctrl_c_before_the_first_result_says_nothing_was_measured_and_keeps_no_run(
        own_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during the first model load: the load finishes (never interrupted inside), then nothing is measured,
    and no empty run is left in the history."""
    from localgen.engine.llama import Engine

    real_init = Engine.__init__

    def init(self: Engine, *a: Any, **kw: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the model loads
        time.sleep(0.2)
        real_init(self, *a, **kw)

    monkeypatch.setattr(Engine, "__init__", init)
    r = invoke("bench", "-p", "8", "-n", "0", "-r", "1", "--no-e2e")
    assert r.exit_code == 130 and r.stdout == ""
    assert r.stderr == "interrupted before the first repetition was measured: nothing saved\n"
    monkeypatch.setattr(Engine, "__init__", real_init)  # (undo() would also leave this test's own home)
    listed = invoke("bench", "history")
    assert listed.stdout == "" and listed.stderr == "no benchmark runs yet: localgen bench\n"


def test_a_model_given_by_a_relative_path_is_kept_by_its_absolute_path(cli: CLI, tmp_path: Path,
                                                                        smollm2_path: Path) -> None:
    """`compare` pairs rows by the model file's path: runs made in different folders must not pair two files."""
    (tmp_path / "x.gguf").symlink_to(smollm2_path)
    c = CLI({**cli.env, "LOCALGEN_HOME": str(knows_the_bandwidth(tmp_path / "home"))})
    r = c("bench", "-m", "./x.gguf", "-p", "8", "-n", "0", "-r", "1", "-t", "1", "--no-e2e", "-o", "json",
          cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [rec["model_filename"] for rec in json.loads(r.stdout)] == [str(tmp_path / "x.gguf")]
    kept = c("bench", "history", str(_run_id(r.stderr)), "-o", "json")
    assert [rec["model_filename"] for rec in json.loads(kept.stdout)] == [str(tmp_path / "x.gguf")]


def test_a_ladder_row_keeps_its_files_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen.quant import ladder
    from localgen.quant import measure as ms

    monkeypatch.chdir(tmp_path)
    row = ladder.Row("x.gguf", "./x.gguf", "Q8_0", 1, 8.5, 1.0, 1.0, 20.0, 0.1, 0.01, 0.001, 0.1, 0.5, 0.99, 0.01,
                     "CPU only")
    assert row.record(ms.Settings(), ladder.Speed(), "default")["model_filename"] == str(tmp_path / "x.gguf")


def test_compare_of_two_ladders_pairs_each_file_whatever_threads_or_batch_timed_it(
        cli: CLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.md: `bench compare` of two --quality runs shows each file's mean KLD, PPL and generation speed in
    both; quantize-choose.md: two texts, or two contexts, side by side. A ladder's KL divergence does not depend on
    the threads it was timed with, nor on the batch its context takes: each file is one row of both runs."""
    from localgen.bench import history

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    system = {"build_commit": "x", "localgen_version": "0"}
    runs = []
    for threads, batch, kld in ((None, 2048, 0.005), (2, 2000, 0.007)):  # -t 2, and a --ctx of 100 (batch 2000)
        run = history.start("localgen bench --quality ...", system)
        for seq, (name, k) in enumerate((("f16.gguf", None), ("model-Q8_0.gguf", kld))):
            history.add(run, seq, {"test": "quality", "model_filename": f"/m/{name}", "model_name": name,
                                   "n_threads": threads, "n_gpu_layers": None, "n_batch": batch, "n_ubatch": 512,
                                   "flash_attn": None, "type_k": "f16", "type_v": "f16", "kld": k, "ppl": 20.0,
                                   "tg_ts": 40.0})
        runs.append(run.id)
    c = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path)})
    r = c("bench", "compare", *map(str, runs), "--json")
    assert r.returncode == 0, r.stderr
    assert [(x["model_name"], x["a_kld"], x["b_kld"]) for x in json.loads(r.stdout)["results"]] == [
        ("f16.gguf", None, None), ("model-Q8_0.gguf", 0.005, 0.007)]
    flat = {page: " ".join((ROOT / "docs" / page).read_text(encoding="utf-8").split())
            for page in ("bench.md", "quantize-choose.md")}
    assert "paired by the file alone, whatever `-t` or `--ctx` each was measured with" in flat["bench.md"]
    assert "each file on one line (two texts, or two contexts)" in flat["quantize-choose.md"]


@pytest.mark.parametrize(("args", "said"), [
    (("-r", "99999999999999999999"), "-r must be within 1 to 1000, not 99999999999999999999"),
    (("-p", "2000000000"), "pp2000000000 needs a context of 2,000,000,000 tokens (-p): past the 8,192 smollm2:135m"),
    (("-n", "9000"), "tg9000 needs a context of 9,000 tokens (-n): past the 8,192"),
    (("-p", "512", "-d", "8000"), "pp512 @ d8000 needs a context of 8,512 tokens (-p + -d)"),
    (("-pg", "99999999999999999999,1"), "--prompt-gen must be at most 2,147,483,647 (llama.cpp takes it as a C int), "
                                        "not 99999999999999999999"),
    (("-npl", "99999999999999999999"), "--parallel must be within 1 to 256, not 99999999999999999999"),
    (("--endpoint", "http://127.0.0.1:9", "-npl", "5000"),
     "--parallel/--concurrency must be within 1 to 1,024, not 5000"),
    (("--endpoint", "http://127.0.0.1:9", "-p", "100000", "-npl", "1000"), "--n-prompt × --num-prompts"),
    (("--endpoint", "http://127.0.0.1:9", "--num-prompts", "99999999999999999999"),
     "--num-prompts must be within 1 to 100000, not 99999999999999999999"),
    (("--quality", "default", "--reference", "smollm2:135m", "-m", "smollm2:135m", "-p", "9000"),
     "pp9000 needs a context of 9,000 tokens"),
    # a hundred million load configurations were listed (minutes, gigabytes) before anything was said
    (("-t", "1-1000", "-b", "1-1000", "-ub", "1-100"),
     "the sweep is 100,000,000 configurations (1000 × 1000 × 100 values): at most 10,000"),
    (("-p", "1-1000", "-n", "1-1000", "-d", "0-9"), "the sweep is 20,000 tests (-p and -n sizes, -pg pairs, at each "
                                                    "-d depth): at most 10,000"),
])
def test_an_absurd_size_or_count_is_refused_before_anything_is_measured(cli: CLI, own_home: Path,
                                                                        args: tuple[str, ...], said: str) -> None:
    """bench.md: -r, -p, -n, -d, -pg, -npl, --num-prompts and a sweep's size past what can run (a test longer than
    the model's training context, the load's cap; more sequences than llama.cpp's 256; more configurations or tests
    than 10,000) are a one-line usage error naming the flag, before any load, estimate or history run: not an
    estimate of billions of hours, nor a failure once measuring."""
    cli = CLI({**cli.env, "LOCALGEN_HOME": str(own_home)})  # a history of its own, whatever ran before
    r = cli("bench", *args, "-o", "md")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
    assert "bench:" not in r.stderr and "measuring" not in r.stderr and r.stdout == "", r.stderr
    assert "no benchmark runs yet" in cli("bench", "history").stderr  # none was started
