"""What a newcomer's trial of `fit` and the placement flags found said wrong: an empty -ot item taken silently;
a bad LLAMA_ARG_OVERRIDE_TENSOR (or LLAMA_ARG_RPC) blamed on a flag never typed; `--gpu-memory 1P` shown as
`1,048,576.0 GiB`; `-ngl 99` said back as `--gpu-layers -1`; doctor's settings line nesting parentheses."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import CLI, InProcessCLI


def _one_line_usage_error(r: object, *words: str) -> str:
    """Exit 2, nothing on stdout, one line on stderr holding each of `words`; the line."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)  # type: ignore[attr-defined]
    err: str = r.stderr  # type: ignore[attr-defined]
    assert r.stdout == "" and err.count("\n") == 1 and "Traceback" not in err, err  # type: ignore[attr-defined]
    for w in words:
        assert w in err, (w, err)
    return err


def _with_env(cli_in_process: InProcessCLI, **env: str) -> InProcessCLI:
    return InProcessCLI({**cli_in_process.env, **env})


@pytest.mark.parametrize("value", ["exps=CPU,,", ",", "exps=CPU,", ",exps=CPU", "exps=CPU,,attn=CPU", " "])
def test_an_empty_ot_item_is_refused_as_llama_cpp_refuses_it(cli_in_process: InProcessCLI, value: str) -> None:
    """llama.cpp splits -ot at each comma and refuses an item without `=`: `-ot 'exps=CPU,,'` was planned as
    `-ot exps=CPU`, exit 0. Now one line naming the flag and the value as typed, exit 2."""
    err = _one_line_usage_error(cli_in_process("fit", "-m", "smollm2:135m", "-ot", value),
                                f"--override-tensor has an empty item in {value!r}")
    assert err.startswith("localgen: error: "), err


def test_an_empty_ot_is_refused_by_run_and_fit(cli_in_process: InProcessCLI) -> None:
    _one_line_usage_error(cli_in_process("fit", "-m", "smollm2:135m", "-ot", ""), "--override-tensor is empty")
    _one_line_usage_error(cli_in_process("run", "-m", "smollm2:135m", "-ot", "exps=CPU,,attn=CPU", "-p", "hi"),
                          "--override-tensor has an empty item in 'exps=CPU,,attn=CPU'")


@pytest.mark.parametrize(("value", "says"), [
    ("garbage", "LLAMA_ARG_OVERRIDE_TENSOR takes PATTERN=BUFFER (e.g. 'exps=CPU'), not 'garbage'"),
    ("exps=CPU,", "LLAMA_ARG_OVERRIDE_TENSOR has an empty item in 'exps=CPU,'"),
    ("blk{=CPU", "LLAMA_ARG_OVERRIDE_TENSOR: 'blk{' is not a regular expression llama.cpp can compile"),
    ("exps=NOPE", "LLAMA_ARG_OVERRIDE_TENSOR: no buffer type 'NOPE' here"),
])
def test_bench_names_the_variable_a_bad_placement_came_from(cli_in_process: InProcessCLI, value: str,
                                                             says: str) -> None:
    """The error named `--override-tensor`, a flag the user never typed; LLAMA_ARG_N_CPU_MOE's named itself."""
    r = _with_env(cli_in_process, LLAMA_ARG_OVERRIDE_TENSOR=value)("bench", "-m", "smollm2:135m", "-p", "8", "-n", "1")
    assert "--override-tensor" not in _one_line_usage_error(r, says), r.stderr


def test_fit_names_the_variable_whose_buffer_the_plan_lacks(cli_in_process: InProcessCLI) -> None:
    env = _with_env(cli_in_process, LLAMA_ARG_OVERRIDE_TENSOR="exps=CUDA3")
    _one_line_usage_error(env("fit", "-m", "smollm2:135m", "--gpu-memory", "24G"),
                          "LLAMA_ARG_OVERRIDE_TENSOR: CUDA3 names GPU 3, and the plan has 1 GPU")
    # a typed -ot is the flag's, whatever the variable says
    _one_line_usage_error(env("fit", "-m", "smollm2:135m", "--gpu-memory", "24G", "-ot", "exps=CUDA2"),
                          "--override-tensor: CUDA2 names GPU 2")


