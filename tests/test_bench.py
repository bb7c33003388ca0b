"""`localgen bench`: flag forms, plans, every output format, history and compare, doctor; real SmolLM2."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localgen.bench import sweep
from localgen.errors import UsageError
from tests.conftest import CLI, ROOT, InProcessCLI, on_all_cpus, unpinned

SMALL = ["-p", "16", "-n", "4", "-r", "2"]  # two repetitions: a spread; the sizes distinct from -pg and -d


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["1,2,4"], [1, 2, 4]),
        (["1-4"], [1, 2, 3, 4]),
        (["1-16*2"], [1, 2, 4, 8, 16]),
        (["0-40+10"], [0, 10, 20, 30, 40]),
        (["1", "2", "2"], [1, 2]),  # repeated flags add up, duplicates dropped
        (["1-3,8"], [1, 2, 3, 8]),
        (["-1,0"], [-1, 0]),
    ],
)
def test_int_lists_and_ranges(items: list[str], expected: list[int]) -> None:
    assert sweep.int_values("-t", items, [9]) == expected


@pytest.mark.parametrize("bad", ["x", "4-1", "1-8*1", "0-8*2", "1-8+0", "1..4", "1-999999"])
def test_bad_ranges_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError):
        sweep.int_values("-t", [bad], [1])


def test_bools_types_pairs_and_plan() -> None:
    assert sweep.bool_values("-fa", ["0,1", "on"], [True]) == [False, True]
    with pytest.raises(UsageError):
        sweep.bool_values("-fa", ["maybe"], [True])
    assert sweep.str_values("-ctk", ["f16,q8_0"], ["f16"], sweep.KV_TYPES) == ["f16", "q8_0"]
    with pytest.raises(UsageError):
        sweep.str_values("-ctk", ["q3_bogus"], ["f16"], sweep.KV_TYPES)
    assert sweep.pairs("-pg", ["512,128", "64,16"]) == [(512, 128), (64, 16)]
    with pytest.raises(UsageError):
        sweep.pairs("-pg", ["512"])
    with pytest.raises(UsageError, match="--prompt-gen must be at least 0, not -1"):  # (it said: not two numbers)
        sweep.build(["m"], [1], [0], [1], [1], [True], ["f16"], ["f16"], [0], [0], sweep.pairs("-pg", ["-1,2"]),
                    [0], 1, e2e=False)
    plan = sweep.build(["m1", "m2"], [1, 2], [0], [2048], [512], [True], ["f16"], ["f16"], [512], [128],
                       [(512, 128)], [0, 4096], 3, e2e=True)
    assert len(plan.configs) == 4
    assert [t.label for t in plan.tests] == ["pp512", "tg128", "pp512+tg128", "pp512 @ d4096", "tg128 @ d4096",
                                             "pp512+tg128 @ d4096", "e2e128"]
    assert plan.tests[3].ctx_needed == 4096 + 512
    with pytest.raises(UsageError, match="nothing to measure"):
        sweep.build(["m"], [1], [0], [1], [1], [True], ["f16"], ["f16"], [0], [0], [], [0], 1, e2e=False)
    with pytest.raises(UsageError, match="nothing to measure"):  # a -pg 0,0 pair too (it divided by zero)
        sweep.build(["m"], [1], [0], [1], [1], [True], ["f16"], ["f16"], [0], [0], [(0, 0)], [0], 1, e2e=False)
    zero_pair = sweep.build(["m"], [1], [0], [1], [1], [True], ["f16"], ["f16"], [4], [0], [(0, 0), (0, 2)], [0], 1,
                            e2e=False)
    assert [t.label for t in zero_pair.tests] == ["pp4", "pp0+tg2"]  # left out, as llama-bench leaves it
    with pytest.raises(UsageError, match="flash attention"):
        sweep.build(["m"], [1], [0], [1], [1], [False], ["f16"], ["q8_0"], [8], [8], [], [0], 1, e2e=False)


def bench(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`localgen bench ARGS` in a process of its own (through the session's fork server: `env` differs from the
    CLI's only in LOCALGEN_HOME)."""
    return CLI(env)("bench", *args)


