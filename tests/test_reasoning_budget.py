"""Reasoning budgets (#44 item 3): past `reasoning_budget` tokens of thinking the block is closed for the model
(its end tag fed as if sampled) and it answers, as llama.cpp's --reasoning-budget. The rule in process
(engine/budget.py); then SmolLM2 under DeepSeek-R1's template, which opens <think> and which SmolLM2 never
closes by itself, through run (one stream, and --file's scheduler) and serve (/v1 and Anthropic's budget_tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localgen.engine.budget import Budget, opened_by
from localgen.serve.pipeline import EFFORT_BUDGETS, effort_budget
from tests.conftest import CLI, ROOT

R1 = ROOT / "tests" / "data" / "templates" / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"


def _close(text: str) -> list[int]:
    return [ord(c) for c in text]  # a stand-in tokenizer: a token per character


def _run(budget: Budget, pieces: list[str]) -> list[str]:
    """Feed the pieces as generated tokens; where the budget forces a token, it is taken instead."""
    out: list[str] = []
    for p in pieces:
        forced = budget.forced()
        while forced is not None:
            out.append(chr(forced))
            budget.seen(chr(forced))
            forced = budget.forced()
        out.append(p)
        budget.seen(p)
    return out


def test_a_block_the_template_opened_is_closed_after_the_budget() -> None:
    b = Budget(3, _close, opened_by("<|Assistant|><think>\n"))
    out = _run(b, ["a", "b", "c", "d", "e"])
    assert "".join(out) == "abc\n</think>\n\nde" and b.closed_for_it


def test_a_block_the_model_opens_counts_from_its_tag_and_one_it_closes_is_left_alone() -> None:
    b = Budget(2, _close, None)
    assert "".join(_run(b, ["x", "<th", "ink>", "a", "b", "c"])) == "x<think>ab\n</think>\n\nc"
    free = Budget(5, _close, ("<think>", "</think>"))
    assert "".join(_run(free, ["a", "</think>", "b", "c", "d", "e", "f"])) == "a</think>bcdef"
    assert not free.closed_for_it
    none = Budget(0, _close, ("<think>", "</think>"))
    assert "".join(_run(none, ["a"])) == "\n</think>\n\na"


def test_effort_levels_set_a_budget_unless_the_request_did() -> None:
    values: dict[str, Any] = {}
    effort_budget(values, "low")
    assert values == {"reasoning_budget": EFFORT_BUDGETS["low"]}
    mine = {"reasoning_budget": 7}
    effort_budget(mine, "medium")
    assert mine == {"reasoning_budget": 7}
    for level in ("high", "none", None, True):
        untouched: dict[str, Any] = {}
        effort_budget(untouched, level)
        assert untouched == {}


def _answer(r: Any) -> dict[str, Any]:
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.splitlines()[0]))


def test_run_closes_the_thinking_and_answers(cli: CLI, tmp_path: Path, smollm2_engine: Any) -> None:
    base = ("run", "--chat-template-file", str(R1), "-n", "24", "--temperature", "0", "--json", "--no-log")
    free = _answer(cli(*base, "Why is the sky blue?"))
    bounded = _answer(cli(*base, "--reasoning-budget", "5", "Why is the sky blue?"))
    assert free["text"] == "" and free["reasoning"], "SmolLM2 never closes R1's block by itself"
    assert bounded["text"] and len(bounded["reasoning"]) < len(free["reasoning"])
    assert free["reasoning"].startswith(bounded["reasoning"].rstrip("\n")), "the same thinking, cut short"
    assert len(smollm2_engine.tokenize(bounded["reasoning"].strip(), False)) <= 5, "never past the budget"
    lines = tmp_path / "in.txt"
    lines.write_text("Why is the sky blue?\n")
    many = _answer(cli(*base, "--reasoning-budget", "5", "--file", str(lines)))
    # --file's scheduler closes the block as the single stream does (its text keeps the thinking and the tag)
    thought, _, answer = many["text"].partition("</think>")
    assert answer.strip() == bounded["text"].strip() and thought.strip() == bounded["reasoning"].strip()


def test_a_budget_with_speculation_or_beams_is_a_usage_error(cli_in_process: Any) -> None:
    for extra in (["--lookup"], ["--beams", "2"]):
        r = cli_in_process("run", "--reasoning-budget", "5", *extra, "-p", "hi")
        assert r.returncode == 2 and "--reasoning-budget cannot be combined" in r.stderr, r.stderr