@pytest.mark.parametrize("command", [["fit"], ["run", "-p", "hi"]])
def test_run_and_fit_name_the_variable_a_bad_placement_came_from(cli_in_process: InProcessCLI,
                                                                 command: list[str]) -> None:
    r = _with_env(cli_in_process, LLAMA_ARG_OVERRIDE_TENSOR="garbage")(*command, "-m", "smollm2:135m")
    _one_line_usage_error(r, "LLAMA_ARG_OVERRIDE_TENSOR takes PATTERN=BUFFER (e.g. 'exps=CPU'), not 'garbage'")
    if command[0] == "run":  # (fit has no --rpc: it plans for devices described, never for a remote one)
        r = _with_env(cli_in_process, LLAMA_ARG_RPC="x")(*command, "-m", "smollm2:135m")
        _one_line_usage_error(r, "LLAMA_ARG_RPC takes HOST:PORT")


@pytest.mark.parametrize("command", [["doctor", "--no-check"], ["bench", "-m", "smollm2:135m", "-p", "8", "-n", "1"]])
def test_a_bad_llama_arg_rpc_is_named_as_the_variable(cli_in_process: InProcessCLI, command: list[str]) -> None:
    r = _with_env(cli_in_process, LLAMA_ARG_RPC="x")(*command)
    assert "--rpc" not in _one_line_usage_error(r, "LLAMA_ARG_RPC takes HOST:PORT[,HOST:PORT...], not 'x'")


def test_sizes_of_a_tib_and_more_read_in_their_own_unit(cli_in_process: InProcessCLI) -> None:
    """`fit --gpu-memory 1P` said `GPU memory 1,048,576.0 GiB described`, its budget `1,048,574.4 GiB`."""
    r = cli_in_process("fit", "-m", "smollm2:135m", "--gpu-memory", "1P", "--ram", "2T")
    assert r.returncode == 0, r.stderr
    assert "machine   RAM 2.0 TiB described · GPU memory 1.0 PiB described\n" in r.stdout, r.stdout
    gpu = next(line for line in r.stdout.splitlines() if line.startswith("GPU "))
    assert gpu.endswith("  1.0 PiB"), gpu  # 1 PiB less the 1.6 GiB kept free: not "1,024.0 TiB"
    assert not re.search(r"\d,\d{3}\.\d", r.stdout), r.stdout
    from localgen.units import format_bytes

    assert [format_bytes(n) for n in (1536 << 30, (1 << 40) - 1, 141 << 30, 3 << 29)] == [
        "1.5 TiB", "1.0 TiB", "141.0 GiB", "1.5 GiB"]


@pytest.mark.parametrize(("given", "said"), [(["-ngl", "99"], "--gpu-layers 99"), (["-ngl", "-1"], "--gpu-layers -1"),
                                             (["--gpu-layers", "31"], "--gpu-layers 31"), ([], "--gpu-layers -1")])
def test_fit_says_gpu_layers_as_given(cli_in_process: InProcessCLI, given: list[str], said: str) -> None:
    """fit.md: a setting given is kept as given; `-ngl 99` was said back as `--gpu-layers -1`. Not given, the
    plan's count of every layer is -1, as run takes it."""
    args = ["fit", "-m", "smollm2:135m", "--gpu-memory", "4G", *given]
    r = cli_in_process(*args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"flags     --ctx 8192 {said}", r.stdout
    assert json.loads(cli_in_process(*args, "--json").stdout)["flags"] == f"--ctx 8192 {said}"


def test_fit_says_a_given_gpu_layers_on_a_machine_without_gpu(cli_in_process: InProcessCLI) -> None:
    """run loads with it there too (llama.cpp offloads nothing without a GPU): the flags are what run takes."""
    r = cli_in_process("fit", "-m", "smollm2:135m", "--gpu-memory", "0", "-ngl", "99")
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "flags     --ctx 8192 --gpu-layers 99", r.stdout


def test_doctors_settings_line_nests_no_parentheses(cli: CLI) -> None:
    """It said `repack off (rule: off (0% of the weights repackable here))`."""
    r = cli("doctor", "-m", "smollm2:135m")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("settings  "))
    depth = 0
    for c in line:
        depth += {"(": 1, ")": -1}.get(c, 0)
        assert depth <= 1, line
    assert re.search(r"repack (on|off) \((flag|tuned on [^()]*|rule: [^()]*)\)", line), line