@pytest.fixture(scope="module")
def benv(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {**cli_env, "LOCALGEN_HOME": str(tmp_path_factory.mktemp("benchhome"))}


@pytest.fixture(scope="module")
def bench_here(benv: dict[str, str], cli_in_process: InProcessCLI) -> InProcessCLI:
    """`localgen bench ...` in this process, in benv's home: for what loads no model (history, compare, refusals)
    or what a test watches from inside (the contexts llama.cpp measures with)."""
    return InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": benv["LOCALGEN_HOME"]})


@pytest.fixture(scope="module")
def jsonl_run(benv: dict[str, str]) -> list[dict[str, Any]]:
    r = bench(benv, *SMALL, "-pg", "8,2", "-d", "0,24", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_jsonl_records_carry_llama_bench_fields_and_ours(jsonl_run: list[dict[str, Any]]) -> None:
    tests = [r["test"] for r in jsonl_run]
    assert tests == ["pp16", "tg4", "pp8+tg2", "pp16 @ d24", "tg4 @ d24", "pp8+tg2 @ d24", "e2e4"]
    for r in jsonl_run:
        for field in ("model_filename", "model_type", "model_size", "model_n_params", "n_prompt", "n_gen",
                      "n_depth", "n_threads", "n_gpu_layers", "n_batch", "n_ubatch", "flash_attn", "type_k",
                      "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts", "load_s",
                      "peak_rss_bytes", "build_commit", "cpu_info", "backends", "test_time"):
            assert field in r, field
        assert len(r["samples_ts"]) == 2 and r["avg_ts"] > 0
        assert r["peak_rss_bytes"] > 50 << 20
        # the rates are the record's own tokens over its own times (llama-bench's avg_ts: the mean of the samples')
        assert r["avg_ts"] == pytest.approx(statistics.fmean(r["samples_ts"]), rel=1e-5)
        if not r["test"].startswith("e2e"):  # an e2e test's tokens are those the run path gave (an EOS ends it)
            tokens = r["n_prompt"] + r["n_gen"]
            assert r["samples_ts"] == pytest.approx([tokens / (ns / 1e9) for ns in r["samples_ns"]], rel=1e-5), r
    by = {r["test"]: r for r in jsonl_run}
    assert by["pp16 @ d24"]["n_depth"] == 24 and by["pp16"]["n_prompt"] == 16 and by["tg4"]["n_gen"] == 4
    assert by["tg4"]["itl_p50_ms"] <= by["tg4"]["itl_p99_ms"]
    assert by["pp8+tg2"]["ttft_ms"] > 0 and by["e2e4"]["ttft_ms"] > 0
    if by["tg4"]["n_gpu_layers"] == 0:
        assert by["tg4"]["limit_ts"] > 0 and by["tg4"]["limit_share"] > 0
    else:  # the limit is host memory bandwidth: with the weights on a GPU there is no honest figure
        assert by["tg4"]["limit_ts"] is None and by["tg4"]["limit_share"] is None
    assert by["pp16"]["limit_ts"] is None


def test_e2e_and_no_e2e_each_say_whether_the_run_path_is_measured(benv: dict[str, str]) -> None:
    """bench.md: `--e2e/--no-e2e`, on by default: the positive form parses and measures e2eN, the negative skips it."""
    for flag, tests in (("--e2e", ["tg2", "e2e2"]), ("--no-e2e", ["tg2"])):
        r = bench(benv, "-p", "0", "-n", "2", "-r", "1", flag, "-o", "jsonl")
        assert r.returncode == 0, r.stderr
        assert [json.loads(line)["test"] for line in r.stdout.splitlines()] == tests, flag


def test_a_broken_chat_template_warns_and_e2e_sends_the_prompt_as_plain_text(benv: dict[str, str], tmp_path: Path,
                                                                            smollm2_path: Path) -> None:
    """A model whose chat template fails: bench measured its rows, then ended in the template's error (naming
    `--raw`, no bench flag) and lost the e2e row. It is a warning, once, and e2e sends its prompt as plain text, as
    for a base model."""
    from tests.gguf_edit import rewrite_strings

    bad = rewrite_strings(smollm2_path, tmp_path / "badtpl.gguf",
                          {"tokenizer.chat_template": '{{ raise_exception("no") }}'})
    r = bench(benv, "-m", str(bad), "-p", "0", "-n", "4", "-r", "2", "-o", "jsonl", "-t", "1,2")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["test"] for line in r.stdout.splitlines()] == ["tg4", "e2e4"] * 2  # (2 configurations)
    assert r.stderr.count("warning: the model's chat template failed: no: e2e sends its prompt as plain text, as "
                          "`run --raw` does\n") == 1, r.stderr


def test_an_e2e_answer_without_a_token_has_no_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """A base model sampled EOS first (seeds 2 and 3 of SmolLM2 on the raw essay prompt): a division by zero, a
    traceback. A repetition with no token is left out of the row; a row of none is one error line."""
    from types import SimpleNamespace

    from localgen.bench import runner
    from localgen.errors import LocalgenError

    engine = SimpleNamespace(load_s=0.1)
    bench_ = SimpleNamespace(clear=lambda: None)
    test = sweep.Test("e2e", 0, 4, 0)
    answers = iter([None, (0.5, 0.1, [0.1, 0.1, 0.1], 4), None])
    monkeypatch.setattr(runner, "_e2e", lambda *a, **k: next(answers))
    result = runner._measure(engine, bench_, None, test, {"name": "m"}, 3, runner.Progress(), None)  # type: ignore
    assert result.samples_ts == [8.0]
    monkeypatch.setattr(runner, "_e2e", lambda *a, **k: None)
    with pytest.raises(LocalgenError, match="e2e4: each answer ended before its first token, so it has no rate"):
        runner._measure(engine, bench_, None, test, {"name": "m"}, 3, runner.Progress(), None)  # type: ignore


def test_every_output_format(benv: dict[str, str], bench_here: InProcessCLI) -> None:
    args = ["-p", "16", "-n", "4", "-r", "1", "--no-e2e"]
    md = bench(benv, *args, "-o", "md")
    assert md.returncode == 0, md.stderr
    lines = md.stdout.splitlines()
    assert lines[0].startswith("| model") and "t/s" in lines[0] and "test" in lines[0]
    # the generation rate's share of the memory-bandwidth limit, named as bench.md names it (it was "of limit")
    assert lines[0].rstrip(" |").endswith("| of BW limit"), lines[0]
    assert "the `of BW limit` column" in (ROOT / "docs" / "bench.md").read_text(encoding="utf-8")
    assert any("pp16" in ln and "±" in ln for ln in lines)
    rows = list(csv.DictReader(io.StringIO(bench(benv, *args, "-o", "csv").stdout)))
    assert [r["n_prompt"] for r in rows] == ["16", "0"] and float(rows[1]["avg_ts"]) > 0
    assert list(rows[0])[:3] == ["build_commit", "build_number", "cpu_info"]
    assert "samples_ts" not in rows[0] and "samples_ns" not in rows[0], "CSV leaves them out, as llama-bench's"
    doc = json.loads(bench(benv, *args, "-o", "json").stdout)
    assert isinstance(doc, list) and doc[0]["test"] == "pp16"
    assert len(doc[0]["samples_ts"]) == len(doc[0]["samples_ns"]) == 1
    default = bench(benv, *args)  # not a terminal: Markdown with the system as comments
    assert default.stdout.startswith("<!-- localgen") and "| model" in default.stdout
    bad = bench_here("bench", *args, "-o", "xml")  # refused before anything loads
    assert bad.returncode == 2 and "--output must be one of" in bad.stderr


def test_bench_measures_where_there_is_no_resource_module(bench_here: InProcessCLI,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows has neither /proc nor the resource module: the peak memory is not measured (null, an empty cell),
    where bench was an ImportError traceback after its first measurement."""
    from localgen import hardware

    proc_field = hardware.proc_kib_field
    monkeypatch.setattr(hardware, "proc_kib_field", lambda path, key: None if key == "VmHWM" else proc_field(path, key))
    monkeypatch.setitem(sys.modules, "resource", None)
    r = bench_here("bench", "-p", "16", "-n", "4", "-r", "1", "--no-e2e", "-o", "jsonl")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["test"] for x in records] == ["pp16", "tg4"] and all(x["peak_rss_bytes"] is None for x in records)


def test_sweep_flags_reach_the_records_and_llama_cpp(bench_here: InProcessCLI,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's sweep flags: every combination is a record carrying its settings, and each context llama.cpp
    measured with is the one asked for, as llama.cpp itself reports it (its getters, and its log of the context
    and the KV cache it built). The command runs in this process, so the same run shows both."""
    from localgen.engine.bench import BenchContext
    from localgen.native import logs
    from localgen.native.lib import lib

    seen: set[tuple[int, int, bool, str, int]] = set()
    measure = BenchContext.prompt

    def prompt(self: BenchContext, n: int) -> float:
        lc, ctx, log = lib(), self.ctx, "\n".join(logs.lines(last=1000))
        fa = re.findall(r"llama_context: flash_attn += (\w+)", log)[-1]
        k = re.findall(r"llama_kv_cache: size = .* K \((\w+)\)", log)[-1]
        assert lc.llama_n_threads(ctx) == lc.llama_n_threads_batch(ctx)
        seen.add((lc.llama_n_threads(ctx), lc.llama_n_batch(ctx), fa == "enabled", k, lc.llama_n_ubatch(ctx)))
        return measure(self, n)

    monkeypatch.setattr(BenchContext, "prompt", prompt)
    r = bench_here("bench", "-p", "8", "-n", "0", "-r", "1", "-t", "1-2", "-b", "16,32", "-ub", "16", "-fa", "0,1",
                   "-ctk", "f16", "-ctk", "q8_0", "--no-e2e", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(recs) == 2 * 2 * 2 * 2
    want = {(t, b, fa, k) for t in (1, 2) for b in (16, 32) for fa in (False, True) for k in ("f16", "q8_0")}
    assert {(x["n_threads"], x["n_batch"], x["flash_attn"], x["type_k"]) for x in recs} == want
    assert {x["n_ubatch"] for x in recs} == {16}
    assert seen == {(*x, 16) for x in want}


def test_where_the_peak_rss_cannot_be_reset_only_the_first_loads_rows_give_it(
        bench_here: InProcessCLI, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.md: where the peak cannot be started again (macOS: no /proc, and ru_maxrss never goes down), only
    the first load's rows give the peak RSS; a later load's rows leave it empty instead of carrying the earlier
    maximum over."""
    import builtins

    from localgen import hardware
    from localgen.bench import runner

    real_open, real_field = builtins.open, hardware.proc_kib_field

    def no_proc(path: Any, *a: Any, **k: Any) -> Any:
        if str(path).startswith("/proc"):
            raise FileNotFoundError(path)
        return real_open(path, *a, **k)

    monkeypatch.setattr(runner, "open", no_proc, raising=False)
    monkeypatch.setattr(hardware, "proc_kib_field", lambda path, key: None if path.startswith("/proc/self")
                        else real_field(path, key))
    r = bench_here("bench", "-p", "8", "-n", "2", "-r", "1", "-t", "1,2", "--no-e2e", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(x["n_threads"], x["test"]) for x in recs] == [(1, "pp8"), (1, "tg2"), (2, "pp8"), (2, "tg2")]
    assert all(x["peak_rss_bytes"] > 50 << 20 for x in recs[:2])
    assert [x["peak_rss_bytes"] for x in recs[2:]] == [None, None]


def test_default_threads_are_the_physical_cores_this_process_may_use(benv: dict[str, str]) -> None:
    """One thread per physical core, counted within the CPU affinity (and cgroup quota), not per logical CPU
    of the machine."""
    from localgen import hardware

    args = ["-p", "16", "-n", "0", "-r", "1", "--no-e2e", "-o", "jsonl"]
    if not hasattr(os, "sched_setaffinity"):
        r = bench(benv, *args)
        assert r.returncode == 0, r.stderr
        assert [json.loads(x)["n_threads"] for x in r.stdout.splitlines()] == [hardware.physical_cores()]
        return
    # on every CPU the suite may use, not the one this test worker keeps to (where the count is 1 anyway)
    r = unpinned("bench", *args, env=benv)
    assert r.returncode == 0, r.stderr
    physical = on_all_cpus(hardware.physical_cores)
    assert [json.loads(x)["n_threads"] for x in r.stdout.splitlines()] == [physical]
    one = subprocess.run([sys.executable, "-m", "localgen", "bench", *args], env=benv, capture_output=True,
                         text=True, timeout=900, cwd=ROOT, stdin=subprocess.DEVNULL,
                         preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    assert one.returncode == 0, one.stderr
    assert [json.loads(x)["n_threads"] for x in one.stdout.splitlines()] == [1], "pinned to one CPU: one thread"


def test_history_and_compare(benv: dict[str, str], bench_here: InProcessCLI,
                             jsonl_run: list[dict[str, Any]]) -> None:
    a = bench(benv, "-p", "16", "-n", "4", "-r", "1", "--no-e2e", "-t", "1", "-o", "json")
    b = bench(benv, "-p", "16", "-n", "4", "-r", "1", "--no-e2e", "-t", "1", "-o", "json")
    assert a.returncode == b.returncode == 0
    ids = [int(s.split("run ")[1].split(":")[0]) for s in (a.stderr, b.stderr)]
    # history and compare read the runs kept in the home: no model, so in this process
    listing = bench_here("bench", "history")
    assert listing.returncode == 0
    assert all(str(i) in listing.stdout for i in ids) and "localgen bench -p 16" in listing.stdout
    shown = json.loads(bench_here("bench", "history", str(ids[0]), "-o", "json").stdout)
    assert shown == json.loads(a.stdout)
    cmp = bench_here("bench", "compare", str(ids[0]), str(ids[1]), "--json")
    assert cmp.returncode == 0, cmp.stderr
    rows = json.loads(cmp.stdout)["results"]
    assert [r["test"] for r in rows] == ["pp16", "tg4"]
    assert all(r["ratio"] and 0.2 < r["ratio"] < 5 for r in rows)
    ts = [{r["test"]: r["avg_ts"] for r in json.loads(run.stdout)} for run in (a, b)]
    assert [(r["a_ts"], r["b_ts"]) for r in rows] == [(ts[0][t], ts[1][t]) for t in ("pp16", "tg4")]
    assert [r["ratio"] for r in rows] == [pytest.approx(ts[1][t] / ts[0][t], abs=6e-5) for t in ("pp16", "tg4")]
    text = bench_here("bench", "compare", str(ids[0]), str(ids[1]))
    assert "B/A" in text.stdout and "█" in text.stdout and "x" in text.stdout
    missing = bench_here("bench", "history", "99999")
    assert missing.returncode == 1 and "no benchmark run 99999" in missing.stderr


def test_history_takes_every_output_format_with_and_without_an_id(benv: dict[str, str],
                                                                   bench_here: InProcessCLI) -> None:
    """bench.md: `bench history [ID] [-o md|csv|json|jsonl]`: each format of a run and of the list; another is one
    line, exit 2. And `bench compare` labels each bar with the settings that tell the rows apart."""
    r = bench(benv, "-p", "16", "-n", "0", "-r", "1", "--no-e2e", "-t", "1,2", "-o", "json")
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    run = str(int(r.stderr.split("saved as run ")[1].split(":")[0]))
    jsonl = bench_here("bench", "history", run, "-o", "jsonl")
    assert jsonl.returncode == 0 and [json.loads(x) for x in jsonl.stdout.splitlines()] == recs
    rows = list(csv.DictReader(io.StringIO(bench_here("bench", "history", run, "-o", "csv").stdout)))
    assert [x["n_threads"] for x in rows] == ["1", "2"]
    md = bench_here("bench", "history", run, "-o", "md").stdout.splitlines()
    assert md[0].startswith("| model") and len(md) == 4
    assert json.loads(bench_here("bench", "history", run, "-o", "json").stdout) == recs
    listed = json.loads(bench_here("bench", "history", "-o", "json").stdout)
    assert listed[0]["id"] == int(run) and listed[0]["results"] == 2 and "-t 1,2" in listed[0]["command"]
    assert set(listed[0]) == {"id", "created", "results", "partial", "command"} and listed[0]["partial"] == 0
    lines = [json.loads(x) for x in bench_here("bench", "history", "-o", "jsonl").stdout.splitlines()]
    assert lines == listed
    table = list(csv.DictReader(io.StringIO(bench_here("bench", "history", "-o", "csv").stdout)))
    assert [int(x["id"]) for x in table] == [x["id"] for x in listed]
    md = bench_here("bench", "history", "-o", "md").stdout.splitlines()
    assert md[0] == "| ID | date | results | command |" and len(md) == len(listed) + 2
    for args in (["history", "-o", "xml"], ["history", run, "-o", "xml"]):
        bad = bench_here("bench", *args)
        assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1
        assert "--output must be one of md, csv, json, jsonl, not 'xml'" in bad.stderr
    chart = bench_here("bench", "compare", run, run).stdout
    assert re.search(r"pp16 threads=1 run \d+ ", chart) and re.search(r"pp16 threads=2 run \d+ ", chart)


@pytest.mark.parametrize("flags", [["-o", "xml"], ["-fa", "0"], ["-fa", "0,1"], ["-d", "4096"], ["-ctk", "q8_0"],
                                   ["-npl", "2"], ["--endpoint", "http://127.0.0.1:9"], ["-b", "512"], ["-pg", "8,2"],
                                   ["--no-e2e"], ["--rpc", "127.0.0.1:50052"]])
def test_quality_refuses_the_flags_it_does_not_use(bench_here: InProcessCLI, flags: list[str]) -> None:
    """bench.md: any of bench's flags --quality does not take is one line, exit 2, before anything loads (the
    reference named here is not there: looking for it would be another error)."""
    r = bench_here("bench", "--quality", "default", "--reference", "/no/such/ref.gguf", "-m", "/no/such.gguf",
                   *flags)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("localgen: error: ")
    assert "--quality does not take" in r.stderr or "--output must be one of" in r.stderr


@pytest.mark.parametrize("flags", [["--ctx", "512"], ["-c", "512"], ["--kld-bound", "0.05"], ["--chunks", "1"]])
def test_the_quality_flags_without_quality_are_refused_even_at_their_defaults(bench_here: InProcessCLI,
                                                                              flags: list[str]) -> None:
    """bench.md: `--ctx`, `--chunks` or `--kld-bound` without `--quality` is refused in one line, exit 2 (a value
    equal to the default was once taken for none given, and the speed sweep ran without a word)."""
    r = bench_here("bench", "-m", "/no/such.gguf", "-p", "8", "-n", "0", *flags)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    said = {"-c": "--ctx"}.get(flags[0], flags[0])
    assert r.stderr == (f"localgen: error: {said} is for --quality (add --quality TEXT --reference SOURCE, or "
                        "leave them out)\n")


def test_bad_bench_flags(bench_here: InProcessCLI) -> None:
    # each refused before any model loads or anything is measured
    r = bench_here("bench", "-t", "1-8*1")
    assert r.returncode == 2 and "factor of 2" in r.stderr
    r = bench_here("bench", "-p", "0", "-n", "0", "--no-e2e")
    assert r.returncode == 2 and "nothing to measure" in r.stderr
    r = bench_here("bench", "-m", "/no/such.gguf", "-p", "8", "-n", "0")
    assert r.returncode == 2 and "-m/--model /no/such.gguf: no such file" in r.stderr


def test_doctor(cli: CLI) -> None:
    r = cli("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "GPU offload: no (CPU-only build)" in r.stdout or "GPU offload: yes" in r.stdout
    assert "check     smollm2:135m" in r.stdout and ": ok" in r.stdout


def test_bar_chart_scales() -> None:
    from localgen.cli.bench.view import bar_chart

    chart = bar_chart([("a", 100.0), ("bb", 50.0)], width=10).splitlines()
    assert chart[0].count("█") == 10 and chart[1].count("█") == 5


def test_the_size_word_follows_the_parameter_count() -> None:
    from localgen.engine.bench import fix_size_word

    # llama.cpp calls any 32-layer Llama with SmolLM2's vocabulary "3B": an 8B-shaped one has 7.4 B parameters
    assert fix_size_word("llama 3B Q4_K - Medium", 7_378_612_224) == "llama 7.4B Q4_K - Medium"
    assert fix_size_word("llama ?B Q4_1", 134_515_008) == "llama ?B Q4_1"
    assert fix_size_word("llama 135M Q4_1", 134_515_008) == "llama 135M Q4_1"
    assert fix_size_word("gemma3 270M Q4_K - Medium", 268_098_176) == "gemma3 270M Q4_K - Medium"
    assert fix_size_word("llama 8B Q4_K - Medium", 8_030_261_248) == "llama 8B Q4_K - Medium"


def test_the_bandwidth_is_measured_once_a_day_per_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench` puts generation rates against the memory bandwidth: measured (1 GB copied in a child process)
    by the first bench of the day on this machine, then read from the cache dir."""
    from localgen.bench import bandwidth

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    measured: list[float] = []

    def measure() -> float:
        measured.append(1e10 + len(measured))
        return measured[-1]

    monkeypatch.setattr(bandwidth, "measure_isolated", measure)
    assert bandwidth.remembered() == 1e10 and bandwidth.remembered() == 1e10 and len(measured) == 1
    cached = tmp_path / "cache" / "bandwidth.json"
    doc = json.loads(cached.read_text())
    cached.write_text(json.dumps({**doc, "at": doc["at"] - bandwidth.REMEMBERED_S - 1}))  # a day old
    assert bandwidth.remembered() == 1e10 + 1 and len(measured) == 2
    cached.write_text(json.dumps({**json.loads(cached.read_text()), "machine": ["another host"]}))
    assert bandwidth.remembered() == 1e10 + 2 and len(measured) == 3
    cached.write_text("not json")
    assert bandwidth.remembered() == 1e10 + 3 and json.loads(cached.read_text())["bytes_per_s"] == 1e10 + 3


def test_a_bandwidth_that_cannot_be_kept_leaves_no_temporary_file(cli_env: dict[str, str], tmp_path: Path) -> None:
    """A cache dir with no room (a file size limit, as a full disk: a file is made, nothing goes in it): the
    measurement is used all the same, and its cache file is not kept; its empty temporary file
    (cache/.bandwidth.json.PID.tmp) was left behind, one more on each bench."""
    import resource

    def no_room() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    script = ("from localgen.bench import bandwidth\n"
              "bandwidth.measure_isolated = lambda: 1e10\n"  # the measurement itself is not what is tested
              "print(bandwidth.remembered())\n")
    r = subprocess.run([sys.executable, "-c", script], env={**cli_env, "LOCALGEN_HOME": str(tmp_path)}, cwd=ROOT,
                       capture_output=True, text=True, preexec_fn=no_room, timeout=600)
    assert (r.returncode, r.stdout, r.stderr) == (0, "10000000000.0\n", "")
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_limit_counts_the_weights_a_token_reads(cli_env: dict[str, str], tmp_path: Path, moe_path: Path,
                                                    smollm2_path: Path) -> None:
    """docs/bench.md: the limit is the memory bandwidth over the bytes a token reads: every weight of a dense model
    with a tied embedding (SmolLM2), but of a mixture of experts only the share of its expert tensors that its
    router picks (expert_used_count of expert_count), and of an untied embedding table one row."""
    import time

    from localgen.bench import bandwidth
    from localgen.models import footprint
    from localgen.models.gguf_meta import read_summary

    home = tmp_path / "home"
    (home / "cache").mkdir(parents=True)
    bw = 1e10
    (home / "cache" / "bandwidth.json").write_text(json.dumps({"machine": bandwidth.machine(), "at": time.time(),
                                                               "bytes_per_s": bw}))
    r = bench({**cli_env, "LOCALGEN_HOME": str(home)}, "-m", f"{moe_path},{smollm2_path}", "-p", "0", "-n", "2",
              "-r", "1", "--no-e2e", "-o", "json")
    assert r.returncode == 0, r.stderr[-2000:]
    by = {Path(x["model_filename"]).name: x for x in json.loads(r.stdout)}
    moe, dense = by[moe_path.name], by[smollm2_path.name]
    if moe["n_gpu_layers"]:
        pytest.skip("the limit is host memory bandwidth: no figure with layers on a GPU")
    s, w = read_summary(str(moe_path)), footprint.layout(str(moe_path))
    n, used = s.metadata["qwen3moe.expert_count"], s.metadata["qwen3moe.expert_used_count"]
    experts = sum(w.experts)
    assert 0 < used < n and experts > w.total // 3
    read = w.total - experts + experts * used // n
    if not w.tied:
        read -= w.embedding - w.embedding // s.vocab_size
    assert moe["model_size"] == w.total > read
    assert moe["limit_ts"] == round(bw / read, 2)
    assert dense["limit_ts"] == round(bw / dense["model_size"], 2)  # tied: every weight, the table read as output


def _ubatch_spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The micro-batch llama.cpp's context uses (its own getter), noted at each prompt bench measures."""
    from localgen.engine.bench import BenchContext
    from localgen.native.lib import lib

    used: list[int] = []
    measure = BenchContext.prompt

    def prompt(self: BenchContext, n: int) -> float:
        used.append(lib().llama_n_ubatch(self.ctx))
        return measure(self, n)

    monkeypatch.setattr(BenchContext, "prompt", prompt)
    return used


def test_the_micro_batch_recorded_is_the_one_asked_and_used(bench_here: InProcessCLI,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/benchmarks.md: bench's records name the settings as llama-bench's do, and llama-bench records -ub as
    asked. Short tests (-p 8 -n 2) still get a context that holds the micro-batch, so llama.cpp's context
    (its own getter) uses the value recorded: asked, or the rule's 512."""
    used = _ubatch_spy(monkeypatch)
    for args, want in ((["-ub", "512"], 512), ([], 512), (["-ub", "64"], 64)):
        used.clear()
        r = bench_here("bench", "-p", "8", "-n", "2", "-r", "1", "-b", "2048", "--no-e2e", "-o", "jsonl", *args)
        assert r.returncode == 0, r.stderr
        assert {json.loads(x)["n_ubatch"] for x in r.stdout.splitlines()} == {want}, args
        assert set(used) == {want}, args


def test_a_tuned_micro_batch_larger_than_the_context_is_recorded_as_used(cli_in_process: InProcessCLI,
                                                                         smollm2_path: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuning record's -ub (2048) larger than a short test's context: llama.cpp caps it at the context, and the
    record bench writes says the value llama.cpp used, not the record's (the load's settings cap it)."""
    from localgen import tuning
    from localgen.engine.defaults import build_id, device_id
    from localgen.models.resolve import resolve

    home = tmp_path / "home"
    monkeypatch.setenv("LOCALGEN_HOME", str(home))
    ref = resolve(str(smollm2_path))
    key = tuning.Key(tuning.file_sha256(ref.path), build_id(), device_id(False), 1)
    tuning.save(tuning.Record(key=key, model=ref.name, size=os.stat(ref.path).st_size, date="2026-11-25T10:00:00Z",
                              settings={"n_ubatch": 2048}, depth=1500, exchange_s=1.0))
    used = _ubatch_spy(monkeypatch)
    here = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(home)})
    r = here("bench", "-m", str(smollm2_path), "-p", "8", "-n", "2", "-r", "1", "-b", "2048", "--no-e2e", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    recorded = {json.loads(x)["n_ubatch"] for x in r.stdout.splitlines()}
    assert len(set(used)) == 1 and used[0] < 2048 and recorded == set(used), (recorded, used)
