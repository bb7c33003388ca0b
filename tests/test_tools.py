"""Tool calling and reasoning: the families' call formats and the stream stage (unit), the grammars parsed by
llama.cpp, the tool loop's round (unit), and `run --functions/--mcp` with a real model (SmolLM2 with Qwen2.5's
template, which renders tools) and a stdio MCP server written with the `mcp` SDK (tests/mcp_server.py). `serve`
with tools: tests/test_tools_serve.py; `chat` with tools: tests/test_tools_chat.py."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripts.tools_reference import TIME, WEATHER
from tests.conftest import CLI, ROOT, InProcessCLI

TEMPLATES = ROOT / "tests" / "data" / "templates"
QWEN = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"
R1 = TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

def _events(fmt: str | None, text: str, step: int = 3, thinking: tuple[str, str] | None = None,
            forced: bool = False, reason: str | None = None) -> list[Any]:
    from localgen.tools.formats import FORMATS
    from localgen.tools.stream import AnswerStream

    stream = AnswerStream(FORMATS[fmt] if fmt else None, thinking, forced=forced)
    out: list[Any] = []
    for i in range(0, len(text), step):
        out += stream.feed(text[i:i + step])
    return out + stream.finish(reason)


def _calls(events: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    from localgen.tools.spec import ToolCall

    return [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)]


def _text(events: list[Any], kind: str) -> str:
    from localgen.tools.stream import Piece

    return "".join(e.text for e in events if isinstance(e, Piece) and e.kind == kind)


@pytest.mark.parametrize(("fmt", "text", "content"), [
    ("hermes", 'Let me check.<tool_call>\n{"name": "w", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>{"name": "w", "arguments": {"city": "Rome"}}</tool_call>', "Let me check."),
    ("llama3", '<|python_tag|>{"name": "w", "parameters": {"city": "Paris"}}; '
               '{"name": "w", "parameters": {"city": "Rome"}}', ""),
    ("mistral", '[TOOL_CALLS][{"name": "w", "arguments": {"city": "Paris"}}, '
                '{"name": "w", "arguments": {"city": "Rome"}}]', ""),
    ("mistral", '[TOOL_CALLS]w[ARGS]{"city": "Paris"}[TOOL_CALLS]w[ARGS]{"city": "Rome"}', ""),
    ("functiongemma", "<start_function_call>call:w{city:<escape>Paris<escape>}<end_function_call>"
                      "<start_function_call>call:w{city:<escape>Rome<escape>}<end_function_call>", ""),
    ("generic", '{"tool_calls": [{"name": "w", "arguments": {"city": "Paris"}}, '
                '{"name": "w", "arguments": {"city": "Rome"}}]}', ""),
])
def test_each_family_format_parses_streamed_calls(fmt: str, text: str, content: str) -> None:
    for step in (1, 4, len(text)):
        events = _events(fmt, text, step)
        assert _calls(events) == [("w", {"city": "Paris"}), ("w", {"city": "Rome"})], (fmt, step)
        assert _text(events, "content") == content


def test_text_without_a_call_stays_content_and_reasoning_goes_apart() -> None:
    assert _text(_events("hermes", "I call no <tools> here, <tool_ only."), "content") == \
        "I call no <tools> here, <tool_ only."
    assert _text(_events("llama3", 'Answer: {"name": 1}'), "content") == 'Answer: {"name": 1}'
    assert _calls(_events("generic", '{"response": "Hi there"}')) == []
    assert _text(_events("generic", '{"response": "Hi there"}'), "content") == "Hi there"
    events = _events("hermes", "<think>Paris? Use the tool.</think>\n\n<tool_call>{\"name\": \"w\", "
                               "\"arguments\": {}}</tool_call>", step=2)
    assert _text(events, "reasoning") == "Paris? Use the tool."
    assert _text(events, "content") == "" and _calls(events) == [("w", {})]
    opened = _events(None, "still thinking</think>The answer.", 2, thinking=("<think>", "</think>"))
    assert _text(opened, "reasoning") == "still thinking" and _text(opened, "content") == "The answer."


def test_a_call_marker_cut_off_after_whole_calls_is_no_text() -> None:
    call = '<tool_call>\n{"name": "zap", "arguments": {}}\n</tool_call>\n'
    for step in (1, 3, 100):
        events = _events("hermes", call + "<tool_call", step)  # max_tokens cut the repeat mid-marker
        assert _calls(events) == [("zap", {})] and _text(events, "content") == "", step
    assert _text(_events("hermes", "Say <tool_"), "content") == "Say <tool_"  # no call before it: text
    for step in (1, 3, 100):  # the first call cut (a forced one, -n 10): no text either (it was the answer)
        events = _events("hermes", '<tool_call>\n{"name": "', step, forced=True)
        assert _calls(events) == [] and _text(events, "content") == "", step
    # where the answer may be prose (tool_choice auto), a marker it writes and never closes is its text, kept
    prose = "<tool_call> is the tag that marks a call."
    assert _text(_events("hermes", prose), "content") == prose


def test_an_answer_cut_inside_a_call_marker_leaves_the_marker_out() -> None:
    """serve with tool_choice required and max_tokens 4 answered `"content": "<tool_call"`, finish_reason length;
    so did an auto answer cut after two tokens (`<tool`): the marker is the start of the call that was cut (tools.md:
    the call it cut is left out). An answer that ended by itself keeps such text (it was no call)."""
    for step in (1, 3, 100):
        for text, fmt, said in (("<tool_call", "hermes", ""), ("<tool", "hermes", ""),
                                ("Sure. <tool_ca", "hermes", "Sure. "), ("[TOOL_CA", "mistral", "")):
            for forced, reason in ((True, "length"), (False, "length"), (False, "context"), (True, "eos")):
                events = _events(fmt, text, step, forced=forced, reason=reason)
                assert _calls(events) == [] and _text(events, "content") == said, (text, step, forced, reason)
        assert _text(_events("hermes", "Say <tool_", step, reason="eos"), "content") == "Say <tool_"


# tools.md: the call max_tokens cut is left out and the answer ends as cut; in the generic format (the JSON answer
# of a template that renders no tools: SmolLM2's) the cut envelope was given whole as the answer's text
@pytest.mark.parametrize(("text", "content"), [
    ('{"tool_call": {"name": "w", "arguments": {"city": "Par', ""),
    ('{"tool_calls": [{"name": "w", "argu', ""),
    ('{"tool_', ""),
    ('  {\n  "response": "It is sunny in \\"Paris\\", with a', 'It is sunny in "Paris", with a'),
    ('{"response": "caf\\u00e', "caf"),
    ('{"response": "smile \\ud83d\\ude00 and \\ud83d', "smile \U0001f600 and "),
    ('{"response": "two\\', "two"),
    ('{"response": "done", "ext', "done"),
    ('{"response": ', ""),
])
def test_a_generic_answer_cut_by_max_tokens_is_its_text_as_far_as_it_came(text: str, content: str) -> None:
    for step in (1, 5, 100):
        events = _events("generic", text, step)
        assert _calls(events) == [] and _text(events, "content") == content, (text, step)
    assert _text(_events("generic", "Plain words, no JSON"), "content") == "Plain words, no JSON"


@pytest.mark.parametrize("text", ['{"tool_call": {"name": "w", "arguments": {"city": "Paris"}}',
                                  '{"tool_call": {\n    "name": "w",\n    "arguments": {"city": "Paris"}\n  }\n',
                                  '{"tool_calls": [{"name": "w", "arguments": {"city": "Paris"}}'])
def test_a_call_whole_before_max_tokens_cut_its_envelope_is_a_call(text: str) -> None:
    """tools.md: calls completed before max_tokens cut the answer are given as calls; a red team's: the singular
    `{"tool_call": {...}` cut before its last `}` lost its whole call (the plural form kept it)."""
    for step in (1, 5, 100):
        events = _events("generic", text, step)
        assert _calls(events) == [("w", {"city": "Paris"})], (text, step)
        assert _text(events, "content") == "", (text, step)


def test_a_forced_call_cut_by_max_tokens_is_no_answer(cli: CLI) -> None:
    """run --tool-choice NAME -n 10: the call is cut before it is whole; nothing of it is the answer (stdout was
    `<tool_call>\\n{"name": "`)."""
    r = _run(cli, "--mcp", MCP, "--yes", "--tool-choice", "add", "-n", "10", "What is 2 + 3?")
    assert "<tool_call>" not in r.stdout and '"name"' not in r.stdout, (r.stdout, r.stderr)
    # nothing on stdout, and the one line that says why (nothing at all was said: exit 0, empty output)
    assert r.returncode == 0 and r.stdout == "", r.stdout
    assert "warning: the answer reached its limit of 10 tokens (-n) before a word of it, in a tool call, which is " \
           "left out: give a larger -n" in r.stderr, r.stderr
    # chat says it too (its answer was empty, with no word on stderr)
    r = cli("chat", *RUN[1:], "--mcp", MCP, "--yes", "--tool-choice", "add", "-n", "10", input="What is 2 + 3?\n")
    assert r.returncode == 0 and "<tool_call>" not in r.stdout, (r.stdout, r.stderr)
    assert "warning: the answer reached its limit of 10 tokens (-n) before a word of it, in a tool call, which is " \
           "left out: give a larger -n" in r.stderr, r.stderr


def test_templates_are_recognised() -> None:
    from localgen.tools.formats import detect

    found = {p.stem: detect(p.read_text()).name for p in TEMPLATES.glob("*.jinja")}
    assert found == {"Qwen-Qwen2.5-7B-Instruct": "hermes", "Qwen-Qwen3-0.6B": "hermes",
                     "meta-llama-Llama-3.2-3B-Instruct": "llama3", "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
                     "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "generic"}


def test_tool_grammars_parse_natively(smollm2_engine: Any) -> None:
    from localgen.tools.formats import FORMATS, constraint
    from localgen.tools.spec import parse_tools

    tools = parse_tools([WEATHER, TIME])
    for fmt in FORMATS.values():
        for forced in (False, True):
            c = constraint(fmt, tools, forced, True)
            if c is not None:
                smollm2_engine.check_grammar(c.grammar)
                assert bool(c.triggers) == (not forced and fmt.name != "generic")


def test_bad_tool_definitions_are_refused() -> None:
    from localgen.errors import ToolError
    from localgen.tools.spec import ToolCall, check_call, parse_tools

    with pytest.raises(ToolError, match="not a valid JSON Schema"):
        parse_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                   "properties": {"a": {"type": 5}}}}}])
    with pytest.raises(ToolError, match="name"):
        parse_tools([{"type": "function", "function": {"name": "no spaces"}}])
    tools = parse_tools([WEATHER])
    with pytest.raises(ToolError, match="not a tool here"):
        check_call(ToolCall("launch", "{}"), tools)
    with pytest.raises(ToolError, match="fail its schema"):
        check_call(ToolCall("get_weather", '{"city": 3}'), tools)
    assert check_call(ToolCall("get_weather", '{"city": "Oslo"}'), tools).name == "get_weather"


def test_functions_file_becomes_tool_schemas() -> None:
    from localgen.tools.functions import load

    tools = {spec.name: spec for spec, _ in load(ROOT / "tests" / "tool_functions.py")}
    w = tools["get_weather"]
    assert w.description == "Get the current weather in a city."
    assert w.parameters["required"] == ["city"]
    assert w.parameters["properties"]["city"] == {"type": "string", "description": "the city name"}
    assert w.parameters["properties"]["unit"]["enum"] == ["C", "F"]


def test_a_repeated_call_ends_the_round_and_runs_once() -> None:
    """SmolLM2 under a forced choice writes the same call again and again until the tokens run out; the
    loop stops the generation at the first repeat and runs the call once."""
    from types import SimpleNamespace

    from localgen.tools.loop import Toolbox, plan_for, run_turn
    from localgen.types import GenerationRequest, SamplingParams

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'

    from tests.conftest import ScriptedGen as Gen

    gens = [Gen([call] * 50), Gen(["It is sunny."])]
    backend = SimpleNamespace(generate=lambda request: gens.pop(0) if gens else None)
    box = Toolbox.open([ROOT / "tests" / "tool_functions.py"], [])
    template = QWEN.read_text()
    first = gens[0]
    turn = run_turn(backend, GenerationRequest(messages=tuple(ASK), sampling=SamplingParams(temperature=0)),
                    plan_for(template, box), box, lambda c: True, lambda e: None, 4, 5.0, template,
                    first=plan_for(template, box, "get_weather"))
    assert first.cancelled and first.read == 2, "generation stops at the first repeat"
    assert [r.text for r in turn.results] == ["It is 21 C and sunny in Paris."]
    assert [m["role"] for m in turn.messages] == ["assistant", "tool", "assistant"]
    assert len(turn.messages[0]["tool_calls"]) == 1 and turn.text == "It is sunny."



def test_a_turn_s_stats_cover_all_its_rounds() -> None:
    """types.turn_stats: one round's stats as they are; several rounds' tokens summed, rates over all their
    tokens, time to first token the first round's, total the model's time, the stop the last round's."""
    from localgen.types import Stats, turn_stats

    one = Stats(prompt_tokens=300, cached_tokens=0, completion_tokens=20, load_s=0.5, ttft_s=0.3, prefill_tps=1000.0,
                decode_tps=100.0, total_s=0.5, finish_reason="stop")
    two = Stats(prompt_tokens=340, cached_tokens=320, completion_tokens=30, load_s=0.5, ttft_s=0.05,
                prefill_tps=400.0, decode_tps=50.0, total_s=0.65, finish_reason="eos")
    assert turn_stats([one]) is one
    both = turn_stats([one, two])
    assert (both.prompt_tokens, both.cached_tokens, both.completion_tokens) == (640, 320, 50)
    assert both.ttft_s == 0.3 and both.load_s == 0.5 and both.finish_reason == "eos"
    assert both.total_s == pytest.approx(1.15)
    assert both.prefill_tps == pytest.approx(320 / (300 / 1000 + 20 / 400))  # 300 + 20 tokens evaluated
    assert both.decode_tps == pytest.approx(48 / (19 / 100 + 29 / 50))  # each round's first token came with its prompt
    assert both.drafted is None and both.media_tokens is None
    from types import SimpleNamespace

    from localgen.tools.loop import Turn

    turn = Turn(generations=[SimpleNamespace(stats=one), SimpleNamespace(stats=None)])  # a round closed unstarted
    assert turn.stats() is one and Turn().stats() is None


