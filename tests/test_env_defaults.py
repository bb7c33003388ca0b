"""docs/configuration.md's variables that set a flag's default: each command the page names reads its
variable (a table: the variable changes what the command does), and the page names exactly the commands
whose flag reads it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, ROOT, InProcessCLI

PAGE = ROOT / "docs" / "configuration.md"
VARS = ("LOCALGEN_MODEL", "LOCALGEN_CTX", "LLAMA_ARG_RPC", "LLAMA_ARG_N_CPU_MOE", "LLAMA_ARG_CPU_MOE",
        "LLAMA_ARG_OVERRIDE_TENSOR", "LLAMA_ARG_KV_UNIFIED", "LOCALGEN_HOST", "LOCALGEN_PORT")
FLAG = {"LOCALGEN_MODEL": "--model", "LOCALGEN_CTX": "--ctx", "LLAMA_ARG_RPC": "--rpc",
        "LOCALGEN_HOST": "--host", "LOCALGEN_PORT": "--port",
        "LLAMA_ARG_N_CPU_MOE": "--n-cpu-moe", "LLAMA_ARG_CPU_MOE": "--cpu-moe",
        "LLAMA_ARG_OVERRIDE_TENSOR": "--override-tensor", "LLAMA_ARG_KV_UNIFIED": "--kv-unified"}
# bench reads these in its body, not through Click (its -m and -ncmoe/-ot are sweeps): the table below shows it
READ_IN_BODY = {("bench", "LOCALGEN_MODEL"), ("bench", "LLAMA_ARG_N_CPU_MOE"), ("bench", "LLAMA_ARG_OVERRIDE_TENSOR")}


def _options() -> dict[tuple[str, str], str | None]:
    """(command, flag) → the environment variable Click reads for it, for every command and subcommand."""
    import typer

    from localgen.cli import app

    out: dict[tuple[str, str], str | None] = {}

    def walk(c: Any, path: list[str]) -> None:
        for name, sub in getattr(c, "commands", {}).items():
            walk(sub, [*path, name])
        for p in c.params:
            for flag in p.opts:
                out[(" ".join(path), flag.split("/")[0])] = p.envvar
    walk(typer.main.get_command(app.build()), [])
    return out


def _page_commands(var: str) -> tuple[set[str], set[str]]:
    """The commands the page's row says read `var`, and those it says do not (after '; not')."""
    row = next(line for line in PAGE.read_text(encoding="utf-8").splitlines()
               if line.startswith("| `") and f"`{var}`" in line.split("|")[1])
    said = row.split("|")[2]
    reads, _, not_ = said.partition("; not")
    from localgen.cli.app import COMMANDS

    names = re.compile(r"`([a-z-]+)(?: -[-a-z]+)?`")
    return ({n for n in names.findall(reads) if n in COMMANDS},
            {n for n in names.findall(not_) if n in COMMANDS})


@pytest.mark.parametrize("var", VARS)
def test_the_page_names_exactly_the_commands_whose_flag_reads_the_variable(var: str) -> None:
    options = _options()
    has_flag = {cmd for (cmd, flag) in options if flag == FLAG[var] and cmd}
    reading = {cmd for (cmd, flag), env in options.items() if flag == FLAG[var] and env == var}
    reading |= {cmd for cmd, v in READ_IN_BODY if v == var}
    reads, not_ = _page_commands(var)
    assert reads == reading, (var, reads ^ reading)
    # every other command with that flag is named as not reading it (bench's --ctx is bench --quality's)
    assert has_flag - reading == not_, var


def _env(cli: CLI, **extra: str) -> dict[str, str]:
    return {**{k: v for k, v in cli.env.items() if not k.startswith("LLAMA_ARG_")}, **extra}


def _json(cli: CLI, args: list[str], env: dict[str, str]) -> Any:
    r = subprocess.run(cli.argv(*args), capture_output=True, text=True, env=env, timeout=600, check=False)
    assert r.returncode == 0, (args, r.stderr[-2000:])
    return json.loads(r.stdout) if args[0] != "bench" else [json.loads(x) for x in r.stdout.splitlines()]


