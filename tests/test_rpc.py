"""llama.cpp RPC on loopback: two `localgen rpc-server` processes take SmolLM2's layers; the answer is the
local one; a dead port is an error before anything loads; a server dying mid-answer is one line, exit 1."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, NO_GPU, ROOT, InProcessCLI, assert_same_greedy_text, knows_the_bandwidth

PROMPT = "The capital of Italy is"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(cli: CLI) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = cli.popen("rpc-server", "--port", str(port), "-t", "1", stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("rpc-server did not start")


@pytest.fixture(scope="module")
def servers(cli: CLI) -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    started = [_start(cli), _start(cli)]
    yield started
    for proc, _ in started:
        proc.kill()
        proc.wait()


def test_a_model_split_over_two_servers_answers_as_locally(cli: CLI,
                                                            servers: list[tuple[subprocess.Popen[bytes], str]]) -> None:
    rpc = ",".join(ep for _, ep in servers)
    local = cli("run", "--raw", "-p", PROMPT, "-n", "12", "--temperature", "0", "--json")
    remote = cli("run", "--raw", "-p", PROMPT, "-n", "12", "--temperature", "0", "--json", "--rpc", rpc, "--verbose")
    assert remote.returncode == 0, remote.stderr
    placed = json.loads(remote.stdout)["load"]["weights_mib"]
    origins = json.loads(remote.stdout)["load"]["origins"]  # an RPC server's device is this machine's CPU here
    from localgen.native.devices import has_gpu

    to = "GPU and RPC servers" if has_gpu() else "RPC servers"  # a GPU here takes the layers the servers do not
    assert origins["repack"] == f"rule: off with layers offloaded to {to}", origins
    assert origins["flash_attn"] == f"rule: on (layers offloaded to {to})", origins
    offloaded = json.loads(remote.stdout)["load"]["offloaded"]  # llama.cpp says "to GPU" for any device
    assert re.fullmatch(rf"offloaded (\d+)/\1 layers to {to}", offloaded), offloaded
    for _, ep in servers:
        assert any(ep in dev and mib > 1 for dev, mib in placed.items()), f"weights on {ep}: {placed}"
        assert any(ep in line and "buffer size" in line for line in remote.stderr.splitlines()), \
            "llama.cpp's load log shows a buffer on each server"
    assert_same_greedy_text([json.loads(remote.stdout)["text"]], [json.loads(local.stdout)["text"]],
                            "layers on RPC servers give the local answer")
    stats = cli("run", "--raw", "-p", PROMPT, "-n", "4", "--rpc", rpc, "--stats")
    assert "weights: " in stats.stderr and all(ep in stats.stderr for _, ep in servers)
    doctor = cli("doctor", "--rpc", rpc)
    assert doctor.returncode == 0 and all(f"RPC       {ep}" in doctor.stdout for _, ep in servers)


def test_one_server_under_two_names_is_named_twice_before_load(
        cli: CLI, servers: list[tuple[subprocess.Popen[bytes], str]]) -> None:
    """rpc.md: a server named twice is a usage error; under two names (localhost and 127.0.0.1) too, told by the
    address its greeting came from. It passed the check of the names, and the load waited for ever on the second
    connection to a server that serves one client at a time."""
    port = servers[0][1].rpartition(":")[2]
    r = cli("run", "-p", "hi", "-n", "2", "--rpc", f"localhost:{port},127.0.0.1:{port}", timeout=120)
    assert r.returncode == 2 and r.stdout == "" and r.stderr == (
        f"localgen: error: localhost:{port} and 127.0.0.1:{port} are one RPC server (127.0.0.1:{port}), named twice "
        "(give each server once)\n"), r.stderr


def test_one_server_under_a_second_name_in_a_later_load_is_named_twice(
        servers: list[tuple[subprocess.Popen[bytes], str]]) -> None:
    """The same check against the servers of earlier loads in the process (serve's models may each name theirs):
    a later name for a server already added is refused, not waited on for ever. In a process of its own: added
    servers stay in llama.cpp's registry for the process's life."""
    port = servers[0][1].rpartition(":")[2]
    script = ("import socket\n"
              "from localgen.errors import UsageError\n"
              "from localgen.native import devices\n"
              f"devices.register_rpc(('localhost:{port}',))\n"
              f"held = socket.create_connection(('127.0.0.1', {port}))\n"  # as a model loaded through it holds it:
              # the server, serving it, would answer no greeting (the refusal comes before one)
              "try:\n"
              f"    devices.register_rpc(('127.0.0.1:{port}',))\n"
              "except UsageError as e:\n"
              "    print(e.message)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.stdout == f"localhost:{port} and 127.0.0.1:{port} are one RPC server (127.0.0.1:{port}), named twice\n", \
        (r.stdout, r.stderr)


def test_a_server_serving_another_client_says_it_may_be(cli: CLI,
                                                         servers: list[tuple[subprocess.Popen[bytes], str]]) -> None:
    """rpc.md: a server serves one client at a time; while another holds it, the greeting goes unanswered, and the
    5 s error's hint says that it may be serving another (it asked only whether an RPC server listened there)."""
    host, _, port = servers[1][1].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30):  # another client, served
        time.sleep(0.5)  # (accepted: the error is the same either way, this only makes it the case described)
        r = cli("run", "-p", "hi", "-n", "2", "--rpc", servers[1][1])
    assert r.returncode == 1 and "did not answer llama.cpp's RPC greeting within 5 s" in r.stderr, r.stderr
    assert "one that is serves one client at a time, and may be serving another)" in r.stderr, r.stderr


