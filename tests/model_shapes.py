"""GGUF models of chosen shapes for the tests and the GPU check, written with the `gguf` package: a
mixture-of-experts model (qwen3moe) or a dense one (llama), either with seeded random weights that llama.cpp
loads and runs (F16, or valid Q4_K/Q6_K blocks), or as a header alone: the metadata and the tensor table of
the real shape, the data region a sparse file (a 30B model takes no disk), for the planner, which reads
headers only. No MoE model ships on PyPI; timings and memory do not depend on the weights' values.

usage: python -m tests.model_shapes SHAPE OUT.gguf [--header-only] [--tokenizer A.gguf]
       SHAPE: one of SHAPES (tiny-moe, tiny-dense, moe-30b-a3b, dense-8b)
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

SEED = 20261128
F32, F16, Q4_K, Q6_K = 0, 1, 12, 14  # ggml types


@dataclass(frozen=True)
class Shape:
    """A model's architecture and sizes."""

    arch: str  # "qwen3moe" or "llama"
    layers: int
    embd: int
    heads: int
    kv_heads: int
    head_dim: int
    ff: int = 0  # dense FFN width (llama)
    experts: int = 0
    used: int = 0
    ff_exp: int = 0  # each expert's FFN width
    vocab: int = 0  # 0: the tokenizer's
    ctx: int = 4096
    quant: str = "f16"  # or "q4_k_m": Q4_K, with Q6_K for attn_v, ffn_down(_exps) and the output
    tied: bool = False  # no output matrix: the embedding is multiplied at the end


SHAPES = {
    # the suite's MoE: 4 layers of 16 experts (2 used), half its weights experts (the embedding, tied, is the
    # other half); a few seconds to write
    "tiny-moe": Shape("qwen3moe", 4, 256, 4, 2, 64, experts=16, used=2, ff_exp=256, tied=True),
    "tiny-dense": Shape("llama", 4, 256, 4, 2, 64, ff=768),
    # Qwen3-30B-A3B and Llama 3.1 8B, Q4_K_M-like
    "moe-30b-a3b": Shape("qwen3moe", 48, 2048, 32, 4, 128, experts=128, used=8, ff_exp=768, vocab=151936,
                         ctx=40960, quant="q4_k_m"),
    "dense-8b": Shape("llama", 32, 4096, 32, 8, 128, ff=14336, vocab=128256, ctx=131072, quant="q4_k_m"),
}

_BLOCKS = {F32: (1, 4), F16: (1, 2), Q4_K: (256, 144), Q6_K: (256, 210)}


def _type(shape: Shape, name: str, dims: tuple[int, ...]) -> int:
    if len(dims) == 1 or "ffn_gate_inp" in name:
        return F32
    if shape.quant == "f16":
        return F16
    if any(k in name for k in ("attn_v", "ffn_down", "output.weight")):
        return Q6_K
    return Q4_K


def tensors(shape: Shape, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Each tensor's name and ggml dimensions (ne0 first: the input width of a matrix)."""
    e, hd = shape.embd, shape.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (e, n_vocab)), ("output_norm.weight", (e,))]
    if not shape.tied:
        out.append(("output.weight", (e, n_vocab)))
    for i in range(shape.layers):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (e,)), (p + "attn_q.weight", (e, shape.heads * hd)),
                (p + "attn_k.weight", (e, shape.kv_heads * hd)), (p + "attn_v.weight", (e, shape.kv_heads * hd)),
                (p + "attn_output.weight", (shape.heads * hd, e)), (p + "ffn_norm.weight", (e,))]
        if shape.arch == "qwen3moe":
            out += [(p + "attn_q_norm.weight", (hd,)), (p + "attn_k_norm.weight", (hd,)),
                    (p + "ffn_gate_inp.weight", (e, shape.experts)),
                    (p + "ffn_gate_exps.weight", (e, shape.ff_exp, shape.experts)),
                    (p + "ffn_up_exps.weight", (e, shape.ff_exp, shape.experts)),
                    (p + "ffn_down_exps.weight", (shape.ff_exp, e, shape.experts))]
        else:
            out += [(p + "ffn_gate.weight", (e, shape.ff)), (p + "ffn_up.weight", (e, shape.ff)),
                    (p + "ffn_down.weight", (shape.ff, e))]
    return out


@functools.cache
def _tokenizer(path: str) -> tuple[tuple[str, Any, Any, Any], ...]:
    """A GGUF's tokenizer.* keys as (name, value, type, array item type), read once per file."""
    import gguf

    r = gguf.GGUFReader(path)
    out = []
    for name, f in r.fields.items():
        if name.startswith("tokenizer."):
            vtype = f.types[0]
            sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
            out.append((name, f.contents(), vtype, sub))
    return tuple(out)


