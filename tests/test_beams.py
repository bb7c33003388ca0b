"""Beam search: one beam is greedy, N beams come back ranked, flags that cannot combine are refused."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CLI, InProcessCLI


@pytest.mark.parametrize("prompt", ["What is the capital of France?", "Write a haiku about snow."])
def test_one_beam_is_exactly_greedy(cli: CLI, prompt: str) -> None:
    greedy = cli("run", "-p", prompt, "-n", "24", "--temperature", "0", "--no-prompt-cache", "--ctx", "512")
    beam = cli("run", "-p", prompt, "-n", "24", "--beams", "1", "--no-prompt-cache", "--ctx", "512")
    assert greedy.returncode == beam.returncode == 0, beam.stderr
    assert beam.stdout == greedy.stdout


def test_beams_are_ranked_with_scores(cli: CLI) -> None:
    r = cli("run", "-p", "What is the capital of France?", "-n", "24", "--beams", "4", "--json",
            "--length-penalty", "1.0", "--ctx", "512")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"text", "finish_reason", "model", "beams", "length_penalty", "load", "stats"}  # docs/run.md
    assert set(doc["model"]) == {"name", "file"}
    beams = doc["beams"]
    assert len(beams) == 4
    scores = [b["score"] for b in beams]
    assert scores == sorted(scores, reverse=True)
    assert doc["text"] == beams[0]["text"] and "Paris" in doc["text"]
    for b in beams:
        assert b["text"] and b["logprob"] < 0 and b["finish_reason"] in ("eos", "length", "stop")
        assert b["score"] == pytest.approx(b["logprob"] / max(1, b["tokens"]), abs=1e-4)


def test_beams_conflicts(cli_in_process: InProcessCLI) -> None:
    r = cli_in_process("run", "-p", "x", "--beams", "2", "--lookup")
    assert r.returncode == 2 and "--beams cannot be combined" in r.stderr
    r = cli_in_process("run", "-p", "x", "--beams", "0")
    assert r.returncode == 2 and "--beams" in r.stderr