def test_a_dead_server_is_an_error_before_load(cli: CLI) -> None:
    port = _free_port()
    r = cli("run", "-p", "hi", "--rpc", f"127.0.0.1:{port}", "--verbose")
    assert r.returncode == 1 and f"cannot reach the RPC server 127.0.0.1:{port}" in r.stderr
    assert "load_tensors" not in r.stderr, "nothing was loaded"
    assert "(start it with `localgen rpc-server` on that machine)" in r.stderr
    r = cli("run", "-p", "hi", "--rpc", "nosuchhost.invalid:50052")  # a name not found: no server to start there
    assert r.returncode == 1 and "cannot reach the RPC server nosuchhost.invalid:50052" in r.stderr, r.stderr
    assert r.stderr.endswith("(check the host name: nosuchhost.invalid is not found)\n"), r.stderr


def test_a_port_that_accepts_and_never_answers_says_so_before_load(cli: CLI) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listening:  # the kernel accepts; nothing ever answers
        port = listening.getsockname()[1]
        r = cli("run", "-p", "hi", "--rpc", f"127.0.0.1:{port}", "--verbose")
    assert r.returncode == 1, r.stderr
    assert f"127.0.0.1:{port} accepted the connection but did not answer llama.cpp's RPC greeting within 5 s" \
        in r.stderr
    assert "load_tensors" not in r.stderr, "nothing was loaded"


class _Greeter:
    """A server that answers llama.cpp's RPC greeting (HELLO, protocol 7.0.0) on each connection, and then
    `then`: "silent" (nothing more), or that many devices to the count and every memory question, and nothing more
    (llama.cpp's next question, a buffer's alignment, waits for ever)."""

    def __init__(self, then: str | int, once: bool = False) -> None:
        import threading

        self.then = then
        self.once = once  # the first connection only (localgen's probe): then it stops listening, as if killed
        self.listening = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listening.getsockname()[1]}"
        self.seen: list[int] = []  # the commands received
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        while not self.done.is_set():
            try:
                conn, _ = self.listening.accept()
            except OSError:
                return
            if self.once:
                self._answer(conn)
                self.listening.close()
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        import struct

        with conn:
            while not self.done.is_set():
                try:
                    cmd = conn.recv(1)[0]
                    size = struct.unpack("<Q", conn.recv(8, socket.MSG_WAITALL))[0]
                    if size:
                        conn.recv(size, socket.MSG_WAITALL)
                except (IndexError, OSError, struct.error):
                    return
                self.seen.append(cmd)
                if cmd == 14:  # HELLO: protocol 7.0.0, no transport capabilities
                    conn.sendall(struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24))
                elif self.then == "silent" or cmd not in (11, 15):
                    self.done.wait(120)
                elif cmd == 15:  # the number of devices
                    conn.sendall(struct.pack("<QI", 4, int(self.then)))
                elif cmd == 11:  # a device's memory: free, total
                    conn.sendall(struct.pack("<QQQ", 16, 2**30, 2**31))

    def close(self) -> None:
        self.done.set()
        self.listening.close()


