"""What loading a model with given settings needs on each device, from its GGUF header alone: the weights
where llama.cpp puts them (by layer, by device, and by placement pattern: experts kept in RAM), the KV
cache, the compute buffers, and the logits' output buffer. The planner (fit.py) searches placements and
contexts with it; serve's residency sets its total against its budget.

How the parts follow llama.cpp (the sizes its load log prints as "model buffer size", "KV buffer size",
"compute buffer size" and "output buffer size"):
- weights: each tensor's bytes from its type's block size. llama.cpp counts n_layer + 1 layers, the output
  layer last: `n_gpu_layers` N puts the last N of them on the GPUs (so the output layer first), split
  between GPUs by their shares (llama-model.cpp, get_layer_buft_list). The token embedding stays on the CPU;
  a tied embedding is loaded a second time as the output matrix where the output layer goes (on the CPU, only
  where it is repacked: a repacked copy; else the output matrix maps the same bytes). A placement
  pattern (-ot, --cpu-moe, --n-cpu-moe) overrides a tensor's layer. Repacked CPU weights are a second copy
  (CPU_REPACK beside CPU_Mapped). With mmap, llama.cpp's CPU_Mapped line is each file's span from the first
  of the CPU's tensors to the end of its last, so with experts in RAM it takes in the GPU's tensors between
  them (mapped, never read): the plan's `mapped` is that span, `weights` what the CPU's tensors hold.
- KV cache: per layer, cells × KV heads × (key + value head size) in its cache type's row size, on its
  layer's device; cells are the context rounded up to 256, per sequence. A sliding-window model (Gemma 3)
  holds every layer at full size: localgen's contexts keep llama.cpp's full-size SWA cache (swa_full).
- compute: ggml reuses one buffer for the whole graph, so its size is the larger of two peaks measured by a
  micro-batch of `n_ubatch` tokens: the logits (tokens × vocabulary, f32) and, without flash attention, the
  attention scores (tokens × cells × (heads + 1 for the mask), f32); each plus two rows of activations. With
  flash attention no score matrix exists, only an f16 mask. With the output layer on a GPU, the split follows
  what llama.cpp reported on an H200 (scripts/gpu_check): the GPU's buffer holds the logits beside its copy of
  the mask, one and a half rows of activations and a MoE's experts' activations; the host's, two rows and the
  mask. Experts kept in RAM are computed on the GPU all the same (llama.cpp copies their weights over for a
  micro-batch), so they add nothing to the host's buffer.
- output: one row of logits per sequence, in host memory.
- an encoder (BERT: attention not causal) has no KV cache, and its compute buffer is _encoder_compute's.

Checked against llama.cpp's load log on the CPU (tests/test_fit.py): weights and KV to the byte, compute
within COMPUTE_TOLERANCE, for SmolLM2 (llama), Gemma 3 (sliding window) and a random qwen3moe model; on an H200
(scripts/gpu_check, its figures in docs/benchmarks.md and tests/test_footprint.py) for an 8B-shaped llama and a
qwen3moe, over five contexts and micro-batches and with experts in RAM."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from localgen import placement
from localgen.errors import ModelFormatError
from localgen.models.gguf_meta import GGML_BLOCKS, MAX_LAYERS, read_table, repackable_types
from localgen.types import GGUFSummary, LoadParams

COMPUTE_TOLERANCE = 0.05  # the compute buffers, relative to what llama.cpp reports
ESTIMATE_TOLERANCE = COMPUTE_TOLERANCE
F32 = 4
LAYER = re.compile(r"^blk\.(\d+)\.")
SPLIT = re.compile(r"-00001-of-(\d{5})\.gguf$")
CPU, GPU = "CPU", "GPU"  # device names: "CPU", and "GPU" or "GPU0", "GPU1", ... with several
KV_BLOCKS = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q5_1": (32, 24), "q5_0": (32, 22),
             "q4_1": (32, 20), "q4_0": (32, 18), "iq4_nl": (32, 18)}
CELLS_PAD = 256  # llama.cpp rounds a context up to this many cells
EMBED_SEQS = 64  # the sequences an embeddings context holds (engine/embed.py's MAX_SEQS)

EMBEDDING = "token_embd.weight"  # the token embedding's name: a tied output matrix is made under it too


@dataclass(frozen=True)
class DeviceNeed:
    """Bytes one device needs, by part."""

    device: str
    weights: int = 0
    kv: int = 0
    compute: int = 0
    output: int = 0
    experts: int = 0  # of `weights`: mixture-of-experts weights
    # the CPU's: what llama.cpp's CPU model buffer lines add up to. With mmap, each file's span from the first of
    # the CPU's tensors to the end of its last (a GPU's tensors between them included: mapped, never read) plus
    # the repacked copies; without, `weights`
    mapped: int = 0

    @property
    def total(self) -> int:
        """Every part."""
        return self.weights + self.kv + self.compute + self.output


@dataclass(frozen=True)
class Footprint:
    """A model's needs on each device it loads onto (the CPU always; each GPU given layers)."""

    devices: tuple[DeviceNeed, ...]
    # where the output matrix is (output.weight, or a tied embedding's copy): a placement pattern may keep it in RAM
    # with the output layer on a GPU; None where the model has none (an encoder)
    output_matrix: str | None = None

    @property
    def total(self) -> int:
        """Every device together."""
        return sum(d.total for d in self.devices)

    def on(self, device: str) -> DeviceNeed:
        """One device's needs (nothing, where the model puts nothing)."""
        return next((d for d in self.devices if d.device == device), DeviceNeed(device))

    @property
    def gpus(self) -> tuple[DeviceNeed, ...]:
        """The GPUs' needs."""
        return tuple(d for d in self.devices if d.device != CPU)


