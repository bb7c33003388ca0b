"""ggml's device registry, through the bindings' own libggml: which devices this build sees (a GPU, an
integrated GPU, RPC servers), and registering llama.cpp RPC servers the way llama.cpp's --rpc does."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from localgen.errors import LocalgenError

CPU, GPU, IGPU, ACCEL = 0, 1, 2, 3
_ggml: Any = None
_registered: set[str] = set()
_peers: dict[str, tuple[Any, ...]] = {}  # each server the greeting reached: the address it answered at


def _lib() -> Any:
    """libggml with the signatures used here (loaded by the bindings; registry functions live in it)."""
    global _ggml
    if _ggml is None:
        from localgen.native.lib import lib, libggml

        lib()
        g = libggml()
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        sigs = {
            "ggml_backend_dev_count": ([], sz), "ggml_backend_dev_get": ([sz], vp),
            "ggml_backend_dev_type": ([vp], ctypes.c_int), "ggml_backend_dev_name": ([vp], ctypes.c_char_p),
            "ggml_backend_dev_description": ([vp], ctypes.c_char_p),
            "ggml_backend_dev_memory": ([vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
            "ggml_backend_reg_by_name": ([ctypes.c_char_p], vp),
            "ggml_backend_reg_get_proc_address": ([vp, ctypes.c_char_p], vp),
            "ggml_backend_register": ([vp], None),
            "ggml_backend_dev_buffer_type": ([vp], vp), "ggml_backend_buft_name": ([vp], ctypes.c_char_p),
        }
        for name, (args, res) in sigs.items():
            fn = getattr(g, name)
            fn.argtypes = args
            fn.restype = res
        _ggml = g
    return _ggml


@dataclass(frozen=True)
class Device:
    """One ggml device."""

    name: str
    description: str
    kind: int  # CPU, GPU, IGPU, ACCEL
    free: int
    total: int


def devices() -> list[Device]:
    """Every device ggml has registered."""
    g = _lib()
    out = []
    for i in range(int(g.ggml_backend_dev_count())):
        dev = g.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(Device((g.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
                          (g.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                          int(g.ggml_backend_dev_type(dev)), int(free.value), int(total.value)))
    return out


def start_rpc_server(endpoint: str, threads: int, cache_dir: str | None) -> None:
    """Serve this machine's devices to llama.cpp RPC clients (blocks until the process ends): the GPUs if
    there are any, else the CPU, through ggml_backend_rpc_start_server of this very build, so client and
    server always speak the same protocol."""
    g = _lib()
    reg = g.ggml_backend_reg_by_name(b"RPC")
    start = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_start_server") if reg else None
    if not start:
        raise LocalgenError("this llama-cpp-python was built without RPC support",
                            hint="rebuild it with scripts/install.sh (it builds with -DGGML_RPC=on)")
    chosen = [i for i, d in enumerate(devices()) if d.kind in (GPU, IGPU) and not d.name.startswith("RPC")]
    if not chosen:
        chosen = [i for i, d in enumerate(devices()) if d.kind == CPU][:1]
    arr = (ctypes.c_void_p * len(chosen))(*[g.ggml_backend_dev_get(i) for i in chosen])
    fn = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                          ctypes.POINTER(ctypes.c_void_p))(start)
    with _stdout_to_stderr():  # its banner and a line per client: stdout carries only an answer, and this has none
        fn(endpoint.encode(), cache_dir.encode() if cache_dir else None, threads, len(chosen), arr)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 is stderr's while the block runs (what C code prints to stdout goes to stderr, a line at a
    time), and stdout's again after; Python's sys.stdout is left unused meanwhile."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    libc: Any = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        libc = ctypes.CDLL(None)
        c_stdout = ctypes.c_void_p.in_dll(libc, "stdout")  # glibc's name (elsewhere: printed when it flushes)
        libc.setvbuf(c_stdout, None, 1, 0)  # _IOLBF: each line as it is printed
    try:
        yield
    finally:
        if libc is not None:
            with contextlib.suppress(AttributeError):
                libc.fflush(None)  # nothing buffered reaches the real stdout after
        os.dup2(saved, 1)
        os.close(saved)


def buffer_types() -> dict[str, int]:
    """Each device's buffer type by name ("CPU", "CUDA0", "RPC0[host:port]"), as llama.cpp's -ot looks them up
    (common/arg.cpp, parse_tensor_buffer_overrides): name → ggml_backend_buffer_type_t address."""
    g = _lib()
    out: dict[str, int] = {}
    for i in range(int(g.ggml_backend_dev_count())):
        buft = g.ggml_backend_dev_buffer_type(g.ggml_backend_dev_get(i))
        if buft:
            out[(g.ggml_backend_buft_name(buft) or b"").decode(errors="replace")] = int(buft)
    return out


def check_buffers(buffers: list[str], name: str = "--override-tensor") -> None:
    """A UsageError naming the buffer types this build has where one of `buffers` is not among them; `name`: where
    they came from (the flag, LLAMA_ARG_OVERRIDE_TENSOR, a preset's PARAMETER override_tensor)."""
    from localgen.errors import UsageError

    have = buffer_types()
    for buffer in buffers:
        if buffer not in have:
            raise UsageError(f"{name}: no buffer type {buffer!r} here; this build has {', '.join(sorted(have))}")


def has_gpu() -> bool:
    """Whether this build sees a local GPU (RPC servers are not one: llama.cpp's own
    llama_supports_gpu_offload says yes for any build with RPC compiled in)."""
    return any(d.kind in (GPU, IGPU) and not d.name.startswith("RPC") for d in devices())


RPC_PROTO_MAJOR = 7  # llama.cpp's RPC protocol of this build (ggml-rpc.h)
_HELLO, _CAPS = 14, 24  # RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE
_DEVICE_COUNT, _DEVICE_MEMORY = 15, 11  # RPC_CMD_DEVICE_COUNT, RPC_CMD_GET_DEVICE_MEMORY
MAX_RPC_DEVICES = 64  # a server that says it has more speaks something else


def rpc_hello(endpoint: str, timeout: float = 5.0) -> tuple[int, int, int]:
    """Check an RPC server before llama.cpp connects (it aborts the process when a server cannot be
    reached or speaks another version, and waits for ever on one that stops answering): connect, exchange
    HELLO, then ask what llama.cpp asks next (ggml_backend_rpc_add_server: the number of devices; registering
    them: each device's memory), each answer within `timeout`; returns its protocol version."""
    import socket
    import struct

    host, _, port = endpoint.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()):
        raise LocalgenError(f"bad RPC server {endpoint!r}: use HOST:PORT")
    try:
        s = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except socket.gaierror as e:  # the name's lookup failed: no server to start there
        raise _lookup_failed(endpoint, host.strip("[]"), e) from None
    except OSError as e:
        raise LocalgenError(f"cannot reach the RPC server {endpoint}: {e.strerror or e}",
                            hint="start it with `localgen rpc-server` on that machine") from None
    step = "the greeting"
    _peers[endpoint] = tuple(s.getpeername()[:2])
    try:
        with s:
            # before the greeting: a server an earlier load holds under another name would not answer it
            _one_each((*sorted(_registered - {endpoint}), endpoint))
            s.sendall(bytes([_HELLO]) + struct.pack("<Q", _CAPS) + bytes(_CAPS))
            head = _recv(s, 8)
            size = struct.unpack("<Q", head)[0]
            if size != 4 + _CAPS:
                raise LocalgenError(f"the RPC server {endpoint} speaks another protocol (its answer to the greeting "
                                    "is not llama.cpp's)",
                                    hint="run `localgen rpc-server` from the same llama-cpp-python build")
            major, minor, patch = _recv(s, size)[:3]
            if major == RPC_PROTO_MAJOR:
                step = "the question of its devices"
                _devices_answer(s, endpoint)
    except TimeoutError:
        if step == "the greeting":
            raise LocalgenError(f"{endpoint} accepted the connection but did not answer llama.cpp's RPC greeting "
                                f"within {timeout:g} s", hint="is an RPC server listening there? start one with "
                                "`localgen rpc-server` on that machine; one that is serves one client at a time, "
                                "and may be serving another") from None
        raise LocalgenError(f"the RPC server {endpoint} answered the greeting but not {step} within {timeout:g} s "
                            "(llama.cpp would wait for it for ever)",
                            hint="restart it with `localgen rpc-server` on that machine") from None
    except OSError as e:
        during = "llama.cpp's RPC greeting" if step == "the greeting" else step
        raise LocalgenError(f"the RPC server {endpoint} broke the connection during {during}: {e.strerror or e}",
                            hint="start it with `localgen rpc-server` on that machine") from None
    if major != RPC_PROTO_MAJOR:
        raise LocalgenError(f"the RPC server {endpoint} speaks protocol {major}.{minor}.{patch}; this build speaks "
                            f"{RPC_PROTO_MAJOR}.x",
                            hint="run `localgen rpc-server` from the same llama-cpp-python build")
    return major, minor, patch


