"""`localgen bench -mg/--main-gpu`: llama-bench's sweep of the main GPU, recorded in its `main_gpu` field and
shown as a column where swept (on this CPU machine llama.cpp's layer split ignores it: the load must not fail).
Real SmolLM2 runs with tiny sizes; the bad values are usage errors before anything loads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import CLI, InProcessCLI, knows_the_bandwidth

SHORT = ("-m", "smollm2:135m", "-p", "8", "-n", "4", "-r", "1", "--no-e2e")


@pytest.fixture()
def own(cli_env: dict[str, str], tmp_path: Path) -> CLI:
    """The CLI with a benchmark history of this test's own."""
    return CLI({**cli_env, "LOCALGEN_HOME": str(knows_the_bandwidth(tmp_path))})


def _records(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_bench_takes_mg_and_records_main_gpu(own: CLI) -> None:
    """`bench -mg 0` (it was `No such command '0'`): the records say main_gpu 0; the table has no column for the
    default, as llama-bench's has none."""
    r = own("bench", *SHORT, "-mg", "0", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    recs = _records(r.stdout)
    assert [x["test"] for x in recs] == ["pp8", "tg4"]
    assert all(x["main_gpu"] == 0 for x in recs)
    run_id = re.search(r"saved as run (\d+)", r.stderr)
    assert run_id, r.stderr
    md = own("bench", "history", run_id.group(1), "-o", "md")
    assert md.returncode == 0, md.stderr
    assert "main_gpu" not in md.stdout.splitlines()[0]


def test_bench_sweeps_main_gpu_as_its_other_load_settings(own: CLI) -> None:
    """`--main-gpu 0,1`: two configurations, each test in both; the md table and CSV carry it (llama-bench's
    column and field name `main_gpu`)."""
    r = own("bench", *SHORT, "--main-gpu", "0,1", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    recs = _records(r.stdout)
    assert [(x["main_gpu"], x["test"]) for x in recs] == [(0, "pp8"), (0, "tg4"), (1, "pp8"), (1, "tg4")]
    run_id = re.search(r"saved as run (\d+)", r.stderr)
    assert run_id, r.stderr
    md = own("bench", "history", run_id.group(1), "-o", "md")
    assert md.returncode == 0, md.stderr
    head, _, *rows = md.stdout.splitlines()
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert "main_gpu" in cols
    at = cols.index("main_gpu")
    assert [[c.strip() for c in row.strip("|").split("|")][at] for row in rows] == ["0", "0", "1", "1"]
    csv = own("bench", "history", run_id.group(1), "-o", "csv")
    assert csv.returncode == 0, csv.stderr
    header = csv.stdout.splitlines()[0].split(",")
    assert [line.split(",")[header.index("main_gpu")] for line in csv.stdout.splitlines()[1:]] == ["0", "0", "1", "1"]


@pytest.mark.parametrize(("value", "said"), [
    ("x", r"-mg/--main-gpu|--main-gpu"),
    ("-1", r"--main-gpu must be at least 0, not -1"),
    ("2147483648", r"--main-gpu must be at most 2,147,483,647 \(llama.cpp takes it as a C int\), not 2147483648"),
], ids=["word", "negative", "past-int32"])
def test_a_bad_main_gpu_is_one_line(cli_in_process: InProcessCLI, value: str, said: str) -> None:
    r = cli_in_process("bench", *SHORT, "-mg", value)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localgen: error: "), r.stderr
    assert re.search(said, lines[0]), lines[0]
    assert "No such command" not in lines[0]


def test_main_gpu_is_refused_with_an_endpoint(cli_in_process: InProcessCLI) -> None:
    """The server loads the model there: -mg, as -ngl, is not bench's to set."""
    r = cli_in_process("bench", "--endpoint", "http://127.0.0.1:9", "-m", "m", "-mg", "0")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip() == ("localgen: error: --main-gpu cannot be used with --endpoint (the server loads "
                                "the model)")
