"""A Hub repo that moves to a new commit: a pull of the new revision replaces the old revision's copy of the same
file (after the new one is whole and verified), `list` names the model once, and a pull that fails leaves the old
revision usable. A commit another ref still names, and the old revision's other files, stay. A split model's ref
moves only after its last part; serve's /api/pull replaces too (a status line); a move for another file (a README)
is said nowhere; a copy one of whose files is in use is kept whole.

A model named at a commit (owner/repo/resolve/COMMIT/FILE, as a pasted URL names it) means those bytes: a pull that
moves main off that commit keeps the older copy where a preset pins it (by that name, or by its file's path), or
where it was pulled by that name, and says so (it removed it, and the preset then ran main's new bytes without a
word, or, made from the file's path, could not find its file); a pinned name whose copy is gone is never answered
with another commit's file: offline it says which revision the cache holds, online it pulls its own commit again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import hub_server
from tests.conftest import ROOT

REPO = "acme/Moving-GGUF"
FILE = "smollm2-135m-instruct-Q4_1.gguf"
OTHER = "smollm2-135m-instruct-Q8_0.gguf"
OLD = hashlib.sha1(b"old").hexdigest()
NEW = hashlib.sha1(b"new").hexdigest()
PIN = f"{REPO}/resolve/{OLD}/{FILE}"


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


def lg(env: dict[str, str], *args: str, stdin: str | None = None,
       timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localgen", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL)


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


def test_a_move_for_another_file_says_nothing(env: dict[str, str], fake_hub: hub_server.FakeHub,
                                              old_file: hub_server.HubFile) -> None:
    """The repo's next commit edits its README only: the model's blob is the same, so the older commit's link goes
    unsaid (it said "replaced ..., freed 0 bytes" on each such pull)."""
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    fake_hub.repos[REPO] = hub_server.HubRepo(NEW, {FILE: old_file, OTHER: old_file,
                                                   "README.md": hub_server.HubFile(b"# a new line\n")})
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0 and "replaced" not in r.stderr and "kept" not in r.stderr, r.stderr
    snaps = repo_dir(env) / "snapshots"
    assert not (snaps / OLD / FILE).exists() and (snaps / NEW / FILE).is_file()
    assert (repo_dir(env) / "blobs" / old_file.sha256).is_file(), "the one blob, the new commit's too"
    assert [i["name"] for i in listed(env)] == [f"{REPO}:Q4_1"]


SPLIT = "acme/Moving-Split-GGUF"


@pytest.fixture(scope="module")
def split_revisions(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
                    ) -> tuple[dict[str, hub_server.HubFile], dict[str, hub_server.HubFile]]:
    """A split model (two parts) at two commits, every part's bytes changed (part 1: a letter of general.name;
    part 2: its last byte)."""
    from tests.gguf_split import split_model

    parts = split_model(smollm2_path, tmp_path_factory.mktemp("split-old"), "smol-Q4_1", 150)
    assert len(parts) == 2
    folder = tmp_path_factory.mktemp("split-new")
    first, second = bytearray(parts[0].read_bytes()), bytearray(parts[1].read_bytes())
    at = first.index(b"Smollm2 135M")
    first[at + 6] = ord("3")
    second[-1] ^= 0xFF
    (folder / parts[0].name).write_bytes(bytes(first))
    (folder / parts[1].name).write_bytes(bytes(second))
    return ({p.name: hub_server.HubFile(p) for p in parts},
            {p.name: hub_server.HubFile(folder / p.name) for p in parts})


def test_a_split_pull_cut_after_part_1_leaves_the_ref_and_the_old_copy(
        env: dict[str, str], fake_hub: hub_server.FakeHub,
        split_revisions: tuple[dict[str, hub_server.HubFile], dict[str, hub_server.HubFile]]) -> None:
    """The ref moved with the first part: a pull cut in part 2 left refs/main at the new commit, so an offline run
    picked the new copy (part 2 missing) and the next pull replaced nothing."""
    from localgen.models.download import ATTEMPTS

    old, new = split_revisions
    first, second = sorted(old)
    fake_hub.repos[SPLIT] = hub_server.HubRepo(OLD, dict(old))
    assert lg(env, "pull", f"{SPLIT}:Q4_1").returncode == 0
    base = Path(env["HF_HUB_CACHE"]) / ("models--" + SPLIT.replace("/", "--"))
    fake_hub.repos[SPLIT] = hub_server.HubRepo(NEW, dict(new))
    fake_hub.drop_after[second] = [new[second].size // 2] * (ATTEMPTS + 1)
    r = lg(env, "pull", f"{SPLIT}:Q4_1")
    assert r.returncode == 1 and f"downloading {second} failed after" in r.stderr, r.stderr
    fake_hub.drop_after.clear()
    assert (base / "blobs" / new[first].sha256).is_file(), "part 1 came whole"
    assert (base / "refs" / "main").read_text() == OLD
    r = lg(env, "run", "-m", f"{SPLIT}:Q4_1", "--offline", "-p", "Hi", "-n", "2")
    assert r.returncode == 0, r.stderr
    items = {i["name"]: i["path"] for i in json.loads(lg(env, "list", "--json").stdout) if SPLIT in i["name"]}
    assert items[f"{SPLIT}:Q4_1"] == str(base / "snapshots" / OLD / first), items
    r = lg(env, "pull", f"{SPLIT}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert f"replaced the copy of {first} at the older revision {OLD[:12]}, freed " in r.stderr, r.stderr
    assert (base / "refs" / "main").read_text() == NEW
    assert not (base / "snapshots" / OLD).exists()
    assert sorted(b.name for b in (base / "blobs").iterdir()) == sorted(f.sha256 for f in new.values())


def test_serves_api_pull_replaces_the_old_copy_with_a_status_line(
        env: dict[str, str], fake_hub: hub_server.FakeHub, old_file: hub_server.HubFile,
        new_file: hub_server.HubFile, monkeypatch: pytest.MonkeyPatch) -> None:
    """/api/pull goes through the same pull: the older copy goes, said as a status line of Ollama's stream."""
    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    for k in ("HF_ENDPOINT", "HF_HUB_CACHE", "LOCALGEN_HOME"):
        monkeypatch.setenv(k, env[k])
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    client = TestClient(build(ServeState(workers={}), Policy(check_host=False)))

    def pull() -> list[dict[str, object]]:
        r = client.post("/api/pull", json={"model": f"{REPO}:Q4_1"})
        assert r.status_code == 200, r.text
        return [json.loads(line) for line in r.text.splitlines()]

    assert pull()[-1] == {"status": "success"}
    move(fake_hub, new_file)
    lines = pull()
    said = f"replaced the copy of {FILE} at the older revision {OLD[:12]}, freed 94 MiB"
    assert {"status": said} in lines and lines[-1] == {"status": "success"}, lines
    assert not (repo_dir(env) / "blobs" / old_file.sha256).exists()
    assert not (repo_dir(env) / "snapshots" / OLD).exists()