BENCH = ["bench", "-p", "8", "-n", "0", "-r", "1", "--no-e2e", "-o", "jsonl"]
RUN = ["run", "--raw", "-p", "hi", "-n", "1", "--json"]
OT = r"blk\.0\.ffn_up_exps=CPU,blk\.1\.ffn_up_exps=CPU"
Probe = Callable[[Any], Any]

# (command line, -m the MoE model?, variable, value, what the output shows of it)
TABLE: list[tuple[list[str], bool, str, str, Probe]] = [
    (BENCH, False, "LOCALGEN_MODEL", "gemma3:270m", lambda rows: rows[0]["model_name"]),
    (BENCH, True, "LLAMA_ARG_N_CPU_MOE", "1", lambda rows: (rows[0]["n_cpu_moe"], rows[0]["moved"])),
    (BENCH, True, "LLAMA_ARG_OVERRIDE_TENSOR", OT, lambda rows: (rows[0]["tensor_buft_overrides"], rows[0]["moved"])),
    (BENCH, True, "LLAMA_ARG_CPU_MOE", "1", lambda rows: rows[0]["moved"]),
    (["fit", "--json"], False, "LOCALGEN_MODEL", "gemma3:270m", lambda d: d["model"]["name"]),
    (["fit", "--json"], False, "LOCALGEN_CTX", "2048", lambda d: (d["ctx"], d["asked_by"])),
    (["fit", "--json", "--gpu-memory", "24G"], True, "LLAMA_ARG_N_CPU_MOE", "1", lambda d: d["experts_in_ram"]),
    (["fit", "--json", "--gpu-memory", "24G"], True, "LLAMA_ARG_OVERRIDE_TENSOR", OT, lambda d: d["experts_in_ram"]),
    (["fit", "--json", "--gpu-memory", "24G"], True, "LLAMA_ARG_CPU_MOE", "1", lambda d: d["experts_in_ram"]),
    (RUN, False, "LOCALGEN_MODEL", "gemma3:270m", lambda d: d["model"]["name"]),
    (RUN, False, "LOCALGEN_CTX", "2048", lambda d: d["load"]["n_ctx"]),
    (RUN, True, "LLAMA_ARG_N_CPU_MOE", "1", lambda d: d["load"]["moved"]),
    (RUN, True, "LLAMA_ARG_OVERRIDE_TENSOR", OT, lambda d: d["load"]["moved"]),
    (RUN, True, "LLAMA_ARG_CPU_MOE", "1", lambda d: d["load"]["moved"]),
]


@pytest.mark.parametrize(("args", "moe", "var", "value", "probe"), TABLE,
                         ids=[f"{t[0][0]}-{t[2]}" for t in TABLE])
def test_the_variable_changes_what_the_command_does(cli: CLI, moe_path: Path, args: list[str], moe: bool, var: str,
                                                     value: str, probe: Probe) -> None:
    argv = [*args, *(["-m", str(moe_path)] if moe else [])]
    without = probe(_json(cli, argv, _env(cli)))
    with_ = probe(_json(cli, argv, _env(cli, **{var: value})))
    assert with_ != without, (argv, var, with_)
    if var == "LOCALGEN_MODEL":
        assert with_ == "gemma3:270m"