def test_a_server_silent_after_the_greeting_is_an_error_before_load(cli: CLI) -> None:
    """llama.cpp asks the number of devices next and would wait for the answer for ever: localgen asks first."""
    silent = _Greeter("silent")
    try:
        started = time.monotonic()
        r = cli("run", "-p", "hi", "-n", "4", "--rpc", silent.endpoint, "--verbose", timeout=120)
    finally:
        silent.close()
    assert r.returncode == 1, r.stderr
    assert f"localgen: error: the RPC server {silent.endpoint} answered the greeting but not the question of its " \
        "devices within 5 s" in r.stderr, r.stderr
    assert "load_tensors" not in r.stderr and time.monotonic() - started < 60


def test_a_server_gone_after_the_probe_says_the_rpc_server_went_away(cli: CLI) -> None:
    """A server killed during the load: llama.cpp's `Failed to connect to HOST:PORT` names no RPC, and the hint
    that says what happened came only with a message that did."""
    gone = _Greeter(1, once=True)
    try:
        r = cli("run", "-p", "hi", "-n", "4", "--rpc", gone.endpoint, timeout=120)
    finally:
        gone.close()
    assert r.returncode == 1 and r.stderr.count("localgen: error:") == 1, r.stderr
    assert "llama.cpp stopped: " in r.stderr and "(an RPC server went away or failed" in r.stderr, r.stderr


def test_ctrl_c_twice_ends_a_run_stuck_inside_llama_cpp(cli: CLI) -> None:
    """A server that answers the probe and then goes silent holds llama.cpp's load for ever (a call Python's own
    Ctrl-C handling cannot stop): the second Ctrl-C ends the process, `interrupted` and exit 130."""
    import signal

    quiet = _Greeter(1)
    try:
        run = cli.popen("run", "-p", "hi", "-n", "4", "--rpc", quiet.endpoint, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not any(cmd not in (11, 14, 15) for cmd in quiet.seen) and time.monotonic() < deadline:
            time.sleep(0.1)  # until llama.cpp asks what the server never answers
        assert run.poll() is None, run.communicate()
        run.send_signal(signal.SIGINT)
        time.sleep(1)
        assert run.poll() is None, "one press waits for llama.cpp"
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=30)
    finally:
        quiet.close()
    assert run.returncode == 130 and err.decode().splitlines()[-1] == "interrupted", (run.returncode, err)


def test_the_probe_asks_what_llama_cpp_asks_next() -> None:
    """The number of devices, then each one's memory; a number past MAX_RPC_DEVICES (or none) is an error."""
    from localgen.errors import LocalgenError
    from localgen.native.devices import MAX_RPC_DEVICES, rpc_hello

    two = _Greeter(2)
    try:
        assert rpc_hello(two.endpoint) == (7, 0, 0)
        assert two.seen == [14, 15, 11, 11], two.seen
    finally:
        two.close()
    for count in (0, MAX_RPC_DEVICES + 1):
        odd = _Greeter(count)
        try:
            with pytest.raises(LocalgenError, match=f"the RPC server {odd.endpoint} says it has {count} devices"):
                rpc_hello(odd.endpoint)
        finally:
            odd.close()


