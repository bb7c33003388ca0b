"""A tiny BERT (encoder-only) GGUF with random weights and a real WordPiece vocabulary, written with the
`gguf` package: an embedding model that names its own pooling (CLS), and with a classification head and
pooling "rank", a reranker. No such model ships on PyPI; this one exercises the same llama.cpp code paths
(BERT graph, llama_encode, CLS and rank pooling), and its numbers are checked against llama.cpp's own
llama-embedding (tests/data/, scripts/embeddings_reference.py). Deterministic: a fixed seed, so the same
bytes every time.

usage: python -m tests.tiny_bert OUT.gguf [--rank]
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path

N_EMBD, N_FF, N_LAYER, N_HEAD, N_CTX = 64, 128, 2, 4, 512
TEXT = ("the a an and or of to in on at for with is are was were be cat dog mat rug sat rested feline kitten "
        "carpet revenue grew percent stocks fell rose market city river paris france capital llama llamas camel "
        "family native south america what where who how which search query document answer question")
WORDS = tuple(TEXT.split())


def vocab() -> list[str]:
    """BERT's layout: [PAD] 0, [unusedN] 1-99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, then words
    (with the leading-space mark llama.cpp's WPM tokenizer uses) and single-character pieces."""
    toks = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 100)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    pieces = list(string.ascii_lowercase + string.digits + ".,!?'-:")
    toks += ["\u2581" + w for w in WORDS] + ["\u2581" + c for c in pieces] + pieces
    return list(dict.fromkeys(toks))  # each token once ("a" is a word and a letter)


def build(out: Path, rank: bool = False) -> Path:
    """Write the model; returns its path."""
    import gguf
    import numpy as np

    toks = vocab()
    types = [gguf.TokenType.CONTROL if t.startswith("[") and t.endswith("]") else gguf.TokenType.NORMAL for t in toks]
    types[100] = gguf.TokenType.UNKNOWN
    rng = np.random.default_rng(20261123 + int(rank))

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    w = gguf.GGUFWriter(str(out), "bert")
    w.add_name("tiny-bert-reranker" if rank else "tiny-bert")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK if rank else gguf.PoolingType.CLS)
    w.add_token_type_count(2)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("bert")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_bos_token_id(101)
    w.add_eos_token_id(102)
    w.add_unk_token_id(100)
    w.add_sep_token_id(102)
    w.add_pad_token_id(0)
    w.add_mask_token_id(103)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    ones, zeros = np.ones(N_EMBD, dtype=np.float32), np.zeros(N_EMBD, dtype=np.float32)
    w.add_tensor("token_embd.weight", rand(len(toks), N_EMBD))
    w.add_tensor("token_types.weight", rand(2, N_EMBD))
    w.add_tensor("position_embd.weight", rand(N_CTX, N_EMBD))
    w.add_tensor("token_embd_norm.weight", ones)
    w.add_tensor("token_embd_norm.bias", zeros)
    for i in range(N_LAYER):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", rand(N_EMBD, N_EMBD))
            w.add_tensor(f"blk.{i}.{name}.bias", rand(N_EMBD))
        w.add_tensor(f"blk.{i}.attn_output_norm.weight", ones)
        w.add_tensor(f"blk.{i}.attn_output_norm.bias", zeros)
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.bias", rand(N_FF))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(N_EMBD, N_FF))
        w.add_tensor(f"blk.{i}.ffn_down.bias", rand(N_EMBD))
        w.add_tensor(f"blk.{i}.layer_output_norm.weight", ones)
        w.add_tensor(f"blk.{i}.layer_output_norm.bias", zeros)
    if rank:
        w.add_tensor("cls.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor("cls.bias", rand(N_EMBD))
        w.add_tensor("cls.output.weight", rand(1, N_EMBD))
        w.add_tensor("cls.output.bias", rand(1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out



def with_other_weights(model: Path, out: Path) -> Path:
    """A copy of `model` at `out` with the lowest bit of its last tensor's last weight flipped: a file of the same
    name, size and shape that is another model (another fingerprint)."""
    import shutil

    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model, out)
    with open(out, "r+b") as f:
        f.seek(-4, 2)
        byte = f.read(1)
        f.seek(-4, 2)
        f.write(bytes([byte[0] ^ 1]))
    return out


def build_nomic(out: Path, n_embd: int = 384, n_ff: int = 1536, n_head: int = 12, n_ctx: int = 2048) -> Path:
    """A nomic-bert (fused QKV, rotary positions, a SwiGLU feed-forward layer) of random weights, two layers, the
    same vocabulary: the shape of nomic-embed-text, whose gated feed-forward layer sizes llama.cpp's compute
    buffer (tests/test_footprint.py)."""
    import gguf
    import numpy as np

    toks = vocab()
    types = [gguf.TokenType.CONTROL if t.startswith("[") and t.endswith("]") else gguf.TokenType.NORMAL for t in toks]
    types[100] = gguf.TokenType.UNKNOWN
    rng = np.random.default_rng(20261201)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = gguf.GGUFWriter(str(out), "nomic-bert")
    w.add_name("tiny-nomic")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(2)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_token_type_count(2)
    w.add_rope_freq_base(1000.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("bert")
    w.add_token_list(toks)
    w.add_token_types(types)
    for add, token in ((w.add_bos_token_id, 101), (w.add_eos_token_id, 102), (w.add_unk_token_id, 100),
                       (w.add_sep_token_id, 102), (w.add_pad_token_id, 0), (w.add_mask_token_id, 103)):
        add(token)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    ones, zeros = np.ones(n_embd, dtype=np.float32), np.zeros(n_embd, dtype=np.float32)
    w.add_tensor("token_embd.weight", rand(len(toks), n_embd))
    w.add_tensor("token_types.weight", rand(2, n_embd))
    w.add_tensor("token_embd_norm.weight", ones)
    w.add_tensor("token_embd_norm.bias", zeros)
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_qkv.weight", rand(3 * n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", rand(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_output_norm.weight", ones)
        w.add_tensor(f"blk.{i}.attn_output_norm.bias", zeros)
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(n_embd, n_ff))
        w.add_tensor(f"blk.{i}.layer_output_norm.weight", ones)
        w.add_tensor(f"blk.{i}.layer_output_norm.bias", zeros)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--rank", action="store_true")
    a = ap.parse_args()
    print(build(a.out, a.rank))