def _devices_answer(sock: Any, endpoint: str) -> None:
    """Ask the server, as llama.cpp will, how many devices it has and each one's memory: an answer of another
    size, or a number of devices past MAX_RPC_DEVICES (or none), is a LocalgenError."""
    import struct

    def ask(cmd: int, payload: bytes, size: int) -> bytes:
        sock.sendall(bytes([cmd]) + struct.pack("<Q", len(payload)) + payload)
        got = struct.unpack("<Q", _recv(sock, 8))[0]
        if got != size:
            raise LocalgenError(f"the RPC server {endpoint} speaks another protocol (its answer about its devices "
                                "is not llama.cpp's)",
                                hint="run `localgen rpc-server` from the same llama-cpp-python build")
        return _recv(sock, size)

    count = struct.unpack("<I", ask(_DEVICE_COUNT, b"", 4))[0]
    if not 0 < count <= MAX_RPC_DEVICES:
        raise LocalgenError(f"the RPC server {endpoint} says it has {count} devices",
                            hint="run `localgen rpc-server` from the same llama-cpp-python build")
    for device in range(count):
        ask(_DEVICE_MEMORY, struct.pack("<I", device), 16)


def _lookup_failed(endpoint: str, host: str, e: OSError) -> LocalgenError:
    """The error for an RPC server whose host name did not resolve: a name the resolver does not know apart from
    a lookup that failed for now (no answer from DNS, EAI_AGAIN), which a retry or an address may get past."""
    import socket

    if e.errno == socket.EAI_AGAIN:
        return LocalgenError(f"cannot reach the RPC server {endpoint}: {host} could not be resolved right now (a "
                             "temporary failure of the name lookup)",
                             hint="try again, or give the server's IP address")
    unknown = {getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY") if hasattr(socket, n)}
    return LocalgenError(f"cannot reach the RPC server {endpoint}: {e.strerror or e}",
                         hint=f"check the host name: {host} is not found" if e.errno in unknown else
                         f"{host} could not be resolved: check the host name and this machine's name service, or "
                         "give the server's IP address")


def _recv(sock: Any, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError(0, "the server closed the connection")
        data += part
    return data


def _one_each(servers: tuple[str, ...]) -> None:
    """A UsageError where two of the servers are one, under two names (localhost:P, 127.0.0.1:P): llama.cpp would
    connect to it twice, and a server answers one client at a time, so the load would wait on it for ever."""
    from localgen.errors import UsageError

    seen: dict[tuple[Any, ...], str] = {}
    for endpoint in servers:
        peer = _peers.get(endpoint)
        if peer is not None and peer in seen:
            host = f"[{peer[0]}]" if ":" in str(peer[0]) else peer[0]  # an IPv6 address as a URL writes it
            raise UsageError(f"{seen[peer]} and {endpoint} are one RPC server ({host}:{peer[1]}), named twice",
                             hint="give each server once")
        if peer is not None:
            seen[peer] = endpoint


def register_rpc(servers: tuple[str, ...]) -> list[Device]:
    """Add llama.cpp RPC servers (HOST:PORT) as devices, once each, as llama.cpp's --rpc does:
    the RPC backend's ggml_backend_rpc_add_server proc address, then ggml_backend_register. Every server is
    checked first (reachable, same protocol). Returns the devices they bring."""
    for endpoint in servers:
        if endpoint not in _registered:
            rpc_hello(endpoint)
    _one_each((*sorted(_registered - set(servers)), *servers))  # those of earlier loads too (serve's)
    from localgen.native.lib import exit_when_stuck

    exit_when_stuck()  # a server may yet go silent mid-load or mid-answer: a second Ctrl-C then ends the process
    g = _lib()
    reg = g.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise LocalgenError("this llama-cpp-python was built without RPC support",
                            hint="rebuild it with scripts/install.sh (it builds with -DGGML_RPC=on)")
    add = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not add:
        raise LocalgenError("this llama.cpp's RPC backend has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(add)
    from localgen.native.lib import rpc_added

    rpc_added()  # (adding one connects again: a server killed since the probe aborts in there)
    for endpoint in servers:
        if endpoint in _registered:
            continue
        server_reg = add_server(endpoint.encode())
        if not server_reg:
            raise LocalgenError(f"cannot add the RPC server {endpoint}")
        g.ggml_backend_register(server_reg)
        _registered.add(endpoint)
    return [d for d in devices() if d.name.startswith("RPC")]


def backend_info() -> dict[str, Any]:
    """What this llama-cpp-python build offers (no model needed)."""
    from localgen.native.lib import lib

    lc = lib()
    return {
        "llama_cpp_python": lc.__version__,
        "gpu_offload": has_gpu(),
        "mmap": bool(lc.llama_supports_mmap()),
        "rpc": bool(lc.llama_supports_rpc()) if hasattr(lc, "llama_supports_rpc") else False,
        "system_info": lc.llama_print_system_info().decode("utf-8", errors="replace").strip(),
    }