# ---- run --------------------------------------------------------------------------------------------------

MCP = f"{sys.executable} {ROOT / 'tests' / 'mcp_server.py'}"
RUN = ("run", "-m", "smollm2:135m", "--chat-template-file", str(QWEN), "--temperature", "0", "-n", "120")


def _run(cli: CLI | InProcessCLI, *args: str) -> Any:
    """`localgen run` with SmolLM2 and Qwen2.5's template. `cli_in_process` for what ends before the model
    loads (usage errors, tools that cannot start or are not there): no process or model load for those."""
    return cli(*RUN, *args)


def _only(tmp_path: Path, *names: str) -> str:
    """A --functions file holding just these functions of tests/tool_functions.py, their source as it is
    there. A run whose --tool-choice forces one tool needs no others in its prompt: each tool's schema is
    some 40 to 90 tokens that every such run would evaluate before its first token."""
    import inspect

    import tests.tool_functions as fns

    source = Path(fns.__file__).read_text()
    head = source[:source.index("\ndef ")]  # its docstring and imports
    path = tmp_path / f"{'_'.join(names)}.py"
    path.write_text("\n\n".join([head, *(inspect.getsource(getattr(fns, n)) for n in names)]))
    return str(path)


def test_what_a_functions_file_prints_goes_to_stderr_not_into_the_answer(cli: CLI, tmp_path: Path) -> None:
    # the red team's tools: their print()s, at import and in the call, came out on stdout before the answer and
    # broke --json for any reader; so did what the programs they start print (descriptor 1, inherited)
    fns = tmp_path / "f_print.py"
    fns.write_text('import os\nimport subprocess\n\nprint("IMPORT-STDOUT")\n'
                   'subprocess.run(["echo", "IMPORT-CHILD-STDOUT"], check=True)\n\n\n'
                   'def get_weather(city: str) -> str:\n    """Weather."""\n    print("TOOL-STDOUT")\n'
                   '    subprocess.run(["echo", "TOOL-CHILD-STDOUT"], check=True)\n'
                   '    os.system("echo TOOL-SYSTEM-STDOUT")\n    return "sunny"\n')
    r = _run(cli, "--functions", str(fns), "--yes", "--tool-choice", "get_weather", "-n", "40", "--json",
             "Weather in Paris?")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # stdout is the one JSON object, nothing before it
    assert doc["tool_calls"][0]["result"] == "sunny", doc
    assert "STDOUT" not in r.stdout
    shown = [r.stderr.index(line) for line in ("IMPORT-STDOUT", "IMPORT-CHILD-STDOUT", "TOOL-STDOUT",
                                                "TOOL-CHILD-STDOUT", "TOOL-SYSTEM-STDOUT")]
    assert shown == sorted(shown), r.stderr
    # as text, piped on (`| cat`): stdout is the answer alone, and the run's stdout is its own again after
    plain = _run(cli, "--functions", str(fns), "--yes", "--tool-choice", "get_weather", "-n", "40",
                 "Weather in Paris?")
    assert plain.returncode == 0 and "STDOUT" not in plain.stdout and "TOOL-SYSTEM-STDOUT" in plain.stderr
    assert plain.stdout.strip() == doc["text"].strip(), (plain.stdout, doc["text"])


