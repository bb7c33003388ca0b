"""bench.md: Ctrl-C inside a test keeps the repetitions it measured as a row marked so (`pp16 (3 of 5 reps)`,
`repetitions` below `repetitions_planned`), shown, saved and listed by `history`; a `--quality` text too short for
its windows is refused before the reference is measured. Real SmolLM2 runs with tiny sizes, in this process."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests import test_bench_edges as edges
from tests.conftest import CLI, knows_the_bandwidth

invoke = edges.invoke  # `localgen ARGS` in this process
own_home = edges.own_home  # the fixture: a benchmark history of this test's own


def _on_prompt(monkeypatch: pytest.MonkeyPatch, call: int, act: Any) -> None:
    """`act()` at the `call`-th prompt decoded (1: the warm-up, 2: the length's probe, 3 on: one per repetition of
    a pp test)."""
    from localgen.engine.bench import BenchContext

    real = BenchContext.prompt
    calls = [0]

    def prompt(self: Any, n: int) -> float:
        calls[0] += 1
        if calls[0] == call:
            act()
        return float(real(self, n))

    monkeypatch.setattr(BenchContext, "prompt", prompt)


@pytest.mark.slow  # benchmarks SmolLM2 in this process
def test_ctrl_c_inside_a_test_keeps_its_measured_repetitions_as_a_row_marked_so(
        own_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during pp16's third repetition of five: that repetition finishes, and the three make a row (it said
    `nothing was measured` after minutes of repetitions)."""
    _on_prompt(monkeypatch, 2 + 3, lambda: os.kill(os.getpid(), signal.SIGINT))
    r = invoke("bench", "-p", "16", "-n", "4", "-r", "5", "-t", "1", "--no-e2e", "-o", "jsonl")
    assert r.exit_code == 130, (r.stderr, repr(r.exception))
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["test"], x["repetitions"], x["repetitions_planned"], len(x["samples_ns"]), len(x["samples_ts"]))
            for x in rows] == [("pp16", 3, 5, 3, 3)]
    lines = r.stderr.splitlines()
    run_id = re.fullmatch(r"saved as run (\d+): localgen bench history \d+", lines[-2])
    assert run_id, r.stderr
    assert lines[-1] == "interrupted; the results above were measured and kept (pp16 holds 3 of its 5 repetitions)"
    kept = invoke("bench", "history", run_id.group(1), "-o", "json")
    assert [(x["test"], x["repetitions"], x["repetitions_planned"], x["samples_ns"]) for x in json.loads(kept.stdout)
            ] == [("pp16", 3, 5, rows[0]["samples_ns"])]
    table = invoke("bench", "history", run_id.group(1), "-o", "md").stdout
    assert re.search(r"\| pp16 \(3 of 5 reps\) +\|", table), table
    csv = invoke("bench", "history", run_id.group(1), "-o", "csv").stdout.splitlines()
    head = csv[0].split(",")
    cells = csv[1].split(",")
    assert (cells[head.index("repetitions")], cells[head.index("repetitions_planned")]) == ("3", "5")
    # the list of runs says it holds a partial row (only its rows did)
    assert [(x["id"], x["results"], x["partial"]) for x in json.loads(invoke("bench", "history", "-o", "json").stdout)
            ] == [(int(run_id.group(1)), 1, 1)]
    listed = invoke("bench", "history").stdout.splitlines()
    assert re.fullmatch(rf" +{run_id.group(1)}  [\d-]+ [\d:]+  1 \(1 partial\)  \S.*", listed[1]), listed
    # bench compare marks the partial side (it compared its mean as any other's, unsaid)
    whole = invoke("bench", "-p", "16", "-n", "4", "-r", "2", "-t", "1", "--no-e2e", "-o", "json")
    assert whole.exit_code == 0, whole.stderr
    whole_id = re.search(r"saved as run (\d+)", whole.stderr).group(1)  # type: ignore[union-attr]
    doc = json.loads(invoke("bench", "compare", run_id.group(1), whole_id, "--json").stdout)["results"]
    assert [(x["test"], x["a_repetitions"], x["a_repetitions_planned"], x["b_repetitions"],
             x["b_repetitions_planned"]) for x in doc] == [("pp16", 3, 5, 2, 2), ("tg4", None, None, 2, 2)], doc
    text = invoke("bench", "compare", run_id.group(1), whole_id).stdout.splitlines()
    row = next(line for line in text if line.split()[1:2] == ["pp16"])
    assert re.search(r"pp16 +[\d.]+ \(3 of 5 reps\) +[\d.]+ +[\d.]+x$", row), text


