"""`localgen rpc-server`: serve this machine's GPUs (or its CPU) to llama.cpp RPC clients (`--rpc` on run,
chat, bench and serve), from the same llama.cpp build, so both ends always speak the same protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from localgen.errors import LocalgenError, UsageError


def rpc_server(
    host: Annotated[
        str, typer.Option("--host", help="IPv4 address to listen on (0.0.0.0: every interface). The protocol is "
                                         "unauthenticated: never expose it to an untrusted network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", min=1, max=65535, help="Port.")] = 50052,
    threads: Annotated[
        int | None, typer.Option("--threads", "-t", min=1, max=1024, show_default=False,
                                 help="CPU threads (default: the physical cores this process may use).")
    ] = None,
    cache: Annotated[
        bool, typer.Option("--cache", help="Keep received tensors in a local cache, so a model's second load "
                                           "sends only hashes.")
    ] = False,
) -> None:
    """Serve this machine's devices to llama.cpp RPC clients until stopped (Ctrl-C)."""
    import signal

    from localgen import hardware, paths
    from localgen.cli.main import is_loopback
    from localgen.cli.output import ErrWriter
    from localgen.native import devices

    err = ErrWriter()
    _can_listen(host, port)
    if not is_loopback(host):
        err.warn(f"listening on {host}: llama.cpp's RPC protocol is unauthenticated and unencrypted; never expose "
                 "it to an untrusted network")
    cache_dir = None
    if cache:
        directory: Path = paths.cache_dir() / "rpc"
        paths.make_dirs(directory)
        cache_dir = str(directory)
    err.line(f"localgen rpc-server on {host}:{port} (RPC protocol {devices.RPC_PROTO_MAJOR}.x); Ctrl-C stops it")
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # no Python handler can run inside the C call
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # so Ctrl-C ends it as it ends llama.cpp's rpc-server
    devices.start_rpc_server(f"{host}:{port}", threads or hardware.physical_cores(), cache_dir)
    # llama.cpp's server returns only when it could not start or stopped accepting, its reason printed above
    raise LocalgenError(f"llama.cpp's RPC server on {host}:{port} stopped (its reason is on the line above)")


def _can_listen(host: str, port: int) -> None:
    """llama.cpp's server listens on one IPv4 address and, where it cannot, prints a line and returns: the
    address is checked here first, so a busy port or a foreign address is one error line before anything
    starts."""
    import ipaddress

    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise UsageError(f"--host takes an IPv4 address (llama.cpp's RPC server listens on IPv4 only), not {host!r}",
                         hint="127.0.0.1 for this machine alone, 0.0.0.0 for every interface") from None
    from localgen.cli.serve.checks import check_port

    check_port(host, port)  # as serve's: an address elsewhere is exit 2, a port in use exit 1, each with its hint
