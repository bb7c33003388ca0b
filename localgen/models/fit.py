"""Will it fit? Memory a model needs at a context length (weights + KV cache + overhead), a verdict for
this machine, the recommended quantization, and how many layers to put on the GPU."""

from __future__ import annotations

from dataclasses import dataclass

from localgen import hardware
from localgen.types import GGUFSummary

KV_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
            "q4_1": 20 / 32, "q4_0": 18 / 32}
FULL_GPU, PARTIAL_GPU, CPU_ONLY, WONT_FIT = "full GPU", "partial GPU", "CPU only", "won't fit"


@dataclass(frozen=True)
class Machine:
    """What the estimate compares against."""

    ram_available: int
    gpu_free: int  # 0 without a usable GPU
    offload: bool
    unified: bool = False


# What a process's own GPU context takes before any model memory (CUDA: the primary context, cuBLAS
# handles and workspace; its size on an H100: docs/benchmarks.md, Costs noted in the code). nvidia-smi's free
# memory does not count it yet.
GPU_CONTEXT_RESERVE = 640 << 20


def this_machine(offload: bool) -> Machine:
    """Read this machine's memory and GPUs; GPU memory net of what our own GPU context will take."""
    g = hardware.gpus()
    ram = hardware.available_ram_bytes() or hardware.total_ram_bytes() or 0
    unified = bool(g and g[0].unified)
    free = sum(x.free for x in g) if offload else 0
    if free and not unified:
        free = max(0, free - GPU_CONTEXT_RESERVE * len(g))
    return Machine(ram_available=ram, gpu_free=free, offload=offload, unified=unified)


@dataclass(frozen=True)
class Estimate:
    """Bytes needed, split by kind."""

    weights: int
    kv: int
    overhead: int

    @property
    def total(self) -> int:
        """Everything."""
        return self.weights + self.kv + self.overhead


def kv_bytes(s: GGUFSummary, n_ctx: int, cache_k: str = "f16", cache_v: str = "f16") -> int:
    """KV cache size: layers × context × KV heads × (key + value head size) × bytes per element."""
    if not (s.n_layers and s.n_head_kv and s.head_dim_k):
        return 0
    per_token = s.n_head_kv * (s.head_dim_k * KV_BYTES[cache_k] + (s.head_dim_v or s.head_dim_k) * KV_BYTES[cache_v])
    return int(s.n_layers * n_ctx * per_token)


def estimate(s: GGUFSummary, weights_bytes: int, n_ctx: int, cache_k: str = "f16", cache_v: str = "f16",
             n_ubatch: int = 512) -> Estimate:
    """Weights as stored, the KV cache, and compute buffers (logits for a micro-batch, plus a margin)."""
    ctx = min(n_ctx, s.context_length or n_ctx)
    overhead = int(0.05 * weights_bytes) + n_ubatch * (s.vocab_size or 32000) * 4 + (64 << 20)
    return Estimate(weights=weights_bytes, kv=kv_bytes(s, ctx, cache_k, cache_v), overhead=overhead)


def verdict(e: Estimate, m: Machine) -> str:
    """full GPU / partial GPU / CPU only / won't fit."""
    if m.offload and m.gpu_free:
        if e.total <= m.gpu_free * 0.95:
            return FULL_GPU
        if m.unified:
            return WONT_FIT
        return PARTIAL_GPU if e.total <= m.gpu_free + m.ram_available * 0.9 else WONT_FIT
    return CPU_ONLY if e.total <= m.ram_available * 0.9 else WONT_FIT


def gpu_layers(s: GGUFSummary, e: Estimate, m: Machine) -> int:
    """Layers to offload so that weights and KV cache stay within free GPU memory: -1 for all, 0 for none."""
    if not m.offload or not m.gpu_free:
        return 0
    if e.total <= m.gpu_free * 0.95:
        return -1
    n = s.n_layers or 0
    if n == 0:
        return 0
    per_layer = (e.weights + e.kv) / n
    budget = m.gpu_free * 0.9 - e.overhead
    return max(0, min(n, int(budget // per_layer)))