def _held_cache(root: Path) -> tuple[Path, list[Path]]:
    """A split model in a cache made as on Windows without symlinks (hard links to the blobs), at commits OLD and
    NEW (refs/main: NEW); returns the repo folder and OLD's parts."""
    base = root / "models--acme--Held-GGUF"
    parts = []
    for commit, text in ((OLD, b"old"), (NEW, b"new")):
        for i in (1, 2):
            data = text + bytes([i])
            blob = base / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            link = base / "snapshots" / commit / f"held-Q4_0-0000{i}-of-00002.gguf"
            link.parent.mkdir(parents=True, exist_ok=True)
            os.link(blob, link)
            if commit == OLD:
                parts.append(link)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(NEW)
    return base, parts


def _in_use(monkeypatch: pytest.MonkeyPatch, held: Path) -> None:
    """Windows' refusal to rename or delete a file a running model holds open, for the file `held` is."""
    ino = held.stat().st_ino

    def refusing(real: Any) -> Any:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                held_now = os.stat(path, follow_symlinks=False).st_ino == ino
            except OSError:
                held_now = False
            if held_now:
                raise PermissionError(13, "The process cannot access the file because it is being used by "
                                          "another process", str(path))
            return real(path, *args, **kwargs)
        return call

    for name in ("unlink", "remove", "replace", "rename"):
        monkeypatch.setattr(os, name, refusing(getattr(os, name)))


