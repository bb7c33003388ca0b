"""What the test suite checks of the machine before it runs (tests/conftest.py)."""

from __future__ import annotations

import shutil
from types import SimpleNamespace
from typing import Any

import pytest

from tests import conftest


def _session() -> Any:
    return SimpleNamespace(config=SimpleNamespace(getoption=lambda name, default=None: default))


def test_a_temporary_folder_without_room_stops_the_run_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Any) -> None:
    """A CI machine whose disk the kept runs had filled showed 303 errors (No space left on device) instead of
    saying so: the controller checks the room under TMPDIR first."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=int(1.5e9)))
    with pytest.raises(pytest.exit.Exception) as stopped:
        conftest.pytest_sessionstart(_session())
    assert stopped.value.returncode == 1
    assert str(stopped.value) == (f"only 1.5 GB free in {tmp_path}: the tests write up to {conftest.TMP_NEEDED_GB} GB "
                                  "there; free some space, or point TMPDIR at a disk with more")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=int(conftest.TMP_NEEDED_GB * 1e9)))
    conftest.pytest_sessionstart(_session())  # room enough: the run goes on
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=0))
    conftest.pytest_sessionstart(_session())  # a worker leaves the check to the controller


def test_a_keyboard_interrupt_escaping_a_test_in_a_worker_is_that_tests_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt out of one test ended a whole CI run ("gw2 received keyboard-interrupt"), no test named:
    in a worker no terminal's Ctrl-C can reach, it is the test's failure; where one can, or outside xdist, it
    stays the user's Ctrl-C."""
    def escaped() -> BaseException:
        call = conftest.pytest_runtest_call(None)  # type: ignore[arg-type]  # the wrapper, as pluggy drives it
        next(call)
        try:
            call.throw(KeyboardInterrupt())
        except BaseException as e:  # what the wrapper lets out, whatever it is
            return e
        raise AssertionError("the wrapper swallowed the interrupt")

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    monkeypatch.setattr(conftest, "_a_terminal_can_interrupt", lambda: False)
    failed = escaped()
    assert isinstance(failed, pytest.fail.Exception), failed
    assert "a KeyboardInterrupt escaped the test" in str(failed)
    assert isinstance(failed.__cause__, KeyboardInterrupt)
    monkeypatch.setattr(conftest, "_a_terminal_can_interrupt", lambda: True)
    assert type(escaped()) is KeyboardInterrupt
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    monkeypatch.setattr(conftest, "_a_terminal_can_interrupt", lambda: False)
    assert type(escaped()) is KeyboardInterrupt


def test_a_ctrl_c_a_test_leaves_pending_fails_that_test_and_is_cleared() -> None:
    """A press a test left deferred (or an `unbroken` block left open) would be raised in a later test of the same
    worker, at a random place."""
    from localgen.native import logs

    logs._deferred = True
    with pytest.raises(pytest.fail.Exception, match="left a Ctrl-C pending"):
        conftest._no_press_left()
    assert not logs.pending() and logs._unbroken == 0
    conftest._no_press_left()  # nothing left: nothing said
