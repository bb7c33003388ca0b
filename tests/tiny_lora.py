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
import functools
from pathlib import Path

RANK = 8
TARGETS = ("attn_q", "attn_v")  # the weights the adapter changes, in every block
SEED = 20261126


@functools.cache
def _targets(base: str) -> tuple[str, tuple[tuple[str, int, int], ...]]:
    """The base's architecture and the weights the adapter changes, with their input and output sizes: read
    once per base by localgen's bounded header reader (gguf's reader parses the vocabulary's arrays too: 2 s of
    CPU for SmolLM2), then shared by the adapter and the foreign one made for the same base."""
    from localgen.models.gguf_meta import read_gguf

    meta, tensors, _ = read_gguf(base)
    found = []
    for name, dims, _type, _offset in tensors:
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in TARGETS and parts[3] == "weight":
            found.append((name, int(dims[0]), int(dims[1])))  # GGUF's order: ne0 (the input) first
    return str(meta["general.architecture"]), tuple(found)


def build(base: Path, out: Path, arch: str | None = None, seed: int = SEED) -> Path:
    """Write an adapter for `base` (its architecture, unless `arch` names another: a file llama.cpp refuses);
    returns its path."""
    import gguf
    import numpy as np

    base_arch, targets = _targets(str(base))
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), arch or base_arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_name("tiny-lora")
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(RANK))  # scale alpha / rank = 1
    for name, n_in, n_out in targets:
        stem = name.removesuffix(".weight")
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
