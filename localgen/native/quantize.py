"""llama.cpp's own quantizer (llama_model_quantize): its file types by llama-quantize's names, ggml's tensor types
by name, and one call that writes a quantized GGUF, with an importance matrix and metadata overrides as
llama-quantize passes them."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localgen.native.lib import forget_on_abort, lib, libggml, remove_on_abort

# llama-quantize's QUANT_OPTIONS (tools/quantize/quantize.cpp), in its order: name, llama_ftype, what it says
FTYPES: tuple[tuple[str, int, str], ...] = (
    ("Q1_0", 40, "1.125 bpw quantization"),
    ("Q2_0", 41, "2.25 bpw quantization (group 64)"),
    ("Q4_0", 2, "4.34G, +0.4685 ppl @ Llama-3-8B"),
    ("Q4_1", 3, "4.78G, +0.4511 ppl @ Llama-3-8B"),
    ("MXFP4_MOE", 38, "MXFP4 MoE"),
    ("Q5_0", 8, "5.21G, +0.1316 ppl @ Llama-3-8B"),
    ("Q5_1", 9, "5.65G, +0.1062 ppl @ Llama-3-8B"),
    ("IQ2_XXS", 19, "2.06 bpw quantization"),
    ("IQ2_XS", 20, "2.31 bpw quantization"),
    ("IQ2_S", 28, "2.5  bpw quantization"),
    ("IQ2_M", 29, "2.7  bpw quantization"),
    ("IQ1_S", 24, "1.56 bpw quantization"),
    ("IQ1_M", 31, "1.75 bpw quantization"),
    ("TQ1_0", 36, "1.69 bpw ternarization"),
    ("TQ2_0", 37, "2.06 bpw ternarization"),
    ("Q2_K", 10, "2.96G, +3.5199 ppl @ Llama-3-8B"),
    ("Q2_K_S", 21, "2.96G, +3.1836 ppl @ Llama-3-8B"),
    ("IQ3_XXS", 23, "3.06 bpw quantization"),
    ("IQ3_S", 26, "3.44 bpw quantization"),
    ("IQ3_M", 27, "3.66 bpw quantization mix"),
    ("Q3_K", 12, "alias for Q3_K_M"),
    ("IQ3_XS", 22, "3.3 bpw quantization"),
    ("Q3_K_S", 11, "3.41G, +1.6321 ppl @ Llama-3-8B"),
    ("Q3_K_M", 12, "3.74G, +0.6569 ppl @ Llama-3-8B"),
    ("Q3_K_L", 13, "4.03G, +0.5562 ppl @ Llama-3-8B"),
    ("IQ4_NL", 25, "4.50 bpw non-linear quantization"),
    ("IQ4_XS", 30, "4.25 bpw non-linear quantization"),
    ("Q4_K", 15, "alias for Q4_K_M"),
    ("Q4_K_S", 14, "4.37G, +0.2689 ppl @ Llama-3-8B"),
    ("Q4_K_M", 15, "4.58G, +0.1754 ppl @ Llama-3-8B"),
    ("Q5_K", 17, "alias for Q5_K_M"),
    ("Q5_K_S", 16, "5.21G, +0.1049 ppl @ Llama-3-8B"),
    ("Q5_K_M", 17, "5.33G, +0.0569 ppl @ Llama-3-8B"),
    ("Q6_K", 18, "6.14G, +0.0217 ppl @ Llama-3-8B"),
    ("Q8_0", 7, "7.96G, +0.0026 ppl @ Llama-3-8B"),
    ("F16", 1, "14.00G, +0.0020 ppl @ Mistral-7B"),
    ("BF16", 32, "14.00G, -0.0050 ppl @ Mistral-7B"),
    ("F32", 0, "26.00G              @ 7B"),
    ("COPY", 0, "only copy tensors, no quantizing"),  # after F32, so that 0 means F32
)

KV_INT, KV_FLOAT, KV_BOOL, KV_STR = 0, 1, 2, 3  # llama_model_kv_override_type
_NO_TYPE = 43  # GGML_TYPE_COUNT: "the rule's type" in llama_model_quantize_params


def file_type(text: str) -> tuple[str, int] | None:
    """llama-quantize's name and llama_ftype for what a user typed (a name in any case, or the number), or None;
    as its try_parse_ftype reads them. An alias (Q3_K, Q4_K, Q5_K) and a number give the canonical name
    (15 and Q4_K give Q4_K_M), the one `list` shows for the file, so one type has one name everywhere."""
    want = text.strip().upper()
    found = next(((name, ftype) for name, ftype, _ in FTYPES if name == want), None)
    if found is None:
        try:
            number = int(want)
        except ValueError:
            return None
        found = next(((name, ftype) for name, ftype, _ in FTYPES if ftype == number), None)
    if found is None:
        return None
    return canonical(found[0]), found[1]


def canonical(name: str) -> str:
    """The type an alias stands for (Q4_K → Q4_K_M); any other name as it is."""
    for other, _, about in FTYPES:
        if other == name and about.startswith("alias for "):
            return about.removeprefix("alias for ")
    return name


# The tensor types ggml_quantize_chunk (ggml/src/ggml.c) writes: a tensor can be quantized to these only. Others
# have a name (q8_1, q8_k, i32, "deprecated" for removed numbers) but no quantizer: llama.cpp asserts, or divides
# by a block size of 0, mid-way through the file.
QUANTIZABLE = frozenset({
    "f32", "f16", "bf16", "q1_0", "q2_0", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "nvfp4", "q2_k",
    "q3_k", "q4_k", "q5_k", "q6_k", "tq1_0", "tq2_0", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq3_s", "iq2_s", "iq1_s",
    "iq1_m", "iq4_nl", "iq4_xs"})
# Those ggml_quantize_requires_imatrix names: without an importance matrix for the tensor, llama.cpp aborts
NEED_IMATRIX = frozenset({"iq2_xxs", "iq2_xs", "iq1_s"})
# What llama.cpp's quantizer refuses to write without the tensor's importance matrix (tensor_type_requires_imatrix),
# part-way through the file: these, and q2_k in a Q2_K_S file (its token embedding excepted)
_LLAMA_NEEDS_IMATRIX = NEED_IMATRIX | {"iq3_xxs", "iq2_s", "iq1_m"}


def requires_imatrix(tensor: str, ggml_name: str, file_type: str) -> bool:
    """Whether llama.cpp needs an importance matrix for `tensor` written as `ggml_name` in a `file_type` file."""
    return ggml_name in _LLAMA_NEEDS_IMATRIX or (
        ggml_name == "q2_k" and file_type.upper() == "Q2_K_S" and tensor != "token_embd.weight")


def ggml_types() -> dict[str, int]:
    """The ggml tensor types a tensor can be quantized to (lower case, as ggml_type_name gives them) → their
    numbers, in ggml's order."""
    fn = libggml().ggml_type_name
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_char_p
    out: dict[str, int] = {}
    for i in range(_NO_TYPE):
        name = (fn(i) or b"").decode().lower()
        if name in QUANTIZABLE:
            out[name] = i
    return out