def test_what_a_tool_prints_reaches_a_terminal_escaped_and_never_a_pipe_on_stdout(cli: CLI, tmp_path: Path) -> None:
    """docs/tools.md: a tool's print()s (sys.stdout and sys.stderr) reach a terminal as its result does, control
    characters escaped (an OSC 52 or a retitle went out raw, escape codes and all), and the stream says it is no
    terminal (so rich or click print plain); `run ... | jq` reads the answer alone on the pipe."""
    import subprocess

    from tests.terminal import drained

    fns = tmp_path / "f_escapes.py"
    fns.write_text('import sys\n\n\ndef get_weather(city: str) -> str:\n    """Weather."""\n'
                   '    print("OUT\\x1b]0;TITLE\\x07", sys.stdout.isatty())\n'
                   '    print("ERR\\x1b]52;c;Zm9v\\x07", file=sys.stderr, flush=True)\n    return "sunny"\n')
    primary, secondary = os.openpty()
    try:
        proc = cli.popen(*RUN, "--functions", str(fns), "--yes", "--tool-choice", "get_weather", "-n", "40",
                         "--json", "Weather in Paris?", stdout=subprocess.PIPE, stderr=secondary)
        os.close(secondary)
        seen = drained(primary, 300)
        out = proc.stdout.read()
        assert proc.wait(60) == 0, seen
    finally:
        os.close(primary)
    doc = json.loads(out)  # the pipe: the one JSON object
    assert doc["tool_calls"][0]["result"] == "sunny" and b"OUT" not in out and b"ERR" not in out, out
    shown = seen.decode()
    assert "OUT\\x1b]0;TITLE\\x07 False" in shown and "ERR\\x1b]52;c;Zm9v\\x07" in shown, shown
    assert "\x1b]" not in shown and "\x07" not in shown, shown


