"""The process environment localgen is started in, as containers, service managers and CI runners leave it: no
folder a temporary file can be written to, resource limits (`ulimit`), streams inherited non-blocking."""

from __future__ import annotations

import resource
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.conftest import CLI, ROOT, SAFETY_NET_S

N = ("-n", "8", "--temperature", "0", "--seed", "1")


def _limited(cli: CLI, limit: int, value: int, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    """`localgen ARGS` with the resource limit `limit` (soft and hard) set to `value` (as `ulimit` sets it)."""
    def lower() -> None:
        resource.setrlimit(limit, (value, value))

    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
    return run(cli.argv(*args), preexec_fn=lower, env=cli.env, capture_output=True, text=True,
               timeout=SAFETY_NET_S, cwd=ROOT, **kw)


def test_with_no_temporary_folder_a_schema_and_a_grammar_still_constrain_the_answer(cli: CLI, tmp_path: Path) -> None:
    """`ulimit -f 0` (like a read-only container) leaves no folder Python's tempfile can use: a JSON schema and a
    grammar still parse (llama.cpp's parser messages are captured without a file), and a bad grammar still
    says why it does not parse."""
    r = _limited(cli, resource.RLIMIT_FSIZE, 0, "run", "--json-schema", '{"type":"object"}', "hi", *N,
                 "--no-log")
    assert r.returncode == 0 and r.stdout.startswith("{"), r.stderr
    (tmp_path / "yes.gbnf").write_text('root ::= "yes"\n')
    (tmp_path / "bad.gbnf").write_text('root ::= "yes\n')
    r = _limited(cli, resource.RLIMIT_FSIZE, 0, "run", "--grammar", str(tmp_path / "yes.gbnf"), "hi", *N,
                 "--no-log")
    assert r.returncode == 0 and r.stdout.strip() == "yes", r.stderr
    r = _limited(cli, resource.RLIMIT_FSIZE, 0, "run", "--grammar", str(tmp_path / "bad.gbnf"), "hi", *N,
                 "--no-log")
    assert r.returncode == 2 and r.stderr == "localgen: error: the grammar does not parse: unexpected end of input\n"
