"""Where a --functions tool's output goes, in the console script a user runs (SmolLM2, Qwen2.5's template, the call
forced with --tool-choice, as tests/test_tools.py does): what the tool's own thread prints is shown on stderr
(escaped on a terminal), what every other thread writes meanwhile is as it was, and nothing a program the tool
starts prints reaches stdout, which carries the answer alone (docs/tools.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.terminal import drained

BIN = Path(sys.executable).parent / "localgen"  # the console script, as a user runs it
QWEN = ROOT / "tests" / "data" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
RUN = ("run", "-m", "smollm2:135m", "--chat-template-file", str(QWEN), "--temperature", "0", "-n", "40",
       "--yes", "--tool-choice", "get_weather")
SAFETY_NET_S = 300


@pytest.fixture
def env(cli_env: dict[str, str], smollm2_path: Path) -> dict[str, str]:
    """The suite's environment but PYTHONUNBUFFERED: stdout buffered, as in a user's shell."""
    return {k: v for k, v in cli_env.items() if k != "PYTHONUNBUFFERED"}


def _on_a_terminal(env: dict[str, str], *args: str) -> tuple[bytes, bytes]:
    """`localgen ARGS` with stderr a terminal (a pty) and stdout a pipe: what each showed."""
    primary, secondary = os.openpty()
    try:
        proc = subprocess.Popen([str(BIN), *args], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=secondary)
        os.close(secondary)
        seen = drained(primary, SAFETY_NET_S)
        out = proc.stdout.read() if proc.stdout else b""
        assert proc.wait(60) == 0, seen
    finally:
        os.close(primary)
    return out, seen


def test_only_the_tools_own_thread_prints_escaped_another_thread_writes_as_before(env: dict[str, str],
                                                                                 tmp_path: Path) -> None:
    """A tool's print of a retitle is escaped on the terminal; a frame of a spinner that another thread writes
    to sys.stderr while the tool runs reaches the terminal as written (it was escaped too: `\\r\\x1b[K` shown
    literally, the line never redrawn)."""
    fns = tmp_path / "f_threads.py"
    fns.write_text(
        "import sys\nimport threading\n\n_go, _done = threading.Event(), threading.Event()\n\n\n"
        "def _spinner():  # another thread, as a progress line's: not the tool's\n"
        "    _go.wait()\n    sys.stderr.write('\\rSPIN-1\\x1b[K\\n')\n    sys.stderr.flush()\n    _done.set()\n\n\n"
        "threading.Thread(target=_spinner, daemon=True).start()\n\n\n"
        "def get_weather(city: str) -> str:\n    \"\"\"Weather.\"\"\"\n"
        "    print('TOOL\\x1b]0;TITLE\\x07', file=sys.stderr, flush=True)\n"
        "    _go.set()\n    _done.wait(60)  # the other thread writes while this call runs\n"
        "    return 'sunny'\n")
    out, seen = _on_a_terminal(env, *RUN, "--functions", str(fns), "--json", "Weather in Paris?")
    doc = json.loads(out)  # stdout: the one JSON object
    assert doc["tool_calls"][0]["result"] == "sunny", doc
    assert b"\rSPIN-1\x1b[K" in seen, seen  # the other thread's frame, as written
    assert b"SPIN-1\\x" not in seen and b"\\rSPIN" not in seen, seen
    assert b"TOOL\\x1b]0;TITLE\\x07" in seen and b"\x1b]0;TITLE" not in seen, seen  # the tool's own: escaped


def test_what_the_programs_a_tool_starts_print_never_reaches_stdout(env: dict[str, str], tmp_path: Path) -> None:
    """`localgen run ... | cat` is the answer alone: a program the tool runs (subprocess.run without capture,
    os.system), one it leaves running that prints after the call (as the answer is written), and a thread it
    starts that prints on sys.stdout, all show on stderr."""
    fns = tmp_path / "f_programs.py"
    fns.write_text(
        "import os\nimport subprocess\nimport sys\nimport threading\n\n\n"
        "def get_weather(city: str) -> str:\n    \"\"\"Weather.\"\"\"\n"
        "    subprocess.run([sys.executable, '-c', 'print(\"CHILD-OUT\")'], check=True)\n"
        "    os.system('echo SYSTEM-OUT')\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1); print(\"LATE-CHILD-OUT\")'])\n"
        "    t = threading.Thread(target=print, args=('THREAD-OUT',))\n    t.start()\n    t.join()\n"
        "    return 'sunny'\n")
    plain = subprocess.run([str(BIN), *RUN, "--functions", str(fns), "Weather in Paris?"], env=env, cwd=ROOT,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert plain.returncode == 0, plain.stderr
    assert "OUT" not in plain.stdout, plain.stdout
    for line in ("CHILD-OUT", "SYSTEM-OUT", "LATE-CHILD-OUT", "THREAD-OUT"):
        assert line in plain.stderr, (line, plain.stderr)
    as_json = subprocess.run([str(BIN), *RUN, "--functions", str(fns), "--json", "Weather in Paris?"], env=env,
                             cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=SAFETY_NET_S)
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)  # nothing before or after the one object
    assert doc["tool_calls"][0]["result"] == "sunny" and plain.stdout.strip() == doc["text"].strip()
