"""A bad value an environment variable gave is named by that variable, not by a flag the user never typed:
LOCALGEN_CTX on fit, embed, rerank and launch (run, chat and serve: tests/test_run_words.py; LLAMA_ARG_*:
tests/test_placement_words.py)."""

from __future__ import annotations

import pytest

from tests.conftest import InProcessCLI

UNKNOWN_CTX = "takes 0 (the model's trained context) or 16 tokens or more, not 10"


@pytest.mark.parametrize("command", [["fit", "-m", "smollm2:135m"], ["embed", "-m", "smollm2:135m", "hi"],
                                     ["rerank", "-m", "smollm2:135m", "q", "d"], ["launch", "claude"]])
def test_localgen_ctx_is_named_by_fit_embed_rerank_and_launch(cli_in_process: InProcessCLI,
                                                              command: list[str]) -> None:
    """`LOCALGEN_CTX=10 localgen fit` (embed, rerank, launch: each has its own --ctx) said `--ctx takes ...`,
    as run no longer does. A --ctx typed over the variable is the flag's error."""
    env = InProcessCLI({**cli_in_process.env, "LOCALGEN_CTX": "10"})
    r = env(*command)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"localgen: error: LOCALGEN_CTX {UNKNOWN_CTX}\n"), r
    r = env(*command, "--ctx", "10")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"localgen: error: --ctx {UNKNOWN_CTX}\n"), r


@pytest.mark.parametrize("command", [["run", "-m", "smollm2:135m", "-p", "hi"], ["fit", "-m", "smollm2:135m"],
                                     ["embed", "-m", "smollm2:135m", "hi"], ["serve", "-m", "smollm2:135m"],
                                     ["launch", "claude"], ["perplexity", "-m", "smollm2:135m"]])
def test_a_context_past_a_c_int_is_refused_by_every_command(cli_in_process: InProcessCLI, command: list[str]) -> None:
    """llama.cpp takes --ctx as a C int: 2,147,483,648 was taken by run (which went on to load) and fit (whose plan
    then said it back as a flag), as no bound stopped it; each command's --ctx and LOCALGEN_CTX now stop at
    2,147,483,647, as bench's sizes do."""
    r = cli_in_process(*command, "--ctx", "2147483648")
    assert (r.returncode, r.stdout) == (2, ""), r
    assert r.stderr.startswith("localgen: error: --ctx must be at most 2,147,483,647 (llama.cpp takes it as a C int), "
                               "not 2147483648"), r
    if command[0] != "perplexity":  # (perplexity's --ctx is its window, no LOCALGEN_CTX)
        r = InProcessCLI({**cli_in_process.env, "LOCALGEN_CTX": "2147483648"})(*command)
        assert (r.returncode, r.stdout) == (2, ""), r
        assert r.stderr.startswith("localgen: error: LOCALGEN_CTX must be at most 2,147,483,647 (llama.cpp takes it "
                                   "as a C int), not 2147483648"), r


def test_configuration_md_quotes_the_error_each_variable_gives() -> None:
    """configuration.md's rows of LOCALGEN_CTX, LLAMA_ARG_RPC and LLAMA_ARG_OVERRIDE_TENSOR promise that a bad value
    is named by the variable; the errors they quote are the ones given (above, and tests/test_placement_words.py)."""
    from tests.conftest import ROOT

    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| `")}
    assert f"is named by it, not by `--ctx`: `LOCALGEN_CTX {UNKNOWN_CTX}` (exit 2)" in rows["`LOCALGEN_CTX`"]
    assert ("a bad value is named by it, not by `--rpc` (`LLAMA_ARG_RPC takes HOST:PORT[,HOST:PORT...], not 'x'`)"
            in rows["`LLAMA_ARG_RPC`"])
    placement = next(row for name, row in rows.items() if "`LLAMA_ARG_OVERRIDE_TENSOR`" in name)
    assert "named by its variable, not by the flag (`LLAMA_ARG_OVERRIDE_TENSOR: no buffer type 'NOPE' here" in placement