@dataclass(frozen=True)
class Tensor:
    """One weight tensor: where it belongs and its bytes."""

    name: str
    layer: int | None  # None: the input (token embedding) or the output layer
    nbytes: int
    expert: bool  # a MoE layer's experts (placement.EXPS)
    repackable: bool  # llama.cpp's CPU backend would repack it here
    output: bool = False  # of the output layer (output.weight, output_norm, ...)
    offset: int = -1  # where its data begins in its file's data section (-1: not known)
    part: int = 0  # which file of a split model holds it
    gpu_pad: int = 0  # the bytes a GPU's buffer adds to it (gpu_padding)


@dataclass(frozen=True)
class WeightLayout:
    """A GGUF's weight tensors, by where llama.cpp puts them."""

    tensors: tuple[Tensor, ...]
    n_layer: int
    tied: bool  # no output matrix of its own: the embedding is multiplied at the end
    # a tied embedding's type and rows are ones the CPU backend repacks: as the output matrix on the CPU it gets a
    # repacked copy (the token embedding itself, read by rows, never does)
    tied_repackable: bool = False

    @property
    def layers(self) -> tuple[int, ...]:
        """Each repeating layer's bytes."""
        out = [0] * self.n_layer
        for t in self.tensors:
            if t.layer is not None:
                out[t.layer] += t.nbytes
        return tuple(out)

    @property
    def experts(self) -> tuple[int, ...]:
        """Each repeating layer's expert bytes (all 0 for a dense model)."""
        out = [0] * self.n_layer
        for t in self.tensors:
            if t.layer is not None and t.expert:
                out[t.layer] += t.nbytes
        return tuple(out)

    @property
    def embedding(self) -> int:
        """The token embedding's bytes."""
        return sum(t.nbytes for t in self.tensors if t.layer is None and not t.output)

    @property
    def embedding_gpu_pad(self) -> int:
        """What a GPU's buffer adds to the token embedding (a tied one's copy as the output matrix there)."""
        return sum(t.gpu_pad for t in self.tensors if t.layer is None and not t.output)

    @property
    def output(self) -> int:
        """The output layer's bytes (without a tied embedding)."""
        return sum(t.nbytes for t in self.tensors if t.output)

    @property
    def total(self) -> int:
        """Every tensor's bytes, as stored."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def moe(self) -> bool:
        """Whether the model has experts."""
        return any(t.expert for t in self.tensors)

    def scaled(self, size: int) -> WeightLayout:
        """The same model in another quantization of `size` bytes of weights in all: every tensor scaled alike
        (`pull --list` knows only the header of one of a repo's files)."""
        factor = size / self.total if self.total else 1.0
        return replace(self, tensors=tuple(replace(t, nbytes=int(t.nbytes * factor), offset=-1) for t in self.tensors))


# ggml's types that llama.cpp removed (ggml.c's type traits: "TYPE_Q4_0_4_4 REMOVED, use Q4_0 with runtime
# repacking"): files of them were published, so they are named, not taken for damage
REMOVED_TYPES = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8", 36: "IQ4_NL_4_4",
                 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}


