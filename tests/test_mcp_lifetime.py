"""How long a stdio MCP server lives: no longer than the command that started it, however that command ends (a
SIGTERM or SIGHUP too, which end `run` by their default action: docs/tools.md). SmolLM2 with Qwen2.5's template
calls a server written here that never answers its call (tests/test_tools_chat.py: Ctrl-C during a call)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.test_tools import QWEN

# a server busy in a call that never returns: it reads no more input (so never sees it end) and ignores SIGTERM
STUCK = '''import json, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def send(o):
    sys.stdout.write(json.dumps(o) + "\\n")
    sys.stdout.flush()
while line := sys.stdin.readline():
    msg = json.loads(line)
    method, rid = msg.get("method"), msg.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": msg["params"]["protocolVersion"],
              "capabilities": {"tools": {}}, "serverInfo": {"name": "stuck", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [{"name": "stall", "description": "Never returns.",
              "inputSchema": {"type": "object", "properties": {}}}]}})
    elif method == "tools/call":
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])  # (whole, or not there: the call has begun)
        while True:
            time.sleep(1)
'''


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie has ended: dead, not yet reaped by whoever is its parent now)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the server's state in /proc")
@pytest.mark.parametrize(("sig", "times"), [(signal.SIGTERM, 1), (signal.SIGHUP, 1), (signal.SIGTERM, 2)],
                         ids=["SIGTERM", "SIGHUP", "SIGTERM-twice"])
def test_a_kill_during_an_mcp_call_takes_its_server_too(cli: CLI, tmp_path: Path, sig: signal.Signals,
                                                        times: int) -> None:
    """A SIGTERM or SIGHUP while an MCP call runs ended `run` by the signal and left the server running (its
    parent gone) until its call returned: one that never returns stayed for good. It is stopped (SIGTERM, then
    SIGKILL after a short grace) before `run` ends, still by the signal."""
    script, pidfile = tmp_path / "stuck.py", tmp_path / "server.pid"
    script.write_text(STUCK)
    p = cli.popen("run", "-m", "smollm2:135m", "--chat-template-file", str(QWEN), "--temperature", "0", "-n", "40",
                  "--mcp", f"{sys.executable} {script} {pidfile}", "--yes", "--tool-choice", "stall",
                  "--tool-timeout", "600", "-p", "Call stall.", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stderr is not None
    pid = 0
    try:
        deadline = time.monotonic() + 300
        while not pidfile.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pidfile.exists(), p.stderr.read().decode() if p.poll() is not None else "the call never began"
        pid = int(pidfile.read_text())
        p.send_signal(sig)
        if times == 2:  # a second one while the server is given its 2 s (a repeated kill): it ended localgen first
            time.sleep(0.5)
            p.send_signal(sig)
        rc = p.wait(timeout=60)
        err = p.stderr.read().decode()
        assert rc == -sig, (rc, err)
        assert not _alive(pid), "the MCP server is left running"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
