"""The flag combinations run and chat share are checked in one place (cli/options/plan.py), so the two commands refuse
the same things with the same words: each rule here runs both commands through it. Every case names a model
file that does not exist, so a rule that did not fire would end in a different error (the model not found),
never in a load. In-process: these are usage errors, before anything loads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT, InProcessCLI

COMMANDS = ("run", "chat")
FUNCTIONS = str(ROOT / "tests" / "tool_functions.py")
ENDPOINT = "http://127.0.0.1:9/v1"  # never reached: the refusal comes first


def _refused(cli_in_process: InProcessCLI, tmp_path: Path, command: str, *args: str, code: int = 2) -> str:
    """stderr of `localgen COMMAND -m MISSING ARGS` (a prompt for run, a message on stdin for chat), which
    must fail with `code` (2: a usage error)."""
    missing = str(tmp_path / "missing.gguf")
    words = [command, "-m", missing, *args] + (["-p", "Hi."] if command == "run" else [])
    r = cli_in_process(*words, input="Hi.\n")
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and not r.stdout
    return r.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_tool_flags_without_tools(cli_in_process: InProcessCLI, tmp_path: Path, command: str) -> None:
    for flag, value in (("--tool-choice", "auto"), ("--tool-steps", "3"), ("--tool-timeout", "5")):
        err = _refused(cli_in_process, tmp_path, command, flag, value)
        assert "--tool-choice, --tool-steps and --tool-timeout go with tools: add --functions or --mcp" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_tools_with_a_grammar_or_schema(cli_in_process: InProcessCLI, tmp_path: Path, command: str) -> None:
    for fmt in (("--grammar", 'root ::= "a"'), ("--json-schema", '{"type": "object"}')):
        err = _refused(cli_in_process, tmp_path, command, "--functions", FUNCTIONS, "--yes", *fmt)
        assert "tools (--functions, --mcp) cannot be combined with a grammar or JSON schema" in err, err


@pytest.mark.parametrize("command", COMMANDS)
def test_tools_with_a_remote_endpoint(cli_in_process: InProcessCLI, tmp_path: Path, command: str) -> None:
    err = _refused(cli_in_process, tmp_path, command, "--functions", FUNCTIONS, "--yes", "--endpoint", ENDPOINT)
    assert "tools (--functions, --mcp) cannot be combined with a remote endpoint" in err, err


@pytest.mark.parametrize("command", COMMANDS)
def test_tools_with_a_named_endpoint(cli_in_process: InProcessCLI, tmp_path: Path, command: str) -> None:
    """docs/remote.md: an endpoint named in endpoints.toml (-m NAME/MODEL) is as remote as --endpoint: the
    server renders its own template, so the tools' format and --tool-choice could not be held there."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "endpoints.toml").write_text(f'[box]\nurl = "{ENDPOINT}"\nmodels = ["m"]\n')
    cli = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(tmp_path)})
    r = cli(command, "-m", "box/m", "--functions", FUNCTIONS, "--yes", *(["-p", "Hi."] if command == "run" else []),
            input="Hi.\n")
    assert r.returncode == 2 and "tools (--functions, --mcp) cannot be combined with a remote endpoint" in r.stderr, (
        r.returncode, r.stderr)


@pytest.mark.parametrize("command", COMMANDS)
def test_tools_without_yes_where_nobody_can_be_asked(cli_in_process: InProcessCLI, tmp_path: Path,
                                                     command: str) -> None:
    """run never asks; a scripted chat (stdin not a terminal, as here) cannot."""
    err = _refused(cli_in_process, tmp_path, command, "--functions", FUNCTIONS)
    who = "run" if command == "run" else "a scripted chat (stdin not a terminal)"
    assert f"the model may call tools, and {who} cannot ask first: add --yes to let the calls run" in err, err


@pytest.mark.parametrize("command", COMMANDS)
def test_tools_on_a_model_without_a_template_are_refused_before_yes_is_asked_for(
        cli_in_process: InProcessCLI, tmp_path: Path, command: str, gemma_path: Path) -> None:
    """A base model cannot be offered tools at all: that error comes first (the --yes one came first, and sent the
    user to add a flag that could not help); with a template given, --yes is what is missing."""
    words = [command, "-m", str(gemma_path), "--functions", FUNCTIONS] + (["-p", "Hi."] if command == "run" else [])
    r = cli_in_process(*words, input="Hi.\n")
    assert (r.returncode, r.stdout, r.stderr.count("\n")) == (2, "", 1), r.stderr
    assert r.stderr.startswith(f"localgen: error: {gemma_path.name} has no chat template (it may be a base model), "
                               "which tools need"), r.stderr
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    r = cli_in_process(*words, "--chat-template-file", str(template), input="Hi.\n")
    assert r.returncode == 2 and "add --yes to let the calls run" in r.stderr, r.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_grammar_flags_one_at_a_time(cli_in_process: InProcessCLI, tmp_path: Path, command: str) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}')
    for pair in ((["--grammar", 'root ::= "a"'], ["--json-schema", "{}"]),
                 (["--json-schema", "{}"], ["--json-schema-file", str(schema)]),
                 (["--grammar", 'root ::= "a"'], ["--json-schema-file", str(schema)])):
        err = _refused(cli_in_process, tmp_path, command, *pair[0], *pair[1])
        assert "--grammar, --json-schema and --json-schema-file cannot be combined" in err, err


