"""Shared fixtures: an isolated LOCALGEN_HOME, a CLI runner, real models, and bad model files."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cpu import cpu_simd  # which kernels made the files of llama.cpp's tools (below)
from tests.fake_openai import FakeServer
from tests.forkserver import ForkServer
from tests.gguf_edit import rewrite_strings

ROOT = Path(__file__).resolve().parent.parent
# the CPUs this process may use, read before pytest_configure keeps a worker to one of them: what a user's
# process gets (tests/test_user_processes.py gives them back to its children)
CPUS = frozenset(os.sched_getaffinity(0))


# where huggingface_hub finds a cache or a token; none of the real home's may reach a test
HF_PRIVATE = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
              "HF_XET_CACHE", "HF_ASSETS_CACHE", "HF_STORED_TOKENS_PATH")
# a terminal's size as another program saw it: importing GNU readline (pytest's capture plugin does, early) writes
# COLUMNS=80 and LINES=24 into the C environment, which pytest-xdist's workers inherit; Rich would then wrap a
# child's lines at 80 columns on a wider terminal
SIZE_VARS = ("COLUMNS", "LINES")
BIG_TEMP_FILE = 1 << 20

# The markers follow from what a test uses, so a new test is classified without its author remembering
# (registered in pyproject.toml; `scripts/test --quick` runs `-m "not slow"`). `slow`: one of these fixtures,
# used directly or through another (a module's server started from `cli_env`), a process started in the
# test's body, or Gemma. A model loaded in this process by a command shows in none of them: mark it by hand.
# A test marked `quick` by hand starts processes that load no model, and stays in the fast layer.
SLOW_FIXTURES = frozenset({"cli", "cli_env", "smollm2_engine", "gemma_path", "bad_models", "moe_path"})
SPAWNS = re.compile(r"\bsubprocess\.|\bpexpect\.|\.popen\(|\bPopen\(")
GEMMA = re.compile(r"gemma_path|gemma3:270m")
GPU = re.compile(r"has_gpu|assert_same_greedy_text|GPU_SHARED_PREFIX")


# the CPUs the suite may use, before a worker keeps to one of them (pytest_configure)
ALL_CPUS = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()


def unpinned(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`localgen ARGS` in an interpreter of its own on every CPU the suite may use (ALL_CPUS), not the one this
    worker keeps to: for what depends on how many CPUs a process has."""
    return subprocess.run([sys.executable, "-m", "localgen", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=SAFETY_NET_S, stdin=subprocess.DEVNULL,
                          preexec_fn=lambda: os.sched_setaffinity(0, ALL_CPUS))


def on_all_cpus(f: Any) -> Any:
    """f() evaluated with this process on every CPU the suite may use (ALL_CPUS), then its own CPUs again."""
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, ALL_CPUS)
    try:
        return f()
    finally:
        os.sched_setaffinity(0, mine)


def _one_tls_context() -> None:
    """The tests' own HTTP calls (httpx.get and .post, a client each; the openai, anthropic and ollama clients) share
    one TLS context, as localgen's clients do (proxies.tls): each made its own, 60 ms of CPU on this machine's cores,
    ten times a second in a loop that polls a server, on the core the server shares."""
    from httpx._transports import default as transports

    made = transports.create_ssl_context
    shared: dict[bool, Any] = {}

    def create(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is not True or cert is not None:
            return made(verify=verify, cert=cert, trust_env=trust_env)
        if trust_env not in shared:
            shared[trust_env] = made(verify=True, cert=None, trust_env=trust_env)
        return shared[trust_env]

    transports.create_ssl_context = create


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`scripts/test` runs one worker per CPU and one more, which shares the first), each
    worker keeps to one CPU, and so do the processes it starts: llama.cpp then runs one thread in each process,
    and no thread of it waits at llama.cpp's barriers for another. The tests' HTTP calls share a TLS context."""
    _one_tls_context()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})


TMP_NEEDED_GB = 8  # what a whole run writes under the temporary folder at its peak, with room to spare


def pytest_sessionstart(session: pytest.Session) -> None:
    """A temporary folder without room for the run stops it at once with one line: a full disk otherwise shows
    as hundreds of errors of tests that could not make their tmp_path (it did, on a CI machine)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or session.config.getoption("collectonly", False):
        return
    folder = tempfile.gettempdir()
    free = shutil.disk_usage(folder).free / 1e9
    if free < TMP_NEEDED_GB:
        pytest.exit(f"only {free:.1f} GB free in {folder}: the tests write up to {TMP_NEEDED_GB} GB there; free some "
                    "space, or point TMPDIR at a disk with more", returncode=1)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """After a run of tests/test_doc_examples_run.py: how many doc examples this machine does not run, by reason
    (each one with -v), as a line of the summary rather than as tests that always skip."""
    reports = [r for rs in terminalreporter.stats.values() for r in rs if hasattr(r, "nodeid")]
    if not any(r.nodeid.startswith("tests/test_doc_examples_run.py") for r in reports):
        return
    from tests.test_doc_examples_run import not_run_summary

    for line in not_run_summary(config.get_verbosity() > 0):
        terminalreporter.write_line(line)


