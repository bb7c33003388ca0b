"""The thinking switch, in every spelling (#44 item 3, the part that needs no budget): run's and chat's
--think/--no-think, chat's /set reasoning, OpenAI's reasoning_effort, Ollama's think (true, false, or a
level), Anthropic's thinking and effort (tests/test_anthropic_adapter.py), the Responses API's
reasoning.effort; all turn the chat template's enable_thinking, and a remote endpoint is sent it as
chat_template_kwargs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localgen.serve.apierror import HTTPError
from tests.conftest import CLI, ROOT

QWEN3 = ROOT / "tests" / "data" / "templates" / "Qwen-Qwen3-0.6B.jinja"
CLOSED = "<think>\n\n</think>"  # what Qwen3's template writes when thinking is off


def test_reasoning_effort_turns_the_switch() -> None:
    import asyncio

    from localgen.serve.openai import CHAT
    from localgen.serve.pipeline import template_args

    def _template_args(body: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
        return template_args(asyncio.run(CHAT.parse(body)))

    assert _template_args({"reasoning_effort": "none"}) == (("enable_thinking", False),)
    assert _template_args({"reasoning_effort": "minimal"}) == (("enable_thinking", False),)
    assert _template_args({"reasoning_effort": "high"}) == (("enable_thinking", True),)
    assert _template_args({}) == ()
    explicit = {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True, "x": 1}}
    assert _template_args(explicit) == (("enable_thinking", True), ("x", 1))
    with pytest.raises(HTTPError) as e:
        _template_args({"reasoning_effort": "extreme"})
    assert e.value.status == 400 and e.value.param == "reasoning_effort"


def test_a_remote_endpoint_is_sent_the_switch() -> None:
    from localgen.remote.client import request_body
    from localgen.types import GenerationRequest

    req = GenerationRequest(messages=({"role": "user", "content": "hi"},), template_args=(("enable_thinking", False),))
    assert request_body("m", req, 1)["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in request_body("m", GenerationRequest(messages=req.messages), 1)


@pytest.mark.parametrize(("flag", "closed"), [("--no-think", True), ("--think", False), (None, False)])
def test_run_think_flags_reach_the_template(cli: CLI, flag: str | None, closed: bool) -> None:
    r = cli("run", "--chat-template-file", str(QWEN3), *([flag] if flag else []), "--verbose-prompt", "-n", "1",
            "--no-log", "hi")
    assert r.returncode == 0, r.stderr
    assert (CLOSED in r.stderr) == closed


def test_run_file_lines_take_the_switch_too(cli: CLI, tmp_path: Path) -> None:
    lines = tmp_path / "in.txt"
    lines.write_text("hi\n")
    r = cli("run", "--chat-template-file", str(QWEN3), "--no-think", "--file", str(lines), "-n", "2", "--json",
            "--temperature", "0", "--no-log")
    plain = cli("run", "--chat-template-file", str(QWEN3), "--file", str(lines), "-n", "2", "--json",
                "--temperature", "0", "--no-log")
    assert r.returncode == plain.returncode == 0, r.stderr + plain.stderr
    import json

    off, default = json.loads(r.stdout), json.loads(plain.stdout)
    assert off["prompt_tokens"] > default["prompt_tokens"], "the closed think block adds prompt tokens"


def test_chat_set_reasoning(monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen.cli.chat import slash
    from localgen.errors import UsageError

    said: list[str] = []

    class Runner:
        thinking: bool | None = None

        def save(self) -> None:  # ChatRunner.save: the conversation's file (a warning where it cannot be written)
            pass

    class View:
        def info(self, text: str) -> None:
            said.append(text)

    runner: Any = Runner()
    slash._set(runner, View(), "reasoning off")
    assert runner.thinking is False and "off" in said[-1]
    slash._set(runner, View(), "reasoning on")
    assert runner.thinking is True
    slash._set(runner, View(), "reasoning default")
    assert runner.thinking is None
    with pytest.raises(UsageError, match="on, off or default"):
        slash._set(runner, View(), "reasoning maybe")
