"""A bounded reader of GGUF headers: metadata and tensor table, never the weights.

A GGUF file is untrusted input. Every length read from it is checked against what is left of the file and
against fixed caps before anything is allocated, so a hostile header ends in ModelFormatError rather than a
hang or an out-of-memory.

Not the `gguf` package (the tests' reference for this reader and its tables): its GGUFReader makes numpy views
of every token and score before it returns, and trusts the counts it reads: a cold summary of SmolLM2 took
36× as long with it, and more memory (docs/benchmarks.md, "Reading GGUF metadata").
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
from collections.abc import Iterable
from typing import Any, BinaryIO

from localgen.errors import ModelFormatError, NotAModelFile, UsageError
from localgen.types import GGUFSummary

MAGIC = b"GGUF"
MAX_KV = 65_536
MAX_TENSORS = 1_000_000
MAX_STRING = 32 << 20  # chat templates can be large; nothing legitimate is near this
MAX_ARRAY_KEEP = 64  # arrays of strings longer than this keep only their length
MAX_DIMS = 8
MAX_ELEMENTS = 1 << 63  # a tensor's elements: llama.cpp refuses INT64_MAX and more
MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS: a model with more does not load
MAX_NUMBERS_KEEP = MAX_LAYERS  # arrays of numbers up to this long are kept whole: per-layer values (head counts)
MAX_COUNT = (1 << 32) - 1  # llama.cpp reads the counts and sizes below as uint32
# the header's numbers the planner reads ({arch}.KEY): each a whole number from 0 to MAX_COUNT, or one per layer
COUNTS = ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
          "attention.head_count_kv", "attention.key_length", "attention.value_length", "expert_count",
          "expert_used_count", "expert_feed_forward_length")
DEFAULT_ALIGNMENT = 32

# GGUF value types: struct format for the scalars.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")

# llama_ftype values (general.file_type) to the names users know. This table and the next are gguf's
# LlamaFileType and GGML_QUANT_SIZES (tests/test_gguf_meta.py fails when gguf adds a type).
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
}

# ggml tensor types: (elements per block, bytes per block), for checking that tensor data is all there.
GGML_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
}


class _Reader:
    def __init__(self, f: BinaryIO, size: int, path: str) -> None:
        self.f = f
        self.size = size
        self.path = path

    def fail(self, why: str) -> ModelFormatError:
        return ModelFormatError(
            f"{self.path} is not a usable GGUF file: {why}",
            hint="the file may be truncated or corrupt; download it again",
        )

    def read(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise self.fail("it ends in the middle of its header")
        return self.f.read(n)

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self, cap: int = MAX_STRING) -> str:
        n = self.scalar("<Q")
        if n > cap:
            raise self.fail(f"a string of {n} bytes in the header is beyond any sane size")
        return self.read(n).decode("utf-8", errors="replace")

    def value(self, vtype: int, key: str = "a key") -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise self.fail(f"unknown metadata value type {vtype}")
        itype = self.scalar("<I")
        count = self.scalar("<Q")
        if itype == _ARRAY:  # refused at once, never walked: an array of empty arrays costs 12 bytes an item
            raise self.fail(f"{key[:200]!r} holds an array of arrays, which llama.cpp does not read")
        if itype != _STRING and itype not in _SCALARS:
            raise self.fail(f"unknown array item type {itype}")
        if count > self.size:  # every item takes at least one byte
            raise self.fail(f"an array claims {count} items, more than the file could hold")
        if itype == _STRING:
            if count > MAX_ARRAY_KEEP:
                self._skip_strings(count)  # token lists and merges: only their length is kept
                return _ArrayLen(count)
            return [self.string() for _ in range(count)]
        fmt = _SCALARS[itype]
        width = struct.calcsize(fmt)
        if count > MAX_NUMBERS_KEEP:  # token scores and types: only their length is kept
            self._skip(width * count)
            return _ArrayLen(count)
        return list(struct.unpack(f"<{count}{fmt[1]}", self.read(width * count)))

    def _skip_strings(self, count: int) -> None:
        """Walk past `count` length-prefixed strings by their lengths alone (no decoding, no copies)."""
        import mmap

        start = self.f.tell()
        with mmap.mmap(self.f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            unpack = _U64.unpack_from
            end = self.size
            off = start
            for _ in range(count):
                if off + 8 > end:
                    raise self.fail("it ends in the middle of its header")
                n = unpack(mm, off)[0]
                if n > MAX_STRING:
                    raise self.fail(f"a string of {n} bytes in the header is beyond any sane size")
                off += 8 + n
            if off > end:
                raise self.fail("it ends in the middle of its header")
        self.f.seek(off)

    def _skip(self, n: int) -> None:
        if self.f.tell() + n > self.size:
            raise self.fail("it ends in the middle of its header")
        self.f.seek(n, os.SEEK_CUR)


def repackable_types() -> frozenset[int]:
    """ggml types that llama.cpp's CPU backend repacks on this processor family (Q4_0, Q4_K, IQ4_NL, MXFP4
    with AVX2 on x86; more on ARM)."""
    import platform

    machine = platform.machine().lower()
    if machine in ("arm64", "aarch64"):
        return frozenset({2, 8, 12, 13, 14, 20, 39})  # + Q8_0, Q5_K, Q6_K
    return frozenset({2, 12, 20, 39})


class _ArrayLen(int):
    """Stands in for a long array (token lists): only its length is kept."""


def _count(value: Any) -> int | None:
    if isinstance(value, list):
        return len(value)
    return int(value) if isinstance(value, int) else None


def not_a_file(path: str | os.PathLike[str]) -> str | None:
    """What `path` is where it is no regular file a model can be read from ("a FIFO", "a device", "a socket"), else
    None (a regular file, a folder, nothing there: the caller says those). Nothing is opened: a FIFO would wait."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (a pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def read_gguf(path: str) -> tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]:
    """Read the metadata and tensor table; returns (metadata, tensors, data_offset). Bounded on any input."""
    kind = not_a_file(path)
    if kind is not None:  # a FIFO's open would wait for a writer; a device reads as empty or endless
        raise UsageError(f"{path} is {kind}, not a model file")
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")  # noqa: SIM115 (closed by the `with f:` below)
    except IsADirectoryError:
        raise NotAModelFile(f"{path} is a folder, not a model file") from None
    except OSError as e:
        raise ModelFormatError(f"cannot read {path}: {e.strerror}") from None
    with f:
        r = _Reader(f, size, path)
        if size == 0:
            raise r.fail("the file is empty")
        if f.read(4) != MAGIC:
            raise ModelFormatError(
                f"{path} is not a GGUF file (wrong magic bytes)",
                hint="localgen runs GGUF models; convert others with llama.cpp's convert_hf_to_gguf.py",
            )
        version = r.scalar("<I")
        if version not in (2, 3):
            raise r.fail(f"unsupported GGUF version {version}")
        n_tensors = r.scalar("<Q")
        n_kv = r.scalar("<Q")
        if n_kv > MAX_KV or n_tensors > MAX_TENSORS:
            raise r.fail(f"it claims {n_kv} metadata keys and {n_tensors} tensors")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string(cap=1 << 16)
            if key in meta:  # llama.cpp refuses the file; taking the last would plan a model it never loads
                raise r.fail(f"the key {key[:200]!r} appears twice in its header")
            vtype = r.scalar("<I")
            meta[key] = r.value(vtype, key)
        tensors: list[tuple[str, list[int], int, int]] = []
        names: set[str] = set()
        for _ in range(n_tensors):
            name = r.string(cap=1 << 16)
            if name in names:
                raise r.fail(f"the tensor {name[:200]!r} appears twice in its table")
            names.add(name)
            n_dims = r.scalar("<I")
            if n_dims > MAX_DIMS:
                raise r.fail(f"tensor {name!r} has {n_dims} dimensions")
            dims = [r.scalar("<Q") for _ in range(n_dims)]
            if math.prod(dims) >= MAX_ELEMENTS:  # llama.cpp's own bound; past it, sizes and counts are nonsense
                raise r.fail(f"tensor {name[:200]!r} claims 2^63 elements or more, past what llama.cpp takes")
            ttype = r.scalar("<I")
            offset = r.scalar("<Q")
            tensors.append((name, dims, ttype, offset))
        align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise r.fail(f"bad alignment {align!r}")
        pos = f.tell()
        data_offset = pos + (-pos % align)
    return meta, tensors, data_offset