def test_a_copy_whose_later_part_is_in_use_is_kept_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          cli_in_process: Any) -> None:
    """rm and the replacement of an older copy removed a split model's parts first to last: a later part in use
    left part 1 gone, the model broken, while the pull said the copy was kept."""
    from localgen.models import resolve, store
    from localgen.models.download import Quiet
    from tests.conftest import InProcessCLI

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    base, parts = _held_cache(tmp_path / "hf")
    everything = sorted(p for p in base.rglob("*") if p.is_file())
    _in_use(monkeypatch, parts[1])
    with pytest.raises(PermissionError):
        store.replace_older("acme/Held-GGUF", "main", OLD, str(base / "snapshots" / NEW / parts[0].name))
    assert sorted(p for p in base.rglob("*") if p.is_file()) == everything, "nothing of the old copy went"
    notes: list[str] = []  # what a pull says of it (its progress's note: stderr, or /api/pull's status line)
    progress = Quiet()
    progress.note = notes.append  # type: ignore[method-assign,assignment]
    resolve.replace_older("acme/Held-GGUF", "main", OLD, base / "snapshots" / NEW / parts[0].name, progress)
    assert notes == [f"the copy of {parts[0].name} at the older revision {OLD[:12]} was kept: The process cannot "
                     "access the file because it is being used by another process"], notes
    assert sorted(p for p in base.rglob("*") if p.is_file()) == everything

    cli = InProcessCLI({**cli_in_process.env, "HF_HUB_CACHE": str(tmp_path / "hf"),
                        "LOCALGEN_HOME": str(tmp_path / "home")})
    r = cli("rm", "acme/Held-GGUF:Q4_0", "--yes")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "being used by another process" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert sorted(p for p in base.rglob("*") if p.is_file()) == everything, "rm removed nothing"
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    r = cli("rm", "acme/Held-GGUF:Q4_0", "--yes")  # no longer in use: it goes, every part of both copies
    assert r.returncode == 0 and "removed 4 file(s), freed 16 bytes" in r.stdout, (r.stdout, r.stderr)
    assert not base.exists(), sorted(base.rglob("*"))  # nothing of the repo left: its folder went too


def test_what_a_killed_removal_set_aside_goes_at_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """store.remove sets each file aside (a hidden name) before it unlinks them: a process killed in between left
    a blob's bytes that no listing sees. The next removal in that repo deletes what a process no longer running
    set aside, and leaves a running one's."""
    import subprocess
    import sys

    from localgen.models import store

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    base, parts = _held_cache(tmp_path / "hf")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = base / "blobs" / f".{'a' * 64}.{int(dead.stdout)}.removing"
    left.write_bytes(b"a killed removal's blob")
    link_left = base / "snapshots" / OLD / f".held-Q4_0-00001-of-00002.gguf.{int(dead.stdout)}.removing"
    link_left.write_bytes(b"x")
    running = base / "blobs" / f".{'b' * 64}.{os.getppid()}.removing"
    running.write_bytes(b"a removal going on now")
    store.remove([], [parts[0]])  # what was set aside within the hour is kept
    assert left.exists() and link_left.exists() and running.exists(), \
        "what was set aside lately is left alone (a process of another machine, sharing the cache, may be removing)"
    monkeypatch.setattr(store, "STALE_S", -1)  # an hour later
    store.remove([], [parts[1]])
    assert not left.exists() and not link_left.exists(), "a dead process's old leftovers deleted"
    assert running.exists(), "a running process's left alone"
    assert not (base / "snapshots" / OLD).exists()


def test_a_removal_passes_over_a_file_gone_meanwhile(tmp_path: Path) -> None:
    """store.remove's all-or-nothing: a file another removal took meanwhile is nothing to remove, not a failure
    that puts the rest back (listed twice here: the second rename finds it gone)."""
    from localgen.models import store

    _, parts = _held_cache(tmp_path / "hf")
    links, _ = store.remove([], [parts[0], parts[0], parts[1]])
    assert not parts[0].exists() and not parts[1].exists() and len(links) == 3


def sha_of(env: dict[str, str], name: str) -> str:
    r = lg(env, "show", name, "--offline", "--json")
    assert r.returncode == 0, r.stderr
    return str(json.loads(r.stdout)["sha256"])