@pytest.mark.parametrize(("value", "message"), [
    ("nonsense", "--rpc takes HOST:PORT[,HOST:PORT...], not 'nonsense'"),
    ("127.0.0.1:50052,:5", "--rpc takes HOST:PORT[,HOST:PORT...], not ':5'"),
    ("127.0.0.1:99999", "--rpc 127.0.0.1:99999: the port must be 1 to 65535"),
    ("127.0.0.1:0", "--rpc 127.0.0.1:0: the port must be 1 to 65535"),
    ("a:\u0665", "--rpc takes HOST:PORT[,HOST:PORT...], not 'a:\u0665'"),  # a digit, but not one a port is written in
    ("a..b:1", "--rpc 'a..b:1' has a host name with an empty label or a label over 63 characters"),
    (f"{'a' * 64}.com:1", f"--rpc '{'a' * 64}.com:1' has a host name with an empty label"),
    ("a b:1", "--rpc 'a b:1' has no valid host name"),  # not 'cannot reach' (exit 1) after a lookup
    ("", "--rpc '' names no server"),  # never taken for the flag left out (docs/ci.md's exit 2 for empty text)
    (" , ", "--rpc ' , ' names no server"),
    ("127.0.0.1:47111,127.0.0.1:47111", "--rpc names 127.0.0.1:47111 twice"),  # not dropped in silence
])
@pytest.mark.parametrize("command", ["run", "doctor", "bench"])
def test_a_malformed_rpc_server_is_a_usage_error(cli_in_process: InProcessCLI, command: str, value: str,
                                                 message: str) -> None:
    """A bad HOST:PORT is exit 2 before anything connects (not 'Connection refused' for port 99999)."""
    r = cli_in_process(command, "--rpc", value, *(["-p", "hi"] if command == "run" else []))
    assert r.returncode == 2 and r.stderr.startswith(f"localgen: error: {message}"), r.stderr
    assert r.stderr.count("\n") == 1 and r.stdout == ""