def layout(path: str) -> WeightLayout:
    """Read the tensor tables (bounded, no weights; every part of a split model), each remembered with its file's
    summary (gguf_meta.read_table)."""
    tensors: list[tuple[Any, ...]] = []
    for i, part in enumerate(_parts(path)):
        tensors.extend((*row, i) for row in read_table(part))
    odd = next(((name, ttype) for name, _, ttype, *_ in tensors if ttype not in GGML_BLOCKS), None)
    if odd is not None and odd[1] in REMOVED_TYPES:  # a real quantization of 2023-24 that llama.cpp dropped
        raise ModelFormatError(f"{path} is quantized as {REMOVED_TYPES[odd[1]]} (its tensor {str(odd[0])[:100]}), "
                               "a type llama.cpp no longer reads", hint="get its Q4_0 (llama.cpp repacks that for "
                               "this CPU as it loads) or another quantization; downloading it again cannot help")
    if odd is not None:  # (gguf_init refuses the file: "tensor ... has invalid ggml type")
        raise ModelFormatError(f"{path} is not a usable GGUF file: its tensor {str(odd[0])[:100]} has the ggml type "
                               f"{odd[1]}, which llama.cpp does not know", hint="the file is corrupt or hostile")
    out = layout_of(tensors)
    if out.n_layer > MAX_LAYERS:  # a tensor named blk.N of a hostile N: every plan walks each layer
        raise ModelFormatError(f"{path} is not a usable GGUF file: its tensors name {out.n_layer:,} layers, "
                               f"more than llama.cpp's {MAX_LAYERS}", hint="the file is corrupt or hostile")
    return out