def test_a_pull_that_moves_main_keeps_the_copy_a_preset_pins(env: dict[str, str], fake_hub: hub_server.FakeHub,
                                                             old_file: hub_server.HubFile,
                                                             new_file: hub_server.HubFile) -> None:
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    old_copy = repo_dir(env) / "snapshots" / OLD / FILE
    r = lg(env, "create", "pinned", "-f", "-", stdin=f"FROM {PIN}\nPARAMETER temperature 0\n")
    assert r.returncode == 0, r.stderr
    r = lg(env, "create", "bypath", "-f", "-", stdin=f"FROM {old_copy}\n")  # kept as the blob's path
    assert r.returncode == 0, r.stderr
    fake_hub.repos[REPO] = hub_server.HubRepo(NEW, {FILE: new_file})
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert (f"kept the copy of {FILE} at the older revision {OLD[:12]}: the presets bypath, pinned name it"
            in r.stderr), r.stderr
    assert "replaced" not in r.stderr, r.stderr
    assert old_copy.is_file() and (repo_dir(env) / "snapshots" / NEW / FILE).is_file()
    assert sha_of(env, "pinned") == old_file.sha256, "the preset runs the bytes of the commit it names"
    assert sha_of(env, "bypath") == old_file.sha256
    assert sha_of(env, f"{REPO}:Q4_1") == new_file.sha256
    r = lg(env, "run", "-m", "pinned", "--offline", "-p", "Hi", "-n", "2")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    names = {i["name"] for i in json.loads(lg(env, "list", "--json").stdout) if REPO in i["name"]}
    assert names == {f"{REPO}:Q4_1", PIN}, names
    r = lg(env, "pull", f"{REPO}:Q4_1")  # the same commit again: nothing to keep or replace, nothing said
    assert r.returncode == 0 and "kept" not in r.stderr and "replaced" not in r.stderr, r.stderr


def scanned_refs(env: dict[str, str]) -> dict[str, set[str]]:
    """What huggingface_hub's own scan of the cache reads: each revision and the refs that name it (a ref naming a
    commit the cache lacks makes it call the repo corrupted: a warning, and the repo left out)."""
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(env["HF_HUB_CACHE"])
    assert not info.warnings, info.warnings
    return {r.commit_hash: set(r.refs) for repo in info.repos for r in repo.revisions}


def test_a_name_pulled_by_its_commit_stays_when_main_moves(env: dict[str, str], fake_hub: hub_server.FakeHub,
                                                           old_file: hub_server.HubFile,
                                                           new_file: hub_server.HubFile) -> None:
    """A file pulled by its commit's name (owner/repo/resolve/COMMIT/FILE, typed once, no preset) means those bytes:
    main's pull that moved off that commit removed it, so the name could not run offline and online downloaded it
    again. The pull pins it (refs/localgen-pins/COMMIT/FILE, a ref huggingface_hub's scan reads as naming that
    revision); main's pull keeps it and says so, and keeps none of the commit's other files. `rm` of the name takes
    its copy and its pin, never main's copy; then the name is never answered with another commit's file: offline it
    says which revision the cache holds, and online `run` pulls its commit again, pinned again."""
    assert lg(env, "pull", PIN).returncode == 0
    pin = repo_dir(env) / "refs" / "localgen-pins" / OLD / FILE
    assert pin.read_text() == OLD
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0  # main at the same commit: refs/main names it
    fake_hub.repos[REPO] = hub_server.HubRepo(NEW, {FILE: new_file})
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert (f"kept the copy of {FILE} at the older revision {OLD[:12]}: it was pulled by that commit (`localgen rm "
            f"{PIN}` removes it)\n" in r.stderr and "replaced" not in r.stderr), r.stderr
    snapshots = repo_dir(env) / "snapshots"
    assert (snapshots / OLD / FILE).is_file() and (snapshots / NEW / FILE).is_file()
    assert sha_of(env, PIN) == old_file.sha256 and sha_of(env, f"{REPO}:Q4_1") == new_file.sha256
    r = lg(env, "run", "-m", PIN, "--offline", "-p", "Hi", "-n", "2")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert {i["name"] for i in listed(env)} == {f"{REPO}:Q4_1", PIN}
    assert scanned_refs(env) == {OLD: {f"localgen-pins/{OLD}/{FILE}"}, NEW: {"main"}}
    r = lg(env, "pull", f"{REPO}:Q4_1")  # the same commit again: nothing to keep or replace, nothing said
    assert r.returncode == 0 and "kept" not in r.stderr and "replaced" not in r.stderr, r.stderr

    r = lg(env, "rm", PIN, "--yes")
    assert r.returncode == 0, r.stderr
    assert not (snapshots / OLD).exists() and (snapshots / NEW / FILE).is_file()
    assert not (repo_dir(env) / "refs" / "localgen-pins").exists()
    assert scanned_refs(env) == {NEW: {"main"}}
    for args in (["show", PIN, "--offline"], ["run", "-m", PIN, "--offline", "-p", "Hi", "-n", "2"]):
        r = lg(env, *args)
        assert (r.returncode, r.stdout) == (1, ""), (args, r.returncode, r.stdout)
        assert r.stderr == (f"localgen: error: {REPO}/{FILE} at revision {OLD[:12]} is not in the cache and localgen "
                            f"is offline (the cache holds it at {NEW[:12]} only) (fetch that revision without "
                            f"--offline: localgen pull {PIN})\n"), r.stderr
    fake_hub.repos[REPO] = hub_server.HubRepo(OLD, {FILE: old_file})  # the Hub keeps every commit: OLD's again
    r = lg(env, "run", "-m", PIN, "-p", "Hi", "-n", "2")  # a run that downloads by the commit's name pins too
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert pin.read_text() == OLD
    assert sha_of(env, PIN) == old_file.sha256 and sha_of(env, f"{REPO}:Q4_1") == new_file.sha256