def _check_count(path: str, key: str, value: Any) -> None:
    """A ModelFormatError unless `value` (the header's, for `key`; None: no such key) is a count llama.cpp reads: a
    whole number from 0 to MAX_COUNT, or a list of them (one per layer). A negative head count made plans of negative
    sizes; 1e300 ended in an OverflowError formatting them."""
    items = value if isinstance(value, list) else [] if value is None else [value]
    for v in items:
        whole = (isinstance(v, int) and not isinstance(v, bool | _ArrayLen)) or (
            isinstance(v, float) and math.isfinite(v) and v.is_integer())
        if not (whole and 0 <= v <= MAX_COUNT):
            shown = f"{v:g}" if isinstance(v, float) else f"{v:,}" if whole else repr(v)[:80]
            if isinstance(v, _ArrayLen):
                shown = f"a list of {v:,} values"
            raise ModelFormatError(
                f"{path} is not a usable GGUF file: its header says {key[:200]} is {shown}, not a whole "
                f"number from 0 to {MAX_COUNT:,}", hint="the file is corrupt or hostile; download it again")


def _split_totals(first: str, count: int, n_params: int, size: int, check_data: bool,
                  parts_read: list[Any] | None) -> tuple[int, int]:
    import re

    m = re.search(r"-00001-of-(\d{5})\.gguf$", first)
    if not m:
        return n_params, size
    for i in range(2, count + 1):
        part = first[: m.start()] + f"-{i:05d}-of-{m.group(1)}.gguf"
        try:
            _meta, tensors, offset = read_gguf(part)
            st = os.stat(part)
            part_size = st.st_size
        except (ModelFormatError, OSError):
            raise ModelFormatError(f"part {i} of the split model {first} is missing or unreadable",
                                   hint="pull the model again") from None
        part_params, end, *_ = _tensor_totals(tensors, offset)
        if check_data and end > part_size:  # as the first part's (summarize): a part cut short is no model
            raise ModelFormatError(
                f"part {i} of the split model {first} is truncated: its tensors need {end:,} bytes, the file has "
                f"{part_size:,}", hint="pull the model again (localgen pull verifies files)")
        n_params += part_params
        size += part_size
        if parts_read is not None:
            parts_read.append((part, st, tensors, offset))
    return n_params, size


