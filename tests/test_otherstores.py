"""Models Ollama and LM Studio downloaded, used in place (models/ollamastore.py, models/lmstudio.py): stores laid
out as those tools write them, around the real SmolLM2 GGUF, driven through the real CLI and server."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import tiny_lora
from tests.conftest import CLI, NO_GPU, ROOT, InProcessCLI
from tests.gguf_edit import rewrite_strings
from tests.test_serve import Server

sys.path.insert(0, str(ROOT / "scripts"))
from make_mmproj import write_mmproj

PROMPT = "What is the capital of France?"
MEDIA = "application/vnd.ollama.image."
PARAMS = {"temperature": 0, "stop": ["Marseillaise"], "num_ctx": 1024, "top_k": 7, "penalize_newline": True,
          "top_p": 7}  # penalize_newline: no localgen setting; top_p 7: out of its range
SYSTEM = "You answer in one word."


def _place(src: Path, dest: Path) -> None:
    """The file at dest without a copy where the file system allows (the stores' own habit: a link)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


class OllamaStore:
    """An Ollama models folder: blobs/sha256-HEX named by their SHA-256, manifests/HOST/NAMESPACE/MODEL/TAG."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)

    def blob(self, media: str, data: bytes | Path) -> dict[str, Any]:
        h = hashlib.sha256()
        if isinstance(data, Path):
            with open(data, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        else:
            h.update(data)
        dest = self.root / "blobs" / f"sha256-{h.hexdigest()}"
        if not dest.exists():
            if isinstance(data, Path):
                _place(data, dest)
            else:
                dest.write_bytes(data)
        return {"mediaType": media, "digest": f"sha256:{h.hexdigest()}", "size": dest.stat().st_size}

    def manifest(self, name: str, layers: list[dict[str, Any]], host: str = "registry.ollama.ai",
                 namespace: str = "library") -> Path:
        model, _, tag = name.partition(":")
        doc = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
               "config": self.blob("application/vnd.docker.container.image.v1+json", b'{"model_format":"gguf"}'),
               "layers": layers}
        path = self.root / "manifests" / host / namespace / model / (tag or "latest")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
        return path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> OllamaStore:
    s = OllamaStore(tmp_path_factory.mktemp("ollama") / "models")
    model = s.blob(MEDIA + "model", smollm2_path)
    template = s.blob(MEDIA + "template", b"{{ .Prompt }}")  # a Go template: never used
    params = s.blob(MEDIA + "params", json.dumps(PARAMS).encode())
    s.manifest("smollm2:135m", [model, template, params])
    s.manifest("bare:v1", [model], namespace="someone")
    proj = write_mmproj(tmp_path_factory.mktemp("proj") / "mmproj.gguf")
    s.manifest("seer:latest", [model, s.blob(MEDIA + "projector", proj),
                               s.blob(MEDIA + "system", SYSTEM.encode())], host="hf.co", namespace="acme")
    lora = tiny_lora.build(smollm2_path, tmp_path_factory.mktemp("lora") / "tiny-lora.gguf")
    s.manifest("tuned:1", [model, s.blob(MEDIA + "adapter", lora)])
    foreign = tiny_lora.build(smollm2_path, tmp_path_factory.mktemp("lora") / "foreign.gguf", arch="gemma3")
    s.manifest("foreign:1", [model, s.blob(MEDIA + "adapter", foreign)])
    s.manifest("chatty:1", [model, s.blob(MEDIA + "messages", json.dumps(
        [{"role": "user", "content": "Hi there."}, {"role": "assistant", "content": "Hello! How can I help?"}]
    ).encode())])
    # damaged entries, each its own name
    s.manifest("short:1", [{**model, "size": model["size"] + 1}])
    s.manifest("gone:1", [{**model, "digest": "sha256:" + "0" * 64}])
    notjson = s.root / "manifests" / "registry.ollama.ai" / "library" / "notjson" / "1"
    notjson.parent.mkdir(parents=True)
    notjson.write_text("{ this is not json")
    return s


@pytest.fixture(scope="module")
def lmstudio_home(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    home = tmp_path_factory.mktemp("lmhome")
    folder = home / ".lmstudio" / "models" / "acme" / "SmolLM2-GGUF"
    _place(smollm2_path, folder / "SmolLM2-135M-Instruct-Q4_1.gguf")
    _place(smollm2_path, folder / "SmolLM2-135M-Instruct-Q8_0.gguf")  # another tag, the same bytes
    write_mmproj(folder / "mmproj-SmolLM2-f16.gguf")
    _place(smollm2_path, home / ".cache" / "lm-studio" / "models" / "old" / "Smol-GGUF" / "smol-Q4_1.gguf")
    return home


@pytest.fixture(scope="module")
def env(cli_env: dict[str, str], store: OllamaStore, lmstudio_home: Path) -> dict[str, str]:
    # no GPU: the params layer's stop string and the system prompt's effect were chosen from a CPU's greedy answers
    # (on an H200 the answer ended before "Marseillaise", and the system prompt left 12 tokens as they were)
    return {**cli_env, "OLLAMA_MODELS": str(store.root), "HOME": str(lmstudio_home), **NO_GPU}


@pytest.fixture(scope="module")
def lg(env: dict[str, str]) -> CLI:
    return CLI(env)


@pytest.fixture(scope="module")
def lg_in(cli_in_process: InProcessCLI, env: dict[str, str]) -> InProcessCLI:
    return InProcessCLI({**cli_in_process.env, "OLLAMA_MODELS": env["OLLAMA_MODELS"], "HOME": env["HOME"]})


def _json(r: Any) -> Any:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_an_ollama_model_runs_from_its_blob_with_its_params(lg: CLI, store: OllamaStore, smollm2_path: Path) -> None:
    """docs/models.md: ollama:NAME runs Ollama's GGUF blob in place; its params layer's temperature, stop, top_k
    and num_ctx apply where no flag is given; a parameter localgen has no knob for is one warning."""
    ours = _json(lg("run", "-m", "ollama:smollm2:135m", "-p", PROMPT, "-n", "24", "--json"))
    same = _json(lg("run", "-m", "smollm2:135m", "-p", PROMPT, "-n", "24", "--json", "--temperature", "0",
                    "--stop", "Marseillaise", "--top-k", "7"))
    assert ours["text"] == same["text"] and ours["text"], (ours["text"], same["text"])
    assert ours["finish_reason"] == "stop", "the params layer's stop string ended it"
    blob = store.root / "blobs" / ("sha256-" + hashlib.sha256(smollm2_path.read_bytes()).hexdigest())
    assert ours["model"]["file"] == str(blob) and ours["model"]["source"] == "ollama"
    assert ours["model"]["name"] == "ollama:smollm2:135m"
    assert ours["load"]["n_ctx"] == 1024
    assert ours["sampling"]["temperature"] == 0 and ours["sampling"]["stop"] == ["Marseillaise"]
    assert ours["sampling"]["top_k"] == 7


def test_flags_beat_an_ollama_model_s_params(lg: CLI) -> None:
    r = lg("run", "-m", "ollama:smollm2:135m", "-p", PROMPT, "-n", "4", "--json", "--ctx", "2048",
           "--stop", "femme", "--top-k", "3", "--temperature", "0.5", "--seed", "1")
    doc = _json(r)
    assert doc["load"]["n_ctx"] == 2048
    assert doc["sampling"]["stop"] == ["femme"] and doc["sampling"]["top_k"] == 3
    assert doc["sampling"]["temperature"] == 0.5
    for key in ("penalize_newline", "top_p"):
        warned = [line for line in r.stderr.splitlines() if f"parameter {key!r}" in line]
        assert len(warned) == 1 and "left out" in warned[0], r.stderr
    assert doc["sampling"]["top_p"] == 0.95, "a value localgen refuses is left out: the default stays"


def test_list_shows_ollama_and_lm_studio_models(lg_in: InProcessCLI, store: OllamaStore) -> None:
    items = {i["name"]: i for i in _json(lg_in("list", "--json"))}
    o = items["ollama:smollm2:135m"]
    assert o["source"] == "ollama" and o["quantization"] == "Q4_1" and o["path"].startswith(str(store.root))
    assert o["size"] == Path(o["path"]).stat().st_size
    assert "ollama:someone/bare:v1" in items and "ollama:hf.co/acme/seer:latest" in items
    for broken in ("ollama:short:1", "ollama:gone:1", "ollama:notjson:1"):
        assert broken not in items, "a damaged entry is left for run and show to name"
    lm = {n: i for n, i in items.items() if i["source"] == "lmstudio"}
    assert set(lm) == {"lmstudio:acme/SmolLM2-GGUF:Q4_1", "lmstudio:acme/SmolLM2-GGUF:Q8_0",
                       "lmstudio:old/Smol-GGUF:Q4_1"}, lm
    assert not any("mmproj" in n for n in items), "a projector is no model"
    table = lg_in("list")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("ollama:smollm2:135m "))
    assert "Q4_1" in row and "94 MiB" in row and str(store.root) in row


def test_show_reads_an_ollama_model_with_its_projector_and_system_prompt(lg_in: InProcessCLI,
                                                                         smollm2_path: Path) -> None:
    doc = _json(lg_in("show", "ollama:smollm2:135m", "--json"))
    assert doc["sha256"] == hashlib.sha256(smollm2_path.read_bytes()).hexdigest()
    assert doc["load"] == {"num_ctx": 1024} and doc["modalities"] == ["text"]
    seer = _json(lg_in("show", "ollama:hf.co/acme/seer", "--json"))
    assert seer["name"] == "ollama:hf.co/acme/seer:latest" and seer["modalities"] == ["text", "image"]
    assert Path(seer["projector"]).name.startswith("sha256-")
    bare = _json(lg_in("show", "OLLAMA:Someone/BARE:V1", "--json", "--offline"))  # the name in any case
    assert bare["load"] == {} and bare["name"] == "ollama:someone/bare:v1"
    modelfile = lg_in("show", "ollama:hf.co/acme/seer", "--modelfile")
    assert modelfile.returncode == 0 and f"SYSTEM {SYSTEM}\n" in modelfile.stdout, modelfile.stdout
    assert "PARAMETER num_ctx 1024" in lg_in("show", "ollama:smollm2:135m", "--modelfile").stdout


def _prompt_tokens(lg: CLI, model: str, *flags: str) -> int:
    doc = _json(lg("run", "-m", model, "-p", PROMPT, "-n", "1", "--json", "--temperature", "0", *flags))
    return int(doc["stats"]["prompt_tokens"])


def test_an_ollama_model_s_system_prompt_and_messages_go_first(lg: CLI) -> None:
    bare = _prompt_tokens(lg, "smollm2:135m")
    assert _prompt_tokens(lg, "ollama:hf.co/acme/seer") == _prompt_tokens(lg, "smollm2:135m", "--system", SYSTEM)
    assert _prompt_tokens(lg, "ollama:hf.co/acme/seer", "--system", "Be brief, please, and kind.") == (
        _prompt_tokens(lg, "smollm2:135m", "--system", "Be brief, please, and kind.")), "--system replaces it"
    assert _prompt_tokens(lg, "ollama:chatty:1") > bare + 10, "the messages layer's turns come before the prompt"


def test_an_ollama_model_s_adapter_applies(lg: CLI, store: OllamaStore) -> None:
    m = json.loads((store.root / "manifests/registry.ollama.ai/library/tuned/1").read_text())
    adapter = store.root / "blobs" / m["layers"][1]["digest"].replace(":", "-")
    tuned = _json(lg("run", "-m", "ollama:tuned:1", "-p", PROMPT, "-n", "12", "--json", "--temperature", "0"))
    same = _json(lg("run", "-m", "smollm2:135m", "-p", PROMPT, "-n", "12", "--json", "--temperature", "0",
                    "--lora", str(adapter)))
    plain = _json(lg("run", "-m", "smollm2:135m", "-p", PROMPT, "-n", "12", "--json", "--temperature", "0"))
    assert tuned["text"] == same["text"] != plain["text"]
    r = lg("run", "-m", "ollama:foreign:1", "-p", PROMPT, "-n", "2")
    assert r.returncode == 2 and "is for the 'gemma3' architecture" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_preset_from_an_ollama_model_keeps_its_settings_under_its_own(lg_in: InProcessCLI, tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text("FROM ollama:smollm2:135m\nPARAMETER top_k 3\n")
    r = lg_in("create", "ollamabot", "-f", str(tmp_path / "Modelfile"))
    assert r.returncode == 0, r.stderr
    try:
        doc = _json(lg_in("show", "ollamabot", "--json"))
        assert doc["load"] == {"num_ctx": 1024} and doc["preset"]["base"] == "ollama:smollm2:135m"
        text = lg_in("show", "ollamabot", "--modelfile").stdout
        assert "FROM ollama:smollm2:135m" in text
    finally:
        assert lg_in("rm", "ollamabot", "--yes").returncode == 0
    (tmp_path / "Other").write_text("FROM smollm2:135m\n")
    for name in ("ollama:mine", "LMStudio:x"):
        r = lg_in("create", name, "-f", str(tmp_path / "Other"))
        assert r.returncode == 2 and "names a model of another tool's store" in r.stderr, r.stderr


def test_rm_refuses_an_ollama_or_lm_studio_model_and_keeps_its_files(lg_in: InProcessCLI, store: OllamaStore,
                                                                       lmstudio_home: Path) -> None:
    blobs = sorted(p.name for p in (store.root / "blobs").iterdir())
    r = lg_in("rm", "ollama:smollm2:135m", "--yes")
    assert r.returncode == 2 and r.stdout == ""
    assert "Ollama's model: remove it with `ollama rm smollm2:135m`" in r.stderr and len(r.stderr.splitlines()) == 1
    r = lg_in("rm", "lmstudio:acme/SmolLM2-GGUF:Q4_1", "--yes")
    assert r.returncode == 2 and "LM Studio's model" in r.stderr
    assert sorted(p.name for p in (store.root / "blobs").iterdir()) == blobs
    assert (store.root / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m").is_file()
    assert len(list((lmstudio_home / ".lmstudio" / "models" / "acme" / "SmolLM2-GGUF").iterdir())) == 3
    r = lg_in("pull", "ollama:smollm2:135m")
    assert r.returncode == 1 and "nothing to pull" in r.stderr


@pytest.mark.parametrize(("name", "rc", "says"), [
    ("ollama:short:1", 1, "holds 98,362,432 bytes, its manifest says 98,362,433 (`ollama pull short:1` fetches"),
    ("ollama:gone:1", 1, "missing from Ollama's store"),
    ("ollama:notjson:1", 1, "is damaged: it is not JSON"),
    ("ollama:nothere", 1, "no Ollama model nothere:latest: no manifest at"),
    ("ollama:../../etc/passwd", 2, "is not an Ollama model name"),
    ("ollama:a/b/c/d", 2, "is not an Ollama model name"),
    ("ollama:", 2, "names no model"),
    ("lmstudio:acme/SmolLM2-GGUF:Q2_K", 1, "has no quantization Q2_K"),
    ("lmstudio:acme/../x", 2, "is not an LM Studio model name"),
    ("lmstudio:acme/none", 1, "no LM Studio model acme/none"),
])
def test_a_damaged_or_wrong_name_is_one_line(lg_in: InProcessCLI, name: str, rc: int, says: str) -> None:
    r = lg_in("show", name)
    assert r.returncode == rc, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_an_lm_studio_model_runs_by_its_tag_with_its_projector(lg: CLI, lmstudio_home: Path) -> None:
    folder = lmstudio_home / ".lmstudio" / "models" / "acme" / "SmolLM2-GGUF"
    doc = _json(lg("run", "-m", "lmstudio:acme/SmolLM2-GGUF:q4_1", "-p", PROMPT, "-n", "6", "--json",
                   "--temperature", "0"))
    same = _json(lg("run", "-m", "smollm2:135m", "-p", PROMPT, "-n", "6", "--json", "--temperature", "0"))
    assert doc["text"] == same["text"] and doc["model"]["source"] == "lmstudio"
    assert doc["model"]["file"] == str(folder / "SmolLM2-135M-Instruct-Q4_1.gguf")
    assert doc["model"]["name"] == "lmstudio:acme/SmolLM2-GGUF:Q4_1"


def test_an_lm_studio_name_without_a_tag_takes_the_best_file(lg_in: InProcessCLI) -> None:
    doc = _json(lg_in("show", "lmstudio:acme/SmolLM2-GGUF", "--json"))
    assert doc["name"] == "lmstudio:acme/SmolLM2-GGUF:Q8_0" and doc["file"].endswith("-Q8_0.gguf")
    assert doc["modalities"] == ["text", "image"] and doc["projector"].endswith("mmproj-SmolLM2-f16.gguf")
    old = _json(lg_in("show", "lmstudio:old/Smol-GGUF", "--json"))
    assert old["file"].endswith(".cache/lm-studio/models/old/Smol-GGUF/smol-Q4_1.gguf")


@pytest.fixture(scope="module")
def server(env: dict[str, str]) -> Iterator[Server]:
    s = Server(env, "--ctx", "1024")
    yield s
    assert s.stop() == 0


def test_serve_lists_and_answers_an_ollama_and_an_lm_studio_model(server: Server, store: OllamaStore) -> None:
    listed = {m["name"]: m for m in httpx.get(f"{server.url}/api/tags", timeout=60).json()["models"]}
    tags = list(listed)
    # an Ollama model's digest is its manifest's, as Ollama lists it (`ollama list`'s ID), not its blob's
    manifest = store.root / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    assert listed["ollama:smollm2:135m"]["digest"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    ids = [m["id"] for m in httpx.get(f"{server.url}/v1/models", timeout=60).json()["data"]]
    for name in ("ollama:smollm2:135m", "lmstudio:acme/SmolLM2-GGUF:Q4_1"):
        assert name in tags and name in ids
    r = httpx.post(f"{server.url}/api/chat", timeout=600, json={
        "model": "ollama:smollm2:135m", "stream": False, "options": {"num_predict": 24},
        "messages": [{"role": "user", "content": PROMPT}]})
    assert r.status_code == 200, r.text
    assert r.json()["done_reason"] == "stop", "the params layer's stop string and temperature apply"
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=600, json={
        "model": "lmstudio:acme/SmolLM2-GGUF:Q4_1", "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": PROMPT}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
    r = httpx.request("DELETE", f"{server.url}/api/delete", json={"model": "ollama:smollm2:135m"}, timeout=60)
    assert r.status_code == 400 and "ollama rm smollm2:135m" in r.text, r.text


def test_a_chat_on_an_ollama_model_starts_with_its_system_prompt(lg: CLI) -> None:
    ours = lg("chat", "-m", "ollama:hf.co/acme/seer", "-n", "12", "--temp", "0", input=PROMPT + "\n")
    same = lg("chat", "-m", "smollm2:135m", "-n", "12", "--temp", "0", "--system", SYSTEM, input=PROMPT + "\n")
    bare = lg("chat", "-m", "smollm2:135m", "-n", "12", "--temp", "0", input=PROMPT + "\n")
    assert ours.returncode == 0 and same.returncode == 0, (ours.stderr, same.stderr)
    assert ours.stdout.strip() and ours.stdout == same.stdout != bare.stdout, (ours.stdout, bare.stdout)


# ---- the red team's findings (each test fails on the code before its fix) ------------------------------------


@pytest.fixture(scope="module")
def odd(store: OllamaStore, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> OllamaStore:
    """Names and layers the first fixture has not: a model called `ollama`, a host with a port, a blob that is a
    folder, a damaged params layer, two model layers, a system prompt on a GGUF without a chat template, a GGUF
    llama.cpp cannot load."""
    model = store.blob(MEDIA + "model", smollm2_path)
    store.manifest("ollama:smol", [model])  # manifests/registry.ollama.ai/library/ollama/smol
    store.manifest("y:z", [model], host="localhost:5000", namespace="x")
    folder = store.blob(MEDIA + "system", b"a folder's digest")
    blob = store.root / "blobs" / folder["digest"].replace(":", "-")
    blob.unlink()
    blob.mkdir()
    (blob / "x").write_bytes(b"x" * 16)
    store.manifest("folder:1", [model, {**folder, "size": blob.stat().st_size}])
    store.manifest("badparams:1", [model, store.blob(MEDIA + "params", b"{ not json")])
    lora = tiny_lora.build(smollm2_path, tmp_path_factory.mktemp("lora2") / "first.gguf")
    store.manifest("twomodel:1", [store.blob(MEDIA + "model", lora), model])
    d = tmp_path_factory.mktemp("gguf")
    plain = rewrite_strings(smollm2_path, d / "plain.gguf", {"tokenizer.chat_template": None})
    store.manifest("plain:1", [store.blob(MEDIA + "model", plain), store.blob(MEDIA + "system", SYSTEM.encode())])
    with open(smollm2_path, "rb") as f:
        (d / "cut.gguf").write_bytes(f.read(20_000_000))
    store.manifest("cut:1", [store.blob(MEDIA + "model", d / "cut.gguf")])
    alien = rewrite_strings(smollm2_path, d / "alien.gguf", {"general.architecture": "frobnicator"})
    store.manifest("alien:1", [store.blob(MEDIA + "model", alien)])
    return store


def test_a_model_called_ollama_is_itself_and_a_third_part_is_a_usage_error(lg_in: InProcessCLI,
                                                                           odd: OllamaStore) -> None:
    """ollama: is taken off once: `ollama:ollama:smol` is Ollama's model ollama:smol, never smol:latest."""
    doc = _json(lg_in("show", "ollama:ollama:smol", "--json"))
    assert doc["name"] == "ollama:ollama:smol"
    r = lg_in("show", "ollama:ollama:smol:latest")
    assert r.returncode == 2 and "is not an Ollama model name" in r.stderr, r.stderr


def test_a_registry_host_with_a_port_is_listed_and_resolves(lg_in: InProcessCLI, odd: OllamaStore) -> None:
    items = {i["name"] for i in _json(lg_in("list", "--json"))}
    assert "ollama:localhost:5000/x/y:z" in items
    doc = _json(lg_in("show", "ollama:localhost:5000/x/y:z", "--json"))
    assert doc["name"] == "ollama:localhost:5000/x/y:z" and doc["architecture"] == "llama"
    long_total = "ollama:" + "/".join(["h" * 70, "n" * 70, "m" * 70]) + ":t"  # over 128, each part under 80
    r = lg_in("show", long_total)
    assert r.returncode == 1 and "no Ollama model" in r.stderr, r.stderr
    r = lg_in("show", "ollama:" + "m" * 81)
    assert r.returncode == 2 and "is not an Ollama model name" in r.stderr, r.stderr


@pytest.mark.parametrize(("args", "rc", "says"), [
    (("show", "ollama:-x"), 2, "is not an Ollama model name"),
    (("show", "ollama:x/-y"), 2, "is not an Ollama model name"),
    (("pull", "ollama:../x"), 2, "is not an Ollama model name"),
    (("rm", "ollama:notthere", "--yes"), 1, "no Ollama model notthere:latest"),
    (("rm", "lmstudio:acme/none", "--yes"), 1, "no LM Studio model acme/none"),
    (("show", "ollama:folder:1"), 1, "is not a file"),
])
def test_names_ollama_would_not_take_and_missing_models_say_so(lg_in: InProcessCLI, odd: OllamaStore,
                                                               args: tuple[str, ...], rc: int, says: str) -> None:
    """docs/models.md: a name Ollama would not take is a usage error; rm of a model not there says so."""
    r = lg_in(*args)
    assert r.returncode == rc and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_list_hides_an_ollama_model_run_refuses_and_show_names_the_damage(lg_in: InProcessCLI,
                                                                         odd: OllamaStore) -> None:
    items = {i["name"] for i in _json(lg_in("list", "--json"))}
    assert "ollama:badparams:1" not in items and "ollama:folder:1" not in items
    # a GGUF whose tensor data is cut short: list read its header alone and listed it, which serve leaves out
    assert "ollama:cut:1" not in items and "ollama:twomodel:1" in items
    r = lg_in("show", "ollama:badparams:1")
    assert r.returncode == 1 and "the params layer of ollama:badparams:1" in r.stderr and "not JSON" in r.stderr
    assert "`ollama pull badparams:1` fetches it again" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_of_two_model_layers_the_last_is_the_model(lg_in: InProcessCLI, odd: OllamaStore, smollm2_path: Path) -> None:
    doc = _json(lg_in("show", "ollama:twomodel:1", "--json"))
    assert doc["sha256"] == hashlib.sha256(smollm2_path.read_bytes()).hexdigest()


def test_a_system_prompt_on_a_model_without_a_chat_template_is_said_once(lg: CLI, odd: OllamaStore) -> None:
    r = lg("run", "-m", "ollama:plain:1", "-p", PROMPT, "-n", "2", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "not used: the model has no chat template" in line]
    assert len(said) == 1 and "ollama:plain:1" in said[0] and "system prompt" in said[0], r.stderr


@pytest.mark.parametrize("name", ["cut:1", "alien:1"])
def test_a_gguf_llama_cpp_cannot_load_is_one_line_naming_the_model(lg: CLI, odd: OllamaStore, name: str) -> None:
    """docs/models.md: a GGUF llama.cpp refuses (truncated; an architecture it does not know, as Ollama's own
    conversions have) is one line naming the model and pointing at the same model's GGUF on Hugging Face."""
    r = lg("run", "-m", f"ollama:{name}", "-p", PROMPT, "-n", "2")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and f"ollama:{name}" in r.stderr, r.stderr
    assert f"`ollama pull {name}`" in r.stderr and "GGUF from Hugging Face" in r.stderr, r.stderr


def test_a_preset_named_ollama_before_is_shadowed_copied_and_removed(lg_in: InProcessCLI, tmp_path: Path) -> None:
    """A preset made as `ollama:old` before ollama: named Ollama's store: run says it is shadowed and how to rename
    it, cp copies it, rm removes it."""
    (tmp_path / "Modelfile").write_text("FROM smollm2:135m\nPARAMETER top_k 5\n")
    assert lg_in("create", "tobeold", "-f", str(tmp_path / "Modelfile")).returncode == 0
    folder = Path(lg_in.env["LOCALGEN_HOME"] or "") / "data" / "presets"
    doc = json.loads((folder / "tobeold.json").read_text())
    (folder / "tobeold.json").unlink()
    (folder / "ollama@old.json").write_text(json.dumps({**doc, "name": "ollama:old"}))
    r = lg_in("run", "-m", "ollama:old", "-p", PROMPT, "-n", "1")
    assert r.returncode == 1 and "your preset ollama:old is shadowed" in r.stderr, r.stderr
    assert "localgen cp ollama:old NEWNAME" in r.stderr, r.stderr
    r = lg_in("cp", "ollama:old", "newold")
    assert r.returncode == 0, r.stderr
    try:
        assert _json(lg_in("show", "newold", "--json"))["preset"]["settings"] == {"top_k": 5}
    finally:
        assert lg_in("rm", "newold", "--yes").returncode == 0
    r = lg_in("rm", "ollama:old", "--yes")
    assert r.returncode == 0 and "removed the preset ollama:old" in r.stdout, r.stderr
    assert not (folder / "ollama@old.json").exists()


def test_fit_names_an_ollama_model_s_num_ctx_as_its_params(lg_in: InProcessCLI) -> None:
    r = lg_in("fit", "-m", "ollama:smollm2:135m")
    assert r.returncode == 0, r.stderr
    assert "its Ollama params' num_ctx" in r.stdout and "preset" not in r.stdout, r.stdout


def test_show_of_a_preset_from_an_ollama_model_gives_what_it_keeps(lg_in: InProcessCLI, tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text("FROM ollama:smollm2:135m\n")
    assert lg_in("create", "ollamakeeps", "-f", str(tmp_path / "Modelfile")).returncode == 0
    try:
        lines = lg_in("show", "ollamakeeps").stdout.splitlines()
        kept = next(line for line in lines if line.startswith("from its base "))
        assert "temperature 0" in kept and "top_k 7" in kept and "context 1024" in kept, lines
        doc = _json(lg_in("show", "ollamakeeps", "--json"))["preset"]
        assert doc["inherited"]["top_k"] == 7 and doc["inherited_context"] == 1024 and doc["settings"] == {}
    finally:
        assert lg_in("rm", "ollamakeeps", "--yes").returncode == 0


def test_serve_finds_an_ollama_model_by_any_spelling_of_its_name(server: Server, lg_in: InProcessCLI,
                                                                 odd: OllamaStore) -> None:
    """A request's ollama:NAME is compared as Ollama's canonical name: no tag (latest), case, library/; /api/show's
    modelfile is `show --modelfile`'s."""
    for name in ("ollama:hf.co/acme/seer", "OLLAMA:HF.co/Acme/Seer:latest", "ollama:library/smollm2:135m",
                 "ollama:SmolLM2:135M"):
        r = httpx.post(f"{server.url}/api/chat", timeout=600, json={
            "model": name, "stream": False, "options": {"num_predict": 2},
            "messages": [{"role": "user", "content": PROMPT}]})
        assert r.status_code == 200, (name, r.text)
        r = httpx.post(f"{server.url}/api/show", timeout=60, json={"model": name})
        assert r.status_code == 200, (name, r.text)
    assert httpx.get(f"{server.url}/v1/models/ollama:hf.co/acme/seer", timeout=60).status_code == 200
    shown = httpx.post(f"{server.url}/api/show", timeout=60, json={"model": "ollama:smollm2:135m"}).json()
    cli = lg_in("show", "ollama:smollm2:135m", "--modelfile").stdout
    assert shown["modelfile"] == cli and "PARAMETER num_ctx 1024" in cli, (shown["modelfile"], cli)


def test_serve_m_an_untagged_ollama_name_answers_it(env: dict[str, str]) -> None:
    """`serve -m ollama:NAME` serves ollama:NAME:latest; a request for the name as given (or its other spellings)
    is that model, not a 404."""
    s = Server(env, "--ctx", "512", "-m", "ollama:hf.co/acme/seer")
    try:
        for name in ("ollama:hf.co/acme/seer", "ollama:HF.co/acme/seer:Latest", "ollama:hf.co/acme/seer:latest"):
            r = httpx.post(f"{s.url}/v1/chat/completions", timeout=600, json={
                "model": name, "max_tokens": 2, "messages": [{"role": "user", "content": PROMPT}]})
            assert r.status_code == 200, (name, r.text)
        r = httpx.post(f"{s.url}/v1/chat/completions", timeout=600, json={
            "model": "ollama:hf.co/acme/other", "max_tokens": 2, "messages": [{"role": "user", "content": PROMPT}]})
        assert r.status_code == 404, r.text
    finally:
        assert s.stop() == 0


def test_lm_studio_s_models_folder_is_followed_where_its_settings_move_it(
        cli_in_process: InProcessCLI, tmp_path: Path, smollm2_path: Path) -> None:
    """LM Studio keeps a models folder chosen in My Models as `downloadsFolder` in ~/.lmstudio/settings.json (the
    older ~/.cache/lm-studio/settings.json alike): its models are found there, where only the default folder was
    looked in. A settings file that is not JSON is one warning, and the default folder is used."""
    home, moved = tmp_path / "home", tmp_path / "big disk" / "models"
    _place(smollm2_path, moved / "acme" / "Moved-GGUF" / "moved-Q4_1.gguf")
    _place(smollm2_path, home / ".lmstudio" / "models" / "acme" / "Default-GGUF" / "default-Q4_1.gguf")
    (home / ".lmstudio" / "settings.json").write_text(json.dumps({"downloadsFolder": str(moved), "other": 1}))
    old_moved = tmp_path / "old disk"
    _place(smollm2_path, old_moved / "old" / "Older-GGUF" / "older-Q4_1.gguf")
    (home / ".cache" / "lm-studio").mkdir(parents=True)
    (home / ".cache" / "lm-studio" / "settings.json").write_text(json.dumps({"downloadsFolder": str(old_moved)}))
    lg = InProcessCLI({**cli_in_process.env, "HOME": str(home)})

    def lm_names() -> list[str]:
        r = lg("list", "--json")
        assert r.returncode == 0, r.stderr
        return sorted(i["name"] for i in json.loads(r.stdout) if i["source"] == "lmstudio")

    assert lm_names() == ["lmstudio:acme/Moved-GGUF:Q4_1", "lmstudio:old/Older-GGUF:Q4_1"]
    doc = _json(lg("show", "lmstudio:acme/Moved-GGUF", "--json"))
    assert doc["file"] == str(moved / "acme" / "Moved-GGUF" / "moved-Q4_1.gguf")
    # no downloadsFolder (or an empty one): the default folder
    (home / ".lmstudio" / "settings.json").write_text(json.dumps({"downloadsFolder": ""}))
    assert lm_names() == ["lmstudio:acme/Default-GGUF:Q4_1", "lmstudio:old/Older-GGUF:Q4_1"]
    # not JSON: one warning naming the file, and the default folder
    (home / ".lmstudio" / "settings.json").write_text('{"downloadsFolder": ')
    r = lg("list", "--json")
    assert r.returncode == 0 and "lmstudio:acme/Default-GGUF:Q4_1" in r.stdout, r.stderr
    said = [line for line in r.stderr.splitlines() if "settings" in line]
    assert len(said) == 1 and said[0].startswith(f"warning: LM Studio's settings {home}/.lmstudio/settings.json are "
                                                 "not JSON"), r.stderr
    assert said[0].endswith("its default models folder is used"), said


def test_an_lm_studio_name_without_a_tag_takes_the_best_file_that_fits(cli_in_process: InProcessCLI, tmp_path: Path,
                                                                       smollm2_path: Path) -> None:
    """Without :QUANT (and no Q4_K_M in the folder), the best quantization that fits this machine's memory, as
    `pull` picks a Hub repo's: it was the best in the folder, however large (here a Q8_0 twice the RAM)."""
    from localgen import hardware

    home = tmp_path / "home"
    folder = home / ".lmstudio" / "models" / "acme" / "Big-GGUF"
    _place(smollm2_path, folder / "big-Q4_1.gguf")
    too_big = 2 * max(hardware.total_ram_bytes() or 0, hardware.available_ram_bytes() or 0, 1 << 36)
    with (folder / "big-Q8_0.gguf").open("wb") as f:
        f.truncate(too_big)  # sparse: nothing is written
    lg = InProcessCLI({**cli_in_process.env, "HOME": str(home)})
    doc = _json(lg("show", "lmstudio:acme/Big-GGUF", "--json"))
    assert doc["name"] == "lmstudio:acme/Big-GGUF:Q4_1" and doc["file"].endswith("big-Q4_1.gguf"), doc
    r = lg("show", "lmstudio:acme/Big-GGUF:Q8_0", "--json")  # asked for by its tag: that file, as before
    assert r.returncode != 0 and "big-Q8_0.gguf" in r.stderr, r.stderr


def test_an_ollama_params_num_ctx_past_the_bound_is_said_as_the_flags_say_it() -> None:
    """The line that leaves an Ollama model's num_ctx out writes its bound as every other bound is written
    (2,147,483,647, not 2147483647), and a number of hundreds of digits in exponent form."""
    from localgen.errors import UsageError
    from localgen.models import ollamastore

    for value, said in ((2**40, "1099511627776"), (10**300, "1e+300"), (8, "8")):
        with pytest.raises(UsageError) as e:
            ollamastore._context(value)
        assert e.value.message == f"num_ctx must be 0 or within 16 to 2,147,483,647, not {said}"