@pytest.mark.slow  # benchmarks SmolLM2 in this process
def test_a_stop_inside_a_repetition_keeps_the_ones_before_it_and_whole_rows_stay_unmarked(
        own_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Ctrl-C (or a SIGTERM) lands inside a repetition: that one is not kept, those before it are. The
    rows measured whole before it carry every repetition, unmarked."""
    def interrupt() -> None:
        raise KeyboardInterrupt

    # pp8 (2 prompts, its warm-up and probe first), then pp16: its second repetition stopped inside
    _on_prompt(monkeypatch, 2 + 2 + 2, interrupt)
    r = invoke("bench", "-p", "8,16", "-n", "0", "-r", "2", "-t", "1", "--no-e2e")
    assert r.exit_code == 130, (r.stderr, repr(r.exception))
    table = [line for line in r.stdout.splitlines() if line.startswith("| llama")]
    assert [re.split(r" *\| *", line)[7] for line in table] == ["pp8", "pp16 (1 of 2 reps)"], r.stdout
    assert r.stderr.splitlines()[-1] == ("interrupted; the results above were measured and kept (pp16 holds 1 of its "
                                         "2 repetitions)")


@pytest.mark.slow  # loads SmolLM2's vocabulary in this process
def test_ctrl_c_before_any_repetition_says_so_and_keeps_no_run(own_home: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during the warm-up, before any repetition: nothing saved, said truthfully."""
    _on_prompt(monkeypatch, 1, lambda: os.kill(os.getpid(), signal.SIGINT))
    r = invoke("bench", "-p", "8", "-n", "0", "-r", "3", "-t", "1", "--no-e2e")
    assert r.exit_code == 130 and r.stdout == "", r.stdout
    assert r.stderr == "interrupted before the first repetition was measured: nothing saved\n"
    assert invoke("bench", "history").stderr == "no benchmark runs yet: localgen bench\n"


def test_a_quality_text_too_short_is_refused_before_the_reference_is_measured(cli: CLI, tmp_path: Path,
                                                                              smollm2_path: Path) -> None:
    """quantize --ladder --measure refuses a short text at once; bench --quality said `measuring the reference ...`
    (a load, and minutes on a large model) before it refused."""
    text = tmp_path / "short.txt"
    text.write_text("hello world\n")
    c = CLI({**cli.env, "LOCALGEN_HOME": str(knows_the_bandwidth(tmp_path / "home"))})
    r = c("bench", "-m", str(smollm2_path), "--quality", str(text), "--reference", str(smollm2_path), "-c", "256",
          "-p", "0", "-n", "0")
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr == ("localgen: error: the text is 2 tokens; perplexity at a context of 256 needs at least 512 "
                        "(two windows) (give a longer text, or a smaller --ctx)\n"), r.stderr


def test_the_docs_say_what_a_stopped_test_keeps() -> None:
    page = " ".join((Path(__file__).parent.parent / "docs" / "bench.md").read_text().split())
    assert "A test stopped part-way is a row of the repetitions it measured, marked so" in page
    assert "`pp256 (18 of 200 reps)`" in page
    assert "`interrupted before the first repetition was measured: nothing saved`" in page
    assert "is refused in one line too, before the reference is measured (its vocabulary alone is read)" in page