# Weight types whose CPU matmul gives a row the same numbers in a batch of any size (checked here on
# SmolLM2 requantized to each: 64 prompts, 8 rows per call against one).
BATCH_INVARIANT_TYPES = frozenset({0, 1, 2, 3, 6, 7, 8, 30})  # F32 F16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 BF16
# Types ggml's tiled CPU matmul (ggml-cpu/tiled) takes over from 8 rows of a batch, with another rounding:
# up to 7 rows compute each as alone (measured on Gemma 3 270M: 16 greedy prompts identical at 7 rows per
# call, 9 of 16 drifted at 8). Q2_K..Q6_K, IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ4_XS, IQ1_M.
TILED_TYPES = frozenset({10, 11, 12, 13, 14, 16, 17, 18, 19, 21, 22, 23, 29})
TILED_EXACT_ROWS = 7
OTHER_EXACT_ROWS = 3  # any other type: the width at which none was seen to drift (repacked layouts: 4+)


def _tensor_totals(tensors: list[tuple[str, list[int], int, int]],
                   data_offset: int) -> tuple[int, int, int, int, int]:
    """(parameters, where the tensor data ends, bytes llama.cpp would repack here, bytes of weights, the most
    rows of a batch the CPU matmuls compute each as alone: 0 for any number)."""
    n_params = repackable = weights = 0
    exact_rows = 0
    tied = not any(name == "output.weight" for name, _, _, _ in tensors)  # the embedding is the output matrix
    end = data_offset
    kinds = repackable_types()
    for name, dims, ttype, offset in tensors:
        n = 1
        for d in dims:
            n *= d
        n_params += n
        block = GGML_BLOCKS.get(ttype)
        if block is not None:
            nbytes = (n // block[0]) * block[1]
            end = max(end, data_offset + offset + nbytes)
            weights += nbytes
            # matrices llama.cpp repacks: these types, 2-D, rows in multiples of 8, not the embedding lookup
            if ttype in kinds and len(dims) == 2 and dims[1] % 8 == 0 and not name.startswith("token_embd"):
                repackable += nbytes
        multiplied = not name.startswith("token_embd") or tied
        if len(dims) == 2 and ttype not in BATCH_INVARIANT_TYPES and multiplied:
            rows = TILED_EXACT_ROWS if ttype in TILED_TYPES else OTHER_EXACT_ROWS
            exact_rows = min(exact_rows, rows) if exact_rows else rows
    return n_params, end, repackable, weights, exact_rows


Header = tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]  # read_gguf's


