"""A LoRA adapter GGUF with seeded random weights for a given base GGUF, written with the `gguf` package: the
file llama.cpp's convert_lora_to_gguf.py writes (general.type "adapter", adapter.type "lora",
adapter.lora.alpha, and a lora_a/lora_b pair per adapted weight). No LoRA for SmolLM2 or Gemma 3 ships on
PyPI; this one takes the same llama.cpp code path (llama_adapter_lora_init, the adapter applied to a context),
and what it makes the base answer is checked against llama.cpp's own llama-server --lora (tests/data/,
scripts/lora_reference.py). Deterministic: a fixed seed, so the same bytes every time.

usage: python -m tests.tiny_lora BASE.gguf OUT.gguf
"""

from __future__ import annotations

import argparse
from pathlib import Path

RANK = 8
TARGETS = ("attn_q", "attn_v")  # the weights the adapter changes, in every block
SEED = 20261126


def build(base: Path, out: Path, arch: str | None = None, seed: int = SEED) -> Path:
    """Write an adapter for `base` (its architecture, unless `arch` names another: a file llama.cpp refuses);
    returns its path."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(base))
    field = reader.fields["general.architecture"]
    base_arch = bytes(field.parts[field.data[0]]).decode()
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), arch or base_arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_name("tiny-lora")
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(RANK))  # scale alpha / rank = 1
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in TARGETS or parts[3] != "weight":
            continue
        n_in, n_out = int(t.shape[0]), int(t.shape[1])  # GGUF's order: ne0 (the input) first
        stem = t.name.removesuffix(".weight")
        # numpy's order is the reverse of ggml's: lora_a is ne [n_in, RANK], lora_b ne [RANK, n_out]
        w.add_tensor(f"{stem}.weight.lora_a", (rng.standard_normal((RANK, n_in)) / np.sqrt(n_in)).astype(np.float32))
        w.add_tensor(f"{stem}.weight.lora_b", (rng.standard_normal((n_out, RANK)) * 0.3).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path)
    ap.add_argument("out", type=Path)
    a = ap.parse_args()
    print(build(a.base, a.out))
