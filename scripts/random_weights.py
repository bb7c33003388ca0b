"""Random weights for the random models of scripts/make_random_llama.py and make_random_moe.py: F16 values, or
blocks of llama.cpp's Q4_K and Q6_K formats written directly (random quants and sub-scales, small finite
scales), so that a quantized model of a real model's size and speed is made in seconds, with no llama-quantize
and no F16 file first. Timings and memory do not depend on the values; the text is noise.

`Q4_K_M` follows llama-quantize's mix for that type: Q6_K for the output, and for attn_v and ffn_down (or
ffn_down_exps) in the first and last eighth of the layers and every third layer between; Q4_K elsewhere; norms
and the router stay F32. Needs numpy and gguf (the dev dependencies)."""

from __future__ import annotations

from typing import Any

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
TYPES = ("f16", "q4_k_m")


class Weights:
    """Makes each tensor of a model in one format (`f16` or `q4_k_m`) and adds it to a GGUFWriter."""

    def __init__(self, kind: str, n_layers: int, seed: int = 0) -> None:
        self.kind, self.n_layers = kind, n_layers
        rng = np.random.default_rng(seed)
        self.values = (rng.standard_normal(1 << 22, dtype=np.float32) * 0.02).astype(np.float16)
        self.bytes = rng.integers(0, 256, 1 << 26, dtype=np.uint8)
        self.scales = rng.uniform(0.002, 0.01, 1 << 16).astype(np.float16)

    def file_type(self) -> int:
        return int(gguf.LlamaFileType.MOSTLY_F16 if self.kind == "f16" else gguf.LlamaFileType.MOSTLY_Q4_K_M)

    def more_bits(self, layer: int) -> bool:
        """llama-quantize's use_more_bits: the layers whose attn_v and ffn_down Q4_K_M keeps in Q6_K."""
        n = self.n_layers
        return layer < n // 8 or layer >= 7 * n // 8 or (layer - n // 8) % 3 == 2

    def qtype(self, name: str) -> Any:
        if self.kind == "f16":
            return Q.F16
        if name == "output.weight":
            return Q.Q6_K
        if name.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")):
            return Q.Q6_K if self.more_bits(int(name.split(".")[1])) else Q.Q4_K
        return Q.Q4_K

    def add(self, writer: gguf.GGUFWriter, name: str, *shape: int) -> None:
        """A weight of logical shape `shape` (outermost first, as numpy's)."""
        qtype = self.qtype(name)
        if qtype == Q.F16:
            writer.add_tensor(name, np.resize(self.values, shape))
            return
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows = int(np.prod(shape[:-1]))
        data = np.resize(self.bytes, (rows * shape[-1] // block, size))
        scales = np.resize(self.scales, (data.shape[0], 2)).view(np.uint8)
        if qtype == Q.Q4_K:  # d and dmin first (two halves), then 12 bytes of 6-bit scales and 128 of quants
            data[:, 0:4] = scales
        else:  # Q6_K: 128 + 64 bytes of quants, 16 int8 scales, then d (one half) last
            data[:, 208:210] = scales[:, 0:2]
        writer.add_tensor(name, data.reshape(*shape[:-1], -1), raw_dtype=qtype)