def _source(fn: object, sources: dict[object, str]) -> str:
    """A test's or a fixture's source, read once."""
    if fn not in sources:
        try:
            sources[fn] = inspect.getsource(fn) if fn is not None else ""  # type: ignore[arg-type]
        except (OSError, TypeError):
            sources[fn] = ""
    return sources[fn]


def _gemma_through(item: pytest.Item, sources: dict[object, str]) -> bool:
    """Whether a test needs Gemma through its parameters (`model` = "gemma3:270m") or a fixture of its module
    that loads it (a module's server started with `-m gemma3:270m`)."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and GEMMA.search(str(callspec.params.get("model", ""))):
        return True
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info is not None else ():
        for d in defs:
            fn = d.func
            if getattr(fn, "__module__", None) != getattr(item.module, "__name__", ""):  # type: ignore[attr-defined]
                continue  # conftest's fixtures: gemma_path is named above
            if GEMMA.search(_source(fn, sources)):
                return True
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks `slow` (starts a process or a server, or loads a model), `gemma` (needs Gemma 3 270M) and `gpu`
    (what it asserts depends on whether layers sit on a GPU: worth a run on a GPU machine, `-m gpu`)."""
    sources: dict[object, str] = {}
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        src = _source(getattr(item, "function", None), sources)
        gemma = "gemma_path" in used or GEMMA.search(src) is not None or _gemma_through(item, sources)
        if (used & SLOW_FIXTURES or SPAWNS.search(src) or gemma) and item.get_closest_marker("quick") is None:
            item.add_marker(pytest.mark.slow)
        if gemma:
            item.add_marker(pytest.mark.gemma)
        if GPU.search(src):
            item.add_marker(pytest.mark.gpu)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        heaviest_files_first(items)


def heaviest_files_first(items: list[pytest.Item]) -> None:
    """Test files in order of their cost, estimated as the number of their slow tests (a Gemma one counting
    twice), heaviest first (lightest first with TESTS_LIGHTEST_FIRST=1), each file's tests in their own order.
    pytest-xdist hands out whole files in this order (`--dist loadfile --no-loadscope-reorder`), so a long file
    seldom starts last while the other worker idles."""
    weight: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        weight[path] = weight.get(path, 0) + (item.get_closest_marker("slow") is not None) + (
            item.get_closest_marker("gemma") is not None)
    # TESTS_LIGHTEST_FIRST=1: the other way round, so that a time-boxed run (scripts/gpu_check's slice of the suite)
    # can cover the files the heaviest-first run of the same length did not reach
    sign = 1 if os.environ.get("TESTS_LIGHTEST_FIRST") == "1" else -1
    items.sort(key=lambda item: sign * weight[item.nodeid.split("::")[0]])  # stable: a file's tests keep their order


@pytest.fixture(scope="session", autouse=True)
def _drop_big_temp_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Model copies, pulls into per-test Hub caches and assembled Gemmas add up to gigabytes per run, and
    pytest keeps the last three runs' temporary folders: at the end of the session files past 1 MiB go,
    the small ones (logs, configs, prompts) stay for reading after a failure."""
    yield
    for path in tmp_path_factory.getbasetemp().rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size > BIG_TEMP_FILE:
            path.unlink()


@pytest.fixture(scope="session")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One LOCALGEN_HOME for the session, so user files never touch the real home; Hugging Face's cache and
    token are the session's too (HF_HOME, HF_HUB_CACHE), in this process and in every child."""
    path = tmp_path_factory.mktemp("home")
    hf = tmp_path_factory.mktemp("hf-home")
    os.environ["LOCALGEN_HOME"] = str(path)
    for k in HF_PRIVATE:
        os.environ.pop(k, None)
    os.environ.update(HF_HOME=str(hf), HF_HUB_CACHE=str(hf / "hub"))
    return path