def test_run_functions_calls_the_tool_and_reports_it(cli: CLI, tmp_path: Path) -> None:
    fns = _only(tmp_path, "get_weather")  # the one tool it forces (tools/functions.py's load is tested above)
    r = _run(cli, "--functions", fns, "--yes", "--tool-choice", "get_weather", "--json", "Weather in Paris?")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tool_calls"] and doc["steps"] >= 2
    # the stats are the whole turn's: each round's tokens summed, time to first token the first round's
    steps, stats = doc["step_stats"], doc["stats"]
    assert len(steps) == doc["steps"] and steps[-1]["completion_tokens"] < stats["completion_tokens"]
    for key in ("prompt_tokens", "cached_tokens", "completion_tokens"):
        assert stats[key] == sum(step[key] for step in steps), key
    assert stats["ttft_s"] == steps[0]["ttft_s"] and stats["finish_reason"] == steps[-1]["finish_reason"]
    first = doc["tool_calls"][0]
    assert first["name"] == "get_weather" and isinstance(first["arguments"]["city"], str)
    unit, city = first["arguments"].get("unit", "C"), first["arguments"]["city"]
    assert first["result"] == f"It is 21 {unit} and sunny in {city}."
    assert "tool call: get_weather(" in r.stderr and "tool result: It is 21" in r.stderr
    # the same run as plain text (--verbose-prompt writes to stderr only, so stdout is still the answer alone)
    plain = _run(cli, "--functions", fns, "--yes", "--tool-choice", "get_weather", "--verbose-prompt", "--stats",
                 "Weather in Paris?")
    assert plain.returncode == 0 and plain.stdout.strip() == doc["text"].strip()
    assert f"{doc['steps']} steps · {stats['prompt_tokens']} prompt tokens" in plain.stderr
    assert f" · {stats['completion_tokens']} generated · " in plain.stderr
    shown = plain.stderr[plain.stderr.index("prompt:"):]
    start = shown.index("\n<tools>\n")  # the block itself, not the "<tools></tools>" that introduces it
    tools = shown[start:shown.index("\n</tools>", start)]
    assert '"name": "get_weather"' in tools, "--verbose-prompt shows the tools"


def test_run_tool_failures_are_one_line_errors(cli: CLI, cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    fns = str(ROOT / "tests" / "tool_functions.py")
    r = _run(cli_in_process, "--functions", fns, "Weather?")
    assert r.returncode == 2 and "add --yes" in r.stderr and not r.stdout
    r = _run(cli, "--functions", _only(tmp_path, "explode"), "--yes", "--tool-choice", "explode", "Go.")
    assert r.returncode == 1 and "explode failed: ValueError: boom" in r.stderr and "Traceback" not in r.stderr
    r = _run(cli, "--functions", _only(tmp_path, "stall"), "--yes", "--tool-choice", "stall", "--tool-timeout", "1",
             "Go.")
    assert r.returncode == 1 and "stall did not finish within 1 s" in r.stderr
    r = _run(cli_in_process, "--functions", fns, "--yes", "--tool-choice", "nosuch", "Go.")  # refused before the load
    assert r.returncode == 1 and "which is none of the tools" in r.stderr
    r = _run(cli_in_process, "--tool-choice", "get_weather", "--yes", "Go.")  # no tools at all: a usage error
    assert r.returncode == 2 and "go with tools: add --functions or --mcp" in r.stderr
    r = _run(cli_in_process, "--functions", str(ROOT / "tests" / "conftest.py"), "--yes", "--raw", "Go.")
    assert r.returncode == 2 and "--raw" in r.stderr


@pytest.mark.parametrize("command", ["run", "chat", "serve"])
def test_an_empty_functions_path_is_named_as_given(cli_in_process: InProcessCLI, command: str) -> None:
    """`--functions ""` is an empty path, said so (it was `--functions .: a folder, not a file`: the path made "."
    before it was checked), a usage error before anything loads."""
    r = cli_in_process(command, "--functions", "", *(["--yes"] if command != "serve" else []))
    assert r.returncode == 2 and not r.stdout, r.stderr
    assert r.stderr == 'localgen: error: --functions "": an empty path, not a file\n', r.stderr


def test_a_functions_file_that_fails_as_it_loads_is_one_line(cli: CLI, tmp_path: Path) -> None:
    """docs/tools.md: a tools file that raises on import, or calls sys.exit there, is one error line and exit
    1, before the model loads (the model named here does not exist)."""
    for body, said in (('raise RuntimeError("first line\\nsecond line")', "RuntimeError: first line second line"),
                       ("import sys\nsys.exit(3)", "SystemExit: 3")):
        fns = tmp_path / "tools.py"
        fns.write_text(body + "\n")
        r = cli("run", "-m", str(tmp_path / "missing.gguf"), "--functions", str(fns), "--yes", "Go.")
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert f"loading {fns} failed: {said}" in r.stderr, r.stderr


def test_a_tool_s_failure_and_a_result_too_big_to_read_are_one_line(tmp_path: Path) -> None:
    """A tool's multi-line exception is one error line, and a result longer than a model can read is refused
    by the tool's name (not as the chat template's "absurdly long prompt")."""
    from localgen.errors import ToolError
    from localgen.tools.loop import MAX_RESULT_CHARS, Toolbox
    from localgen.tools.spec import ToolCall

    fns = tmp_path / "tools.py"
    fns.write_text('def fail() -> str:\n    """Fail."""\n    raise ValueError("first\\nsecond\\n\\nthird")\n\n'
                   f'def huge() -> str:\n    """Huge."""\n    return "x" * {MAX_RESULT_CHARS + 1}\n\n'
                   f'def big() -> str:\n    """Big."""\n    return "x" * {MAX_RESULT_CHARS}\n')
    box = Toolbox.open([fns], [])
    try:
        with pytest.raises(ToolError) as e:
            box.call(ToolCall("fail", "{}"), 10)
        assert e.value.message == "fail failed: ValueError: first second third"
        with pytest.raises(ToolError) as e:
            box.call(ToolCall("huge", "{}"), 10)
        assert e.value.message.startswith(f"huge returned {MAX_RESULT_CHARS + 1:,} characters"), e.value.message
        assert len(box.call(ToolCall("big", "{}"), 10)) == MAX_RESULT_CHARS
    finally:
        box.close()


def test_a_result_or_failure_that_is_not_utf8_is_read_with_replacement_characters(tmp_path: Path) -> None:
    """A file name os.listdir gives for bytes that are not UTF-8 (kept as lone surrogates), in a result or in a
    failure's words, reaches the model as U+FFFD, as a decoder replaces a bad byte: the run went on to a one-line
    error ("the text is not valid UTF-8") and serve's POST /tools/call was a 500 with a traceback."""
    from localgen.errors import ToolError
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "ok.txt").touch()
    open(os.fsencode(folder) + b"/caf\xe9.txt", "w").close()  # a name only bytes can give
    fns = tmp_path / "tools.py"
    fns.write_text("import os\n\n\n"
                   "def listing(folder: str) -> str:\n    \"\"\"List.\"\"\"\n"
                   "    return ', '.join(sorted(os.listdir(folder)))\n\n\n"
                   "def unread(folder: str) -> str:\n    \"\"\"Fail.\"\"\"\n"
                   "    raise OSError('cannot read ' + sorted(os.listdir(folder))[0])\n\n\n"
                   "def lone() -> list[str]:\n    \"\"\"A JSON escape's surrogate.\"\"\"\n"
                   "    return ['\\ud800']\n")
    box = Toolbox.open([fns], [])
    try:
        args = json.dumps({"folder": str(folder)})
        assert box.call(ToolCall("listing", args), 10) == "caf\ufffd.txt, ok.txt"
        assert box.call(ToolCall("lone", "{}"), 10) == '["\ufffd"]'
        with pytest.raises(ToolError) as e:
            box.call(ToolCall("unread", args), 10)
        assert e.value.message == "unread failed: OSError: cannot read caf\ufffd.txt", e.value.message
    finally:
        box.close()


