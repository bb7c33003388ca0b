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