def layout_of(table: Iterable[tuple[Any, ...]]) -> WeightLayout:
    """A layout from a GGUF tensor table: (name, dims, ggml type, offset) rows, each with the index of the file
    of a split model that holds it where there are several."""
    kinds = repackable_types()
    out = []
    n_layer = 0
    rows = list(table)
    for name, dims, ttype, offset, *part in rows:
        block = GGML_BLOCKS.get(ttype)
        if block is None:
            continue
        n = 1
        for d in dims:
            n *= d
        m = LAYER.match(name)
        layer = int(m.group(1)) if m else None
        if layer is not None:
            n_layer = max(n_layer, layer + 1)
        expert = placement.is_expert(name)
        # what the CPU backend repacks: a matrix (MUL_MAT) or a layer's experts (MUL_MAT_ID, 3-D) of a repacked
        # type whose rows come in eights
        shaped = len(dims) == 2 or (len(dims) == 3 and expert)
        nbytes = (n // block[0]) * block[1]
        out.append(Tensor(name, layer, nbytes, expert,
                          ttype in kinds and shaped and dims[1] % 8 == 0 and not name.startswith("token_embd"),
                          output=layer is None and not name.startswith("token_embd"), offset=offset,
                          part=part[0] if part else 0, gpu_pad=gpu_padding(nbytes, dims[0] if dims else 0, block)))
    tied = not any(t.name == "output.weight" for t in out)
    embd = next(((ttype, dims) for name, dims, ttype, *_ in rows if name == EMBEDDING), None)
    return WeightLayout(tuple(out), n_layer, tied, tied and embd is not None and embd[0] in kinds
                        and len(embd[1]) == 2 and embd[1][1] % 8 == 0)


# CUDA's buffer (ggml-cuda.cu's get_alloc_size): a quantized tensor whose rows are not a multiple of
# MATRIX_ROW_PADDING elements gets room for one row's worth more, and every tensor starts at a multiple of the
# buffer's alignment
CUDA_ROW_PADDING, CUDA_ALIGNMENT = 512, 128


def gpu_padding(nbytes: int, ne0: int, block: tuple[int, int]) -> int:
    """The bytes a GPU's buffer adds to a tensor of `nbytes` whose rows have `ne0` elements, in llama.cpp's CUDA
    (and HIP) buffers: a few hundred bytes where a row's length is not a multiple of 512 (SmolLM2's 576: 0.07 MiB
    of 92 MiB), none for the usual 4096-wide model. Metal's buffers add none: there the plan is that much over."""
    values, size = block
    pad = (CUDA_ROW_PADDING - ne0 % CUDA_ROW_PADDING) // values * size if values > 1 and ne0 % CUDA_ROW_PADDING else 0
    return pad + -(nbytes + pad) % CUDA_ALIGNMENT


def _parts(path: str) -> list[str]:
    m = SPLIT.search(path)
    if not m:
        return [path]
    return [path[: m.start()] + f"-{i:05d}-of-{m.group(1)}.gguf" for i in range(1, int(m.group(1)) + 1)]


def cells(n_ctx: int) -> int:
    """The cells llama.cpp gives a context of n_ctx tokens (a multiple of 256)."""
    return -(-n_ctx // CELLS_PAD) * CELLS_PAD


def kv_bytes(s: GGUFSummary, n_cells: int, cache_k: str = "f16", cache_v: str = "f16",
             layers: int | None = None) -> int:
    """The KV cache of `layers` layers (default: all) for n_cells cells, in the cache types' row sizes."""
    if not (s.n_layers and s.n_head_kv and s.head_dim_k):
        return 0
    bk, bv = KV_BLOCKS[cache_k], KV_BLOCKS[cache_v]
    row_k = s.n_head_kv * s.head_dim_k // bk[0] * bk[1]
    row_v = s.n_head_kv * (s.head_dim_v or s.head_dim_k) // bv[0] * bv[1]
    return (s.n_layers if layers is None else layers) * n_cells * (row_k + row_v)


@dataclass(frozen=True)
class Placement:
    """Where the layers and tensors go: llama.cpp's n_gpu_layers (of n_layer + 1, the output layer counted),
    the GPUs' shares of them, and the placement patterns in order."""

    gpu_layers: int = 0
    shares: tuple[float, ...] = (1.0,)  # one per GPU
    overrides: tuple[tuple[str, str], ...] = ()
    cpu_moe_layers: int = 0  # the planner's --n-cpu-moe (the same as its patterns, without a regex per tensor)

    def device_of_layer(self, il: int, n_layer: int) -> int | None:
        """The GPU of layer il (n_layer: the output layer), or None for the CPU, as llama.cpp assigns it."""
        n_gpu = min(self.gpu_layers, n_layer + 1)
        start = n_layer + 1 - n_gpu
        if n_gpu <= 0 or il < start:
            return None
        total = sum(self.shares) or 1.0
        cumulative, acc = [], 0.0
        for x in self.shares:
            acc += x
            cumulative.append(acc / total)
        return min(bisect.bisect_right(cumulative, (il - start) / n_gpu), len(self.shares) - 1)


def _device_name(gpu: int | None, n_gpus: int) -> str:
    if gpu is None:
        return CPU
    return GPU if n_gpus == 1 else f"{GPU}{gpu}"


def estimate(s: GGUFSummary, weights: WeightLayout, load: LoadParams, n_seq: int = 1,
             gpu_layers: int = 0, where: Placement | None = None, repack: bool | None = None) -> Footprint:
    """Per-device needs at `load`'s context per sequence (`n_seq` sequences, each its own cells), cache types,
    micro-batch and flash attention. `where` places layers and tensors; without it, `gpu_layers` repeating
    layers go to one GPU (-1, or more than the model has: all of them and the output layer) with `load`'s
    placement patterns. `repack`: CPU weights repacked (default: load.repack)."""
    n_layer = weights.n_layer or s.n_layers or 0
    if where is None:
        n_gpu = n_layer + 1 if gpu_layers < 0 or gpu_layers > n_layer else gpu_layers
        where = Placement(n_gpu, overrides=placement.overrides(load.override_tensor, load.cpu_moe,
                                                               load.n_cpu_moe or 0))
    n_gpus = len(where.shares)
    layer_dev = [where.device_of_layer(il, n_layer) for il in range(n_layer + 1)]
    names = [_device_name(None, n_gpus)] + [_device_name(g, n_gpus) for g in range(n_gpus)]
    w = dict.fromkeys(names, 0)
    experts = dict.fromkeys(names, 0)
    repack = bool(load.repack) if repack is None else repack
    spans: dict[int, tuple[int, int]] = {}  # file -> the first byte and the end of the CPU's mapped tensors in it
    copies = 0  # repacked copies of CPU tensors (llama.cpp's CPU_REPACK buffer)
    matrix: str | None = None  # where output.weight is
    known = load.use_mmap  # the span is known: mapped, and every tensor's offset read from the file
    for t in weights.tensors:
        home = layer_dev[n_layer] if t.output else (None if t.layer is None else layer_dev[t.layer])
        dev = home
        if t.expert and t.layer is not None and t.layer < where.cpu_moe_layers:
            dev = None
        elif where.overrides:
            buffer = placement.buffer_of(t.name, where.overrides)
            if buffer is not None:
                dev = placement.gpu_index(buffer)
                dev = None if dev is None else min(dev, n_gpus - 1)
        name = _device_name(dev, n_gpus)
        if t.name == "output.weight":
            matrix = name
        repacked = dev is None and repack and t.repackable
        w[name] += t.nbytes * (2 if repacked else 1) + (0 if dev is None else t.gpu_pad)
        known = known and t.offset >= 0
        if repacked:
            copies += t.nbytes
        elif dev is None:  # in the buffer llama.cpp maps from the file for the CPU
            lo, hi = spans.get(t.part, (t.offset, t.offset + t.nbytes))
            spans[t.part] = (min(lo, t.offset), max(hi, t.offset + t.nbytes))
        if t.expert:
            experts[name] += t.nbytes
    out_dev = layer_dev[n_layer]
    if weights.tied and where.overrides:  # llama.cpp makes the output matrix under the embedding's name, so the
        buffer = placement.buffer_of(EMBEDDING, where.overrides)  # -ot pattern that names the embedding places it
        if buffer is not None:
            out_dev = placement.gpu_index(buffer)
            out_dev = None if out_dev is None else min(out_dev, n_gpus - 1)
    if weights.tied and not s.encoder_only:
        matrix = _device_name(out_dev, n_gpus)
    if weights.tied and out_dev is not None:  # the embedding again, as the output matrix
        w[_device_name(out_dev, n_gpus)] += weights.embedding + weights.embedding_gpu_pad
    elif weights.tied and repack and weights.tied_repackable:  # on the CPU, the output matrix's repacked copy
        w[CPU] += weights.embedding
        copies += weights.embedding

    n_cells = cells(load.n_ctx)
    kv = dict.fromkeys(names, 0)
    # an encoder (BERT) attends within its micro-batch alone: llama.cpp makes it no KV cache
    per_layer = 0 if s.encoder_only else kv_bytes(s, n_cells * n_seq, load.cache_type_k, load.cache_type_v, layers=1)
    for il in range(n_layer):
        kv[_device_name(layer_dev[il], n_gpus)] += per_layer

    compute = _compute(s, load, n_cells, [_device_name(d, n_gpus) for d in layer_dev], names)
    output = n_seq * (s.vocab_size or 0) * F32

    mapped = sum(hi - lo for lo, hi in spans.values()) + copies if known else w[CPU]
    devices = [DeviceNeed(name, weights=w[name], kv=kv[name], compute=compute[name],
                          output=output if name == CPU else 0, experts=experts[name],
                          mapped=mapped if name == CPU else 0)
               for name in names if name == CPU or w[name] or kv[name] or compute[name]]
    return Footprint(tuple(devices), output_matrix=matrix)


def _compute(s: GGUFSummary, load: LoadParams, n_cells: int, layer_dev: list[str], names: list[str]) -> dict[str, int]:
    """Each device's compute buffer (its largest micro-batch's activations), by `estimate`'s device names; `layer_dev`:
    the device of each repeating layer, then the output layer's."""
    ub = min(load.n_ubatch or 512, load.n_batch, n_cells)
    if s.encoder_only:  # no logits, no cache: the micro-batch's own tokens attend to each other
        enc = _encoder_compute(s, ub, load.flash_attn is not False)
        return {name: enc if name in layer_dev else 0 for name in names}
    rows = 2 * ub * (s.n_embd or 0) * F32
    logits = ub * (s.vocab_size or 0) * F32 + rows
    flash = load.flash_attn is not False  # None and "auto": localgen's rule and llama.cpp's both turn it on here
    scores = ub * n_cells * (2 if flash else (s.n_head or 1) * F32 + F32) + rows
    # a layer's feed-forward activations (the dense FFN's two, or the chosen experts' three per token)
    used, ff_exp = _meta_int(s, "expert_used_count"), _meta_int(s, "expert_feed_forward_length")
    ffn = ub * max(2 * _meta_int(s, "feed_forward_length"), 3 * used * ff_exp) * F32 + rows
    compute = dict.fromkeys(names, 0)
    out_dev = layer_dev[-1]
    for name in {d for d in layer_dev[:-1] if d != CPU}:
        compute[name] = max(scores, ffn)
    compute[out_dev] = max(logits, scores, ffn)
    if out_dev != CPU:
        # the GPU holds its copy of the mask through the logits, and a MoE's experts' activations; the host
        # buffer, the input rows and the mask; experts in RAM are computed on the GPU all the same (llama.cpp
        # copies their weights over for a micro-batch), so they add nothing to it
        mask = ub * n_cells * (2 if flash else F32)
        experts_rows = ub * 3 * used * ff_exp * F32
        compute[out_dev] = max(logits - rows + mask + 3 * ub * (s.n_embd or 0) * F32 // 2 + experts_rows, scores,
                               ffn)
        compute[CPU] = rows + mask
    return compute


def embeddings_bytes(s: GGUFSummary, n_ctx: int, flash: bool = True) -> int:
    """What an embeddings context (engine/embed.py: n_batch = n_ubatch = n_ctx, EMBED_SEQS sequences drawing on
    one pool of n_ctx cells, every token an output) takes beside the model's weights, on every device together:
    - KV cache: n_ctx cells (rounded up to 256) for a causal model; an encoder (BERT) keeps none.
    - output: a row of logits and one of embeddings per sequence, f32 (llama.cpp reserves both).
    - compute: the attention mask (f16 with flash attention, which llama.cpp's choice turns on where the device
      has it; without, the scores of every head in f32) and two rows of activations, both alive through the
      graph, plus the larger of the logits (computed for every token) and the feed-forward layer's activations
      (its up projection and a residual row); an encoder's as _encoder_compute counts it.
    Checked against llama.cpp's sizes (tests/test_footprint.py) for SmolLM2 and BERT models: within
    COMPUTE_TOLERANCE."""
    n_cells = cells(n_ctx)
    ub = n_cells  # a text is encoded in one ubatch: the window's cells
    n_embd, vocab = s.n_embd or 0, s.vocab_size or 0
    output = EMBED_SEQS * (vocab + n_embd) * F32
    if s.encoder_only:
        return output + _encoder_compute(s, ub, flash)
    mask = ub * n_cells * (2 if flash else ((s.n_head or 1) + 1) * F32)
    rows = 2 * ub * n_embd * F32
    ffn = ub * (_meta_int(s, "feed_forward_length") + n_embd) * F32
    return kv_bytes(s, n_cells) + output + mask + rows + max(ub * vocab * F32, ffn)


# encoders whose feed-forward layer is gated (llama.cpp's LLM_FFN_SILU/GELU with LLM_FFN_PAR): up, gate, product
GATED_ENCODERS = frozenset({"nomic-bert", "nomic-bert-moe", "jina-bert-v2", "modern-bert", "neo-bert"})


def _encoder_compute(s: GGUFSummary, ub: int, flash: bool) -> int:
    """An encoder's compute buffer for a micro-batch of `ub` tokens (a non-causal graph: no cache, the tokens
    attend to each other, no output head): the mask (and without flash attention every head's scores), two rows
    of activations, and the larger of the feed-forward layer's (its up projection and a residual row) and the
    attention's (its query, key and value rows in f32 and an f16 copy for the kernel: 3.5 rows). A gated
    feed-forward layer (nomic-bert's SwiGLU) holds its up projection, its gate and their product. llama.cpp's
    sizes for BERTs from 64 to 384 wide, feed-forward 2 and 4 times that, 256 to 4,096 tokens, and nomic-berts
    384 and 768 wide: within 1 %."""
    n_embd = s.n_embd or 0
    mask = ub * ub * (2 if flash else ((s.n_head or 1) + 1) * F32)
    rows = 2 * ub * n_embd * F32
    n_ff = _meta_int(s, "feed_forward_length") * (3 if s.architecture in GATED_ENCODERS else 1)
    ffn = ub * (n_ff + n_embd) * F32
    attention = ub * n_embd * F32 * 7 // 2
    return mask + rows + max(ffn, attention)


def _meta_int(s: GGUFSummary, key: str) -> int:
    """An architecture's integer (the first of a per-layer list), 0 where the header has none."""
    v = s.metadata.get(f"{s.architecture}.{key}")
    if isinstance(v, list):
        v = max((x for x in v if isinstance(x, int)), default=0)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def of_file(path: str, s: GGUFSummary, load: LoadParams, n_seq: int = 1, gpu_layers: int = 0) -> Footprint:
    """estimate() for a model file (the first part of a split model)."""
    return estimate(s, layout(path), load, n_seq, gpu_layers)