def test_bench_takes_the_variables_as_one_value_each(cli: CLI, moe_path: Path, tmp_path: Path) -> None:
    """LOCALGEN_MODEL is one model (no comma list), LLAMA_ARG_OVERRIDE_TENSOR one placement of comma-separated
    pairs (as run reads it), LLAMA_ARG_N_CPU_MOE one number; a typed flag wins; a bad number is a usage error."""
    rows = _json(cli, [*BENCH, "-m", str(moe_path)], _env(cli, LLAMA_ARG_OVERRIDE_TENSOR=OT, LLAMA_ARG_N_CPU_MOE="2"))
    assert [(r["n_cpu_moe"], r["tensor_buft_overrides"]) for r in rows] == [(2, OT.replace(",", ";"))]
    rows = _json(cli, [*BENCH, "-m", str(moe_path), "-ncmoe", "0", "-ot", ""],
                 _env(cli, LLAMA_ARG_OVERRIDE_TENSOR=OT, LLAMA_ARG_N_CPU_MOE="2"))
    assert [(r["n_cpu_moe"], r["tensor_buft_overrides"]) for r in rows] == [(0, "none")]
    odd = tmp_path / "a,b.gguf"
    os.link(moe_path, odd)
    rows = _json(cli, BENCH, _env(cli, LOCALGEN_MODEL=str(odd)))
    assert [r["model_filename"] for r in rows] == [str(odd)]
    # a list there is said as such (it was "unknown model 'smollm2:135m,gemma3:270m' (did you mean ...)")
    r = subprocess.run(cli.argv(*BENCH), capture_output=True, text=True, timeout=120, check=False,
                       env=_env(cli, LOCALGEN_MODEL="smollm2:135m,gemma3:270m"))
    assert (r.returncode, r.stderr) == (2, "localgen: error: LOCALGEN_MODEL names one model, not a list "
                                           "('smollm2:135m,gemma3:270m') (give bench several with -m: -m "
                                           "smollm2:135m,gemma3:270m)\n"), r.stderr
    r = subprocess.run(cli.argv(*BENCH), capture_output=True, text=True, env=_env(cli, LLAMA_ARG_N_CPU_MOE="x"),
                       timeout=120, check=False)
    assert r.returncode == 2 and "LLAMA_ARG_N_CPU_MOE takes a number of layers" in r.stderr, r.stderr


def test_models_page_names_every_command_with_offline() -> None:
    """docs/models.md's `--offline` sentence lists exactly the commands that take the flag, and each reads
    LOCALGEN_OFFLINE, as configuration.md's row says."""
    options = _options()
    having = {cmd for (cmd, flag) in options if flag == "--offline" and cmd}
    assert {options[(cmd, "--offline")] for cmd in having} == {"LOCALGEN_OFFLINE"}
    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    start = page.index("- `--offline` (on ")
    said = page[start:page.index(")", start)]
    from localgen.cli.app import COMMANDS

    assert {n for n in re.findall(r"`([a-z-]+)`", said) if n in COMMANDS} == having


@pytest.mark.parametrize(("var", "value", "flag"), [
    ("LLAMA_ARG_N_CPU_MOE", "2", ["--n-cpu-moe", "2"]), ("LLAMA_ARG_CPU_MOE", "on", ["--cpu-moe"]),
    ("LLAMA_ARG_OVERRIDE_TENSOR", "exps=CPU", ["-ot", "exps=CPU"]), ("LLAMA_ARG_RPC", "127.0.0.1:50052",
                                                                     ["--rpc", "127.0.0.1:50052"]),
])
def test_a_llama_arg_variable_is_no_error_with_an_endpoint(cli_in_process: InProcessCLI, var: str, value: str,
                                                           flag: list[str]) -> None:
    """docs/configuration.md: a value from an LLAMA_ARG_* variable is a default for loads here: "unlike the flag
    typed, it is no error with `--endpoint` (the server loads the model)" (LLAMA_ARG_KV_UNIFIED:
    tests/test_kv_layout.py). Nothing listens on port 9: the run gets as far as asking it."""
    remote = ["run", "--endpoint", "http://127.0.0.1:9", "-p", "hi"]
    r = InProcessCLI({**cli_in_process.env, var: value})(*remote)
    assert r.returncode == 1 and r.stderr.startswith("localgen: error: cannot reach 127.0.0.1:9"), r.stderr
    r = cli_in_process(*remote, *flag)
    assert r.returncode == 2 and "cannot be used with a remote endpoint" in r.stderr, r.stderr


def test_a_flag_wins_over_its_variable(cli_in_process: InProcessCLI) -> None:
    """docs/configuration.md: "Where a flag and its variable are both given, the flag wins" (`fit`, which loads
    nothing, says where its window came from)."""
    env = InProcessCLI({**cli_in_process.env, "LOCALGEN_MODEL": "nope", "LOCALGEN_CTX": "2048"})
    r = env("fit", "--json", "-m", "smollm2:135m", "--ctx", "1024")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["model"]["name"], doc["ctx"], doc["asked_by"]) == ("smollm2:135m", 1024, "--ctx"), doc
    doc = json.loads(InProcessCLI({**cli_in_process.env, "LOCALGEN_CTX": "2048"})("fit", "--json").stdout)
    assert (doc["ctx"], doc["asked_by"]) == (2048, "LOCALGEN_CTX"), doc