def summarize(path: str, file_size: int | None = None, check_data: bool = True,
              header: Header | None = None, parts_read: list[Any] | None = None) -> GGUFSummary:
    """Read a GGUF header and summarize it; raises ModelFormatError for anything llama.cpp would choke on.
    `file_size` stands in for the real size when `path` holds only the start of a remote file; `header`: read_gguf's
    result for it, read already; `parts_read` gets a split model's other parts as read: (path, stat, tensor table,
    data offset) each."""
    meta, tensors, data_offset = header or read_gguf(path)
    size = file_size if file_size is not None else os.path.getsize(path)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFormatError(f"{path} has no general.architecture key; it is not a model GGUF")
    if not tensors:
        raise ModelFormatError(f"{path} holds no tensors; it is not a model GGUF")
    n_params, end, repackable, weights, exact_rows = _tensor_totals(tensors, data_offset)
    if check_data and end > size:
        raise ModelFormatError(
            f"{path} is truncated: its tensors need {end:,} bytes, the file has {size:,}",
            hint="download it again (localgen pull verifies files)",
        )

    for key in COUNTS:
        _check_count(path, f"{arch}.{key}", meta.get(f"{arch}.{key}"))

    def get_int(key: str) -> int | None:
        v = meta.get(f"{arch}.{key}")
        if isinstance(v, list):  # per-layer values (some models): take the first
            v = v[0] if v else None
        return None if v is None else int(v)

    n_layers = get_int("block_count")
    if n_layers is not None and n_layers > MAX_LAYERS:  # llama.cpp refuses it; our planner would walk every layer
        raise ModelFormatError(f"{path} is not a usable GGUF file: its header claims {n_layers:,} layers, "
                               f"more than llama.cpp's {MAX_LAYERS}", hint="the file is corrupt or hostile")
    parts = meta.get("split.count")
    if isinstance(parts, int) and parts > 1 and file_size is None:
        # A split model: parameters and bytes of every part (each part lists only its own tensors).
        n_params, size = _split_totals(path, parts, n_params, size, check_data, parts_read)
    n_embd, n_head = get_int("embedding_length"), get_int("attention.head_count")
    head_k = get_int("attention.key_length") or (n_embd // n_head if n_embd and n_head else None)
    tokens = meta.get("tokenizer.ggml.tokens")
    ftype = meta.get("general.file_type")
    template = meta.get("tokenizer.chat_template")
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    return GGUFSummary(
        architecture=arch,
        name=meta.get("general.name") if isinstance(meta.get("general.name"), str) else None,
        quantization=FILE_TYPES.get(ftype, f"type {ftype}") if isinstance(ftype, int) else None,
        context_length=get_int("context_length"),
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=get_int("attention.head_count_kv") or n_head,
        head_dim_k=head_k,
        head_dim_v=get_int("attention.value_length") or head_k,
        vocab_size=_count(tokens),
        n_params=n_params,
        tensor_bytes=size - data_offset,
        file_size=size,
        chat_template=template if isinstance(template, str) and template.strip() else None,
        license=meta.get("general.license") if isinstance(meta.get("general.license"), str) else None,
        add_bos=add_bos if isinstance(add_bos, bool) else None,
        repackable_share=repackable / weights if weights else None,
        exact_rows=exact_rows,
        metadata={k: v for k, v in meta.items() if not isinstance(v, _ArrayLen)},
    )


MAX_EXPERTS = 1024  # llama.cpp's LLAMA_MAX_EXPERTS (src/llama-hparams.h)
NEEDED = ("context_length", "embedding_length", "block_count")  # the keys llama.cpp's load_hparams requires


def refusal(s: GGUFSummary, tensor_names: Iterable[str] = ()) -> str | None:
    """Why llama.cpp's load_hparams (src/llama-model.cpp) would refuse this header, in words; None where it would
    not. Its asserts end the process (`GGML_ASSERT(n_expert_used_max <= hparams.n_expert)`), which `run` reports
    as llama.cpp stopping; `fit` and `pull --list` plan nothing for such a header. `tensor_names`: the model's
    (an attention layer's tensors are shaped by the head count)."""
    arch, meta = s.architecture, s.metadata
    if arch == "clip":  # a projector: llama.cpp reads no hyperparameters of it
        return None
    for key in NEEDED:
        if meta.get(f"{arch}.{key}") is None:
            return f"its header has no {arch}.{key}, which llama.cpp needs"
    if not s.n_layers:
        return f"its header says {arch}.block_count is 0"

    def most(key: str) -> int:
        value = meta.get(f"{arch}.{key}")
        values = value if isinstance(value, list) else [value]
        return max((int(v) for v in values if isinstance(v, int | float)), default=0)

    experts, used = most("expert_count"), most("expert_used_count")
    if experts > MAX_EXPERTS:
        return f"its header says {arch}.expert_count is {experts:,}, more than llama.cpp's {MAX_EXPERTS:,}"
    if used > experts:
        return f"its header says {arch}.expert_used_count is {used:,}, " + (
            f"more than its {experts:,} experts" if experts else "and it names no experts")
    if experts and not used:
        return f"its header names {experts:,} experts and no {arch}.expert_used_count (of at least 1)"
    names = set(tensor_names)
    if s.n_head is None and any(".attn_q." in n or ".attn_qkv." in n for n in names):
        return f"its header has no {arch}.attention.head_count, which its attention tensors' shapes need"
    for key, shaped in PER_LAYER.items():  # get_key_or_arr: one value, or a list of one value per layer
        value = meta.get(f"{arch}.{key}")
        if isinstance(value, list) and len(value) != s.n_layers:
            return (f"its header lists {len(value):,} values of {arch}.{key} for its {s.n_layers:,} layers (llama.cpp "
                    "takes one a layer)")
        first = value[0] if isinstance(value, list) and value else value
        # the first layer's count shapes every layer's tensors in most architectures' create_tensors (a 0 of a later
        # layer loads there; a hybrid's recurrent first layer has no attention tensors to shape)
        if first == 0 and any(f"blk.0.{t}.weight" in names for t in shaped):
            return f"its header says {arch}.{key} is 0 for layer 0, whose attention tensors need it"
    return None


# the per-layer counts load_hparams reads with get_key_or_arr, and the tensors each shapes
PER_LAYER = {"attention.head_count": ("attn_q", "attn_qkv"), "attention.head_count_kv": ("attn_k", "attn_qkv"),
             "feed_forward_length": ()}


SUMMARY_FORMAT = 6  # 6: counts checked (_check_count), per-layer lists kept whole


TABLE_FORMAT = 1


def read_summary(path: str, check_data: bool = True, use_cache: bool = True) -> GGUFSummary:
    """summarize(), remembered per file (path, size, mtime) in the cache dir: every `run`, `show` and `list`
    reads each model's header once (and its tensor table with it: read_table)."""
    import platform
    import re

    if not use_cache:
        return summarize(path, check_data=check_data)
    try:
        st = os.stat(path)
    except OSError:
        return summarize(path, check_data=check_data)  # raises the proper error
    stamp = [SUMMARY_FORMAT, os.path.realpath(path), st.st_size, st.st_mtime_ns, check_data, platform.machine()]
    split = re.search(r"-00001-of-(\d{5})\.gguf$", path)
    for i in range(2, int(split.group(1)) + 1 if split else 0):  # each part as it is now (one cut short since, or
        try:  # replaced, is read again: it is refused, or its figures are new)
            part = os.stat(path[: split.start()] + f"-{i:05d}-of-{split.group(1)}.gguf")  # type: ignore[union-attr]
            stamp += [part.st_size, part.st_mtime_ns]
        except OSError:
            stamp.append(None)
    doc = _cached(stamp)
    if isinstance(doc, dict) and _summary_shaped(doc):
        return GGUFSummary(**doc)
    header = read_gguf(path)
    parts: list[Any] = []
    summary = summarize(path, check_data=check_data, header=header, parts_read=parts)
    _remember(stamp, dataclasses.asdict(summary))
    for part, part_st, tensors, offset in [(path, st, header[1], header[2]), *parts]:  # for the plan's layout()
        _remember(_table_stamp(part, part_st), {"tensors": tensors, "data_offset": offset})
    return summary


_KINDS = {"str": (str,), "int": (int,), "float": (float, int), "bool": (bool,), "dict[str, Any]": (dict,)}


def _summary_shaped(doc: dict[str, Any]) -> bool:
    """Whether a remembered summary has GGUFSummary's fields, each of its type: one that does not (edited by hand,
    or written by another version in the same format) is read from the file again, never handed on (it was a
    TypeError traceback in list and show, and a file called corrupt by fit)."""
    fields = {f.name: f for f in dataclasses.fields(GGUFSummary)}
    if not doc.keys() <= fields.keys():
        return False
    for name, f in fields.items():
        if name not in doc:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                return False
            continue
        value = doc[name]
        kinds = str(f.type).split(" | ")
        if value is None and "None" in kinds:
            continue
        allowed = tuple(t for k in kinds if k != "None" for t in _KINDS.get(k, ()))
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            return False
    return True


def read_table(path: str) -> list[tuple[str, list[int], int, int]]:
    """read_gguf()'s tensor table, as read_summary remembered it with the summary (and a split model's summary, each
    part's): a plan after a summary reads no header again. Read from the file where none was remembered (a remote
    header's start in a temporary file: nothing is written for it)."""
    try:
        st = os.stat(path)
    except OSError:
        return read_gguf(path)[1]  # raises the proper error
    stamp = _table_stamp(path, st)
    doc = _cached(stamp)
    if doc is not None:
        try:
            return [(str(name), [int(d) for d in dims], int(ttype), int(offset))
                    for name, dims, ttype, offset in doc["tensors"]]
        except (KeyError, TypeError, ValueError):
            pass
    return read_gguf(path)[1]


def _table_stamp(path: str, st: os.stat_result) -> list[Any]:
    return ["table", TABLE_FORMAT, os.path.realpath(path), st.st_size, st.st_mtime_ns]


def _cache_file(stamp: list[Any]) -> Any:
    import hashlib
    import json

    from localgen import paths

    key = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:32]
    return paths.cache_dir() / "gguf-summaries" / f"{key}.json"


def _cached(stamp: list[Any]) -> Any:
    """What _remember kept for `stamp` (None: nothing, or something unreadable)."""
    import json

    try:
        doc = json.loads(_cache_file(stamp).read_text())
        if isinstance(doc, dict) and doc.get("stamp") == stamp:
            return doc["summary"]
    except (OSError, ValueError, TypeError, KeyError):
        pass
    return None


def _remember(stamp: list[Any], value: Any) -> None:
    import contextlib
    import json

    from localgen import paths

    with contextlib.suppress(OSError, TypeError, ValueError):  # a cache: without it the next read parses again
        paths.replace_text(_cache_file(stamp), json.dumps({"stamp": stamp, "summary": value}, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise TypeError(type(value).__name__)