def test_a_pin_keeps_its_file_only_and_the_same_bytes_too(env: dict[str, str], fake_hub: hub_server.FakeHub,
                                                          old_file: hub_server.HubFile,
                                                          new_file: hub_server.HubFile) -> None:
    """A pin keeps the file pulled by its commit's name, not the commit's other files: main's pull of another
    file replaces that one's older copy as ever. Main moves for a README: the pinned file is the same blob at the
    new commit, and its older link went without a word, so the name's own commit had no copy (offline: "the cache
    holds it at NEW only"); it stays, without a word. `rm` of main's name takes every copy and the pin with it."""
    assert lg(env, "pull", PIN).returncode == 0
    assert lg(env, "pull", f"{REPO}:Q8_0").returncode == 0  # main at the pinned commit, for another file
    fake_hub.repos[REPO] = hub_server.HubRepo(NEW, {FILE: new_file, OTHER: new_file})
    r = lg(env, "pull", f"{REPO}:Q8_0")
    assert r.returncode == 0 and f"replaced the copy of {OTHER} at the older revision {OLD[:12]}" in r.stderr, r.stderr
    snapshots = repo_dir(env) / "snapshots"
    assert (snapshots / OLD / FILE).is_file() and not (snapshots / OLD / OTHER).exists()

    shutil.rmtree(repo_dir(env))
    fake_hub.repos[REPO] = hub_server.HubRepo(OLD, {FILE: old_file})
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    assert lg(env, "pull", PIN).returncode == 0  # a file the cache holds already: pinned all the same
    assert (repo_dir(env) / "refs" / "localgen-pins" / OLD / FILE).read_text() == OLD
    fake_hub.repos[REPO] = hub_server.HubRepo(NEW, {FILE: old_file, "README.md": hub_server.HubFile(b"# more\n")})
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0 and "kept" not in r.stderr and "replaced" not in r.stderr, r.stderr
    snapshots = repo_dir(env) / "snapshots"
    assert (snapshots / OLD / FILE).is_file() and (snapshots / NEW / FILE).is_file()
    r = lg(env, "run", "-m", PIN, "--offline", "-p", "Hi", "-n", "2")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = lg(env, "rm", f"{REPO}:Q4_1", "--yes")  # every commit's copy of it
    assert r.returncode == 0, r.stderr
    assert not (snapshots / OLD).exists() and not (snapshots / NEW / FILE).exists()
    assert not (repo_dir(env) / "refs" / "localgen-pins").exists()


OFFLINE_MISSING = (f"localgen: error: {REPO}:Q4_1 is not in the cache and localgen is offline (nothing is cached "
                   "yet; pull without --offline)\n")


