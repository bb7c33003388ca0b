"""scripts/harness.py, what the benchmark scripts share: free ports, servers that are always stopped, alternating
rounds, medians and percentiles; and every script's --help. No model is loaded and no localgen server started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import harness  # noqa: E402

SLEEPER = [sys.executable, "-c", "import sys, time; open(sys.argv[1], 'w').write(str(__import__('os').getpid())); "
                                 "time.sleep(600)"]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_free_port_is_bindable() -> None:
    port = harness.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        assert s.getsockname()[1] == port


def test_server_that_never_answers_is_stopped_with_a_clear_error(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    url = f"http://127.0.0.1:{harness.free_port()}/health"
    with pytest.raises(harness.ServerError, match=r"sleeper did not answer .*/health within 1 s") as e, \
            harness.server([*SLEEPER, str(pidfile)], url, timeout=1, name="sleeper"):
        pass
    assert isinstance(e.value, SystemExit)  # a script ends with the message, not a traceback
    assert gone(int(pidfile.read_text()))


def test_server_that_exits_first_says_so() -> None:
    url = f"http://127.0.0.1:{harness.free_port()}/health"
    with pytest.raises(harness.ServerError, match=r"quitter exited \(3\) before answering"), \
            harness.server([sys.executable, "-c", "raise SystemExit(3)"], url, timeout=30, name="quitter"):
        pass


def test_server_is_stopped_after_the_block_and_after_an_error() -> None:
    port = harness.free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with harness.server(cmd, f"http://127.0.0.1:{port}/", timeout=30) as proc:
        assert proc.poll() is None
        assert harness.answers(f"http://127.0.0.1:{port}/")
    assert proc.returncode is not None
    with pytest.raises(KeyError), harness.server(cmd, f"http://127.0.0.1:{port}/", timeout=30) as proc:
        raise KeyError("the body failed")
    assert proc.returncode is not None


def test_stop_kills_what_ignores_the_signal(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; "
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN); open(sys.argv[1], 'w').close(); "
                             "time.sleep(600)", str(ready)])
    while not ready.exists():
        time.sleep(0.05)
    harness.stop(proc, signal.SIGTERM, grace=0.5)
    assert proc.returncode == -signal.SIGKILL
    harness.stop(proc)  # already gone: nothing to do


def test_alternate_flips_the_order_every_other_round() -> None:
    calls: list[str] = []
    rounds: list[int] = []

    def case(name: str) -> str:
        calls.append(name)
        return f"{name}{len(calls)}"

    got = harness.alternate({"a": lambda: case("a"), "b": lambda: case("b")}, 3,
                            after=lambda r, samples: rounds.append(r))
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert got == {"a": ["a1", "a4", "a5"], "b": ["b2", "b3", "b6"]}
    assert rounds == [0, 1, 2]


def test_alternate_in_a_fixed_order() -> None:
    calls: list[int] = []
    got = harness.alternate({1: lambda: calls.append(1), 2: lambda: calls.append(2), 3: lambda: calls.append(3)},
                            2, flip=False)
    assert calls == [1, 2, 3, 1, 2, 3]
    assert {k: len(v) for k, v in got.items()} == {1: 2, 2: 2, 3: 2}
    assert harness.alternate({"a": lambda: 1}, 0) == {"a": []}


def test_median_percentile_and_ratios() -> None:
    assert harness.median([3, 1, 2]) == 2
    assert harness.median(iter([4.0, 1.0, 3.0, 2.0])) == 2.5
    xs = [float(x) for x in range(1, 101)]  # 1..100
    assert harness.percentile(xs, 0.5) == 51  # nearest rank of 49.5 rounds to 50 (even): the 51st value
    assert harness.percentile(xs, 0.99) == 99
    assert harness.percentile(xs, 1.0) == 100
    assert harness.percentile(xs, 0.0) == 1
    assert harness.percentile([7.0], 0.99) == 7
    assert harness.percentile([], 0.5) != harness.percentile([], 0.5)  # nan
    assert harness.paired_ratio([2.0, 3.0, 8.0], [1.0, 3.0, 2.0]) == 2
    assert harness.ratio(3, 2) == "1.50x"
    assert harness.ratio(1, 3, "6.3f") == " 0.333x"


def test_timed_runs() -> None:
    secs, got = harness.timed(lambda: 42)
    assert got == 42 and secs >= 0
    assert harness.run_timed([sys.executable, "-c", "pass"]) > 0
    with pytest.raises(subprocess.CalledProcessError):
        harness.run_timed([sys.executable, "-c", "raise SystemExit(2)"])


def test_executable_is_a_usage_error_when_missing(tmp_path: Path) -> None:
    assert harness.executable(sys.executable) == sys.executable
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_embed.py"), "--llama-server",
                        str(tmp_path / "llama-server")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert r.stdout == ""
    assert f"no program at {tmp_path / 'llama-server'}" in r.stderr


SCRIPTS = sorted(p for p in (ROOT / "scripts").glob("*.py") if p.name != "harness.py")


def test_every_script_answers_help() -> None:
    """Run as users run them (`python scripts/x.py`), all at once: each prints its usage and exits 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def help_of(script: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=120)

    with ThreadPoolExecutor(4) as pool:
        done = dict(zip(SCRIPTS, pool.map(help_of, SCRIPTS), strict=True))
    assert len(done) >= 20
    for script, r in done.items():
        assert r.returncode == 0, f"{script.name}: {r.stderr}"
        assert r.stdout.startswith("usage:"), script.name


def test_same_answers_prints_each_pair_and_says_whether_all_agree(capsys: pytest.CaptureFixture[str]) -> None:
    theirs = {"1.0": {"a": "x", "b": "y"}}
    assert harness.same_answers(theirs, {"1.0": {"a": "x", "b": "y"}})
    assert not harness.same_answers(theirs, {"1.0": {"a": "x", "b": "z"}})
    out = capsys.readouterr().out
    assert "2 of 2 the same" in out and "1 of 2 the same" in out and "DIFFERENT  1.0 / b" in out
