"""ggml's device registry, through the bindings' own libggml: which devices this build sees (a GPU, an
integrated GPU, RPC servers), and registering llama.cpp RPC servers the way llama.cpp's --rpc does."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from localgen.errors import LocalgenError

CPU, GPU, IGPU, ACCEL = 0, 1, 2, 3
_ggml: Any = None
_registered: set[str] = set()


def _lib() -> Any:
    """libggml with the signatures used here (loaded by the bindings; registry functions live in it)."""
    global _ggml
    if _ggml is None:
        from localgen.engine.lib import lib

        lib()
        from llama_cpp._ggml import libggml

        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        sigs = {
            "ggml_backend_dev_count": ([], sz), "ggml_backend_dev_get": ([sz], vp),
            "ggml_backend_dev_type": ([vp], ctypes.c_int), "ggml_backend_dev_name": ([vp], ctypes.c_char_p),
            "ggml_backend_dev_description": ([vp], ctypes.c_char_p),
            "ggml_backend_dev_memory": ([vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
            "ggml_backend_reg_by_name": ([ctypes.c_char_p], vp),
            "ggml_backend_reg_get_proc_address": ([vp, ctypes.c_char_p], vp),
            "ggml_backend_register": ([vp], None),
        }
        for name, (args, res) in sigs.items():
            fn = getattr(libggml, name)
            fn.argtypes = args
            fn.restype = res
        _ggml = libggml
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


def has_gpu() -> bool:
    """Whether this build sees a local GPU (RPC servers are not one: llama.cpp's own
    llama_supports_gpu_offload says yes for any build with RPC compiled in)."""
    return any(d.kind in (GPU, IGPU) and not d.name.startswith("RPC") for d in devices())


def register_rpc(servers: tuple[str, ...]) -> list[Device]:
    """Add llama.cpp RPC servers (HOST:PORT) as devices, once each, as llama.cpp's --rpc does:
    the RPC backend's ggml_backend_rpc_add_server proc address, then ggml_backend_register. Returns the
    devices they bring."""
    g = _lib()
    reg = g.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise LocalgenError("this llama-cpp-python was built without RPC support",
                            hint="rebuild it with scripts/install.sh (it builds with -DGGML_RPC=on)")
    add = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not add:
        raise LocalgenError("this llama.cpp's RPC backend has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(add)
    for endpoint in servers:
        if endpoint in _registered:
            continue
        server_reg = add_server(endpoint.encode())
        if not server_reg:
            raise LocalgenError(f"cannot add the RPC server {endpoint}")
        g.ggml_backend_register(server_reg)
        _registered.add(endpoint)
    return [d for d in devices() if d.name.startswith("RPC")]
