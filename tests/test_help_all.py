"""`run --help` fits a screen or two (#45 item 8): run, chat and serve list the options most uses need, and
`--help-all` lists every one; a hidden option is hidden from the help only, never from parsing. In process,
through the entry point a subprocess runs."""

from __future__ import annotations

import pytest

from localgen.cli.helpall import COMMON
from tests.conftest import InProcessCLI


def _help(cli: InProcessCLI, *args: str) -> str:
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize(("command", "common", "rare"), [
    ("run", ["--prompt", "--temperature", "--max-tokens", "--ctx", "--json", "--file"],
     ["--dry-multiplier", "--mirostat", "--lora", "--model-draft", "--cache-type-k", "--beams", "--functions"]),
    ("chat", ["--resume", "--temperature", "--system", "--endpoint"],
     ["--xtc-probability", "--numa", "--mirostat", "--tool-choice"]),
    ("serve", ["--port", "--parallel", "--api-key", "--max-memory", "--temperature"],
     ["--cache-ram", "--allow-image-urls", "--drain-timeout", "--rope-scaling"]),
])
def test_help_lists_the_common_options_and_help_all_every_one(cli_in_process: InProcessCLI, command: str,
                                                              common: list[str], rare: list[str]) -> None:
    cli_in_process.env["COLUMNS"] = "120"
    short = _help(cli_in_process, command, "--help")
    full = _help(cli_in_process, command, "--help-all")
    for flag in common:
        assert flag in short and flag in full, flag
    for flag in rare:
        assert flag not in short and flag in full, flag
    assert f"more options (sampling, loading and GPU, and the rest): localgen {command} --help-all" in short
    assert "--help-all" not in full
    assert len(short.splitlines()) <= 110 < len(full.splitlines())  # two screens, from over three


def test_a_hidden_option_still_parses(cli_in_process: InProcessCLI) -> None:
    r = cli_in_process("run", "-p", "hi", "--dry-multiplier", "lots")
    assert r.returncode == 2 and "--dry-multiplier" in r.stderr and "No such option" not in r.stderr


def test_the_common_sets_name_real_options() -> None:
    import typer

    from localgen.cli import app

    for command, names in COMMON.items():
        params = {p.name for p in typer.main.get_command(app.build(command)).commands[command].params}  # type: ignore[attr-defined]
        assert names <= params, names - params