def test_rm_of_every_copy_leaves_no_ref_to_a_commit_it_removed(env: dict[str, str]) -> None:
    """`rm` of a model's every copy left refs/main naming a commit whose snapshot it had removed: huggingface_hub's
    scan_cache_dir then called the whole repo corrupted (`hf cache ls` left it out with a warning); then, the ref
    gone, an empty models--OWNER--REPO folder that `hf cache ls` listed as a repo of 0 bytes. The ref goes with its
    snapshot, and the folder with its last file, as the hub's own delete strategy drops them; an offline run of the
    name is the same one-line 'not in the cache' error as before, and a pull brings it back."""
    from huggingface_hub import scan_cache_dir

    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    r = lg(env, "rm", f"{REPO}:Q4_1", "--yes")
    assert r.returncode == 0, r.stderr
    assert not repo_dir(env).exists(), sorted(str(p) for p in repo_dir(env).rglob("*"))
    info = scan_cache_dir(env["HF_HUB_CACHE"])
    assert not info.warnings and not info.repos, (info.warnings, info.repos)
    r = lg(env, "run", "-m", f"{REPO}:Q4_1", "--offline", "-p", "Hi", "-n", "1")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", OFFLINE_MISSING)
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    assert (repo_dir(env) / "refs" / "main").read_text() == OLD


def test_rm_drops_the_refs_of_the_commits_it_removed_only(env: dict[str, str]) -> None:
    """A ref below refs/ (refs/refs/pr/1, as `hf download --revision refs/pr/1` writes it) naming the commit `rm`
    removed stayed, and the hub's scan called the repo corrupted all the same; and every ref to a missing commit
    went, also one another tool's download had just written: huggingface_hub writes refs/REVISION before the
    snapshot, so the download then finished with no ref to it (and `hf cache prune` removes a revision no ref names).
    Refs at any depth naming a removed commit go, another commit's stay, and the folder stays with them."""
    from huggingface_hub import scan_cache_dir

    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    refs = repo_dir(env) / "refs"
    (refs / "refs" / "pr").mkdir(parents=True)
    (refs / "refs" / "pr" / "1").write_text(OLD)
    (refs / "dev").write_text(NEW)  # a download of dev under way: its snapshot is yet to come
    r = lg(env, "rm", REPO, "--yes")
    assert r.returncode == 0, r.stderr
    assert sorted(p.relative_to(refs).as_posix() for p in refs.rglob("*")) == ["dev"]
    assert (refs / "dev").read_text() == NEW
    (repo_dir(env) / "snapshots" / NEW).mkdir()  # the download done (its file aside)
    info = scan_cache_dir(env["HF_HUB_CACHE"])
    assert not info.warnings, info.warnings
    assert {r.commit_hash: set(r.refs) for repo in info.repos for r in repo.revisions} == {NEW: {"dev"}}