def test_a_result_holding_nan_or_infinity_reaches_the_model_as_valid_json(tmp_path: Path) -> None:
    """docs/tools.md: NaN and infinities in a result the model reads as JSON are null (json.dumps wrote `NaN`,
    `Infinity`: no JSON); a cycle is still the value's str()."""
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    fns = tmp_path / "tools.py"
    fns.write_text('def stats() -> dict:\n    """Stats."""\n'
                   '    return {"mean": float("nan"), "range": [float("-inf"), 1.5, (float("inf"),)], "n": 0}\n\n\n'
                   'def ring() -> list:\n    """A cycle."""\n    r = [float("nan")]\n    r.append(r)\n    return r\n')
    box = Toolbox.open([fns], [])
    try:
        text = box.call(ToolCall("stats", "{}"), 10)

        def strict(word: str) -> Any:
            raise AssertionError(f"{word} in {text}")

        assert json.loads(text, parse_constant=strict) == {"mean": None, "range": [None, 1.5, [None]], "n": 0}
        assert box.call(ToolCall("ring", "{}"), 10) == "[nan, [...]]"
    finally:
        box.close()


def test_a_lambda_in_a_functions_file_is_no_tool_and_fails_nothing(tmp_path: Path) -> None:
    """docs/tools.md: `g = lambda x: x` at a file's top level is left out (it failed the whole file: `<lambda> is
    not a usable tool name`); the file's def functions are its tools."""
    from localgen.tools.loop import Toolbox

    fns = tmp_path / "tools.py"
    fns.write_text('g = lambda x: x  # noqa: E731\n\n\ndef add(a: int, b: int) -> int:\n    """Add."""\n'
                   '    return g(a) + b\n')
    box = Toolbox.open([fns], [])
    try:
        assert [s.name for s in box.specs] == ["add"]
    finally:
        box.close()


def test_a_function_with_positional_only_parameters_is_called_with_them_by_position(tmp_path: Path) -> None:
    """`def f(a, /, b)` is offered with a, b as any function's parameters, and called with a by position (every
    call failed: "positional-only arguments passed as keyword arguments"); one left out before another given
    takes its default."""
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    fns = tmp_path / "tools.py"
    fns.write_text('def posonly(a: int, /, b: int) -> int:\n    """Add."""\n    return a + b\n\n\n'
                   'def defaults(a: int = 1, b: int = 10, /, c: int = 100) -> int:\n    """Add."""\n'
                   '    return a + b + c\n')
    box = Toolbox.open([fns], [])
    try:
        assert box.call(ToolCall("posonly", '{"a": 2, "b": 40}'), 10) == "42"
        assert box.call(ToolCall("defaults", '{"b": 20}'), 10) == "121"
        assert box.call(ToolCall("defaults", '{"c": 5}'), 10) == "16"
        assert box.call(ToolCall("defaults", '{"a": 3, "b": 4, "c": 5}'), 10) == "12"
    finally:
        box.close()


TICKER = '''
import time


def ticker() -> str:
    """Print a tick every 50 ms, for a minute."""
    for i in range(1200):
        print(f"tick {i}", flush=True)
        time.sleep(0.05)
    return "done"
'''

PAST_TIMEOUT = '''
import sys, time
from pathlib import Path
from localgen.errors import ToolError
from localgen.tools.loop import Toolbox
from localgen.tools.spec import ToolCall

box = Toolbox.open([Path(sys.argv[1])], [])
try:
    box.call(ToolCall("ticker", "{}"), 0.5)
except ToolError as e:
    print("error:", e.message, file=sys.stderr, flush=True)
print("the answer goes on", flush=True)
for _ in range(200):  # until the call stops (each tick is 50 ms apart), 20 s at most
    if not box.running:
        break
    time.sleep(0.1)
time.sleep(0.5)
print("stopped" if not box.running else "still running", flush=True)
'''


