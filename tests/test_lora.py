"""LoRA adapters (#43 item 5's ADAPTER, and --lora / --lora-scaled as llama.cpp spells them): the adapter is
tests/tiny_lora.py's seeded random one for SmolLM2, and what it makes SmolLM2 say greedily is held to what
llama.cpp's own llama-server says with it (tests/data/llama_server_lora.json, scripts/lora_reference.py), at
scales 1, 0.5 and 0 (the base), in `run`, in a preset, and in serve's scheduler (another context than run's)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from localgen.errors import ModelLoadError, UsageError
from localgen.models import lora, modelfile
from tests import tiny_lora
from tests.conftest import CLI, HF_PRIVATE, InProcessCLI, same_text_as_reference
from tests.test_presets import one_error
from tests.test_serve import Server

REFERENCE = json.loads((Path(__file__).parent / "data" / "llama_server_lora.json").read_text())
ANSWERS: dict[str, dict[str, str]] = REFERENCE["answers"]
FRANCE, ONCE = "The capital of France is", "Once upon a time"
N = str(REFERENCE["n_predict"])


@pytest.fixture(scope="session")
def adapter(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_lora.build(smollm2_path, tmp_path_factory.mktemp("lora") / "tiny-lora.gguf")


@pytest.fixture(scope="session")
def foreign(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same adapter, labelled for another architecture: llama.cpp refuses it for SmolLM2."""
    return tiny_lora.build(smollm2_path, tmp_path_factory.mktemp("lora") / "gemma-lora.gguf", arch="gemma3")


@pytest.fixture
def pcli(tmp_path: Path) -> InProcessCLI:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("LOCALGEN_") or k in HF_PRIVATE}
    env.update(LOCALGEN_HOME=str(tmp_path / "home"), NO_COLOR="1", HF_HUB_OFFLINE="1")
    return InProcessCLI(env)


def test_the_adapter_is_the_one_llama_server_answered_with(adapter: Path) -> None:
    assert hashlib.sha256(adapter.read_bytes()).hexdigest() == REFERENCE["adapter_sha256"]
    # the adapter changes what the model says, and half of it changes less: the comparisons below mean something
    assert ANSWERS["1.0"][FRANCE] != ANSWERS["0.0"][FRANCE] != ANSWERS["0.5"][FRANCE] != ANSWERS["1.0"][FRANCE]


# ---- in process: the Modelfile, the header check, the flags ---------------------------------------------------