def test_a_server_dying_mid_answer_is_one_line_and_exit_1(cli: CLI) -> None:
    proc, ep = _start(cli)
    try:
        run = cli.popen("run", "--raw", "-p", "Once upon a time", "-n", "2000", "--ignore-eos", "--rpc", ep,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert run.stdout is not None
        run.stdout.read(20)  # generating now
        proc.kill()
        _, err = run.communicate(timeout=60)
        text = err.decode()
        assert run.returncode == 1, text
        assert "llama.cpp stopped" in text and text.count("localgen: error") == 1 and "Traceback" not in text
    finally:
        proc.kill()
        proc.wait()


def test_a_server_killed_mid_bench_still_prints_the_rows_measured_and_says_where_they_are_kept(
        cli: CLI, tmp_path: Path) -> None:
    """bench.md: a run that fails part-way prints the rows measured and says how many it kept; llama.cpp aborting
    the process when its RPC server goes away ended it with the one error line alone."""
    home = knows_the_bandwidth(tmp_path / "home")
    c, db = CLI({**cli.env, "LOCALGEN_HOME": str(home)}), home / "data" / "bench.sqlite"
    proc, ep = _start(cli)
    try:
        bench = c.popen("bench", "--rpc", ep, "-p", "8", "-n", "8000", "-r", "1", "-t", "1", "--no-e2e",
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        while bench.poll() is None:  # the pp8 row kept, tg8000 under way
            with contextlib.suppress(sqlite3.Error), \
                    contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
                if conn.execute("SELECT count(*) FROM results").fetchone()[0]:
                    break
            time.sleep(0.1)
        proc.kill()
        out, err = (b.decode() for b in bench.communicate(timeout=120))
    finally:
        proc.kill()
        proc.wait()
    assert bench.returncode == 1, err
    assert [line.split("|")[7].strip() for line in out.splitlines() if line.startswith("| llama")] == ["pp8"], out
    lines = err.splitlines()
    assert lines[-2] == "1 result measured; kept as run 1: localgen bench history 1", err
    assert lines[-1].startswith("localgen: error: llama.cpp stopped: ") and "RPC server went away" in lines[-1], err
    assert "Traceback" not in err


def test_rpc_server_prints_llama_cpps_banner_on_stderr_and_nothing_on_stdout(cli: CLI, tmp_path: Path) -> None:
    """stdout carries only the answer, and rpc-server has none: llama.cpp's start-up banner (`Starting RPC
    server`, its devices, the transport) and its line per client went to stdout."""
    out, err = tmp_path / "out", tmp_path / "err"
    port = _free_port()
    with out.open("wb") as o, err.open("wb") as e:
        proc = cli.popen("rpc-server", "--port", str(port), "-t", "1", stdout=o, stderr=e)
    try:
        deadline = time.monotonic() + 60
        said = ""
        while "Client connection closed" not in said and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            time.sleep(0.2)
            said = out.read_text() + err.read_text()
    finally:
        proc.kill()
        proc.wait()
    assert out.read_text() == "", out.read_text()
    text = err.read_text()
    assert text.startswith(f"localgen rpc-server on 127.0.0.1:{port}") and "Starting RPC server" in text, text
    assert "Client connection closed" in text, text


def test_an_rpc_server_that_cannot_listen_is_one_line_before_it_starts(cli: CLI) -> None:
    """A taken port (exit 1) or an address this machine lacks (exit 2, as serve's): one error line with its hint,
    before the start line (llama.cpp's own server prints its banner and `Failed to create server socket`, and
    returns)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = cli("rpc-server", "--port", str(port), timeout=60)
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr == (f"localgen: error: cannot listen on 127.0.0.1:{port}: Address already in use (pick another "
                        "--port, or stop what is using it)\n")
    free = _free_port()
    r = cli("rpc-server", "--host", "192.0.2.1", "--port", str(free), timeout=60)  # TEST-NET-1: no one's
    assert (r.returncode, r.stdout) == (2, "") and r.stderr.startswith(
        f"localgen: error: cannot listen on 192.0.2.1:{free}: 192.0.2.1 is not an address of this machine (give one "
        "of this machine's: 127.0.0.1"), r.stderr
    assert r.stderr.count("\n") == 1, "no warning and no start line for a server that never starts"
    r = cli("rpc-server", "--host", "localhost", timeout=60)
    assert r.returncode == 2 and "--host takes an IPv4 address" in r.stderr and r.stderr.count("\n") == 1


def test_an_rpc_server_that_returns_is_an_error(cli_in_process: InProcessCLI, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's server returns only when it failed (its reason printed): that is exit 1, never 0. And
    docs/rpc.md: anything but loopback prints a warning that the protocol is unauthenticated."""
    from localgen.native import devices

    monkeypatch.setattr(devices, "start_rpc_server", lambda *args: None)
    r = cli_in_process("rpc-server", "--port", str(_free_port()))
    assert r.returncode == 1 and "llama.cpp's RPC server on 127.0.0.1:" in r.stderr and "stopped" in r.stderr
    assert "unauthenticated" not in r.stderr, "loopback is not warned about"
    r = cli_in_process("rpc-server", "--host", "0.0.0.0", "--port", str(_free_port()))  # bound, never listening
    assert r.stderr.startswith("warning: listening on 0.0.0.0: llama.cpp's RPC protocol is unauthenticated and "
                               "unencrypted"), r.stderr


def test_gpu_layers_and_tensor_split_say_what_goes_to_the_servers(
        cli: CLI, servers: list[tuple[subprocess.Popen[bytes], str]]) -> None:
    """docs/rpc.md: every layer is offloaded across the servers "unless `--gpu-layers` says otherwise;
    `--tensor-split` sets the proportions" (here the servers are the only devices: no GPU in the list)."""
    first, second = (ep for _, ep in servers)

    def placed(*flags: str) -> dict[str, float]:  # (this machine's GPU hidden: on one, it would take layers too)
        r = CLI({**cli.env, **NO_GPU})("run", "--raw", "-p", PROMPT, "-n", "1", "--json", "--rpc", f"{first},{second}",
                                       *flags)
        assert r.returncode == 0, r.stderr
        weights = json.loads(r.stdout)["load"]["weights_mib"]
        return {ep: sum(mib for dev, mib in weights.items() if ep in dev) for ep in (first, second)}

    both = placed()
    assert both[first] > 1 and both[second] > 1, both
    assert placed("-ngl", "0") == {first: 0, second: 0}
    alone = placed("--tensor-split", "1,0")
    assert alone[second] == 0 and alone[first] > both[first], alone
    more = placed("--tensor-split", "1,3")
    assert 0 < more[first] < more[second], more


def test_rpc_servers_synopsis_is_its_defaults() -> None:
    """docs/rpc.md: `localgen rpc-server [--host 127.0.0.1] [--port 50052] [--threads N] [--cache]`."""
    import re

    import typer

    from localgen.cli import app, params
    from tests.conftest import ROOT

    page = (ROOT / "docs" / "rpc.md").read_text(encoding="utf-8")
    synopsis = re.search(r"`localgen rpc-server (\[.*?\])`", page)
    assert synopsis, "the page gives rpc-server's synopsis"
    params.install()
    command: Any = typer.main.get_command(app.build())
    found = {p.opts[0]: p.default for p in command.commands["rpc-server"].params if p.opts[0].startswith("--")}
    said = dict(re.findall(r"\[(--[\w-]+)(?: ([^\]]+))?\]", synopsis[1]))
    assert said.keys() == found.keys() - {"--help"}, (said, found)
    assert (said["--host"], said["--port"]) == (found["--host"], str(found["--port"]))
    assert found["--threads"] is None and found["--cache"] is False


def test_doctor_says_the_weights_on_each_server_and_a_server_it_cannot_reach(
        cli: CLI, servers: list[tuple[subprocess.Popen[bytes], str]]) -> None:
    """docs/doctor.md: `doctor --rpc HOST:PORT,...` checks that each server answers with the same protocol and runs
    the test generation across them, "printing the MiB of weights on each device"; one it cannot reach is a
    PROBLEM line and exit 1, with no test load."""
    import re

    rpc = ",".join(ep for _, ep in servers)
    r = cli("doctor", "--rpc", rpc)
    assert r.returncode == 0, r.stdout + r.stderr
    check = next(line for line in r.stdout.splitlines() if line.startswith("check "))
    for _, ep in servers:
        found = re.search(rf"RPC\d+\[{re.escape(ep)}\] ([\d.,]+) MiB", check)
        assert found and float(found[1].replace(",", "")) > 1, check
    dead = f"127.0.0.1:{_free_port()}"
    r = cli("doctor", "--rpc", f"{rpc},{dead}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"PROBLEM   cannot reach the RPC server {dead}" in r.stdout
    assert not [line for line in r.stdout.splitlines() if line.startswith(("check ", "placement "))], r.stdout


def test_the_commands_that_take_rpc_are_the_pages() -> None:
    """docs/rpc.md: `--rpc HOST:PORT[,HOST:PORT...]` (`LLAMA_ARG_RPC`) "on `run`, `chat`, `bench`, `serve` and
    `doctor`": exactly the commands that have the flag, each reading the variable."""
    import re

    import typer

    from localgen.cli import app, params
    from tests.conftest import ROOT

    page = " ".join((ROOT / "docs" / "rpc.md").read_text(encoding="utf-8").split())
    listed = re.search(r"\(`LLAMA_ARG_RPC`, as llama.cpp reads it\) on (.+?)\. ", page)
    assert listed, "the page names the commands"
    named = set(re.findall(r"`([a-z-]+)`", listed[1]))
    params.install()
    command: Any = typer.main.get_command(app.build())
    having = {name: p for name, cmd in command.commands.items() for p in getattr(cmd, "params", [])
              if "--rpc" in p.opts}
    assert named == set(having) == {"run", "chat", "bench", "serve", "doctor"}, (named, set(having))
    assert all(p.envvar == "LLAMA_ARG_RPC" for p in having.values()), {n: p.envvar for n, p in having.items()}


def test_the_plans_mapped_span_is_llama_cpps_cpu_mapped_line_with_experts_in_ram(
        cli: CLI, moe_path: Path, servers: list[tuple[subprocess.Popen[bytes], str]]) -> None:
    """With the layers on another device and the first layers' experts kept in RAM, llama.cpp maps for the CPU the
    file's span from the token embedding to the end of those experts: the tensors of the other device between them
    are in its CPU_Mapped line (as on an H200, docs/benchmarks.md). The plan's `mapped` is that line, to the byte;
    its CPU `weights` are the CPU's own tensors, fewer."""
    from localgen.models import footprint
    from localgen.models.gguf_meta import read_summary
    from localgen.types import LoadParams

    _, ep = servers[0]
    s, w = read_summary(str(moe_path)), footprint.layout(str(moe_path))
    for flags, n_cpu_moe in ((["--n-cpu-moe", "2"], 2), ([], 0)):
        r = cli("run", "-m", str(moe_path), "--raw", "-p", "Once upon a time", "-n", "1", "--json", "--rpc", ep,
                *flags)
        assert r.returncode == 0, r.stderr[-2000:]
        loaded = json.loads(r.stdout)["load"]["weights_mib"]
        plan = footprint.estimate(s, w, LoadParams(n_ctx=512, n_cpu_moe=n_cpu_moe or None), gpu_layers=-1).on("CPU")
        assert loaded["CPU_Mapped"] == round(plan.mapped / 2**20, 2), (flags, loaded, plan)
        if n_cpu_moe:
            assert plan.weights < plan.mapped, "the server's tensors between the CPU's are mapped, not the CPU's"
        else:  # the token embedding alone
            assert plan.mapped == plan.weights == w.embedding


def test_a_second_ctrl_c_says_the_commands_last_words_once_before_interrupted() -> None:
    """rpc.md: a second Ctrl-C that ends a call stuck in llama.cpp lets bench print the rows it measured first, as
    an abort does (the same hook, native/lib.py's last_words), and only once whichever exit comes first."""
    import sys

    code = ("from localgen.native import lib\n"
            "with lib.last_words(lambda: print('the rows measured')):\n"
            "    lib._say_last_words()\n"  # an abort's exit got there first: the second says nothing again
            "    lib._exit_interrupted()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (r.returncode, r.stdout, r.stderr) == (130, "the rows measured\n", "interrupted\n"), r


@pytest.mark.parametrize("ot", [None, "token_embd=CPU", r"token_embd\.weight=CPU,blk\.1\.ffn_.*_exps=CPU"])
def test_the_plan_places_a_tied_output_matrix_where_llama_cpp_does(cli: CLI, moe_path: Path, ot: str | None,
                                                                   servers: list[tuple[subprocess.Popen[bytes], str]]
                                                                   ) -> None:
    """fit.md: the plan's weights are exact with and without placement flags. llama.cpp makes a tied output matrix
    under the embedding's name, so an -ot pattern that names the embedding moves that copy off the device too: the
    plan kept it on the GPU (24 of the tiny MoE's 50 MiB over). An RPC server stands in for the GPU (no padding)."""
    from localgen import placement
    from localgen.models import footprint
    from localgen.models.gguf_meta import read_summary
    from localgen.types import LoadParams

    flags = ["-ot", ot] if ot else []
    r = CLI({**cli.env, **NO_GPU})("run", "-m", str(moe_path), "--raw", "-p", "hi", "-n", "1", "--json", "--rpc",
                                   servers[0][1], *flags)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = json.loads(r.stdout)["load"]["weights_mib"]
    on_server = sum(mib for dev, mib in loaded.items() if servers[0][1] in dev)
    w = footprint.layout(str(moe_path))
    assert w.tied
    plan = footprint.estimate(read_summary(str(moe_path)), w, LoadParams(n_ctx=512), where=footprint.Placement(
        w.n_layer + 1, overrides=placement.overrides(placement.parse(ot), False, 0)))
    assert not any(t.gpu_pad for t in w.tensors)  # (a CUDA buffer's padding, which an RPC server's has not)
    planned = plan.on(footprint.GPU).weights
    assert on_server == pytest.approx(planned / (1 << 20), abs=0.01), (loaded, planned / (1 << 20))