def knows_the_bandwidth(home: Path) -> Path:
    """Give a LOCALGEN_HOME a memory bandwidth measured already (a made-up 10 GB/s), as every `bench` after the
    first on a machine finds one: the measurement (1 GB copied in a child process, 2.5 s of CPU) is test_bench's
    business, not that of each test that benchmarks in a home of its own. Returns the home."""
    from localgen.bench import bandwidth

    (home / "cache").mkdir(parents=True, exist_ok=True)
    (home / "cache" / "bandwidth.json").write_text(json.dumps(
        {"machine": bandwidth.machine(), "at": time.time(), "bytes_per_s": 1e10}))
    return home


@pytest.fixture(scope="session")
def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LOCALGEN_") and k not in HF_PRIVATE and k not in SIZE_VARS}
    env.update(LOCALGEN_HOME=str(home), PYTHONUNBUFFERED="1", NO_COLOR="1", HF_HUB_OFFLINE="1",
               HF_HOME=os.environ["HF_HOME"], HF_HUB_CACHE=os.environ["HF_HUB_CACHE"])
    return env


SAFETY_NET_S = 900  # a hung child fails the test; a slow one (two busy cores) must not


class CLI:
    """Runs `python -m localgen` as a user would, with stdin, stdout and stderr kept apart. A call is a process
    forked from the fork server (tests/forkserver.py: a Python with the libraries imported already) when its
    environment differs from the server's in LOCALGEN_* variables only; any other call, and `popen`, starts
    an interpreter."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "localgen", *args]

    def __call__(self, *args: str, input: str | None = None, timeout: float = SAFETY_NET_S,
                 cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`localgen ARGS` run to its end, in `cwd` (default: the checkout)."""
        forks = fork_server(self.env)
        if forks is not None and forks.accepts(self.env):
            return forks.run(list(args), self.env, input or "", timeout, cwd=cwd)
        return subprocess.run(
            self.argv(*args),
            input=input if input is not None else "",
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            cwd=cwd or ROOT,
        )

    def popen(self, *args: str, cwd: Path | None = None, **kw: Any) -> Any:
        """`localgen ARGS` left running in `cwd` (default: the checkout), as subprocess.Popen(..., **kw) starts
        it (forked where the fork server takes the environment and the keywords are the streams, text and
        bufsize)."""
        forks = fork_server(self.env)
        if forks is not None and forks.accepts(self.env) and kw.keys() <= {"stdin", "stdout", "stderr", "text",
                                                                             "bufsize"}:
            streams = {"stdin": None, "stdout": None, "stderr": None, **kw}  # Popen's defaults: the caller's own
            return forks.popen(list(args), self.env, sigint=True, cwd=cwd, **streams)
        return subprocess.Popen(self.argv(*args), env=self.env, cwd=cwd or ROOT, preexec_fn=default_sigint, **kw)


def default_sigint() -> None:
    """For a child the tests interrupt: a shell running the suite as a background job ignores SIGINT, and
    children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_FORKS: list[ForkServer] = []
_FORKS_LOCK = threading.Lock()  # tests call the CLI from threads too


def fork_server(env: dict[str, str]) -> ForkServer | None:
    """The session's fork server, started by the first call that can use one (in that call's environment);
    none with LOCALGEN_TEST_FORKSERVER=0, when every call starts an interpreter, as `popen` always does."""
    if os.environ.get("LOCALGEN_TEST_FORKSERVER", "1") == "0":
        return None
    with _FORKS_LOCK:
        if not _FORKS:
            _FORKS.append(ForkServer(env, ROOT, Path(tempfile.mkdtemp(prefix="localgen-forks-"))))
        return _FORKS[0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A KeyboardInterrupt that escapes a test in a pytest-xdist worker no terminal can interrupt is that test's
    failure, its traceback shown: pytest takes one for the user's Ctrl-C, and the worker ended the whole session
    ("gw2 received keyboard-interrupt", in a CI run, with no Ctrl-C anywhere and no test named)."""
    try:
        return (yield)
    except KeyboardInterrupt as e:
        if not os.environ.get("PYTEST_XDIST_WORKER") or _a_terminal_can_interrupt():
            raise
        raise pytest.fail.Exception("a KeyboardInterrupt escaped the test (no Ctrl-C can reach this worker): "
                                    "a SIGINT sent to the worker, or a press a test arranged raised where it "
                                    "did not expect it") from e


