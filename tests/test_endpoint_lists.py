"""docs/remote.md and configuration.md: `--endpoint` and LOCALGEN_ENDPOINT take several URLs separated by commas
(as --rpc's servers are) or, in the variable, by blanks; the same server twice is one endpoint; an empty item
is none, and none at all a usage error."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import CLI
from tests.fake_openai import FakeServer


@pytest.fixture(scope="module")
def two() -> Iterator[tuple[FakeServer, FakeServer]]:
    a, b = FakeServer(), FakeServer()
    yield a, b
    a.stop()
    b.stop()


def _run(cli: CLI, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli.argv("run", "-m", "plain", "-p", "hi", "--json", *args), capture_output=True,
                          text=True, env={**cli.env, **env}, timeout=120, check=False)


def test_endpoints_are_comma_or_blank_separated(cli: CLI, two: tuple[FakeServer, FakeServer]) -> None:
    a, b = two
    both = [f"{a.url}/v1", f"{b.url}/v1"]
    for env, args in (({"LOCALGEN_ENDPOINT": f"{a.url},{b.url}"}, ()),
                      ({"LOCALGEN_ENDPOINT": f"{a.url}, {b.url}/"}, ()),
                      ({"LOCALGEN_ENDPOINT": f"{a.url} {b.url}"}, ()),
                      ({}, ("--endpoint", f"{a.url},{b.url}")),
                      ({}, ("--endpoint", a.url, "--endpoint", f"{b.url},{a.url}/v1"))):
        r = _run(cli, env, *args)
        assert r.returncode == 0, (env, args, r.stderr)
        assert json.loads(r.stdout)["model"]["endpoint"] == both, (env, args)
    r = _run(cli, {}, "--endpoint", ",")
    assert r.returncode == 2 and "--endpoint needs an http:// or https:// URL, not ','" in r.stderr, r.stderr
