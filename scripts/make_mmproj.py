#!/usr/bin/env python3
"""Writes a small random-weight vision projector (mmproj GGUF) that libmtmd loads: LLaVA-1.5's kind
(projector type mlp: a CLIP ViT with a class embedding, then a two-layer GELU MLP) sized for a text model
of `--n-embd` (SmolLM2-135M: 576). SmolVLM's own type (idefics3) wraps images in tokens SmolLM2's
vocabulary lacks, so it cannot pair with it; mlp wraps them in nothing. No vision GGUF is reachable from
the package registries, so the tests pair this with the real SmolLM2 to prove the plumbing
(preprocessing, encode, positions, decoding) against llama-mtmd-cli: the weights are seeded, so the file
is the same bytes on every machine. Also writes a test picture (PNG, stdlib only).

    scripts/make_mmproj.py OUT.gguf [--n-embd 576] [--seed 0]
    scripts/make_mmproj.py --png OUT.png [--size 96x64]
"""

from __future__ import annotations

import argparse
import struct
import sys
import zlib
from pathlib import Path


def write_mmproj(path: Path, n_embd_text: int = 576, seed: int = 0, image_size: int = 64, patch: int = 16,
                 n_embd: int = 64, n_ff: int = 128, n_layer: int = 2, n_head: int = 4) -> Path:
    """A seeded mlp projector for a text model whose embeddings have `n_embd_text` values."""
    import gguf
    import numpy as np

    rng = np.random.RandomState(seed)

    def w(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    out = gguf.GGUFWriter(str(path), "clip")
    out.add_string("general.name", "localgen test projector (random weights)")
    out.add_string("clip.projector_type", "mlp")
    out.add_bool("clip.has_vision_encoder", True)
    out.add_bool("clip.has_audio_encoder", False)
    out.add_bool("clip.use_gelu", True)
    out.add_uint32("clip.vision.image_size", image_size)
    out.add_uint32("clip.vision.patch_size", patch)
    out.add_uint32("clip.vision.embedding_length", n_embd)
    out.add_uint32("clip.vision.feed_forward_length", n_ff)
    out.add_uint32("clip.vision.block_count", n_layer)
    out.add_uint32("clip.vision.projection_dim", n_embd_text)
    out.add_uint32("clip.vision.attention.head_count", n_head)
    out.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    out.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    out.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    n_patches = (image_size // patch) ** 2
    out.add_tensor("v.patch_embd.weight", w(n_embd, 3, patch, patch))
    out.add_tensor("v.patch_embd.bias", zeros(n_embd))
    out.add_tensor("v.class_embd", w(n_embd))
    out.add_tensor("v.position_embd.weight", w(n_patches + 1, n_embd))
    out.add_tensor("v.pre_ln.weight", ones(n_embd))
    out.add_tensor("v.pre_ln.bias", zeros(n_embd))
    for i in range(n_layer):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out.add_tensor(f"v.blk.{i}.{name}.weight", w(n_embd, n_embd))
            out.add_tensor(f"v.blk.{i}.{name}.bias", zeros(n_embd))
        out.add_tensor(f"v.blk.{i}.ln1.weight", ones(n_embd))
        out.add_tensor(f"v.blk.{i}.ln1.bias", zeros(n_embd))
        out.add_tensor(f"v.blk.{i}.ln2.weight", ones(n_embd))
        out.add_tensor(f"v.blk.{i}.ln2.bias", zeros(n_embd))
        out.add_tensor(f"v.blk.{i}.ffn_up.weight", w(n_ff, n_embd))
        out.add_tensor(f"v.blk.{i}.ffn_up.bias", zeros(n_ff))
        out.add_tensor(f"v.blk.{i}.ffn_down.weight", w(n_embd, n_ff))
        out.add_tensor(f"v.blk.{i}.ffn_down.bias", zeros(n_embd))
    out.add_tensor("mm.0.weight", w(n_embd_text, n_embd, std=0.3))
    out.add_tensor("mm.0.bias", zeros(n_embd_text))
    out.add_tensor("mm.2.weight", w(n_embd_text, n_embd_text, std=0.1))
    out.add_tensor("mm.2.bias", zeros(n_embd_text))
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return path


def png(width: int = 96, height: int = 64) -> bytes:
    """A colour-gradient RGB picture with a diagonal stripe, as PNG bytes (deterministic)."""
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter: none
        for x in range(width):
            stripe = 255 if abs(x - y) < 4 else 0
            rows += bytes(((x * 255) // max(1, width - 1), (y * 255) // max(1, height - 1), stripe))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(rows), 9)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--n-embd", type=int, default=576)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--png", action="store_true", help="write the test picture instead")
    ap.add_argument("--size", default="96x64")
    a = ap.parse_args(argv)
    if a.png:
        w, h = (int(v) for v in a.size.split("x"))
        a.out.write_bytes(png(w, h))
    else:
        write_mmproj(a.out, a.n_embd, a.seed)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