def test_rm_reads_no_ref_that_is_no_file_and_removes_nothing_through_a_link(env: dict[str, str],
                                                                            tmp_path: Path) -> None:
    """A FIFO among the refs (read, it held rm for ever, the model already removed), or a ref linked to /dev/zero
    (read without end): no ref huggingface_hub writes, left as they are. A folder of refs linked outside the cache
    keeps what is in it, refs naming the removed commit too."""
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    refs = repo_dir(env) / "refs"
    os.mkfifo(refs / "pipe")
    (refs / "zero").symlink_to("/dev/zero")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "main").write_text(OLD)
    (refs / "elsewhere").symlink_to(outside)
    r = lg(env, "rm", REPO, "--yes", timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("removed 1 file(s)"), r.stderr
    assert sorted(p.name for p in refs.iterdir()) == ["elsewhere", "pipe", "zero"]
    assert (outside / "main").read_text() == OLD, "nothing outside the cache is removed"


def test_rm_takes_the_repo_folder_with_its_unfinished_downloads(env: dict[str, str]) -> None:
    """An unfinished download keeps the repo's folder (`rm OWNER/REPO:TAG` leaves it; which file it was is not
    known offline); `rm OWNER/REPO`, which takes it, takes the folder too, with huggingface_hub's .no_exist record
    (the files a commit lacks), as `hf cache rm` takes a repo whose every revision goes."""
    from huggingface_hub import scan_cache_dir

    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    partial = repo_dir(env) / "blobs" / f"{'0' * 64}.incomplete"
    partial.write_bytes(b"\0" * 3000)
    (repo_dir(env) / ".no_exist" / OLD).mkdir(parents=True)
    (repo_dir(env) / ".no_exist" / OLD / "config.json").write_bytes(b"")
    r = lg(env, "rm", f"{REPO}:Q4_1", "--yes")
    assert r.returncode == 0 and partial.is_file(), r.stderr
    assert not (repo_dir(env) / "refs" / "main").exists()
    assert not scan_cache_dir(env["HF_HUB_CACHE"]).warnings
    r = lg(env, "rm", REPO, "--yes")
    assert (r.returncode, r.stdout) == (0, f"removed the unfinished download(s) of {REPO}, freed 3 KiB\n"), r.stderr
    assert not repo_dir(env).exists(), sorted(str(p) for p in repo_dir(env).rglob("*"))
    r = lg(env, "run", "-m", f"{REPO}:Q4_1", "--offline", "-p", "Hi", "-n", "1")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", OFFLINE_MISSING)


def test_rm_of_an_older_copy_by_the_name_list_gives_it_removes_that_copy_only(
        env: dict[str, str], fake_hub: hub_server.FakeHub, old_file: hub_server.HubFile,
        new_file: hub_server.HubFile) -> None:
    """`list` names a copy kept at an older commit a tag names OWNER/REPO/resolve/TAG/FILE; `rm` of that name removed
    main's copy too (a tag was read as 'any commit, that one first'). It removes the tag's commit's copy and the tag
    (no copy of its commit left); main's stays, and runs offline. A tag the cache has no ref for removes nothing."""
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    (repo_dir(env) / "refs" / "v1").write_text(OLD)
    move(fake_hub, new_file)
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    snaps = repo_dir(env) / "snapshots"
    tagged = f"{REPO}/resolve/v1/{FILE}"
    r = lg(env, "rm", f"{REPO}/resolve/v2/{FILE}", "--yes")
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert "not in the cache" in r.stderr and (snaps / OLD / FILE).is_file() and (snaps / NEW / FILE).is_file()
    r = lg(env, "rm", tagged, "--yes")
    assert r.returncode == 0 and r.stdout.startswith("removed 1 file(s)"), (r.stdout, r.stderr)
    assert not (snaps / OLD).exists() and not (repo_dir(env) / "refs" / "v1").exists()
    assert sha256(snaps / NEW / FILE) == new_file.sha256
    assert {i["name"]: i["path"] for i in listed(env)} == {f"{REPO}:Q4_1": str(snaps / NEW / FILE)}
    r = lg(env, "run", "-m", f"{REPO}:Q4_1", "--offline", "-p", "Hi", "-n", "1")
    assert r.returncode == 0, r.stderr


def test_rm_in_a_snapshots_folder_it_cannot_write_removes_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       cli_in_process: Any) -> None:
    """A cache whose snapshots/ folder the user cannot write (shared, made by another user): rm removed the model's
    files, then failed on the emptied commit folder, exit 1 'Permission denied' for a removal that had happened.
    The folder stays; rm says what it removed, exit 0, and the model is no longer listed."""
    from tests.conftest import InProcessCLI

    base, _ = _held_cache(tmp_path / "hf")
    snaps = base / "snapshots"
    real_rmdir = os.rmdir

    def refusing(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).parent == snaps:
            raise PermissionError(13, "Permission denied", str(path))
        real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", refusing)
    cli = InProcessCLI({**cli_in_process.env, "HF_HUB_CACHE": str(tmp_path / "hf"),
                        "LOCALGEN_HOME": str(tmp_path / "home")})
    r = cli("rm", "acme/Held-GGUF:Q4_0", "--yes")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert "removed 4 file(s), freed 16 bytes" in r.stdout, r.stdout
    assert sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()) == ["refs/main"]
    assert sorted(p.name for p in (base / "snapshots").iterdir()) == sorted([NEW, OLD]), \
        "the empty commit folders it could not remove"
    r = cli("list", "--json")
    assert r.returncode == 0 and "Held" not in r.stdout, r.stdout