def _a_terminal_can_interrupt() -> bool:
    """Whether this process is in its terminal's foreground process group (where a Ctrl-C lands)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _no_press_left() -> None:
    """A Ctrl-C a test left deferred (localgen.native.logs) or an `unbroken` block it left open would be raised in
    a later test of this worker, at a random place (a KeyboardInterrupt there ends the session): cleared, and
    this test fails."""
    logs = sys.modules.get("localgen.native.logs")
    if logs is None or not (logs._deferred or logs._unbroken):
        return
    left = f"deferred Ctrl-C: {logs._deferred}, open unbroken blocks: {logs._unbroken}"
    logs._deferred, logs._unbroken = False, 0
    pytest.fail(f"the test left a Ctrl-C pending ({left}): cleared")


@pytest.fixture(autouse=True)
def _signals_as_found() -> Iterator[None]:
    """Each test leaves this thread's signal mask and its SIGINT, SIGTERM and SIGHUP handlers as it found them: one
    it leaves changed is put back, and a warning names it (a blocked or ignored signal left behind reaches every
    process the worker starts later, which a signal a test sends then ends nothing)."""
    watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    handlers = {s: signal.getsignal(s) for s in watched}
    yield
    left = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    changed = {s: h for s, h in handlers.items() if signal.getsignal(s) is not h}
    if left != mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for sig, handler in changed.items():
        if handler is not None:
            signal.signal(sig, handler)
    if left != mask or changed:
        import warnings

        warnings.warn(f"the test left the signal mask {sorted(left)} (it found {sorted(mask)}) and changed the "
                      f"handlers of {sorted(s.name for s in changed)}: put back", stacklevel=1)
    _no_press_left()


@pytest.fixture(scope="session", autouse=True)
def _close_fork_server() -> Iterator[None]:
    yield
    for forks in _FORKS:
        forks.close()
    _FORKS.clear()


@pytest.fixture(scope="session")
def cli(cli_env: dict[str, str]) -> CLI:
    return CLI(cli_env)


class InProcessCLI:
    """`localgen ARGS` in this process, through the entry point a subprocess runs (localgen.cli.main.main):
    the same parsing, validation and one-line errors, without a Python start per call. For what ends before a
    model loads; what generates or needs a process of its own (signals, pipes, a terminal) takes `cli`."""

    def __init__(self, env: dict[str, str | None]) -> None:
        self.env = env

    def __call__(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        from typer.testing import CliRunner

        from localgen.cli.main import main

        # main() installs its own (serve: SIGTERM's and SIGHUP's too); the test session keeps pytest's
        watched = (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None))  # none: Windows, simulated
        handlers = {sig: signal.getsignal(sig) for sig in watched if sig is not None}
        try:
            with CliRunner().isolation(input=input or "", env=self.env) as (out, err, _):
                try:
                    main(list(args))
                    rc = 0
                except SystemExit as e:
                    rc = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
                sys.stdout.flush()  # the runner's text wrappers buffer what print() wrote
                sys.stderr.flush()
                stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        return subprocess.CompletedProcess(["localgen", *args], rc, stdout, stderr)


@pytest.fixture(scope="session")
def cli_in_process(home: Path) -> InProcessCLI:
    """`cli`'s environment (the session's home, no colour, offline, no other LOCALGEN_*), set while a call runs."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("LOCALGEN_") or k in HF_PRIVATE}
    env.update(LOCALGEN_HOME=str(home), NO_COLOR="1", HF_HUB_OFFLINE="1")
    return InProcessCLI(env)


@pytest.fixture(scope="session")
def smollm2_path(home: Path) -> Path:
    from localgen.models.resolve import resolve

    return Path(resolve("smollm2:135m").path)


@pytest.fixture(scope="session")
def gemma_path(home: Path) -> Path:
    from localgen.models.resolve import resolve

    return Path(resolve("gemma3:270m").path)


