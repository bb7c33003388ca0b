"""`serve --host` that names no address of this machine is one honest line, exit 2, before any model loads, as
`--rpc` words its hosts: a name whose lookup failed for now (EAI_AGAIN, no answer from DNS) is not called a name that
does not exist; an unknown name says it is not found; an address of another machine says so (it was exit 1 and
"Cannot assign requested address"); `[::1]` is the address ::1 (it was looked up as a name)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from tests.conftest import InProcessCLI

HINT = "127.0.0.1 for this machine only, 0.0.0.0 for every interface"


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def one_line(r: object) -> str:
    """The one stderr line of an exit 2 that printed nothing on stdout."""
    assert (r.returncode, r.stdout) == (2, ""), (r.returncode, r.stdout, r.stderr)  # type: ignore[attr-defined]
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr  # type: ignore[attr-defined]
    return str(r.stderr)  # type: ignore[attr-defined]


def failing_lookup(monkeypatch: pytest.MonkeyPatch, host: str, err: int, why: str) -> None:
    """The system resolver answering `err` for `host` (every other name as it is)."""
    real: Callable[..., object] = socket.getaddrinfo

    def lookup(name: object, *args: object, **kw: object) -> object:
        if name == host:
            raise socket.gaierror(err, why)
        return real(name, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)


def test_a_host_whose_lookup_fails_for_now_is_said_so_not_no_such_host(cli_in_process: InProcessCLI,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    failing_lookup(monkeypatch, "gpu-box.lan", socket.EAI_AGAIN, "Temporary failure in name resolution")
    port = free_port()
    said = one_line(cli_in_process("serve", "--host", "gpu-box.lan", "--port", port))
    assert said == (f"localgen: error: cannot listen on gpu-box.lan:{port}: gpu-box.lan could not be resolved right "
                    f"now (a temporary failure of the name lookup) (try again, or give an address of this machine: "
                    f"{HINT})\n"), said


def test_an_unknown_host_name_is_not_found(cli_in_process: InProcessCLI, monkeypatch: pytest.MonkeyPatch) -> None:
    failing_lookup(monkeypatch, "no-such-box.lan", socket.EAI_NONAME, "Name or service not known")
    port = free_port()
    said = one_line(cli_in_process("serve", "--host", "no-such-box.lan", "--port", port))
    assert said == (f"localgen: error: cannot listen on no-such-box.lan:{port}: no such host: no-such-box.lan is not "
                    f"found (--host takes an address or a host name of this machine: {HINT})\n"), said


def test_a_real_lookup_of_a_reserved_name_gets_one_of_the_honest_lines(cli_in_process: InProcessCLI) -> None:
    """Through this machine's own resolver (no patch): .invalid never resolves; offline, the lookup may fail for
    now instead. Either way the line says which, never the resolver's bare "Name or service not known"."""
    said = one_line(cli_in_process("serve", "--host", "nosuch.invalid", "--port", free_port()))
    assert ("no such host: nosuch.invalid is not found" in said
            or "nosuch.invalid could not be resolved right now" in said), said


def test_an_address_of_another_machine_is_a_usage_error_that_says_so(cli_in_process: InProcessCLI) -> None:
    port = free_port()
    said = one_line(cli_in_process("serve", "--host", "192.0.2.1", "--port", port))  # TEST-NET-1: no one's
    assert said == (f"localgen: error: cannot listen on 192.0.2.1:{port}: 192.0.2.1 is not an address of this "
                    f"machine (give one of this machine's: {HINT}, or an interface's own address)\n"), said
    said = one_line(cli_in_process("serve", "--host", "192.0.2", "--port", port))  # inet_aton's short form
    assert "192.0.2 (192.0.0.2) is not an address of this machine" in said, said
    said = one_line(cli_in_process("serve", "--host", "169.254.7.7", "--port", port))  # IPv4 link-local: no
    assert said == (f"localgen: error: cannot listen on 169.254.7.7:{port}: 169.254.7.7 is not an address of this "
                    f"machine (give one of this machine's: {HINT}, or an interface's own address)\n"), said  # %eth0


def ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6(), reason="no IPv6 loopback here")
def test_an_ipv6_address_in_brackets_is_that_address(cli_in_process: InProcessCLI) -> None:
    """`--host [::1]` (as URLs write it, and as `[::1]:PORT` was taken already) is ::1: a busy port there is the busy
    port's line, exit 1, where it was "no such host" for `[::1]`."""
    with socket.socket(socket.AF_INET6) as busy:
        busy.bind(("::1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        r = cli_in_process("serve", "--host", "[::1]", "--port", port)
    assert r.returncode == 1 and r.stderr.startswith(f"localgen: error: cannot listen on [::1]:{port}: "), r.stderr
    assert "no such host" not in r.stderr and "pick another --port" in r.stderr, r.stderr
    said = one_line(cli_in_process("serve", "--host", "fe80::1", "--port", free_port()))  # link-local, no interface
    assert "fe80::1 is not an address of this machine" in said, said


@pytest.mark.parametrize("args", [("ps",), ("stop", "x"), ("launch", "codex", "--print-env")], ids=lambda a: a[0])
def test_a_client_s_empty_host_is_told_to_name_the_server_not_an_interface(cli_in_process: InProcessCLI,
                                                                           args: tuple[str, ...]) -> None:
    """A client's --host (ps's, stop's, launch's) is where to find a server: its hint names the server's address,
    not serve's 0.0.0.0 for every interface (launch wrote http://0.0.0.0:... into the agent's settings)."""
    for host, why in (("", "--host is empty"), ("a b", "--host 'a b' is not a host name or address: it has spaces")):
        said = one_line(cli_in_process(*args, "--host", host))
        assert said.startswith(f"localgen: error: {why}") and said.endswith(
            "(give the server's address or host name: 127.0.0.1 for a server on this machine)\n"), said
    assert one_line(cli_in_process("serve", "--host", "")).endswith(f"(give an address: {HINT})\n")
