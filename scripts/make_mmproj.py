#!/usr/bin/env python3
"""Writes a small random-weight vision projector (mmproj GGUF) that libmtmd loads: LLaVA-1.5's kind
(projector type mlp: a CLIP ViT with a class embedding, then a two-layer GELU MLP) sized for a text model
of `--n-embd` (SmolLM2-135M: 576). SmolVLM's own type (idefics3) wraps images in tokens SmolLM2's
vocabulary lacks, so it cannot pair with it; mlp wraps them in nothing. No vision GGUF is reachable from
the package registries, so the tests pair this with the real SmolLM2 to prove the plumbing
(preprocessing, encode, positions, decoding) against llama-mtmd-cli: the weights are seeded, so the file
is the same bytes on every machine. Also writes the audio projector (Ultravox's kind), a test picture (PNG)
and a test clip (WAV), stdlib only.

    scripts/make_mmproj.py OUT.gguf [--n-embd 576] [--seed 0]
    scripts/make_mmproj.py --audio OUT.gguf [--n-embd 576] [--seed 0]
    scripts/make_mmproj.py --png OUT.png [--size 96x64]
    scripts/make_mmproj.py --wav OUT.wav [--seconds 1.5]
"""

from __future__ import annotations

import argparse
import struct
import sys
import zlib
from pathlib import Path
from typing import Any


class _Random:
    """Seeded weights: the same bytes on every machine."""

    def __init__(self, seed: int) -> None:
        import numpy as np

        self.rng = np.random.RandomState(seed)

    def w(self, *shape: int, std: float = 0.02) -> Any:
        import numpy as np

        return (self.rng.standard_normal(shape) * std).astype(np.float32)


def _ones(*shape: int) -> Any:
    import numpy as np

    return np.ones(shape, dtype=np.float32)


def _zeros(*shape: int) -> Any:
    import numpy as np

    return np.zeros(shape, dtype=np.float32)


def _blocks(out: Any, prefix: str, r: _Random, n_layer: int, n_embd: int, n_ff: int, k_bias: bool) -> None:
    """A ViT's (or Whisper's) transformer blocks: attention with biases, two layer norms, a GELU FFN."""
    for i in range(n_layer):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out.add_tensor(f"{prefix}.blk.{i}.{name}.weight", r.w(n_embd, n_embd))
            if k_bias or name != "attn_k":
                out.add_tensor(f"{prefix}.blk.{i}.{name}.bias", _zeros(n_embd))
        for name in ("ln1", "ln2"):
            out.add_tensor(f"{prefix}.blk.{i}.{name}.weight", _ones(n_embd))
            out.add_tensor(f"{prefix}.blk.{i}.{name}.bias", _zeros(n_embd))
        out.add_tensor(f"{prefix}.blk.{i}.ffn_up.weight", r.w(n_ff, n_embd))
        out.add_tensor(f"{prefix}.blk.{i}.ffn_up.bias", _zeros(n_ff))
        out.add_tensor(f"{prefix}.blk.{i}.ffn_down.weight", r.w(n_embd, n_ff))
        out.add_tensor(f"{prefix}.blk.{i}.ffn_down.bias", _zeros(n_embd))


def _header(path: Path, kind: str, modality: str, n_embd: int, n_ff: int, n_layer: int, n_embd_text: int,
            n_head: int, eps: float) -> Any:
    """A GGUF writer with a projector's common header: its type, its one modality and the encoder's shape."""
    import gguf

    out = gguf.GGUFWriter(str(path), "clip")
    out.add_string("general.name", f"localgen test {modality} projector (random weights)")
    out.add_string("clip.projector_type", kind)
    out.add_bool("clip.has_vision_encoder", modality == "vision")
    out.add_bool("clip.has_audio_encoder", modality == "audio")
    out.add_uint32(f"clip.{modality}.embedding_length", n_embd)
    out.add_uint32(f"clip.{modality}.feed_forward_length", n_ff)
    out.add_uint32(f"clip.{modality}.block_count", n_layer)
    out.add_uint32(f"clip.{modality}.projection_dim", n_embd_text)
    out.add_uint32(f"clip.{modality}.attention.head_count", n_head)
    out.add_float32(f"clip.{modality}.attention.layer_norm_epsilon", eps)
    return out


