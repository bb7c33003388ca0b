"""Every number that reaches llama.cpp as a C int stops at 2,147,483,647, wherever it is given (a flag, an environment
variable, a Modelfile's PARAMETER line), in one line that says so as bench's sizes say it; and fit's rounding of a
context up to llama.cpp's multiple of 256 stops at the largest such multiple a C int holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localgen.errors import UsageError
from localgen.types import LoadParams
from tests.conftest import InProcessCLI

C_INT = "must be at most 2,147,483,647 (llama.cpp takes it as a C int), not "


def one_line(r: object, start: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr that begins `localgen: error: ` + `start`."""
    assert (r.returncode, r.stdout) == (2, ""), r  # type: ignore[attr-defined]
    lines = r.stderr.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("localgen: error: " + start), r.stderr  # type: ignore[attr-defined]


def test_fit_caps_a_context_rounded_up_at_the_largest_multiple_of_256_a_c_int_holds(
        cli_in_process: InProcessCLI) -> None:
    """docs/fit.md: --ctx 2147483647, rounded up, was 2,147,483,648 tokens (one past llama.cpp's C int) in the plan
    and in --json; the plan now stops at 2,147,483,392 and says it rounded down, and its flags say what it planned."""
    args = ("fit", "-m", "smollm2:135m", "--ctx", "2147483647", "--rope-scaling", "yarn", "--ram", "1P")
    r = cli_in_process(*args)
    assert r.returncode == 0, r.stderr
    assert ("context 2,147,483,392 tokens (2,147,483,647 asked, rounded down to a multiple of 256, the largest a C "
            "int holds)") in r.stdout, r.stdout
    assert "flags     --ctx 2147483392 --rope-scaling yarn\n" in r.stdout, r.stdout
    doc = json.loads(cli_in_process(*args, "--json").stdout)
    assert (doc["ctx"], doc["asked"], doc["flags"]) == (2147483392, 2147483647, "--ctx 2147483392 --rope-scaling yarn")
    r = cli_in_process("fit", "-m", "smollm2:135m", "--ctx", "2147483300", "--rope-scaling", "yarn", "--ram", "1P")
    assert "context 2,147,483,392 tokens (2,147,483,300 asked, rounded up to a multiple of 256)" in r.stdout, r.stdout


@pytest.mark.parametrize("flag", ["-b", "-ub", "-ngl", "--n-cpu-moe"])
@pytest.mark.parametrize("command", [["run", "-m", "smollm2:135m", "-n", "1", "-p", "hi"],
                                     ["serve", "-m", "smollm2:135m", "--log-format", "x"],
                                     ["fit", "-m", "smollm2:135m"]])
def test_a_load_size_past_a_c_int_is_refused(cli_in_process: InProcessCLI, command: list[str], flag: str) -> None:
    """-b, -ub, -ngl and --n-cpu-moe had no top: 2147483648 (and 99999999999999999999) were taken, run and chat went
    on to load and generate, and fit said them back as flags, as if llama.cpp could take them. (serve's bad
    --log-format, found after the flags, keeps a regression from starting a server.)"""
    for value in ("2147483648", "99999999999999999999"):
        one_line(cli_in_process(*command, flag, value), f"{flag} {C_INT}{value}")
    if command[0] != "serve":  # the top itself is a C int
        r = cli_in_process(*command, flag, "2147483647")
        assert C_INT not in r.stderr, r.stderr


def test_an_environment_variable_past_a_c_int_is_named(cli_in_process: InProcessCLI) -> None:
    """LLAMA_ARG_N_CPU_MOE, a C int in llama.cpp, is held to the flag's top and named as the value's source (bench
    named --n-cpu-moe, a flag not typed)."""
    env = InProcessCLI({**cli_in_process.env, "LLAMA_ARG_N_CPU_MOE": "4294967296"})
    for args in (("fit", "-m", "smollm2:135m"), ("bench", "-m", "smollm2:135m", "-p", "8", "-n", "0", "-r", "1")):
        one_line(env(*args), f"LLAMA_ARG_N_CPU_MOE {C_INT}4294967296")


@pytest.mark.parametrize(("setting", "knob"), [("num_batch", "batch_size"), ("num_gpu", "gpu_layers")])
def test_a_modelfile_load_setting_past_a_c_int_is_refused(cli_in_process: InProcessCLI, tmp_path: Path,
                                                          setting: str, knob: str) -> None:
    """A Modelfile's PARAMETER num_batch 4294967296 made a preset whose loads took it (num_ctx was already held to
    2147483647): the table's top is every path's."""
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f"FROM smollm2:135m\nPARAMETER {setting} 4294967296\n")
    r = cli_in_process("create", "big", "-f", str(modelfile))
    assert (r.returncode, r.stdout) == (2, ""), r
    assert r.stderr == (f"localgen: error: {modelfile} line 2: PARAMETER {setting}: {knob} {C_INT}4294967296\n"), r


@pytest.mark.parametrize(("field", "flag"), [("n_ctx", "--ctx"), ("n_batch", "--batch-size"),
                                             ("n_ubatch", "--ubatch-size"), ("n_gpu_layers", "--gpu-layers"),
                                             ("n_cpu_moe", "--n-cpu-moe")])
def test_load_params_refuse_a_c_int_past_its_top(field: str, flag: str) -> None:
    """LoadParams, which every load goes through (a preset's, a request's, a command's own options), holds the C
    ints to their top whatever path built it; 2**31 - 1 itself is taken."""
    with pytest.raises(UsageError) as e:
        LoadParams(**{field: 2**31})  # type: ignore[arg-type]
    assert e.value.message == f"{flag} {C_INT}2147483648"
    assert getattr(LoadParams(**{field: 2**31 - 1}), field) == 2**31 - 1  # type: ignore[arg-type]


@pytest.mark.parametrize("args", [["perplexity", "-m", "smollm2:135m", "--chunks", "1", "-b"],
                                  ["perplexity", "-m", "smollm2:135m", "--chunks", "1", "-ub"],
                                  ["perplexity", "-m", "smollm2:135m", "--chunks", "1", "-ngl"],
                                  ["launch", "claude", "-ngl"],
                                  ["bench", "-m", "smollm2:135m", "--quality", "default", "--reference",
                                   "smollm2:135m", "-c"]])
def test_the_commands_own_sizes_stop_at_a_c_int(cli_in_process: InProcessCLI, args: list[str]) -> None:
    """perplexity's -b 2147483648 was llama.cpp's error (`n_seq_max must be <= 256`, exit 1) and -ub's ran;
    launch's -ngl went on to start a server with it; bench --quality -c was measured against the text's length."""
    one_line(cli_in_process(*args, "2147483648"), f"{args[-1]} {C_INT}2147483648")


def test_a_load_pads_a_context_to_the_same_cells_fit_plans(smollm2_path: Path) -> None:
    """run padded --ctx 2147483647 to 2**31 cells, one past llama.cpp's C int, where fit plans 2,147,483,392."""
    from localgen.engine import defaults
    from localgen.models.resolve import resolve

    loaded, _ = defaults.resolve(resolve(str(smollm2_path)), LoadParams(n_ctx=2**31 - 1, rope_scaling="yarn"),
                                 cpu_only=True, use_records=False)
    assert loaded.n_ctx == 2147483392
