"""docs/tools.md's bounds: --tool-timeout is 0.1 to 86400 s (a day) in run, chat and serve, another value a usage
error (1e300 once reached the MCP client and failed a working call with an OverflowError); a --functions file
runs inside localgen's process, so its os._exit ends localgen with its status and no line, as the page says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import CLI, InProcessCLI

TOOL = 'def echo(text: str) -> str:\n    """Say it back."""\n    return text\n'


@pytest.mark.parametrize("value", ["1e300", "86401"])
@pytest.mark.parametrize("command", ["run", "chat", "serve"])
def test_a_tool_timeout_past_a_day_is_a_usage_error(cli_in_process: InProcessCLI, tmp_path: Path, command: str,
                                                   value: str) -> None:
    functions = tmp_path / "tools.py"
    functions.write_text(TOOL)
    r = cli_in_process(command, "--functions", str(functions), "--tool-timeout", value,
                       *(["--yes", "-p", "hi"] if command == "run" else []))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("localgen: error: --tool-timeout must be within 0.1 to 86400, not "), r.stderr


def test_os_exit_in_a_functions_file_ends_localgen_with_its_status(cli: CLI, tmp_path: Path) -> None:
    """Documented, not caught: Python cannot catch os._exit (sys.exit is one error line: tests/test_tools*)."""
    functions = tmp_path / "exits.py"
    functions.write_text("import os\nos._exit(3)\n")
    r = cli("run", "--functions", str(functions), "--yes", "-p", "hi", timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (3, "", "")