def build(shape: Shape, out: Path, tokenizer: Path | None = None, header_only: bool = False,
          seed: int = SEED) -> Path:
    """Write the model; returns its path. A tokenizer GGUF gives the vocabulary (a model llama.cpp can run);
    without one, `shape.vocab` placeholder tokens (a header for the planner: nothing tokenizes with it)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(out), shape.arch)
    if tokenizer is not None:
        items = _tokenizer(str(tokenizer))
        for name, value, vtype, sub in items:
            w.add_key_value(name, value, vtype, sub_type=sub)
        n_vocab = next(len(v) for n, v, _, _ in items if n == "tokenizer.ggml.tokens")
    else:
        n_vocab = shape.vocab
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}" for i in range(n_vocab)])
    w.add_name(f"random-{shape.arch}-{shape.layers}L")
    w.add_context_length(shape.ctx)
    w.add_embedding_length(shape.embd)
    w.add_block_count(shape.layers)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(n_vocab)
    if shape.arch == "qwen3moe":
        w.add_feed_forward_length(shape.ff_exp * shape.used)
        w.add_expert_count(shape.experts)
        w.add_expert_used_count(shape.used)
        w.add_expert_feed_forward_length(shape.ff_exp)
    else:
        w.add_feed_forward_length(shape.ff)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if shape.quant == "f16" else gguf.LlamaFileType.MOSTLY_Q4_K_M)

    rng = np.random.default_rng(seed)
    pool = {F32: (rng.standard_normal(1 << 20) * 0.02).astype(np.float32).view(np.uint8),
            F16: (rng.standard_normal(1 << 21) * 0.02).astype(np.float16).view(np.uint8),
            Q4_K: _blocks(rng, 144, ((0, 0.0005), (2, 0.0))), Q6_K: _blocks(rng, 210, ((208, 0.0005),))}
    for name, dims in tensors(shape, n_vocab):
        ttype = _type(shape, name, dims)
        per, size = _BLOCKS[ttype]
        n = 1
        for d in dims:
            n *= d
        nbytes = n // per * size
        raw = gguf.GGMLQuantizationType(ttype)
        numpy_shape = tuple(reversed(dims))
        if ttype != F32 and ttype != F16:  # a quantized tensor's numpy shape is in bytes per row
            numpy_shape = (*numpy_shape[:-1], numpy_shape[-1] // per * size)
        if header_only:
            w.add_tensor_info(name, numpy_shape, np.dtype(np.uint8 if ttype not in (F32, F16) else
                                                          (np.float32 if ttype == F32 else np.float16)),
                              nbytes, raw_dtype=raw)
        elif name.endswith("norm.weight"):
            w.add_tensor(name, np.ones(dims, dtype=np.float32))
        else:
            data = np.resize(pool[ttype], nbytes)
            if ttype == F32:
                data = data.view(np.float32)
            elif ttype == F16:
                data = data.view(np.float16)
            w.add_tensor(name, data.reshape(numpy_shape), raw_dtype=raw if ttype not in (F32, F16) else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    if header_only:
        w.write_ti_data_to_file()
        w.close()
        _extend_sparse(out)
    else:
        w.write_tensors_to_file()
        w.close()
    return out


def _blocks(rng: Any, size: int, scales: tuple[tuple[int, float], ...], count: int = 4096) -> Any:
    """`count` quantized blocks of random quants whose f16 scales (at the offsets given) are sane numbers."""
    import numpy as np

    b = rng.integers(0, 256, size=(count, size), dtype=np.uint8)
    for offset, value in scales:
        b[:, offset:offset + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return b.reshape(-1)


def _extend_sparse(path: Path) -> None:
    """Give a header-only file the size its tensor table says, as a hole (no blocks on disk)."""
    from localgen.models.gguf_meta import GGML_BLOCKS, read_gguf

    _meta, table, data_offset = read_gguf(str(path))
    end = data_offset
    for _name, dims, ttype, offset in table:
        per, size = GGML_BLOCKS[ttype]
        n = 1
        for d in dims:
            n *= d
        end = max(end, data_offset + offset + n // per * size)
    with open(path, "r+b") as f:
        f.truncate(end)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--header-only", action="store_true")
    ap.add_argument("--tokenizer", type=Path, help="a GGUF whose tokenizer the model takes")
    ap.add_argument("--layers", type=int, help="override the shape's layer count")
    a = ap.parse_args()
    shape = SHAPES[a.shape] if a.layers is None else replace(SHAPES[a.shape], layers=a.layers)
    print(build(shape, a.out, a.tokenizer, a.header_only))


if __name__ == "__main__":
    main()