@pytest.mark.parametrize("command", COMMANDS)
def test_flags_a_remote_endpoint_cannot_honour(cli_in_process: InProcessCLI, tmp_path: Path, command: str) -> None:
    for args, flag in ((["--offline"], "--offline"), (["--verbose"], "--verbose"), (["--threads", "2"], "--threads"),
                       (["--grammar", 'root ::= "a"'], "--grammar (GBNF; --json-schema works)"),
                       (["--prompt-cache"], "--prompt-cache")):
        err = _refused(cli_in_process, tmp_path, command, "--endpoint", ENDPOINT, *args)
        assert f"{flag} cannot be used with a remote endpoint" in err, (args, err)


@pytest.mark.parametrize("command", COMMANDS)
def test_the_system_prompt_must_be_text(cli_in_process: InProcessCLI, tmp_path: Path, command: str) -> None:
    err = _refused(cli_in_process, tmp_path, command, "--system", "bad \udcff byte")
    assert "--system is not valid UTF-8 text: byte 0xff at character 5 is not UTF-8" in err, err


@pytest.mark.parametrize("command", COMMANDS)
def test_load_settings_are_checked_before_the_model(cli_in_process: InProcessCLI, tmp_path: Path,
                                                    command: str) -> None:
    err = _refused(cli_in_process, tmp_path, command, "--flash-attn=sometimes")
    assert "--flash-attn takes on, off or auto, not 'sometimes'" in err, err
    err = _refused(cli_in_process, tmp_path, command, "--lora", str(tmp_path / "nothing.gguf"))
    assert f"--lora {tmp_path / 'nothing.gguf'}: no such file" in err, err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_schema_that_makes_no_grammar(cli_in_process: InProcessCLI, tmp_path: Path, command: str) -> None:
    err = _refused(cli_in_process, tmp_path, command, "--json-schema", "{not json")
    assert "the JSON schema is not valid JSON" in err, err


# the whole option set stays at the entry -------------------------------------------------------------------------

CLI = ROOT / "localgen" / "cli"
# where run's and chat's options become their plans: the only modules whose functions take the whole set
ENTRY = {"run/command.py", "chat/command.py", "run/plan.py", "chat/plan.py", "options/plan.py"}
WHOLE = {"RunArgs", "ChatArgs", "ModelArgs"}
ON_THE_WAY = ("run/execute.py", "run/prompt.py", "run/many.py", "run/tools.py", "options/tools.py",
              "options/preset.py", "options/files.py", "log/conversation.py", "chat/loop.py", "chat/message.py",
              "chat/view.py", "chat/turn.py", "chat/slash.py", "chat/repl.py", "chat/render.py", "output.py")


def _names(node: ast.AST | None) -> set[str]:
    """The names and attribute names in an expression."""
    if node is None:
        return set()
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))}


def test_no_function_past_the_entry_takes_the_whole_option_set() -> None:
    """A function after the plan is made takes typed pieces of it (LoadPlan, SendPlan, an option group),
    never RunArgs or ChatArgs: its parameters say what it uses."""
    takers = []
    for path in sorted(CLI.rglob("*.py")):
        if str(path.relative_to(CLI)) in ENTRY:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                if any(_names(a.annotation) & WHOLE for a in args):
                    takers.append(f"{path.relative_to(CLI)}:{node.name}")
    assert takers == []


def lookups(folder: Path) -> list[str]:
    """given("...") and knobs.get("...") calls in the modules on run's and chat's way."""
    found = []
    for name in ON_THE_WAY:
        for node in ast.walk(ast.parse((folder / name).read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                    and isinstance(node.args[0], ast.Constant)):
                continue
            if node.func.attr == "given" or (node.func.attr == "get" and _names(node.func.value) & {"knobs", "k"}):
                found.append(f"{name}:{node.lineno}")
    return found


def test_no_setting_is_looked_up_by_name_on_the_way() -> None:
    """run's and chat's flows read the plan's typed fields: no given("...") or knobs.get("...") there."""
    assert lookups(CLI) == []