def test_adapter_lines_parse_relative_to_the_modelfile_and_write_back(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    m = modelfile.parse("FROM smollm2:135m\nADAPTER sub/a.gguf\nADAPTER /abs/b.gguf\n", folder=tmp_path)
    assert m.adapters == (str(tmp_path / "sub" / "a.gguf"), "/abs/b.gguf")
    assert modelfile.write(m).splitlines()[1:3] == [f"ADAPTER {tmp_path / 'sub' / 'a.gguf'}", "ADAPTER /abs/b.gguf"]
    assert modelfile.parse(modelfile.write(m)) == m
    with pytest.raises(UsageError, match="line 2: ADAPTER takes an absolute path here"):
        modelfile.parse("FROM smollm2:135m\nADAPTER a.gguf\n")  # over HTTP or stdin: no folder
    with pytest.raises(UsageError, match=r"line 2: ADAPTER .*adapter is not a \.gguf file"):
        modelfile.parse("FROM smollm2:135m\nADAPTER ./adapter\n", folder=tmp_path)  # a PEFT folder


def test_the_header_says_whether_an_adapter_fits_the_base(adapter: Path, foreign: Path, smollm2_path: Path,
                                                          tmp_path: Path) -> None:
    lora.check(str(adapter), "llama", "smollm2:135m")
    with pytest.raises(UsageError, match="is for the 'gemma3' architecture, and smollm2:135m is 'llama'"):
        lora.check(str(foreign), "llama", "smollm2:135m")
    with pytest.raises(UsageError, match=r"is not a LoRA adapter GGUF \(general.type is 'model'\)"):
        lora.check(str(smollm2_path), "llama", "smollm2:135m")
    (tmp_path / "text.gguf").write_text("not a gguf")
    with pytest.raises(UsageError, match=r"the LoRA adapter .* is not a GGUF file"):
        lora.check(str(tmp_path / "text.gguf"), "llama", "smollm2:135m")


def test_lora_flags_are_llama_cpps_spellings(adapter: Path, tmp_path: Path) -> None:
    from localgen.cli.options.knobs import lora_adapters

    a = str(adapter)
    assert lora_adapters(f"{a},{a}", f"{a}:0.5") == ((a, 1.0), (a, 1.0), (a, 0.5))
    assert lora_adapters(None, None) == ()
    for bad in (f"{a}:half", f"{a}", ":0.5", f"{a}:nan"):
        with pytest.raises(UsageError, match="--lora-scaled takes FILE:SCALE"):
            lora_adapters(None, bad)
    with pytest.raises(UsageError, match=r"^--lora .*missing\.gguf: no such file$"):
        lora_adapters(str(tmp_path / "missing.gguf"), None)


def test_a_preset_with_an_adapter_is_created_shown_and_removed(pcli: InProcessCLI, adapter: Path, foreign: Path,
                                                                tmp_path: Path) -> None:
    folder = tmp_path / "mf"
    folder.mkdir()
    (folder / "style.gguf").write_bytes(adapter.read_bytes())
    (folder / "Modelfile").write_text("FROM smollm2:135m\nADAPTER ./style.gguf\n")
    r = pcli("create", "styled", "-f", str(folder / "Modelfile"))
    assert r.returncode == 0, r.stderr
    assert pcli("show", "styled", "--modelfile").stdout.splitlines()[1] == f"ADAPTER {folder / 'style.gguf'}"
    assert json.loads(pcli("show", "styled", "--json").stdout)["adapters"] == [str(folder / "style.gguf")]
    assert f"LoRA adapters   {folder / 'style.gguf'}" in pcli("show", "styled").stdout
    one_error(pcli("create", "other", "-f", "-", input=f"FROM smollm2:135m\nADAPTER {foreign}\n"),
              "stdin: ADAPTER: the LoRA adapter", "'gemma3' architecture")
    one_error(pcli("create", "other", "-f", "-", input="FROM styled\nADAPTER /nowhere/x.gguf\n"), "cannot read")
    # FROM a preset keeps its adapters; removing presets never removes an adapter file
    assert pcli("create", "layered", "-f", "-", input="FROM styled\nPARAMETER top_k 5\n").returncode == 0
    assert f"ADAPTER {folder / 'style.gguf'}" in pcli("show", "layered", "--modelfile").stdout
    assert pcli("rm", "layered", "--yes").returncode == 0 and pcli("rm", "styled", "--yes").returncode == 0
    assert (folder / "style.gguf").read_bytes() == adapter.read_bytes()


def test_serves_footprint_counts_the_adapters_weights(adapter: Path) -> None:
    import dataclasses

    from localgen.models.resolve import resolve
    from localgen.serve.model import footprint
    from localgen.types import LoadParams

    ref = resolve("smollm2:135m", offline=True)
    plain = footprint(ref, LoadParams(n_ctx=512), 1)
    assert footprint(ref, LoadParams(n_ctx=512, lora=((str(adapter), 1.0),)), 1) == plain + adapter.stat().st_size
    styled = dataclasses.replace(ref, adapters=((str(adapter), 1.0),))
    assert footprint(styled, LoadParams(n_ctx=512), 1) == plain + adapter.stat().st_size


# ---- a real model ---------------------------------------------------------------------------------------------


def _run(cli: CLI, prompt: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("run", "--raw", "-p", prompt, "-n", N, "--temp", "0", "--no-log", *args)


@pytest.mark.parametrize("scale", ["1.0", "0.5", "0.0"])
def test_run_with_an_adapter_says_what_llama_server_says(cli: CLI, adapter: Path, scale: str) -> None:
    flags = ["--lora", str(adapter)] if scale == "1.0" else ["--lora-scaled", f"{adapter}:{scale}"]
    r = _run(cli, FRANCE, *flags)
    assert r.returncode == 0, r.stderr
    same_text_as_reference(r.stdout.removesuffix("\n"), ANSWERS[scale][FRANCE])


def test_a_wrong_adapter_is_one_error_before_the_model_loads(cli: CLI, foreign: Path, smollm2_path: Path) -> None:
    one_error(_run(cli, FRANCE, "--lora", str(foreign)), "'gemma3' architecture")
    one_error(_run(cli, FRANCE, "--lora", str(smollm2_path)), "is not a LoRA adapter GGUF")
    one_error(_run(cli, FRANCE, "--lora-scaled", "x.gguf"), "--lora-scaled takes FILE:SCALE")
    one_error(cli("run", "--endpoint", "http://127.0.0.1:9", "-p", "hi", "--lora", str(foreign)), "--lora")


def test_an_adapter_given_as_the_model_says_so(cli: CLI, adapter: Path) -> None:
    """An adapter as -m (run, fit): one usage error naming it an adapter and how to give it (a red team's: fit said
    its header had no llama.context_length, "corrupt, or made for another program", and run llama.cpp's words)."""
    for args in (["run", "-m", str(adapter), "-p", "hi", "-n", "1"], ["fit", "-m", str(adapter)]):
        r = cli(*args)
        assert (r.returncode, r.stdout) == (2, ""), (args, r.stderr)
        assert r.stderr == (f"localgen: error: tiny-lora.gguf is a LoRA adapter, not a model (give it with its base "
                            f"model: -m BASE --lora {adapter})\n"), r.stderr


def test_the_engine_refuses_what_llama_cpp_refuses_and_keys_saved_states_by_adapter(
        smollm2_engine: Any, adapter: Path, foreign: Path) -> None:
    import dataclasses

    from localgen.engine.llama import Engine
    from localgen.types import LoadParams

    ref = smollm2_engine.model
    with pytest.raises(ModelLoadError, match=r"could not apply the LoRA adapter .*arch mismatch"):
        Engine(dataclasses.replace(ref, adapters=((str(foreign), 1.0),)), LoadParams(n_ctx=256))
    half = Engine(ref, LoadParams(n_ctx=2048, lora=((str(adapter), 0.5),)))
    try:
        assert half.adapters == ((str(adapter), 0.5),)
        # nothing but the adapter differs (the model file's path, size, mtime and a sample of its bytes: a second
        # link another test gave it since the shared engine loaded is no change, localgen/fileid.py)
        plain = smollm2_engine.identity.split("|")
        mine = half.identity.split("|")
        assert mine[:4] == plain[:4], (mine, plain)
        assert mine[4:len(plain)] == plain[4:] and mine[len(plain):] and mine[len(plain)].startswith("lora:"), mine
    finally:
        half.close()


def test_a_preset_with_an_adapter_in_run_and_in_serve(cli_env: dict[str, str], adapter: Path,
                                                      tmp_path: Path, smollm2_path: Path) -> None:
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    (tmp_path / "Modelfile").write_text(f"FROM smollm2:135m\nADAPTER {adapter}\n")
    cli = CLI(env)
    assert cli("create", "styled", "-f", str(tmp_path / "Modelfile")).returncode == 0
    (tmp_path / "Modelfile").write_text(f"FROM {smollm2_path}\nADAPTER {adapter}\n")  # a preset of a file's path
    assert cli("create", "filestyled", "-f", str(tmp_path / "Modelfile")).returncode == 0
    r = _run(cli, ONCE, "-m", "styled")
    assert r.returncode == 0, r.stderr
    same_text_as_reference(r.stdout.removesuffix("\n"), ANSWERS["1.0"][ONCE])
    # serve: --lora-scaled on the model loaded at start; the preset loaded on demand with its ADAPTER; both
    # through the scheduler's own contexts (not run's)
    server = Server(env, "-np", "2", "--ctx", "512", "--lora-scaled", f"{adapter}:0.5")
    try:
        for model, prompt, scale in (("smollm2:135m", FRANCE, "0.5"), ("styled", ONCE, "1.0"),
                                     ("styled", FRANCE, "1.0")):
            body = {"model": model, "prompt": prompt, "max_tokens": int(N), "temperature": 0}
            got = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
            assert got.status_code == 200, got.text
            same_text_as_reference(got.json()["choices"][0]["text"], ANSWERS[scale][prompt], f"{model} {prompt}")
        shown = httpx.post(f"{server.url}/api/show", json={"model": "styled"}, timeout=60).json()
        assert f"ADAPTER {adapter}" in shown["modelfile"]
        made = httpx.post(f"{server.url}/api/create", timeout=60, json={
            "model": "x", "modelfile": f"FROM smollm2:135m\nADAPTER {adapter}\n"})  # a path on the server's machine
        assert made.status_code == 400 and "ADAPTER names a file on the server's machine" in made.json()["error"]
        # FROM a preset of a file with an ADAPTER: the preset is looked up, never its path (a 400 "not here")
        made = httpx.post(f"{server.url}/api/create", timeout=60, json={
            "model": "child", "from": "filestyled", "system": "Be brief.", "stream": False})
        assert made.status_code == 200, made.text
        shown = httpx.post(f"{server.url}/api/show", json={"model": "child"}, timeout=60).json()
        assert f"ADAPTER {adapter}" in shown["modelfile"] and "SYSTEM Be brief." in shown["modelfile"], shown
    finally:
        assert server.stop() == 0
    log = server.proc.stderr.read().decode() if server.proc.stderr else ""
    assert "Traceback" not in log, log

