"""`localgen pull ollama:NAME` from a registry without Ollama (models/registry.py): a loopback registry
(tests/registry_server.py) serving SmolLM2's GGUF as Ollama's library does, pulled over http by the real CLI into
localgen's data dir in Ollama's layout, then run, listed, shown and removed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import registry_server
from tests.conftest import ROOT, InProcessCLI
from tests.forkserver import ForkServer
from tests.hub_server import HubFile
from tests.registry_server import MANIFEST_TYPE, FakeRegistry
from tests.test_otherstores import MEDIA, OllamaStore

PARAMS = b'{"temperature": 0, "num_predict": 6}'
SYSTEM = b"You answer in one word."


@pytest.fixture(scope="module")
def served() -> Iterator[FakeRegistry]:
    reg, server = registry_server.start()
    yield reg
    server.shutdown()
    server.cdn.shutdown()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def gguf(smollm2_path: Path) -> HubFile:
    return HubFile(smollm2_path)


@pytest.fixture
def reg(served: FakeRegistry, gguf: HubFile) -> FakeRegistry:
    """The registry with library/smollm2:135m (GGUF, params, system prompt) and library/smollm2:plain (the same
    GGUF blob alone)."""
    served.reset()
    served.add("library/smollm2:135m", [("model", gguf), ("params", HubFile(PARAMS)), ("system", HubFile(SYSTEM))])
    served.add("library/smollm2:plain", [("model", gguf)])
    return served


@pytest.fixture(scope="module")
def forks(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    """A fork server in this module's environment: online (no HF_HUB_OFFLINE) and with an empty Ollama store of
    its own, so that nothing of the real ~/.ollama is read and what Ollama's store holds after a pull is seen."""
    e = {k: v for k, v in cli_env.items() if k != "HF_HUB_OFFLINE"}
    e["OLLAMA_MODELS"] = str(tmp_path_factory.mktemp("ollama-store"))
    server = ForkServer(e, ROOT, Path(tempfile.mkdtemp(prefix="localgen-forks-")))
    yield server
    server.close()


@pytest.fixture
def env(forks: ForkServer, tmp_path: Path) -> dict[str, str]:
    return {**forks.env, "LOCALGEN_HOME": str(tmp_path / "home")}


@pytest.fixture
def lg(forks: ForkServer, env: dict[str, str]) -> Lg:
    return Lg(forks, env)


class Lg:
    """`localgen ARGS` in the test's environment (forked where the environment allows, else a new interpreter)."""

    def __init__(self, forks: ForkServer, env: dict[str, str]) -> None:
        self.forks, self.env = forks, env

    def __call__(self, *args: str, **more: str) -> subprocess.CompletedProcess[str]:
        env = {**self.env, **more}
        if self.forks.accepts(env):
            return self.forks.run(list(args), env, "", 600)
        return subprocess.run([sys.executable, "-m", "localgen", *args], env=env, capture_output=True, text=True,
                              timeout=600, cwd=ROOT, stdin=subprocess.DEVNULL)

    @property
    def pulled(self) -> Path:
        return Path(self.env["LOCALGEN_HOME"]) / "data" / "ollama"


def name(reg: FakeRegistry, model: str = "smollm2:135m") -> str:
    return f"ollama:{reg.host}/library/{model}"


def one_line(r: subprocess.CompletedProcess[str], rc: int, says: str, progress: bool = False) -> None:
    """The command failed with `rc` and one error line saying `says` (after a download's progress lines, with
    `progress`)."""
    assert r.returncode == rc, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert says in lines[-1] and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 or (progress and sum("error" in x for x in lines) == 1), r.stderr