def write_mmproj(path: Path, n_embd_text: int = 576, seed: int = 0, image_size: int = 64, patch: int = 16,
                 n_embd: int = 64, n_ff: int = 128, n_layer: int = 2, n_head: int = 4) -> Path:
    """A seeded mlp projector for a text model whose embeddings have `n_embd_text` values."""
    r = _Random(seed)
    w, ones, zeros = r.w, _ones, _zeros
    out = _header(path, "mlp", "vision", n_embd, n_ff, n_layer, n_embd_text, n_head, 1e-6)
    out.add_bool("clip.use_gelu", True)
    out.add_uint32("clip.vision.image_size", image_size)
    out.add_uint32("clip.vision.patch_size", patch)
    out.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    out.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    n_patches = (image_size // patch) ** 2
    out.add_tensor("v.patch_embd.weight", w(n_embd, 3, patch, patch))
    out.add_tensor("v.patch_embd.bias", zeros(n_embd))
    out.add_tensor("v.class_embd", w(n_embd))
    out.add_tensor("v.position_embd.weight", w(n_patches + 1, n_embd))
    out.add_tensor("v.pre_ln.weight", ones(n_embd))
    out.add_tensor("v.pre_ln.bias", zeros(n_embd))
    _blocks(out, "v", r, n_layer, n_embd, n_ff, k_bias=True)
    out.add_tensor("mm.0.weight", w(n_embd_text, n_embd, std=0.3))
    out.add_tensor("mm.0.bias", zeros(n_embd_text))
    out.add_tensor("mm.2.weight", w(n_embd_text, n_embd_text, std=0.1))
    out.add_tensor("mm.2.bias", zeros(n_embd_text))
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return path


def write_audio_mmproj(path: Path, n_embd_text: int = 576, seed: int = 0, n_mel: int = 80, n_embd: int = 64,
                       n_ff: int = 128, n_layer: int = 2, n_head: int = 4, stack: int = 4, n_proj: int = 256) -> Path:
    """A seeded audio projector of Ultravox's kind (projector type ultravox: a Whisper encoder, two
    convolutions then transformer blocks, its frames stacked by `stack`, then an RMS-normed SwiGLU MLP) for
    a text model whose embeddings have `n_embd_text` values. A 30-second window becomes 375 tokens. (With
    Ultravox's own factor, 8, this llama.cpp aborts: it expects 187 tokens and its graph makes 188.)"""
    r = _Random(seed)
    w, ones, zeros = r.w, _ones, _zeros
    out = _header(path, "ultravox", "audio", n_embd, n_ff, n_layer, n_embd_text, n_head, 1e-5)
    out.add_uint32("clip.audio.num_mel_bins", n_mel)
    out.add_uint32("clip.audio.projector.stack_factor", stack)
    # the convolutions' biases are (channels, 1), as Whisper's converter writes them, to broadcast over time
    out.add_tensor("a.conv1d.1.weight", w(n_embd, n_mel, 3, std=0.1))
    out.add_tensor("a.conv1d.1.bias", zeros(n_embd, 1))
    out.add_tensor("a.conv1d.2.weight", w(n_embd, n_embd, 3, std=0.1))
    out.add_tensor("a.conv1d.2.bias", zeros(n_embd, 1))
    out.add_tensor("a.position_embd.weight", w(1500, n_embd))
    _blocks(out, "a", r, n_layer, n_embd, n_ff, k_bias=False)  # Whisper's key projection has no bias
    out.add_tensor("a.post_ln.weight", ones(n_embd))
    out.add_tensor("a.post_ln.bias", zeros(n_embd))
    out.add_tensor("mm.a.norm_pre.weight", ones(n_embd * stack))
    out.add_tensor("mm.a.mlp.1.weight", w(2 * n_proj, n_embd * stack, std=0.1))
    out.add_tensor("mm.a.norm_mid.weight", ones(n_proj))
    out.add_tensor("mm.a.mlp.2.weight", w(n_embd_text, n_proj, std=0.1))
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return path


def wav(seconds: float = 1.5, rate: int = 16000, tones: tuple[float, ...] = (440.0, 660.0)) -> bytes:
    """A 16-bit mono WAV of `tones` played one after another, as bytes (deterministic, stdlib only)."""
    import io
    import math
    import wave

    n = int(seconds * rate)
    per = max(1, n // len(tones))
    frames = bytearray()
    for i in range(n):
        f = tones[min(i // per, len(tones) - 1)]
        frames += struct.pack("<h", int(12000 * math.sin(2 * math.pi * f * i / rate)))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(bytes(frames))
    return buf.getvalue()


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
    ap = argparse.ArgumentParser(description="Write a seeded random-weight projector (mmproj GGUF) for SmolLM2, "
                                             "to try images or audio with a real text model, or a test picture or "
                                             "clip.",
                                 epilog="The projectors prove the plumbing, not eyesight or hearing: what the model "
                                        "says of a picture is noise.")
    ap.add_argument("out", type=Path)
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--audio", action="store_true",
                      help="an audio projector (Ultravox's kind) instead of a vision one")
    what.add_argument("--png", action="store_true", help="write the test picture instead")
    what.add_argument("--wav", action="store_true", help="write the test clip (two tones, 16 kHz) instead")
    ap.add_argument("--n-embd", type=int, default=576, help="the text model's embedding width (SmolLM2-135M: 576)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", default="96x64", help="the picture's WIDTHxHEIGHT (--png)")
    ap.add_argument("--seconds", type=float, default=1.5, help="the clip's length (--wav)")
    a = ap.parse_args(argv)
    if a.png:
        try:
            w, h = (int(v) for v in a.size.lower().split("x"))
        except ValueError:
            ap.error(f"--size takes WIDTHxHEIGHT, such as 96x64, not {a.size!r}")
        if not (0 < w <= 4096 and 0 < h <= 4096):
            ap.error(f"--size: each side from 1 to 4096 pixels, not {a.size}")
        a.out.write_bytes(png(w, h))
    elif a.wav:
        if not 0 < a.seconds <= 600:
            ap.error(f"--seconds: more than 0 and at most 600, not {a.seconds:g}")
        a.out.write_bytes(wav(a.seconds))
    elif a.audio:
        write_audio_mmproj(a.out, a.n_embd, a.seed)
    else:
        write_mmproj(a.out, a.n_embd, a.seed)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
