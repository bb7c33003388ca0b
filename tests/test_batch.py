"""Many prompts: --file / --each-line, input order, per-line errors, --parallel identical to running alone."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import CLI

PROMPTS = ["Tell me about rivers.", "What is the capital of France?", "Write a haiku about snow.",
           "List three colors.", "Why do cats purr?"]


def test_parallel_greedy_output_equals_running_alone(cli: CLI, tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("\n".join(PROMPTS) + "\n")
    alone = []
    for p in PROMPTS:
        r = cli("run", "-p", p, "-n", "24", "--temperature", "0", "--no-prompt-cache", "--ctx", "512")
        assert r.returncode == 0, r.stderr
        alone.append(" ".join(r.stdout.split()))
    for n in ("1", "3"):
        r = cli("run", "--file", str(f), "-n", "24", "--temperature", "0", "--parallel", n, "--ctx", "512")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == alone, f"--parallel {n} changed an answer"


def test_file_lines_jsonl_blank_and_bad_lines(cli: CLI, tmp_path: Path) -> None:
    f = tmp_path / "mixed.txt"
    f.write_text('Say yes.\n\n{"prompt": "Say no.", "id": "b", "temperature": 0, "max_tokens": 3}\n'
                 '{"prompt": 5}\n{"prompt": "x", "temperature": 9}\nSay maybe.\n')
    r = cli("run", "--file", str(f), "-n", "4", "--parallel", "2", "--json", "--ctx", "512")
    assert r.returncode == 1, "a failed line makes the exit status 1"
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["line"] for d in docs] == [1, 2, 3, 4, 5, 6], "one result per input line, in order"
    assert docs[0]["text"] and docs[0]["completion_tokens"] <= 4
    assert "text" not in docs[1] and "error" not in docs[1]
    assert docs[2]["id"] == "b" and docs[2]["completion_tokens"] <= 3
    assert "needs a \"prompt\" string" in docs[3]["error"]
    assert "out of range" in docs[4]["error"]
    assert docs[5]["text"]
    plain = cli("run", "--file", str(f), "-n", "4", "--ctx", "512")
    assert plain.returncode == 1
    lines = plain.stdout.split("\n")[:-1]
    assert len(lines) == 6 and lines[1] == "" and lines[3] == "" and lines[0] and lines[5]
    assert "localgen: line 4: bad JSON line" in plain.stderr


def test_each_line_from_stdin_with_instruction(cli: CLI) -> None:
    r = cli("run", "--each-line", "-p", "Answer with one word: positive or negative.", "-n", "3",
            "--parallel", "4", "--json", "--stats", "--ctx", "512",
            input="I love it\nI hate it\nBest day ever\nWorst food\nFine\nGreat\n")
    assert r.returncode == 0, r.stderr
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["line"] for d in docs] == [1, 2, 3, 4, 5, 6]
    assert all(d["prompt_tokens"] > 10 and d["completion_tokens"] >= 1 for d in docs)
    assert "6 prompts" in r.stderr and "aggregate" in r.stderr


def test_a_prompt_longer_than_its_window_fails_alone(cli: CLI, tmp_path: Path) -> None:
    f = tmp_path / "long.txt"
    f.write_text("Hi\n" + "word " * 600 + "\nBye\n")
    r = cli("run", "--file", str(f), "-n", "3", "--ctx", "256", "--parallel", "2", "--json")
    assert r.returncode == 1
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert docs[0]["text"] and docs[2]["text"]
    assert "longer than the context window" in docs[1]["error"]


def test_conflicting_batch_flags(cli: CLI, tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("hi\n")
    r = cli("run", "--file", str(f), "--each-line")
    assert r.returncode == 2 and "cannot be combined" in r.stderr
    r = cli("run", "--file", str(f), "--parallel", "0")
    assert r.returncode == 2 and "--parallel" in r.stderr


def test_bench_parallel_reports_aggregate_rates(cli: CLI) -> None:
    r = cli("bench", "-p", "16", "-n", "8", "-r", "1", "--parallel", "1,2", "--no-e2e", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    recs = {x["test"]: x for x in map(json.loads, r.stdout.splitlines())}
    assert set(recs) == {"pp16", "tg8", "pp16 x2", "tg8 x2"}
    assert recs["tg8 x2"]["n_parallel"] == 2 and recs["tg8 x2"]["avg_ts"] > 0
