"""A tiny llama GGUF with random weights and another model's tokenizer (every `tokenizer.*` field copied from its
GGUF), written with the `gguf` package: a draft model with SmolLM2's vocabulary whose drafts are (almost) never
what SmolLM2 says (serve --draft's tests: a useless draft must turn itself off). Deterministic: a fixed seed, so
the same bytes every time; a few MB (the vocabulary's two matrices, F16).

usage: python -m tests.tiny_llama TOKENIZER.gguf OUT.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

N_EMBD, N_FF, N_LAYER, N_HEAD, N_HEAD_KV, N_CTX = 64, 128, 2, 4, 2, 8192


def build(tokenizer: Path, out: Path, seed: int = 0) -> Path:
    """Write the model; returns its path."""
    import gguf
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from make_random_llama import copy_tokenizer  # (the GPU check's 8B-shaped models take theirs so too)

    w = gguf.GGUFWriter(str(out), "llama")
    n_vocab = copy_tokenizer(str(tokenizer), w)
    head_dim = N_EMBD // N_HEAD
    w.add_name("tiny-random-llama")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    rng = np.random.default_rng(seed)

    def rand(rows: int, cols: int, dtype: type = np.float32) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(dtype)

    ones = np.ones(N_EMBD, dtype=np.float32)
    kv = N_HEAD_KV * head_dim
    w.add_tensor("token_embd.weight", rand(n_vocab, N_EMBD, np.float16))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", rand(n_vocab, N_EMBD, np.float16))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(p + "attn_k.weight", rand(kv, N_EMBD))
        w.add_tensor(p + "attn_v.weight", rand(kv, N_EMBD))
        w.add_tensor(p + "attn_output.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", rand(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", rand(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", rand(N_EMBD, N_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer", type=Path)
    ap.add_argument("out", type=Path)
    a = ap.parse_args()
    print(build(a.tokenizer, a.out))
