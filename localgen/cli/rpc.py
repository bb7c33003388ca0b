"""`localgen rpc-server`: serve this machine's GPUs (or its CPU) to llama.cpp RPC clients (`--rpc` on run,
chat, bench and serve), from the same llama.cpp build, so both ends always speak the same protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def rpc_server(
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on. The protocol is unauthenticated: never expose it "
                                         "to an untrusted network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", min=1, max=65535, help="Port.")] = 50052,
    threads: Annotated[
        int | None, typer.Option("--threads", "-t", min=1, show_default=False,
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
    if not is_loopback(host):
        err.warn(f"listening on {host}: llama.cpp's RPC protocol is unauthenticated and unencrypted; never expose "
                 "it to an untrusted network")
    cache_dir = None
    if cache:
        directory: Path = paths.cache_dir() / "rpc"
        directory.mkdir(parents=True, exist_ok=True)
        cache_dir = str(directory)
    err.line(f"localgen rpc-server on {host}:{port} (RPC protocol {devices.RPC_PROTO_MAJOR}.x); Ctrl-C stops it")
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # no Python handler can run inside the C call
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # so Ctrl-C ends it as it ends llama.cpp's rpc-server
    devices.start_rpc_server(f"{host}:{port}", threads or hardware.physical_cores(), cache_dir)
