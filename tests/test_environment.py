"""The process environment localgen is started in, as containers, service managers and CI runners leave it: no
folder a temporary file can be written to, resource limits (`ulimit`), streams inherited non-blocking."""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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


_OTHER_THREAD = """
import os, sys, threading
from localgen.errors import GrammarError
from localgen.native import grammar
from localgen.native.lib import lib

lc = lib()
parse = lc.llama_sampler_init_grammar

def writing_meanwhile(*args):  # another thread (a server's access log) writes while the grammar is parsed
    t = threading.Thread(target=lambda: os.write(2, b"another thread's line\\n"))
    t.start()
    t.join()
    return parse(*args)

lc.llama_sampler_init_grammar = writing_meanwhile
try:
    grammar.check_grammar(None, 'root ::= "a" (')
except GrammarError as e:
    print(e.message)
"""


def test_what_other_threads_write_while_a_grammar_is_parsed_reaches_stderr() -> None:
    # fd 2 is the process's while llama.cpp's parser writes to it: serve's access lines written meanwhile were
    # lost (48 requests, 41 lines); the parser's own error stays out of stderr and in the one-line error
    r = subprocess.run([sys.executable, "-c", _OTHER_THREAD], capture_output=True, text=True, cwd=ROOT,
                       timeout=SAFETY_NET_S, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "the grammar does not parse: expecting ')' at the end of the grammar\n"
    assert r.stderr == "another thread's line\n"


F_SETPIPE_SZ = 1031  # Linux's fcntl for a pipe's capacity
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pipe's size and /proc/PID/wchan: Linux")


def _pipe(nonblocking_end: int) -> tuple[int, int]:
    """A pipe of one page whose read (0) or write (1) end is non-blocking, as a Node.js parent leaves its pipes."""
    ends = os.pipe()
    os.set_blocking(ends[nonblocking_end], False)
    fcntl.fcntl(ends[1], F_SETPIPE_SZ, 4096)
    return ends


def _until_waiting(p: subprocess.Popen[Any], on: str) -> None:
    """Until the process waits in the kernel function `on` (its pipe full, or empty), or has ended."""
    wchan = Path(f"/proc/{p.pid}/wchan")
    while p.poll() is None and on not in wchan.read_text():
        time.sleep(0.05)


@linux_only
def test_a_non_blocking_stdout_gets_the_whole_output_and_is_left_non_blocking(cli: CLI) -> None:
    """stdout shared non-blocking with a parent that reads it only once the pipe is full: the output waits for
    the reader (it was cut at the first pipe-full: `write could not complete without blocking`, exit 1), and the
    pipe is non-blocking again, as the parent left it, when the command ends."""
    import select

    read_end, write_end = _pipe(1)
    p = subprocess.Popen(cli.argv("--help"), stdout=write_end, stderr=subprocess.PIPE, env=cli.env, cwd=ROOT)
    _until_waiting(p, "pipe_write")
    got = bytearray()
    while p.poll() is None:
        if select.select([read_end], [], [], 0.1)[0]:
            got += os.read(read_end, 65536)
    assert not os.get_blocking(write_end), "the parent's pipe is non-blocking again"
    os.close(write_end)
    with os.fdopen(read_end, "rb") as rest:
        text = (got + rest.read()).decode()
    assert p.returncode == 0 and p.stderr is not None and p.stderr.read() == b""
    assert len(text) > 4096 and text.rstrip().endswith("╯"), text[-300:]


@linux_only
def test_a_non_blocking_stdin_is_waited_for(cli: CLI) -> None:
    """stdin inherited non-blocking, its data not written yet: run waits for the prompt (it said "no prompt",
    and chat ended having done nothing, exit 0)."""
    read_end, write_end = _pipe(0)
    p = subprocess.Popen(cli.argv("run", *N, "--no-log"), stdin=read_end, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=cli.env, cwd=ROOT, text=True)
    os.close(read_end)
    _until_waiting(p, "pipe_read")
    with os.fdopen(write_end, "wb") as feed:
        feed.write(b"Name a yellow fruit.\n")
    out, err = p.communicate(timeout=SAFETY_NET_S)
    assert p.returncode == 0 and out.strip() and err == "", err


def test_out_of_descriptors_is_said_so_not_a_full_disk(cli: CLI, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`ulimit -n` too low for a database: the collections say so (they said "no space is left on its disk"), and
    the log's warning names the limit, not the Python module whose import met it."""
    from localgen.embeddings import storedb

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    storedb.path().parent.mkdir(parents=True)
    storedb.make_schema(storedb.path())
    env = {**cli.env, "LOCALGEN_HOME": str(tmp_path)}
    r = _limited(CLI(env), resource.RLIMIT_NOFILE, 6, "collections")
    assert r.returncode == 1 and r.stderr == (f"localgen: error: the collections database {storedb.path()} cannot be "
                                              "used: too many open files (raise `ulimit -n`)\n"), r.stderr
    from localgen.log.store import _os_why

    met = OSError(errno.EMFILE, "Too many open files", str(ROOT / "localgen" / "sqlitedb.py"))
    assert _os_why(met, tmp_path) == "too many open files (raise `ulimit -n`)"
    too_big = OSError(errno.EFBIG, "File too large", str(tmp_path / "logs.db"))
    assert _os_why(too_big, tmp_path) == "the file size limit (`ulimit -f`) is reached"


def test_the_file_size_limit_is_said_so_not_a_disk_io_error(cli: CLI, tmp_path: Path) -> None:
    """`ulimit -f` reached by the benchmark history: said so, without "disk I/O error" and the hint to move the data
    folder elsewhere, which would meet the same limit."""
    r = _limited(CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path)}), resource.RLIMIT_FSIZE, 0, "bench", "history")
    history = tmp_path / "data" / "bench.sqlite"
    assert r.returncode == 1 and r.stderr == (f"localgen: error: the benchmark history {history} cannot be used: "
                                              "the file size limit (`ulimit -f`) is reached\n"), r.stderr