def block_size(ggml_type: int) -> int:
    """How many values one block of a ggml type holds (ggml_blck_size): a row quantized to it is a multiple."""
    fn = libggml().ggml_blck_size
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int64
    return int(fn(ggml_type))


@dataclass(frozen=True)
class QuantizeParams:
    """llama_model_quantize_params as localgen sets them; the rest keep llama.cpp's defaults."""

    ftype: int
    threads: int = 0  # 0: std::thread::hardware_concurrency()
    only_copy: bool = False
    allow_requantize: bool = False
    leave_output_tensor: bool = False
    pure: bool = False
    output_tensor_type: int | None = None
    token_embedding_type: int | None = None
    dry_run: bool = False
    imatrix: Mapping[str, Any] = field(default_factory=dict)  # tensor name → float32 numpy array (contiguous)
    kv_overrides: tuple[tuple[str, int | str], ...] = ()  # metadata written into the output


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], p: QuantizeParams) -> bool:
    """Write `dst` from `src` (llama_model_quantize); False where llama.cpp failed (its log says why). Blocks, and
    cannot be interrupted: call it from a thread to stay responsive."""
    lc = lib()
    qp = lc.llama_model_quantize_default_params()
    qp.nthread = p.threads
    qp.ftype = p.ftype
    qp.only_copy = p.only_copy
    qp.allow_requantize = p.allow_requantize
    qp.quantize_output_tensor = not p.leave_output_tensor
    qp.pure = p.pure
    qp.dry_run = p.dry_run
    if p.output_tensor_type is not None:
        qp.output_tensor_type = p.output_tensor_type
    if p.token_embedding_type is not None:
        qp.token_embedding_type = p.token_embedding_type
    keep: list[Any] = []  # what the params point at, alive until the call returns
    if p.imatrix:
        entries = (lc.llama_model_imatrix_data * (len(p.imatrix) + 1))()  # the last one zeroed: the end
        for i, (name, values) in enumerate(p.imatrix.items()):
            encoded = name.encode()
            keep += [encoded, values]
            entries[i].name = encoded
            entries[i].data = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = int(values.size)
        keep.append(entries)
        qp.imatrix = ctypes.cast(entries, ctypes.POINTER(lc.llama_model_imatrix_data))
    if p.kv_overrides:
        kvs = (lc.llama_model_kv_override * (len(p.kv_overrides) + 1))()  # the last one's empty key: the end
        for i, (key, value) in enumerate(p.kv_overrides):
            kvs[i].key = key.encode()[:127]
            if isinstance(value, str):
                kvs[i].tag = KV_STR
                kvs[i].value.val_str = value.encode()[:127]
            else:
                kvs[i].tag = KV_INT
                kvs[i].value.val_i64 = value
        keep.append(kvs)
        qp.kv_overrides = ctypes.cast(kvs, ctypes.POINTER(lc.llama_model_kv_override))
    remove_on_abort(dst)  # llama.cpp aborting mid-way ends the process: the abort handler removes what it wrote
    try:
        rc = lc.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(qp))
    finally:
        forget_on_abort(dst)
    del keep
    return int(rc) == 0