def test_pull_stores_ollama_s_layout_that_run_list_and_show_read(lg: Lg, reg: FakeRegistry, gguf: HubFile) -> None:
    """docs/models.md "Models from Ollama's library": the manifest (asked for as a Docker v2 manifest) and each
    blob land in localgen's data dir in Ollama's layout, never in Ollama's store; run answers with the model and
    its params, list and show name it, show gives its system prompt."""
    r = lg("pull", name(reg))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:3] == [name(reg), "Q4_1", "94"], r.stdout
    method, path, _, accept = reg.requests[0]
    assert (method, path, accept) == ("GET", "/v2/library/smollm2/manifests/135m", MANIFEST_TYPE)
    manifest = lg.pulled / "manifests" / reg.host / "library" / "smollm2" / "135m"
    assert manifest.read_bytes() == reg.manifests["library/smollm2:135m"]  # as sent: Ollama's digest of it holds
    blobs = sorted(p.name for p in (lg.pulled / "blobs").iterdir())
    assert len(blobs) == 4 and f"sha256-{gguf.sha256}" in blobs, blobs  # config, model, params, system
    assert not any(Path(lg.env["OLLAMA_MODELS"]).iterdir())
    r = lg("run", "-m", name(reg), "-p", "What is the capital of France?", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"]["name"] == name(reg) and out["model"]["source"] == "ollama", out
    assert out["text"] and out["stats"]["completion_tokens"] <= 6, out
    assert (out["sampling"]["temperature"], out["sampling"]["max_tokens"]) == (0, 6), out  # the params layer's
    listed = {m["name"]: m for m in json.loads(lg("list", "--json").stdout)}
    assert listed[name(reg)]["source"] == "ollama"
    shown = json.loads(lg("show", name(reg), "--json").stdout)
    assert shown["name"] == name(reg) and shown["sha256"] == gguf.sha256, shown
    assert f"SYSTEM {SYSTEM.decode()}\n" in lg("show", name(reg), "--modelfile").stdout


def test_pull_writes_its_manifest_where_python_has_no_fchmod(env: dict[str, str], reg: FakeRegistry,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Python on Windows has os.fchmod only from 3.13: the manifest (0644, as the blobs are) is written without
    it."""
    monkeypatch.delattr(os, "fchmod", raising=False)
    run = InProcessCLI({"LOCALGEN_HOME": env["LOCALGEN_HOME"], "OLLAMA_MODELS": env["OLLAMA_MODELS"],
                        "HF_HUB_OFFLINE": None, "NO_COLOR": "1"})
    r = run("pull", name(reg, "smollm2:plain"))
    assert r.returncode == 0, r.stderr
    manifest = Path(env["LOCALGEN_HOME"]) / "data" / "ollama" / "manifests" / reg.host / "library" / "smollm2"
    assert (manifest / "plain").read_bytes() == reg.manifests["library/smollm2:plain"]
    assert (manifest / "plain").stat().st_mode & 0o777 == 0o644


def test_a_cut_connection_resumes_and_a_partial_blob_never_takes_its_digest_s_name(lg: Lg, reg: FakeRegistry,
                                                                                     gguf: HubFile) -> None:
    """docs/models.md: a pull that stops keeps its bytes in sha256-HEX.incomplete, lists nothing, and the next
    pull continues from there with a Range request."""
    digest = "sha256:" + gguf.sha256
    # six cuts that each bring bytes, then five that bring none: the pull gives up after six tries in a row with
    # no progress but the first's (a try that brings bytes starts the count again)
    reg.drop_after[digest] = [i * 10_000_000 for i in range(1, 7)] + [60_000_000] * 5
    r = lg("pull", name(reg, "smollm2:plain"))
    one_line(r, 1, "failed after 6 tries", progress=True)
    blob = lg.pulled / "blobs" / f"sha256-{gguf.sha256}"
    assert not blob.exists() and blob.with_name(blob.name + ".incomplete").stat().st_size == 60_000_000
    assert not (lg.pulled / "manifests").exists()
    assert name(reg, "smollm2:plain") not in lg("list").stdout
    r = lg("pull", name(reg, "smollm2:plain"))
    assert r.returncode == 0, r.stderr
    assert "resuming at" in r.stderr and reg.blob_requests(digest)[-1] == "bytes=60000000-", reg.requests
    assert blob.stat().st_size == gguf.size and not blob.with_name(blob.name + ".incomplete").exists()


def test_rm_of_a_pull_that_gave_up_removes_what_it_left(lg: Lg, reg: FakeRegistry, gguf: HubFile) -> None:
    """docs/models.md: `rm ollama:NAME` of a name whose pull gave up (no manifest) removes the blobs it left,
    whole (the config) or partial (.incomplete), and keeps those another unfinished pull names."""
    reg.add("library/smollm2:again", [("model", gguf), ("params", HubFile(PARAMS))])
    reg.drop_after["sha256:" + gguf.sha256] = [i * 10_000_000 for i in range(1, 7)] + [60_000_000] * 5 + [
        60_000_000 + i * 1_000_000 for i in range(1, 7)] + [66_000_000] * 5  # each pull gives up: cuts with no bytes
    for tag in ("plain", "again"):
        one_line(lg("pull", name(reg, f"smollm2:{tag}")), 1, "failed after 6 tries", progress=True)
    partial = lg.pulled / "blobs" / f"sha256-{gguf.sha256}.incomplete"
    assert partial.stat().st_size == 66_000_000 and name(reg, "smollm2:plain") not in lg("list").stdout
    r = lg("rm", name(reg, "smollm2:plain"), "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"removed the unfinished pull of {name(reg, 'smollm2:plain')}, freed"), r.stdout
    assert "2 blob(s) another pulled model or unfinished pull uses were kept" in r.stdout, r.stdout
    assert partial.exists()  # the pull of smollm2:again would resume it
    r = lg("rm", name(reg, "smollm2:again"), "--yes")
    assert r.returncode == 0 and "freed 63" in r.stdout, r.stdout  # 66,000,000 bytes and the config
    assert not any((lg.pulled / "blobs").iterdir()), list((lg.pulled / "blobs").iterdir())
    one_line(lg("rm", name(reg, "smollm2:plain"), "--yes"), 1, f"no Ollama model {reg.host}/library/smollm2:plain")


def test_blobs_follow_the_registry_s_redirect_to_its_cdn_and_resume_there(lg: Lg, reg: FakeRegistry,
                                                                            gguf: HubFile) -> None:
    """registry.ollama.ai answers a blob's GET with a redirect to a CDN: the pull follows it, with its Range."""
    reg.redirect_blobs = True
    reg.drop_after["sha256:" + gguf.sha256] = [20_000_000]
    r = lg("pull", name(reg, "smollm2:plain"))
    assert r.returncode == 0, r.stderr
    got = [rng for path, rng in reg.cdn_requests if path.endswith(gguf.sha256)]
    assert got == ["bytes=0-", "bytes=20000000-"], reg.cdn_requests
    assert (lg.pulled / "blobs" / f"sha256-{gguf.sha256}").stat().st_size == gguf.size


def test_a_blob_that_is_not_its_digest_is_deleted_and_nothing_is_listed(lg: Lg, reg: FakeRegistry,
                                                                          gguf: HubFile) -> None:
    reg.blobs["sha256:" + gguf.sha256] = registry_server.wrong(gguf)
    r = lg("pull", name(reg, "smollm2:plain"))
    one_line(r, 1, "does not match its digest in", progress=True)
    assert "the bad download was deleted" in r.stderr
    assert [p.name for p in (lg.pulled / "blobs").iterdir()] == [next(
        f"sha256-{d.split(':')[1]}" for d in reg.blobs if d != "sha256:" + gguf.sha256)]  # the config alone
    assert not (lg.pulled / "manifests").exists()


def test_rm_removes_a_pulled_model_and_keeps_the_blobs_another_uses(lg: Lg, reg: FakeRegistry,
                                                                     gguf: HubFile) -> None:
    """docs/models.md: blobs two pulled models share are stored once; rm takes a model's manifest and the blobs
    no other pulled model uses."""
    for tag in ("smollm2:135m", "smollm2:plain"):
        assert lg("pull", name(reg, tag)).returncode == 0
    model = lg.pulled / "blobs" / f"sha256-{gguf.sha256}"
    assert len(list((lg.pulled / "blobs").iterdir())) == 4  # config, GGUF, params, system: each once
    assert len(reg.blob_requests("sha256:" + gguf.sha256)) == 1  # the second tag's GGUF was here already
    r = lg("rm", name(reg), "--yes")
    assert r.returncode == 0, r.stderr
    assert "removed" in r.stdout, r.stdout
    assert "2 blob(s) another pulled model or unfinished pull uses were kept" in r.stdout, r.stdout
    assert model.exists() and len(list((lg.pulled / "blobs").iterdir())) == 2  # the GGUF and the config stay
    assert not (lg.pulled / "manifests" / reg.host / "library" / "smollm2" / "135m").exists()
    assert lg("show", name(reg, "smollm2:plain")).returncode == 0
    r = lg("rm", name(reg, "smollm2:plain"), "--yes")
    assert r.returncode == 0 and "freed 94" in r.stdout, r.stdout
    assert not any((lg.pulled / "blobs").iterdir()) and not any((lg.pulled / "manifests").iterdir())
    one_line(lg("rm", name(reg), "--yes"), 1, f"no Ollama model {reg.host}/library/smollm2:135m")


def test_pulling_a_moved_tag_again_removes_the_blobs_only_its_old_manifest_named(lg: Lg, reg: FakeRegistry,
                                                                                   gguf: HubFile,
                                                                                   tmp_path: Path) -> None:
    """docs/models.md: pulling a tag again after it moved (a new model blob, new params) deletes the blobs of its
    old manifest that no pulled manifest names, as Ollama's pull prunes; a blob another tag uses stays."""
    moved = tmp_path / "moved.gguf"
    moved.write_bytes(Path(gguf.source).read_bytes() + b"\0" * 64)  # another blob that is still a GGUF
    new = HubFile(moved)
    blob = lambda f: lg.pulled / "blobs" / f"sha256-{f.sha256}"  # noqa: E731
    params, system = HubFile(PARAMS), HubFile(SYSTEM)
    for tag in ("smollm2:135m", "smollm2:plain"):  # 135m: the GGUF, params, system; plain: the GGUF alone
        assert lg("pull", name(reg, tag)).returncode == 0
    params2 = HubFile(b'{"temperature": 0.5}')
    reg.add("library/smollm2:135m", [("model", new), ("params", params2), ("system", system)])
    r = lg("pull", name(reg))
    assert r.returncode == 0, r.stderr
    assert not blob(params).exists()  # only the old manifest named it
    assert blob(gguf).exists() and blob(system).exists() and blob(new).exists() and blob(params2).exists()
    reg.add("library/smollm2:135m", [("model", gguf), ("params", params), ("system", system)])
    assert lg("pull", name(reg)).returncode == 0
    assert not blob(new).exists() and not blob(params2).exists()  # the model blob the tag left
    assert len(list((lg.pulled / "blobs").iterdir())) == 4  # config, GGUF, params, system
    assert lg("run", "-m", name(reg, "smollm2:plain"), "-p", "Hi", "-n", "2").returncode == 0


def test_two_threads_pulling_one_model_both_succeed(reg: FakeRegistry, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """serve's /api/pull pulls in threads of one process: two pulls of one model at once both write the
    manifest (each through a temporary file of its own: they shared one, and the second's rename failed). Both
    reach the manifest's rename before either does it (a barrier; a pull that waits for the other's blob locks
    goes on after a few seconds)."""
    import os
    import threading

    from localgen.models import ollamastore, registry
    from localgen.models.download import Quiet

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    reg.add("library/tiny:1", [("model", HubFile(b"GGUF" + b"\0" * 60)), ("params", HubFile(PARAMS))])
    target = ollamastore.parse_name(f"{reg.host}/library/tiny:1")
    both = threading.Barrier(2, timeout=3)
    replace = os.replace

    def rename_together(src: str, dst: str) -> None:
        if "manifests" in str(dst):
            with contextlib.suppress(threading.BrokenBarrierError):
                both.wait()
        replace(src, dst)

    monkeypatch.setattr(os, "replace", rename_together)
    errors: list[BaseException] = []

    def pull() -> None:
        try:
            registry.pull(target, Quiet())
        except BaseException as e:  # the test reports it
            errors.append(e)

    threads = [threading.Thread(target=pull) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [], errors
    manifest = tmp_path / "home" / "data" / "ollama" / "manifests" / reg.host / "library" / "tiny" / "1"
    assert manifest.read_bytes() == reg.manifests["library/tiny:1"]
    assert [p.name for p in manifest.parent.iterdir()] == ["1"]  # no temporary file left


def test_rm_waits_for_a_pull_that_holds_a_blob_and_keeps_what_its_manifest_names(lg: Lg, reg: FakeRegistry,
                                                                                  gguf: HubFile) -> None:
    """A pull holds each blob's lock from its fetch until its manifest is written: rm of another model that
    shares the blob waits for that lock (saying so), then keeps the blob the new manifest names; the lock files
    stay (another process may hold one)."""
    from filelock import FileLock

    assert lg("pull", name(reg, "smollm2:plain")).returncode == 0
    manifest = lg.pulled / "manifests" / reg.host / "library" / "smollm2" / "plain"
    raw = manifest.read_bytes()
    blobs = sorted(p.name for p in (lg.pulled / "blobs").iterdir())  # the config and the GGUF
    locks = [FileLock(str(lg.pulled / ".locks" / f"{b}.lock")) for b in blobs]
    for lock in locks:  # as a pull of smollm2:other (the same blobs) holds them before its manifest is written
        lock.acquire(timeout=0)
    rm = subprocess.Popen([sys.executable, "-m", "localgen", "rm", name(reg, "smollm2:plain"), "--yes"],
                          env=lg.env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        assert rm.stderr is not None
        said = ""
        while "waiting for it to finish" not in said and (line := rm.stderr.readline()):
            said += line
        assert f"{blobs[0]}: another process is downloading it; waiting for it to finish" in said, said
        assert all((lg.pulled / "blobs" / b).exists() for b in blobs)
        other = manifest.with_name("other")
        other.parent.mkdir(parents=True, exist_ok=True)  # rm took the empty folders
        other.write_bytes(raw)  # the other pull's manifest, then its locks go
    finally:
        for lock in locks:
            lock.release()
        out, err = rm.communicate(timeout=120)
    assert rm.returncode == 0, err
    assert "freed 0 bytes (2 blob(s) another pulled model or unfinished pull uses were kept)" in out, out
    assert all((lg.pulled / "blobs" / b).exists() for b in blobs) and not manifest.exists()
    assert all((lg.pulled / ".locks" / f"{b}.lock").exists() for b in blobs)
    assert lg("run", "-m", name(reg, "smollm2:other"), "-p", "Hi", "-n", "2").returncode == 0


def test_rm_removes_a_pulled_model_whose_manifest_is_damaged(lg: Lg, reg: FakeRegistry) -> None:
    """docs/models.md: a pulled model whose manifest is damaged is removed all the same, with the blobs no
    other manifest names."""
    for tag in ("smollm2:135m", "smollm2:plain"):
        assert lg("pull", name(reg, tag)).returncode == 0
    manifest = lg.pulled / "manifests" / reg.host / "library" / "smollm2" / "135m"
    manifest.write_bytes(b"{not json")
    r = lg("rm", name(reg), "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"removed {name(reg)}, freed"), r.stdout
    assert not manifest.exists() and len(list((lg.pulled / "blobs").iterdir())) == 2  # plain's config and GGUF
    assert lg("run", "-m", name(reg, "smollm2:plain"), "-p", "Hi", "-n", "2").returncode == 0


@pytest.mark.parametrize(("flag", "how", "online"), [
    ([], {"LOCALGEN_OFFLINE": "1"}, "with LOCALGEN_OFFLINE unset"),
    (["--offline"], {}, "without --offline"),
    ([], {"HF_HUB_OFFLINE": "1"}, "with HF_HUB_OFFLINE unset"),
])
def test_run_pulls_a_model_in_no_store_unless_offline(lg: Lg, reg: FakeRegistry, flag: list[str],
                                                      how: dict[str, str], online: str) -> None:
    """docs/models.md: `run -m ollama:NAME` of a model in neither store downloads it, as a Hub name does;
    offline (--offline, LOCALGEN_OFFLINE=1, HF_HUB_OFFLINE=1) it is one line naming `localgen pull`, which
    offline uses a pulled copy as it is."""
    r = lg("run", "-m", name(reg), "-p", "Hi", "-n", "2", *flag, **how)
    one_line(r, 1, f"no Ollama model {reg.host}/library/smollm2:135m")
    assert f"`localgen pull {name(reg)}` {online} downloads it from {reg.host}" in r.stderr
    one_line(lg("pull", name(reg), *flag, **how), 1, "is not pulled and localgen is offline")
    r = lg("show", name(reg))  # online, but show never downloads
    one_line(r, 1, f"`localgen pull {name(reg)}` downloads it from {reg.host}")
    one_line(lg("pull", name(reg), "--list"), 2, "pull --list lists a Hugging Face repo's quantizations")
    assert reg.requests == []
    r = lg("run", "-m", name(reg), "-p", "Hi", "-n", "2")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert reg.requests[0][1] == "/v2/library/smollm2/manifests/135m"
    asked = len(reg.requests)
    r = lg("pull", name(reg), *flag, **how)
    assert r.returncode == 0 and r.stdout.startswith(name(reg)), r.stderr
    assert f"is pulled (not checked for a newer version on {reg.host})" in r.stderr
    assert len(reg.requests) == asked  # nothing asked of the registry


def _no_model(reg: FakeRegistry) -> None:
    reg.add("library/textonly:1", [("params", HubFile(PARAMS))])


def _mlx(reg: FakeRegistry) -> None:
    """As Ollama's MLX and safetensors tags (-nvfp4, mxfp8, mlx...): big tensor layers and no model layer."""
    reg.add("library/mlx:1", [("tensor", HubFile(b"t")), ("tokenizer", HubFile(b"k"))])
    doc = json.loads(reg.manifests["library/mlx:1"])
    doc["layers"][0]["size"] = 3 << 30
    doc["layers"][1]["size"] = 2 << 20
    reg.manifests["library/mlx:1"] = json.dumps(doc).encode()


def _big_manifest(reg: FakeRegistry) -> None:
    reg.manifests["library/big:1"] = b" " * (1 << 20) + reg.manifests["library/smollm2:plain"]


def _big_layer(reg: FakeRegistry) -> None:
    reg.add("library/big:1", [("model", HubFile(b"x")), ("system", HubFile(b"y"))])
    doc = json.loads(reg.manifests["library/big:1"])
    doc["layers"][1]["size"] = 2 << 20
    reg.manifests["library/big:1"] = json.dumps(doc).encode()


def _no_room(reg: FakeRegistry) -> None:
    reg.add("library/big:1", [("model", HubFile(b"x"))])
    doc = json.loads(reg.manifests["library/big:1"])
    doc["layers"][0]["size"] = 1 << 40  # 1 TiB: within a model layer's limit, beyond this disk
    reg.manifests["library/big:1"] = json.dumps(doc).encode()


@pytest.mark.parametrize(("model", "setup", "says"), [
    ("nothere", None, "has no model library/nothere with the tag latest (404)"),
    ("smollm2:nosuchtag", None, "has no model library/smollm2 with the tag nosuchtag (404)"),
    ("textonly:1", _no_model, "has no GGUF model layer in its manifest: localgen cannot run it"),
    ("mlx:1", _mlx, "has no GGUF model layer in its manifest: localgen cannot run it"),
    ("big:1", _big_manifest, "a manifest over 1,048,576 bytes is refused"),
    ("big:1", _big_layer, "its system layer is 2,097,152 bytes, over the 1,048,576 localgen takes"),
    ("big:1", _no_room, "not enough disk space for"),
])
def test_registry_errors_are_one_line_before_any_blob(lg: Lg, reg: FakeRegistry, model: str, setup: object,
                                                      says: str) -> None:
    if callable(setup):
        setup(reg)
    one_line(lg("pull", name(reg, model)), 1, says)
    assert [p for _, p, _, _ in reg.requests if "/blobs/" in p] == []
    assert not (lg.pulled / "manifests").exists()


def test_a_registry_over_its_rate_is_asked_again(lg: Lg, reg: FakeRegistry) -> None:
    """docs/models.md: a 429 for the manifest (Retry-After: 1) is retried as a 5xx is."""
    reg.fail_statuses.extend([429, 503])
    r = lg("pull", name(reg, "smollm2:plain"))
    assert r.returncode == 0, r.stderr
    assert [p for _, p, _, _ in reg.requests[:3]] == ["/v2/library/smollm2/manifests/plain"] * 3, reg.requests


def test_a_registry_that_wants_a_login_refuses_in_one_line(lg: Lg, reg: FakeRegistry) -> None:
    reg.fail_statuses.append(401)
    one_line(lg("pull", name(reg)), 1, f"{reg.host} refused the manifest of {reg.host}/library/smollm2:135m (401)")
    assert len(reg.requests) == 1 and not (lg.pulled / "manifests").exists()


@pytest.mark.parametrize(("host", "why"), [("127.0.0.1:1", "connection refused"),
                                         ("registry.invalid", "")])  # .invalid never resolves (RFC 2606)
def test_an_unreachable_registry_is_named_with_the_reason(lg: Lg, host: str, why: str) -> None:
    r = lg("pull", f"ollama:{host}/library/smollm2")
    one_line(r, 1, f"cannot reach the registry {host}: {why}")
    assert ">" not in r.stderr and "urlopen" not in r.stderr, r.stderr  # the reason alone, not urllib's wrapping


@pytest.mark.parametrize("bad", ["ollama:a/../b", "ollama:../x", "ollama:127.0.0.1:1/../x/y", "ollama:x:.."])
def test_a_name_that_leaves_the_store_is_refused_before_any_request(lg: Lg, reg: FakeRegistry, bad: str) -> None:
    for cmd in (("pull", bad), ("run", "-m", bad, "-p", "x"), ("rm", bad, "--yes")):
        one_line(lg(*cmd), 2, "is not an Ollama model name")
    assert reg.requests == [] and not lg.pulled.exists()


def test_only_a_loopback_registry_is_spoken_to_over_http() -> None:
    from localgen.models.registry import base_url

    assert base_url("registry.ollama.ai") == "https://registry.ollama.ai"
    assert base_url("10.0.0.1:5000") == "https://10.0.0.1:5000"
    assert base_url("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert base_url("localhost") == "http://localhost"


def test_serve_pulls_an_ollama_name_over_ollama_s_api_and_deletes_it(env: dict[str, str], reg: FakeRegistry,
                                                                    gguf: HubFile, tmp_path: Path) -> None:
    """docs/models.md "Models from Ollama's library": serve's /api/pull takes an ollama: name as `localgen pull`
    does (progress lines, the blobs in localgen's pulled models), the model then answers and is listed, a model
    Ollama's own store holds is here already (nothing asked of the registry), a tag the registry lacks is a 404,
    and /api/delete removes the pulled copy, unloading that tag alone (not another tag on the same blob); a
    registry on a loopback address is a 403 without serve --allow-private-urls."""
    import httpx
    import ollama

    from tests.test_serve import Server

    model = name(reg, "smollm2:plain")
    s = Server({**env, "LOCALGEN_HOME": str(tmp_path / "serve-home")}, "-np", "1", "--ctx", "512")
    try:  # a registry on a loopback or private address: not for a client to make the server reach
        r = httpx.post(f"{s.url}/api/pull", json={"model": model, "stream": False}, timeout=60)
        assert r.status_code == 403 and "is a loopback address" in r.json()["error"], r.text
        assert "--allow-private-urls" in r.json()["error"] and reg.requests == []
    finally:
        assert s.stop() == 0
    s = Server({**env, "LOCALGEN_HOME": str(tmp_path / "serve-home")}, "-np", "1", "--ctx", "512",
               "--allow-private-urls", "--max-models", "2")
    try:
        client = ollama.Client(host=s.url)
        lines = list(client.pull(model, stream=True))
        statuses = [x.status for x in lines]
        assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
        assert any(x.total == gguf.size and x.completed == gguf.size for x in lines), lines
        assert f"/v2/library/smollm2/blobs/sha256:{gguf.sha256}" in [p for _, p, _, _ in reg.requests]
        assert model in [m.model for m in client.list().models]
        r = client.generate(model=model, prompt="Say hi.", options={"num_predict": 3, "temperature": 0})
        assert r.done and r.eval_count and r.eval_count <= 3
        ollamas = OllamaStore(Path(env["OLLAMA_MODELS"]))  # Ollama's own store holds this one: nothing to pull
        theirs = ollamas.manifest("theirs:1", [ollamas.blob(MEDIA + "model", Path(gguf.source))], host=reg.host)
        try:
            before = len(reg.requests)
            lines = list(client.pull(name(reg, "theirs:1"), stream=True))
            assert lines[-1].status == "success" and len(reg.requests) == before, (lines, reg.requests)
        finally:  # the module's Ollama store is empty again
            for made in theirs.parents[4].iterdir():
                shutil.rmtree(made)
        r2 = httpx.post(f"{s.url}/api/pull", json={"model": name(reg, "smollm2:none"), "stream": False}, timeout=60)
        assert r2.status_code == 404 and "with the tag none (404)" in r2.json()["error"], r2.text
        other = name(reg, "smollm2:135m")  # the same GGUF blob: its worker stays when plain is deleted
        assert list(client.pull(other, stream=True))[-1].status == "success"
        assert client.generate(model=other, prompt="Hi", options={"num_predict": 2}).done
        client.delete(model)
        assert model not in [m.model for m in client.list().models]
        assert [m.model for m in client.ps().models] == [other]
        client.delete(other)
        assert not list((tmp_path / "serve-home" / "data" / "ollama" / "blobs").iterdir())
    finally:
        assert s.stop() == 0
        log = s.proc.stderr.read().decode() if s.proc.stderr else ""
    assert "Traceback" not in log, log


def test_serve_pull_checks_where_each_connection_lands_not_only_the_name(
        served: FakeRegistry, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    """DNS rebinding: a registry's name that answers a public address to serve's check and 127.0.0.1 to the
    connection reached this machine's ports, and the client read which answered in the raw error (`[SSL:
    WRONG_VERSION_NUMBER]`, `connection refused`). The connection's peer is checked before TLS; the client is told
    `cannot reach the registry HOST`, the server's log why."""
    import socket

    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    real = socket.getaddrinfo
    lookups = []

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.test":  # TTL 0: public once, then loopback
            lookups.append(host)
            return real("93.184.216.34" if len(lookups) == 1 else "127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    host = f"rebind.test:{served.host.rpartition(':')[2]}"
    with TestClient(build(ServeState(workers={}), Policy(check_host=False))) as client:
        r = client.post("/api/pull", json={"model": f"ollama:{host}/library/smollm2:plain", "stream": False})
    assert r.status_code == 502 and r.json()["error"] == f"cannot reach the registry {host}", r.text
    assert len(lookups) > 1, "the name was looked up again to connect"
    assert "rebind.test is at a loopback address" in capfd.readouterr().err