@pytest.fixture(scope="session")
def moe_path(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """A small mixture-of-experts model (qwen3moe, random weights, SmolLM2's tokenizer) that llama.cpp runs
    (tests/model_shapes.py)."""
    from tests.model_shapes import SHAPES, build

    return build(SHAPES["tiny-moe"], tmp_path_factory.mktemp("moe") / "tiny-moe.gguf", tokenizer=smollm2_path)


@pytest.fixture(scope="session")
def shape_path(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A header-only model of a named shape (tests/model_shapes.py: moe-30b-a3b, dense-8b): its tensors' data a
    hole in a sparse file, for the planner, which reads headers only. Written once per shape."""
    from tests.model_shapes import SHAPES, build

    folder = tmp_path_factory.mktemp("shapes")
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in made:
            made[name] = build(SHAPES[name], folder / f"{name}.gguf", header_only=True)
        return made[name]

    return make


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_path: Path) -> Iterator[object]:
    """The real SmolLM2 model, loaded once for every in-process engine test."""
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    engine = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=2048))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def bad_models(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    """Broken model files, built from the real SmolLM2."""
    d = tmp_path_factory.mktemp("bad")
    out = {}
    (d / "text.gguf").write_text("this is not a model\n")
    out["not_gguf"] = d / "text.gguf"
    (d / "empty.gguf").write_bytes(b"")
    out["empty"] = d / "empty.gguf"
    with open(smollm2_path, "rb") as f:
        (d / "truncated.gguf").write_bytes(f.read(20_000_000))
    out["truncated"] = d / "truncated.gguf"
    (d / "header.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**60).to_bytes(8, "little") * 2)
    out["hostile_header"] = d / "header.gguf"
    out["bad_shape"] = damaged_shape(smollm2_path, d / "shape.gguf")
    edits = {
        "unknown_arch": {"general.architecture": "frobnicator"},
        "broken_template": {"tokenizer.chat_template": "{% for m in messages %}{{ m.content "},
        "hostile_template": {"tokenizer.chat_template": "{{ ''.__class__.__mro__[1].__subclasses__() }}"},
        "endless_template": {
            "tokenizer.chat_template": "{% for a in range(100000) %}{% for b in range(100000) %}"
            "{% endfor %}{% endfor %}"
        },
        "huge_template": {"tokenizer.chat_template": "{{ 'x' * 1000000000 }}"},
        "no_template": {"tokenizer.chat_template": None},
    }
    for name, change in edits.items():
        out[name] = rewrite_strings(smollm2_path, d / f"{name}.gguf", change)
    return out


def damaged_shape(model: Path, out: Path) -> Path:
    """A copy of `model` whose first tensor's row is 7 elements long, no whole number of its type's blocks: a
    header that reads, and a load llama.cpp refuses in its tensor info."""
    import numpy as np
    from gguf import GGUFReader

    reader = GGUFReader(model)
    dims = reader.tensors[0].field.parts[3]
    at = dims.ctypes.data - reader.data.ctypes.data
    data = bytearray(model.read_bytes())
    del reader
    data[at:at + 8] = np.uint64(7).tobytes()
    out.write_bytes(data)
    return out


GPU_SHARED_PREFIX = 16  # characters, about four tokens: where most greedy answers on a GPU still agree


def shared_prefix(a: str, b: str) -> int:
    """How many leading characters two texts have in common."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def opening(text: str) -> str:
    """A text's first word (with the blanks before it), at most GPU_SHARED_PREFIX characters of it."""
    stripped = text.lstrip()
    word = stripped.split(maxsplit=1)[0] if stripped else ""
    return text[:len(text) - len(stripped) + min(len(word), GPU_SHARED_PREFIX)]


def assert_same_greedy_text(got: list[str], want: list[str], why: str) -> None:
    """Greedy answers from two kernel paths (RPC against local, one server against another, drafts checked
    in batches against one token at a time) are bit-identical on the CPU build, where every one of those
    paths computes a row with the same kernels. A GPU's kernels change with the batch's shape and with where
    the layers sit, and a near tie can then go the other way, for a small model sometimes within its first
    words (SmolLM2 on an H200: "Item 0: the box" against "Item 0: The box"). There each answer must begin
    with its counterpart's first word, and of three or more, at least half must share their first
    GPU_SHARED_PREFIX characters: an answer to another prompt, or the noise of a broken path, fails both."""
    from localgen.native.devices import has_gpu

    if has_gpu():
        assert len(got) == len(want), why
        for g, w in zip(got, want, strict=True):
            assert g and g.startswith(opening(w)), f"{why}: {g!r} against {w!r}"
        if len(got) >= 3:
            alike = sum(shared_prefix(g, w) >= min(len(w), GPU_SHARED_PREFIX) for g, w in zip(got, want, strict=True))
            pairs = list(zip(got, want, strict=True))
            assert 2 * alike >= len(got), f"{why}: {alike} of {len(got)} begin alike: {pairs}"
    else:
        assert got == want, why


def config_file(home: Path, name: str) -> Iterator[Path]:
    """A file of the home's config folder (LOCALGEN_HOME/config, paths.config_dir), removed after the test: for
    fixtures to `yield from`."""
    config = home / "config"
    config.mkdir(parents=True, exist_ok=True)
    path = config / name
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def endpoints_toml(home: Path) -> Iterator[Path]:
    """The home's endpoints.toml, removed after the test."""
    yield from config_file(home, "endpoints.toml")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    """A fake OpenAI-compatible server on loopback (tests/fake_openai.py), one per test module."""
    s = FakeServer()
    yield s
    s.stop()


class ScriptedGen:
    """A scripted generation for the tool loop's tests: its pieces, until cancelled."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces, self.read, self.cancelled = pieces, 0, False

    def __iter__(self) -> Iterator[Any]:
        from types import SimpleNamespace

        for piece in self.pieces:
            if self.cancelled:
                return
            self.read += 1
            yield SimpleNamespace(text=piece)

    def cancel(self) -> None:
        self.cancelled = True


# --- outputs of llama.cpp's own tools kept in tests/data, made on one CPU ----------------------------------------
# Another CPU's kernels (other SIMD widths, another order of summing) move logits by ~1e-5: greedy text can take
# another word at a near-tie, and perplexity moves in its third digit. Where this CPU computes as the one that made
# the files (the canary below), the tests hold localgen to them exactly; elsewhere to what other kernels move.
REFERENCE_PREFIX = 8  # characters greedy text must share with the reference's on another CPU
# what hides a CUDA GPU from llama.cpp (it computes on the CPU, as a machine without one): for a test that holds a
# CPU's figures or text (a file llama.cpp's tool wrote on a CPU, a greedy answer the test's words were chosen from),
# or a count a GPU's driver changes (descriptors). On an H200 such tests failed on what the GPU's kernels rightly
# compute otherwise (the GPU's own behaviour is the `gpu` marker's tests')
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def reference_kernels() -> bool:
    """Whether this CPU computes as the one that made tests/data's files: SmolLM2's embedding of one text (the
    kernels generation uses) equals llama-embedding's stored vector to 1e-9 (an AMD EPYC without AVX-512, against
    files made on another CPU: 3.8e-5). Computed once per process, with the real CLI."""
    global _REFERENCE_KERNELS
    if _REFERENCE_KERNELS is None:
        ref = json.loads((ROOT / "tests" / "data" / "llama_embedding_smollm2.json").read_text())
        with tempfile.TemporaryDirectory() as home:
            env = {**os.environ, "LOCALGEN_HOME": home, "HF_HUB_OFFLINE": "1"}
            out = subprocess.run([sys.executable, "-m", "localgen", "embed", "-m", ref["model"], "--pooling",
                                  ref["pooling"], ref["texts"][0]], env=env, capture_output=True, text=True,
                                 timeout=SAFETY_NET_S, check=True).stdout
        mine, theirs = json.loads(out.splitlines()[0])["embedding"], ref["embeddings"][0]
        dot = sum(a * b for a, b in zip(mine, theirs, strict=True))
        cos = dot / (sum(a * a for a in mine) ** 0.5 * sum(b * b for b in theirs) ** 0.5)
        _REFERENCE_KERNELS = 1 - cos < 1e-9
    return _REFERENCE_KERNELS


_REFERENCE_KERNELS: bool | None = None


def same_text_as_reference(ours: str, theirs: str, what: str = "", made_on: str | None = None) -> None:
    """Greedy text as llama.cpp's tool wrote it: the same text on the CPU that made the file; elsewhere the same
    first REFERENCE_PREFIX characters (the model, its template and prompt as llama.cpp had them), after which
    another CPU's rounding may pick another word at a near-tie. `made_on`: a case the file's rows say was made on
    another CPU than the file's canary (its cpu_simd), exact on such a CPU only."""
    if made_on is not None and made_on != cpu_simd():
        n = min(REFERENCE_PREFIX, len(theirs))
        assert ours[:n] == theirs[:n], (what, ours, theirs)
        return
    if made_on is not None or reference_kernels():
        assert ours == theirs, what
        return
    n = min(REFERENCE_PREFIX, len(theirs))
    assert ours[:n] == theirs[:n], (what, ours, theirs)


def reference_rel(same: float, other: float) -> float:
    """A relative tolerance for a figure llama.cpp's tool measured: `same` on the CPU that made the file, `other`
    elsewhere."""
    return same if reference_kernels() else other
