"""A Hub repo that moves to a new commit: a pull of the new revision replaces the old revision's copy of the same
file (after the new one is whole and verified), `list` names the model once, and a pull that fails leaves the old
revision usable. A commit another ref still names, and the old revision's other files, stay."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import hub_server
from tests.conftest import ROOT

REPO = "acme/Moving-GGUF"
FILE = "smollm2-135m-instruct-Q4_1.gguf"
OTHER = "smollm2-135m-instruct-Q8_0.gguf"
OLD = hashlib.sha1(b"old").hexdigest()
NEW = hashlib.sha1(b"new").hexdigest()


@pytest.fixture(scope="module")
def fake_hub() -> Iterator[hub_server.FakeHub]:
    hub, server = hub_server.start()
    yield hub
    server.shutdown()
    server.cdn.shutdown()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def old_file(smollm2_path: Path) -> hub_server.HubFile:
    return hub_server.HubFile(smollm2_path)


@pytest.fixture(scope="module")
def new_file(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> hub_server.HubFile:
    """The same model with other bytes: one letter of its general.name changed (a GGUF that loads all the same)."""
    data = bytearray(smollm2_path.read_bytes())
    at = data.index(b"Smollm2 135M", 0, 4096)
    data[at + 6] = ord("3")
    path = tmp_path_factory.mktemp("revisions") / FILE
    path.write_bytes(bytes(data))
    return hub_server.HubFile(path)


@pytest.fixture
def env(cli_env: dict[str, str], fake_hub: hub_server.FakeHub, old_file: hub_server.HubFile,
        tmp_path: Path) -> dict[str, str]:
    fake_hub.reset()
    fake_hub.repos[REPO] = hub_server.HubRepo(OLD, {FILE: old_file, OTHER: old_file})
    e = {k: v for k, v in cli_env.items() if k != "HF_HUB_OFFLINE"}
    e.update(HF_ENDPOINT=fake_hub.url, HF_HUB_CACHE=str(tmp_path / "hf"), LOCALGEN_HOME=str(tmp_path / "home"))
    return e


def lg(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localgen", *args], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT, stdin=subprocess.DEVNULL)


def repo_dir(env: dict[str, str]) -> Path:
    return Path(env["HF_HUB_CACHE"]) / ("models--" + REPO.replace("/", "--"))


def listed(env: dict[str, str]) -> list[dict[str, str]]:
    r = lg(env, "list", "--json")
    assert r.returncode == 0, r.stderr
    return [i for i in json.loads(r.stdout) if REPO in i["name"]]


def move(hub: hub_server.FakeHub, new_file: hub_server.HubFile) -> None:
    """The repo's next commit: FILE's bytes changed, OTHER's not."""
    repo = hub.repos[REPO]
    hub.repos[REPO] = hub_server.HubRepo(NEW, {FILE: new_file, OTHER: repo.files[OTHER]})


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_pull_of_a_new_revision_replaces_the_old_copy(env: dict[str, str], fake_hub: hub_server.FakeHub,
                                                       old_file: hub_server.HubFile,
                                                       new_file: hub_server.HubFile) -> None:
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    old_blob = repo_dir(env) / "blobs" / old_file.sha256
    assert old_blob.is_file()
    move(fake_hub, new_file)
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert f"replaced the copy of {FILE} at the older revision {OLD[:12]}, freed 94 MiB" in r.stderr, r.stderr
    items = listed(env)
    assert [i["name"] for i in items] == [f"{REPO}:Q4_1"], items
    assert Path(items[0]["path"]) == repo_dir(env) / "snapshots" / NEW / FILE
    assert not old_blob.exists() and not (repo_dir(env) / "snapshots" / OLD).exists()
    assert sha256(Path(items[0]["path"])) == new_file.sha256
    assert (repo_dir(env) / "refs" / "main").read_text() == NEW
    shown = json.loads(lg(env, "show", f"{REPO}:Q4_1", "--json").stdout)
    assert shown["sha256"] == new_file.sha256
    r = lg(env, "run", "-m", f"{REPO}:Q4_1", "--offline", "-p", "Hi", "-n", "2")
    assert r.returncode == 0, r.stderr
    r = lg(env, "pull", f"{REPO}:Q4_1")  # the same revision again: nothing to replace
    assert r.returncode == 0 and "replaced" not in r.stderr, r.stderr