def test_a_python_tool_past_its_timeout_is_stopped_and_prints_no_more(tmp_path: Path) -> None:
    """docs/tools.md: a call past --tool-timeout is stopped (at its next line of Python), and nothing it prints
    after shows: it printed into the answer (stdout) after the turn had moved on."""
    import subprocess

    fns = tmp_path / "ticker.py"
    fns.write_text(TICKER)
    r = subprocess.run([sys.executable, "-c", PAST_TIMEOUT, str(fns)], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "the answer goes on\nstopped\n", r.stdout
    assert "tick 0" in r.stderr and "error: ticker did not finish within 0.5 s" in r.stderr, r.stderr
    after = r.stderr[r.stderr.index("error: "):]
    assert not re.search(r"tick \d", after) and "Traceback" not in r.stderr, r.stderr


def test_redaction_takes_the_values_the_page_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/tools.md: values of 8 characters or more, of variables named like *KEY*, *TOKEN*, *SECRET*,
    *PASSW*, *CREDENTIAL*, *AUTH*, in any case."""
    from localgen.tools.loop import redact

    names = ["MY_API_KEY", "gh_token", "A_SECRET", "DB_PASSWORD", "CREDENTIALS_X", "OAuth_Y"]
    for i, n in enumerate(names):
        monkeypatch.setenv(n, f"value-{i}-abcdefgh")
    monkeypatch.setenv("SHORT_KEY", "1234567")
    monkeypatch.setenv("PLAIN", "plain-value-123")
    text = " ".join(f"value-{i}-abcdefgh" for i in range(len(names))) + " 1234567 plain-value-123"
    assert redact(text) == " ".join(f"[{n} redacted]" for n in names) + " 1234567 plain-value-123"


def test_an_mcp_server_that_writes_no_json_rpc_is_one_line(cli: CLI, tmp_path: Path) -> None:
    """The SDK logs a traceback for each line on a server's stdout that is not JSON-RPC: off stderr, which
    has the one error line."""
    r = cli("run", "-m", str(tmp_path / "missing.gguf"), "--mcp", "echo not-json-rpc", "--yes", "Go.")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "the MCP server echo not-json-rpc failed (starting): it wrote 'not-json-rpc' on stdout, which is not " \
           "JSON-RPC, and ended" in r.stderr and "Traceback" not in r.stderr, r.stderr  # not "Connection closed"
    r = cli("run", "-m", str(tmp_path / "missing.gguf"), "--mcp", "true", "--yes", "Go.")  # no server at all
    assert r.returncode == 1 and r.stderr == "localgen: error: the MCP server true failed (starting): it ended " \
        "before it answered (an MCP server answers JSON-RPC on its stdin and stdout)\n", r.stderr
    r = cli("run", "-m", str(tmp_path / "missing.gguf"), "--mcp", "'unclosed quote", "--yes", "Go.")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is not a command line" in r.stderr, r.stderr


RAW = f"{sys.executable} {ROOT / 'tests' / 'mcp_raw_server.py'}"


def test_an_mcp_line_that_cannot_be_read_is_the_error_not_a_timeout(cli_in_process: InProcessCLI,
                                                                     tmp_path: Path) -> None:
    """A listing pydantic cannot read (a schema nested past its recursion limit) fails the start at once, saying
    so, not as a server that did not answer; bytes that are not UTF-8 in an answer are read as U+FFFD, and the
    server keeps answering (they had ended the SDK's reader: every later call a timeout)."""
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    r = cli_in_process("run", "-m", str(tmp_path / "missing.gguf"), "--mcp", f"{RAW} deep:250", "--yes", "Go.")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "sent a line that is not JSON-RPC: Invalid JSON: recursion limit exceeded" in r.stderr, r.stderr
    assert "(starting)" in r.stderr and "did not answer" not in r.stderr
    box = Toolbox.open([], [f"{RAW} badutf8"])
    try:
        assert box.call(ToolCall("bad", "{}"), 30) == "ab\ufffd\ufffd cd"
        assert box.call(ToolCall("add", '{"a": 1, "b": 2}'), 30) == "3"
    finally:
        box.close()
    # a structured logger's JSON line on stdout (no "jsonrpc", no "id") is a log line, passed over as the SDK does:
    # the server starts and answers (such a line had failed the start and every call)
    box = Toolbox.open([], [f"{RAW} jsonlog"])
    try:
        assert box.call(ToolCall("add", '{"a": 2, "b": 2}'), 30) == "4"
    finally:
        box.close()


def test_a_stdio_program_that_writes_a_banner_and_no_message_fails_its_start_quoting_it(
        cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    """docs/tools.md: a stdio server whose first line is not JSON-RPC (a banner) and that sends no message in the
    5 s after it fails its start then, one line quoting that line (control characters escaped), not as the 30 s
    start timeout's "sent a line that is not JSON-RPC: Invalid JSON: expected value". One that answers after such
    a line (test above: jsonlog) starts as before."""
    banner = tmp_path / "banner.py"
    banner.write_text('import time\nprint("Welcome to Weather v2 \\x1b[1m(ready)", flush=True)\ntime.sleep(120)\n')
    r = cli_in_process("run", "-m", str(tmp_path / "missing.gguf"), "--mcp", f"{sys.executable} {banner}", "--yes",
                       "Go.")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert (r"wrote 'Welcome to Weather v2 \x1b[1m(ready)' on stdout, which is not JSON-RPC, and sent no message in "
            "the 5 s after it (starting)") in r.stderr, r.stderr
    assert "\x1b" not in r.stderr and "did not answer" not in r.stderr


def test_an_mcp_servers_error_answer_fails_the_call_and_the_server_stays() -> None:
    """A JSON-RPC error answer of code -32000 (the SDK's own code for a closed connection, and the first a server
    may use for its own errors) fails that call, its message's lines joined (tools.md), and the server stays, its
    tools offered: it was taken for gone, its tools withdrawn for good while it ran on."""
    from localgen.errors import ToolError
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    box = Toolbox.open([], [f"{RAW} rpcerror"])
    try:
        with pytest.raises(ToolError) as e:
            box.call(ToolCall("err", "{}"), 30)
        assert e.value.message.endswith("failed (calling err): MCPError: custom error with newline"), e.value.message
        assert e.value.hint is None and [s.name for s in box.specs] == ["add", "err"]
        assert box.call(ToolCall("add", '{"a": 1, "b": 2}'), 30) == "3"
    finally:
        box.close()


@pytest.mark.parametrize("mib", ["17", "16"])
def test_a_stdio_mcp_line_over_16_mib_is_refused_and_its_server_withdrawn(mib: str) -> None:
    """docs/tools.md: one line (one message) a stdio server writes is read up to 16 MiB: past that the call fails
    saying so, not with a timeout or once the whole line is held, and the server's tools are withdrawn; so does a
    line a few bytes past the bound whose end came in the same read (16 MiB of text and the message around it:
    it was read)."""
    from localgen.errors import ToolError
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    box = Toolbox.open([], [f"{RAW} big:{mib}"])
    try:
        with pytest.raises(ToolError) as e:
            box.call(ToolCall("big", "{}"), 30)
        assert "sent a line over 16 MiB (one message): at most that is read" in e.value.message, e.value.message
        assert e.value.message.endswith("(calling big)") and box.specs == ()
    finally:
        box.close()


def test_an_mcp_server_whose_close_fails_is_one_warning_line_not_a_traceback(
        cli_in_process: InProcessCLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/tools.md: the MCP servers close together, each in a thread of its own; one whose close fails (an SDK
    error as it shuts down, made here after the real close ended the server) is one warning line naming it before
    the run's own error, never the thread's traceback (threading.excepthook's, which pytest would catch: its
    default put back)."""
    import threading

    from localgen.tools import mcp

    closed = mcp.McpServer.close

    def failing(self: mcp.McpServer) -> None:
        closed(self)
        raise RuntimeError("Event loop is closed\n(a second line)")

    monkeypatch.setattr(mcp.McpServer, "close", failing)
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)
    r = cli_in_process("run", "-m", str(tmp_path / "missing.gguf"), "--mcp", MCP, "--yes", "Go.")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr  # (a model path that is not there)
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[1].startswith("localgen: error: ") and "missing.gguf" in lines[1], r.stderr
    label = MCP if len(MCP) <= 60 else MCP[:57] + "..."  # (a command line's label: itself, cut to 60 characters)
    assert lines[0] == f"warning: the MCP server {label} did not close cleanly: RuntimeError: Event loop is closed " \
                       "(a second line)"  # its lines joined (tools.md)


def test_an_mcp_embedded_resource_reaches_the_model_as_its_text() -> None:
    """docs/tools.md: a result's embedded text resource is its text; a blob one, a placeholder naming it."""
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    box = Toolbox.open([], [f"{RAW} resource"])
    try:
        assert box.call(ToolCall("res", "{}"), 30) == "the notes say 42"
        assert box.call(ToolCall("blob", "{}"), 30) == "[resource file:///cat.png (image/png)]"
    finally:
        box.close()


def test_an_sdk_whose_stdio_parts_moved_still_serves_its_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """tools/mcp.py reads stdio with parts of the mcp SDK that are not its API (pinned by pyproject.toml); an SDK
    without one of them is served by its own stdio reader, as before, rather than failing every start."""
    from localgen.tools import mcp as ours
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    monkeypatch.setattr(ours, "_SDK_PARTS", (*ours._SDK_PARTS, "_a_part_no_sdk_has"))
    box = Toolbox.open([], [f"{RAW} resource"])
    try:
        assert box.call(ToolCall("res", "{}"), 30) == "the notes say 42"
    finally:
        box.close()


def test_run_prints_no_cut_off_call_marker(cli: CLI, tmp_path: Path) -> None:
    """A call with no arguments, forced, is made again until -n cuts the repeat inside `<tool_call`: that
    piece of a marker is neither answer text on stdout nor, when the tool fails, printed before the error."""
    for body, code in (('return "zapped"', 0), ('raise RuntimeError("boom")', 1)):
        fns = tmp_path / "zap.py"
        fns.write_text(f'def zap() -> str:\n    """Zap."""\n    {body}\n')
        r = cli(*RUN[:-1], "32", "--functions", str(fns), "--yes", "--tool-choice", "zap", "go")
        assert r.returncode == code and "tool call: zap({})" in r.stderr, r.stderr
        assert "<tool_call" not in r.stdout and (code or "zapped" in r.stdout), r.stdout


def test_a_tool_choice_naming_no_tool_is_refused_before_the_model_loads(cli_in_process: InProcessCLI,
                                                                        tmp_path: Path) -> None:
    """docs/tools.md: a --tool-choice NAME that is none of the tools is refused once the tools are open, before
    the model loads: with a model file that does not exist, that refusal is still the one said."""
    fns = str(ROOT / "tests" / "tool_functions.py")
    missing = str(tmp_path / "missing.gguf")
    for command in ("run", "chat"):
        r = cli_in_process(command, "-m", missing, "--functions", fns, "--yes", "--tool-choice", "nosuch",
                           *(["Go."] if command == "run" else []), input="Go.\n")
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert "--tool-choice names 'nosuch', which is none of the tools: " in r.stderr and "missing" not in r.stderr
        assert "get_weather" in r.stderr.split("none of the tools: ")[1], r.stderr  # the tools it could name


def test_run_keeps_secrets_from_the_model(cli: CLI, tmp_path: Path) -> None:
    fns = _only(tmp_path, "secret")
    r = _run(CLI({**cli.env, "TEST_API_TOKEN": "abcdefgh12345678"}), "--functions", fns, "--yes", "--tool-choice",
             "secret", "--json", "Get it.")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tool_calls"][0]["result"] == "token=[TEST_API_TOKEN redacted]"
    assert "abcdefgh12345678" not in r.stdout + r.stderr


def test_an_mcp_server_that_stopped_has_its_tools_withdrawn(tmp_path: Path) -> None:
    """A call that finds its MCP server gone says so, with a hint that its tools are no longer offered; from then
    on the model is not offered them (a chat's next turn would otherwise call a dead server again), while the
    tools of a Python file stay."""
    from localgen.errors import ToolError
    from localgen.tools.loop import Toolbox, plan_for
    from localgen.tools.spec import ToolCall

    (tmp_path / "tools.py").write_text('def double(x: int) -> int:\n    """Twice x."""\n    return 2 * x\n')
    box = Toolbox.open([tmp_path / "tools.py"], [MCP])
    try:
        assert {s.name for s in box.specs} == {"double", "add", "leak", "crash"}
        template = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}{{ tools }}{% endif %}"
        before = plan_for(template, box)
        with pytest.raises(ToolError) as e:
            box.call(ToolCall("crash", "{}"), 30)
        assert "failed (calling crash)" in e.value.message and "no longer offered" in (e.value.hint or "")
        assert [s.name for s in box.specs] == ["double"]
        after = plan_for(template, box)
        assert before is not None and after is not None and after.tools == box.specs != before.tools
        with pytest.raises(ToolError, match="not a tool here"):
            box.call(ToolCall("add", '{"a": 1, "b": 2}'), 30)
        assert box.call(ToolCall("double", '{"x": 4}'), 30) == "8"
    finally:
        box.close()


def test_run_with_a_stdio_mcp_server(cli: CLI, cli_in_process: InProcessCLI, monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    r = _run(cli, "--mcp", MCP, "--yes", "--tool-choice", "add", "--json", "What is 2 + 3?")
    assert r.returncode == 0, r.stderr
    calls = json.loads(r.stdout)["tool_calls"]
    assert calls and calls[0]["name"] == "add"
    assert calls[0]["result"] == str(calls[0]["arguments"]["a"] + calls[0]["arguments"]["b"])
    # the server never gets the secret: asked of the Toolbox that `run` opens (the same start, with this
    # process's environment), which needs no model to make the call
    monkeypatch.setenv("TEST_API_TOKEN", "abcdefgh12345678")
    box = Toolbox.open([], [MCP])
    try:
        assert box.call(ToolCall("leak", "{}"), 30) == "token=unset"  # redacted, it would say so
    finally:
        box.close()
    r = _run(cli, "--mcp", MCP, "--yes", "--tool-choice", "crash", "Crash.")
    assert r.returncode == 1 and "failed (calling crash)" in r.stderr and "Traceback" not in r.stderr
    r = _run(cli_in_process, "--mcp", "no-such-mcp-server-command", "--yes", "Go.")
    assert r.returncode == 1 and "no-such-mcp-server-command failed (starting)" in r.stderr
    # a server that dies as it starts: its last line on stderr is the reason given (stderr is not a terminal)
    dying = f"{sys.executable} -c \"import sys; sys.exit('No module named mcp (a test)')\""
    r = _run(cli_in_process, "--mcp", dying, "--yes", "Go.")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "failed (starting)" in r.stderr and "it said: No module named mcp (a test)" in r.stderr, r.stderr
    # it never offered tools, so no "(it has gone: its tools are no longer offered to the model)"; a long last
    # line is cut at a word and says so, where it ended mid-word ("see the migratio")
    assert "no longer offered" not in r.stderr, r.stderr
    words = " ".join(f"word{i:03}" for i in range(60))  # 479 characters
    r = _run(cli_in_process, "--mcp", f"{sys.executable} -c \"import sys; sys.exit('{words}')\"", "--yes", "Go.")
    said = r.stderr.strip().partition("it said: ")[2]
    assert r.returncode == 1 and said.endswith(" …") and said[:-2] in words, r.stderr
    assert said[:-2].split()[-1] in words.split(), r.stderr


def test_an_mcp_server_that_dies_says_why_where_there_is_no_pread(cli_in_process: InProcessCLI,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows has no os.pread: the server's last line on stderr is read all the same, where the one-line error
    was an AttributeError traceback."""
    monkeypatch.delattr(os, "pread")
    dying = f"{sys.executable} -c \"import sys; sys.exit('No module named mcp (a test)')\""
    r = _run(cli_in_process, "--mcp", dying, "--yes", "Go.")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "failed (starting)" in r.stderr and "it said: No module named mcp (a test)" in r.stderr, r.stderr


def test_a_listing_in_pages_is_read_to_its_end_and_one_that_never_ends_is_one_line(cli_in_process: InProcessCLI,
                                                                                   tmp_path: Path) -> None:
    """tools/list's nextCursor is followed until there is none (run and chat offer the tools of every page: a
    --tool-choice naming the last page's tool is no error, the missing model is); a server that sends the same
    cursor again, or pages without end, is one line past tools/mcp.py's limits, never a loop."""
    missing = str(tmp_path / "missing.gguf")
    for command, pages in (("run", "1"), ("chat", "1"), ("run", "emptycursor")):  # an empty cursor: the end
        r = cli_in_process(command, "-m", missing, "--mcp", f"{MCP} --pages {pages}", "--yes", "--tool-choice",
                           "crash", *(["Go."] if command == "run" else []), input="Go.\n")
        assert r.returncode != 0 and "missing.gguf" in r.stderr, r.stderr
        assert "which is none of the tools" not in r.stderr, r.stderr
    for how, said in (("same", "sent the same tools/list cursor twice: its listing would never end"),
                      ("endless", "listed its tools in more than 1,000 pages: at most 1,000 are read"),
                      ("bigcursor", "sent a tools/list cursor of 5,000 characters: at most 4,096 are sent back")):
        r = cli_in_process("run", "-m", missing, "--mcp", f"{MCP} --pages {how}", "--yes", "Go.")
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
    from tests.test_responses_mcp import mcp_server

    with mcp_server(None, "--oversized", "count", "--pages", "100") as url:  # 1,007 tools, 100 a page
        r = cli_in_process("run", "-m", missing, "--mcp", url, "--yes", "Go.")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "listed 1,007 tools: at most 1,000 are read" in r.stderr, r.stderr


def test_a_listing_that_is_not_mcps_is_one_line_naming_the_field(cli_in_process: InProcessCLI,
                                                                  tmp_path: Path) -> None:
    """A tools/list answer pydantic cannot read ("tools": "nope") was the SDK's ValidationError, in several lines
    that said nothing of where: it is one line naming the MCP server and the field at fault."""
    r = cli_in_process("run", "-m", str(tmp_path / "missing.gguf"), "--mcp", f"{RAW} badlist", "--yes", "Go.")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "tools/list answer is not MCP's: tools: " in r.stderr and "ValidationError" not in r.stderr, r.stderr


def test_run_hides_thinking_unless_asked(cli: CLI) -> None:
    base = ("run", "-m", "smollm2:135m", "--chat-template-file", str(R1), "--temperature", "0", "-n", "16")
    hidden = cli(*base, "Why is the sky blue?")
    shown = cli(*base, "--show-thinking", "Why is the sky blue?")
    doc = json.loads(cli(*base, "--json", "Why is the sky blue?").stdout)
    assert hidden.returncode == shown.returncode == 0
    assert hidden.stdout == "" and doc["text"] == "" and doc["reasoning"]
    assert doc["reasoning"].strip()[:20] in shown.stderr and "thinking:" in shown.stderr
    assert Path(R1).exists()


@contextlib.contextmanager
def mcp_over_http() -> Iterator[int]:
    """tests/mcp_server.py over streamable HTTP on a free port (its URL: http://127.0.0.1:PORT/mcp), stopped after."""
    import socket
    import subprocess
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "mcp_server.py"), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def test_run_with_a_streamable_http_mcp_server(cli: CLI, cli_in_process: InProcessCLI) -> None:
    with mcp_over_http() as port:
        r = _run(cli, "--mcp", f"http://127.0.0.1:{port}/mcp", "--yes", "--tool-choice", "add", "--tool-steps", "2",
                 "--json", "What is 2 + 3?")
        assert r.returncode == 0, r.stderr
        calls = json.loads(r.stdout)["tool_calls"]
        assert calls[0]["name"] == "add"
        assert calls[0]["result"] == str(calls[0]["arguments"]["a"] + calls[0]["arguments"]["b"])
    # nothing listens there now: one line that says so (the SDK's own error is a bare CancelledError)
    r = _run(cli_in_process, "--mcp", f"http://127.0.0.1:{port}/mcp", "--yes", "What is 2 + 3?")
    url = f"http://127.0.0.1:{port}/mcp"
    assert (r.returncode, r.stderr) == (1, f"localgen: error: cannot reach the MCP server {url}: Connection refused\n")


def test_tool_steps_bounds_the_rounds_of_calls(cli: CLI) -> None:
    """`step`'s result asks for the next step (the model copies the call): with --tool-steps 2, two rounds of calls
    run, and the third generation's calls never do (it ran a third round, then said "after 2 rounds")."""
    r = _run(cli, "--mcp", f"{MCP} --steps", "--yes", "--tool-choice", "step", "--tool-steps", "2",
             "Do the task: call step with n=1, then each step it says, until step 20.")
    assert r.returncode == 1 and "still calling tools after 2 rounds" in r.stderr, r.stderr
    kinds = [line.split(":")[0] for line in r.stderr.splitlines() if line.startswith(("tool call:", "tool result:"))]
    ran = sum(1 for a, b in itertools.pairwise(kinds) if (a, b) == ("tool call", "tool result"))
    assert ran == 2 and kinds[-1] == "tool call", r.stderr  # a round's calls, then their results; the last never run


def test_an_mcp_tool_whose_name_a_request_cannot_carry_is_left_out_of_run_with_a_warning(
        cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    """run and chat offer an MCP server's tools as a request's `tools` carries them (1-64 of [A-Za-z0-9_.-]): one
    named otherwise (MCP allows 128 characters of any kind) is left out with one warning, the server's other tools
    kept (a name holding a space, a newline and a quote was offered to the model as it was)."""
    missing = str(tmp_path / "missing.gguf")
    r = cli_in_process("run", "-m", missing, "--mcp", f"{MCP} --bad-names", "--yes", "--tool-choice", "add", "Go.")
    assert r.returncode != 0 and "missing.gguf" in r.stderr and "which is none of the tools" not in r.stderr, r.stderr
    assert "is left out: a tool's name must be 1-64 ASCII letters, digits, _ . or -" in r.stderr
    assert "tool 'a b\\n\"c' is left out" in r.stderr and "tool 'search_" + "x" * 73 + "' is left out" in r.stderr
    r = cli_in_process("run", "-m", missing, "--mcp", f"{MCP} --bad-names", "--yes", "--tool-choice", "a b", "Go.")
    assert r.returncode != 0 and "which is none of the tools" in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["run", "chat"])
@pytest.mark.parametrize("choice", ["", "  "])
def test_an_empty_tool_choice_is_a_usage_error(cli_in_process: InProcessCLI, command: str, choice: str) -> None:
    """docs/ci.md's exit 2: an empty name is never taken for a flag left out (`--tool-choice ''` ran as auto)."""
    fns = str(ROOT / "tests" / "tool_functions.py")
    r = cli_in_process(command, "--functions", fns, "--yes", "--tool-choice", choice,
                       *(["Go."] if command == "run" else []), input="Go.\n")
    assert r.returncode == 2 and "--tool-choice is empty: give a value, or leave it out" in r.stderr, r.stderr
    assert not r.stdout
