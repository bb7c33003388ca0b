"""What loading a model with given LoadParams needs, per device, from its GGUF header alone (#43 item 2):
weights on the CPU and on the GPU for the layers offloaded, the KV cache for its cells and cache types, the
compute buffers, and the logits' output buffer. fit.py's estimate answers "will it fit" for a quantization
not yet downloaded; this one is for a file on disk, about to load, to set against what is free.

How the parts follow llama.cpp (the sizes its load log prints as "model buffer size", "KV buffer size",
"compute buffer size" and "output buffer size"):
- weights: each tensor's bytes from its type's block size. Repeating layers go to the GPU from the last one
  down (`n_gpu_layers` of them); the output matrix too once every layer is there (a tied embedding is then
  loaded twice: the lookup stays on the CPU). The token embedding always stays on the CPU.
- KV cache: layers × cells × KV heads × (key + value head size) × bytes per element of its cache type, on
  the device of its layer. An interleaved sliding-window model (Gemma 3) holds every layer at full size, as
  localgen's contexts load them.
- compute: ggml reuses one buffer for the whole graph, so its size is the larger of two peaks measured by a
  micro-batch of `n_ubatch` tokens: the logits (tokens × vocabulary, f32) and, without flash attention, the
  attention scores (tokens × cells × (heads + 1 for the mask), f32); each plus two rows of activations. With
  flash attention no score matrix exists, only an f16 mask.
- output: one row of logits per sequence, in host memory.

Checked against llama.cpp's own figures for SmolLM2 135M and Gemma 3 270M on the CPU, with and without
flash attention, at two contexts each: every part within 15 % (tests/test_footprint.py; the
figures are on docs/benchmarks.md). On a GPU the split of the compute buffers between the devices is an
approximation that is not checked yet."""

from __future__ import annotations

import re
from dataclasses import dataclass

from localgen.models.fit import kv_bytes
from localgen.models.gguf_meta import GGML_BLOCKS, read_gguf
from localgen.types import GGUFSummary, LoadParams

F32 = 4
LAYER = re.compile(r"^blk\.(\d+)\.")
SPLIT = re.compile(r"-00001-of-(\d{5})\.gguf$")
CPU, GPU = "CPU", "GPU"


@dataclass(frozen=True)
class DeviceNeed:
    """Bytes one device needs, by part."""

    device: str
    weights: int = 0
    kv: int = 0
    compute: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        """Every part."""
        return self.weights + self.kv + self.compute + self.output


@dataclass(frozen=True)
class Footprint:
    """A model's needs on each device it loads onto (the CPU always; a GPU when layers are offloaded)."""

    devices: tuple[DeviceNeed, ...]

    @property
    def total(self) -> int:
        """Every device together."""
        return sum(d.total for d in self.devices)

    def on(self, device: str) -> DeviceNeed:
        """One device's needs (nothing, where the model puts nothing)."""
        return next((d for d in self.devices if d.device == device), DeviceNeed(device))


@dataclass(frozen=True)
class WeightLayout:
    """A GGUF's weight bytes by where llama.cpp puts them: each repeating layer, the embedding lookup, the
    output matrix and its norm."""

    layers: tuple[int, ...]
    embedding: int
    output: int
    tied: bool  # no output matrix of its own: the embedding is multiplied at the end


def layout(path: str) -> WeightLayout:
    """Read the tensor tables (bounded, no weights; every part of a split model) and add up each tensor's
    bytes by place."""
    tensors = []
    for part in _parts(path):
        tensors.extend(read_gguf(part)[1])
    layers: dict[int, int] = {}
    embedding = output = 0
    tied = True
    for name, dims, ttype, _offset in tensors:
        block = GGML_BLOCKS.get(ttype)
        if block is None:
            continue
        n = 1
        for d in dims:
            n *= d
        nbytes = (n // block[0]) * block[1]
        m = LAYER.match(name)
        if m:
            layers[int(m.group(1))] = layers.get(int(m.group(1)), 0) + nbytes
        elif name.startswith("token_embd"):
            embedding += nbytes
        else:  # output.weight, output_norm, rope factors: the output layer's
            output += nbytes
            tied = tied and name != "output.weight"
    return WeightLayout(tuple(layers[i] for i in sorted(layers)), embedding, output, tied)


def _parts(path: str) -> list[str]:
    m = SPLIT.search(path)
    if not m:
        return [path]
    return [path[: m.start()] + f"-{i:05d}-of-{m.group(1)}.gguf" for i in range(1, int(m.group(1)) + 1)]


def estimate(s: GGUFSummary, weights: WeightLayout, load: LoadParams, n_seq: int = 1,
             gpu_layers: int = 0) -> Footprint:
    """Per-device needs at `load`'s context (KV cells across all `n_seq` sequences), cache types, micro-batch
    and flash attention, with `gpu_layers` repeating layers on a GPU (-1 or more than the model has: all,
    and the output matrix too)."""
    n_layer = len(weights.layers) or s.n_layers or 0
    on_gpu = n_layer if gpu_layers < 0 else min(gpu_layers, n_layer)
    full = on_gpu == n_layer and n_layer > 0 and (gpu_layers < 0 or gpu_layers > n_layer)
    gpu_weights = sum(weights.layers[n_layer - on_gpu:]) if on_gpu else 0
    cpu_weights = sum(weights.layers) - gpu_weights + weights.embedding
    if full:
        gpu_weights += weights.output + (weights.embedding if weights.tied else 0)
    else:
        cpu_weights += weights.output

    kv = kv_bytes(s, load.n_ctx, load.cache_type_k, load.cache_type_v)
    gpu_kv = kv * on_gpu // n_layer if n_layer else 0

    ub = min(load.n_ubatch or 512, load.n_batch, load.n_ctx)
    rows = 2 * ub * (s.n_embd or 0) * F32
    logits = ub * (s.vocab_size or 0) * F32 + rows
    flash = load.flash_attn is not False  # None and "auto": localgen's rule and llama.cpp's both turn it on here
    scores = ub * load.n_ctx * (2 if flash else (s.n_head or 1) * F32 + F32) + rows
    if full:
        gpu_compute, cpu_compute = max(logits, scores), ub * (s.n_embd or 0) * F32
    elif on_gpu:
        gpu_compute, cpu_compute = scores, max(logits, scores)
    else:
        gpu_compute, cpu_compute = 0, max(logits, scores)
    output = n_seq * (s.vocab_size or 0) * F32

    cpu = DeviceNeed(CPU, weights=cpu_weights, kv=kv - gpu_kv, compute=cpu_compute, output=output)
    if not on_gpu and not full:
        return Footprint((cpu,))
    return Footprint((cpu, DeviceNeed(GPU, weights=gpu_weights, kv=gpu_kv, compute=gpu_compute)))


def of_file(path: str, s: GGUFSummary, load: LoadParams, n_seq: int = 1, gpu_layers: int = 0) -> Footprint:
    """estimate() for a model file (the first part of a split model)."""
    return estimate(s, layout(path), load, n_seq, gpu_layers)