def test_a_pull_that_fails_leaves_the_old_revision_usable(env: dict[str, str], fake_hub: hub_server.FakeHub,
                                                          old_file: hub_server.HubFile,
                                                          new_file: hub_server.HubFile) -> None:
    from localgen.models.download import ATTEMPTS

    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    move(fake_hub, new_file)
    fake_hub.drop_after[FILE] = [20_000_000] * (ATTEMPTS + 1)  # cut there, then at once on every try after
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 1 and f"downloading {FILE} failed after" in r.stderr, r.stderr
    fake_hub.drop_after.clear()
    old_blob = repo_dir(env) / "blobs" / old_file.sha256
    assert old_blob.is_file() and sha256(old_blob) == old_file.sha256
    assert (repo_dir(env) / "blobs" / (new_file.sha256 + ".incomplete")).is_file()
    items = listed(env)
    assert [i["name"] for i in items] == [f"{REPO}:Q4_1"], items
    assert Path(items[0]["path"]) == repo_dir(env) / "snapshots" / OLD / FILE
    r = lg(env, "run", "-m", f"{REPO}:Q4_1", "--offline", "-p", "Hi", "-n", "2")
    assert r.returncode == 0, r.stderr
    r = lg(env, "pull", f"{REPO}:Q4_1")  # the next pull resumes, and only then replaces the old copy
    assert r.returncode == 0 and "resuming at" in r.stderr and "replaced the copy" in r.stderr, r.stderr
    assert not old_blob.exists()
    assert [i["name"] for i in listed(env)] == [f"{REPO}:Q4_1"]


def test_other_files_and_a_commit_another_ref_names_stay(env: dict[str, str], fake_hub: hub_server.FakeHub,
                                                         old_file: hub_server.HubFile,
                                                         new_file: hub_server.HubFile) -> None:
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    assert lg(env, "pull", f"{REPO}:Q8_0").returncode == 0  # the same bytes: one blob, two links
    move(fake_hub, new_file)
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    snaps = repo_dir(env) / "snapshots"
    assert not (snaps / OLD / FILE).exists() and (snaps / OLD / OTHER).is_file(), "another file of the old revision"
    assert (repo_dir(env) / "blobs" / old_file.sha256).is_file(), "its blob, which the other file uses"
    assert "freed 0 bytes" in r.stderr, r.stderr
    assert sorted(i["name"] for i in listed(env)) == [f"{REPO}:Q4_1", f"{REPO}:Q8_0"]

    # a tag (a ref huggingface_hub or a pull by that name wrote) that names the old commit keeps its copy
    shutil.rmtree(repo_dir(env))
    fake_hub.repos[REPO] = hub_server.HubRepo(OLD, {FILE: old_file, OTHER: old_file})
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    (repo_dir(env) / "refs" / "v1").write_text(OLD)
    move(fake_hub, new_file)
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0 and "replaced" not in r.stderr, r.stderr
    assert (snaps / OLD / FILE).is_file() and (snaps / NEW / FILE).is_file()
    tagged = f"{REPO}/resolve/v1/{FILE}"  # the older copy is listed by the name that runs it, never as a twin
    items = {i["name"]: i["path"] for i in listed(env)}
    assert items == {f"{REPO}:Q4_1": str(snaps / NEW / FILE), tagged: str(snaps / OLD / FILE)}, items
    shown = json.loads(lg(env, "show", tagged, "--offline", "--json").stdout)
    assert shown["sha256"] == old_file.sha256
    (repo_dir(env) / "refs" / "v1").unlink()  # no ref names it (another tool kept it): named by its commit
    assert f"{REPO}/resolve/{OLD}/{FILE}" in {i["name"] for i in listed(env)}
