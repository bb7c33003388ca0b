"""The GGUF header reader in process: it agrees with the `gguf` package (its tables and what GGUFWriter
writes), and a corrupt or hostile header ends in one ModelFormatError line without allocating what the file
claims."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from localgen.errors import ModelFormatError
from localgen.models import gguf_meta


def _by_gguf(path: Path) -> tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]:
    """read_gguf()'s result as GGUFReader sees the file (long arrays as their length)."""
    from gguf import GGUFReader, GGUFValueType

    r = GGUFReader(path)
    meta: dict[str, Any] = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        keep = gguf_meta.MAX_ARRAY_KEEP if field.types[-1] == GGUFValueType.STRING else gguf_meta.MAX_NUMBERS_KEEP
        long = field.types[0] == GGUFValueType.ARRAY and len(field.data) > keep
        meta[key] = len(field.data) if long else field.contents()
    tensors = [(t.name, [int(d) for d in t.shape], int(t.tensor_type), t.data_offset - r.data_offset)
               for t in r.tensors]
    return meta, tensors, r.data_offset


def _write(path: Path, tensors: bool = True) -> Path:
    """A small model GGUF with a value of every type, long arrays, a 64-byte alignment and quantized tensors."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_name("tiny")
    w.add_context_length(4096)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_file_type(7)
    w.add_chat_template("{{ messages[0]['content'] }}")
    w.add_add_bos_token(True)
    w.add_token_list([f"tok{i}é".encode() for i in range(300)])
    w.add_token_scores([float(-i) for i in range(300)])
    for name, vtype, value in [("u8", GGUFValueType.UINT8, 200), ("i8", GGUFValueType.INT8, -5),
                               ("u16", GGUFValueType.UINT16, 60000), ("i16", GGUFValueType.INT16, -300),
                               ("u32", GGUFValueType.UINT32, 4_000_000_000), ("i32", GGUFValueType.INT32, -70000),
                               ("f32", GGUFValueType.FLOAT32, 0.5), ("u64", GGUFValueType.UINT64, 1 << 40),
                               ("i64", GGUFValueType.INT64, -(1 << 40)), ("f64", GGUFValueType.FLOAT64, 0.1),
                               ("flag", GGUFValueType.BOOL, False), ("text", GGUFValueType.STRING, "ünï")]:
        w.add_key_value(f"test.{name}", value, vtype)
    w.add_array("test.short", [3, 1, 4])
    w.add_array("test.words", ["a", "bc"])
    if tensors:
        w.add_tensor("token_embd.weight", np.arange(64 * 8, dtype=np.float32).reshape(8, 64))
        w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
        q8 = np.zeros((64, 64 // 32 * 34), dtype=np.uint8)  # 64 rows of two Q8_0 blocks
        w.add_tensor("output.weight", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_tables_are_the_gguf_packages() -> None:
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType, LlamaFileType

    blocks = {int(t): size for t, size in GGML_QUANT_SIZES.items()}
    assert blocks == gguf_meta.GGML_BLOCKS
    names = {int(t): t.name.removeprefix("MOSTLY_") for t in LlamaFileType if t.name != "GUESSED"}
    names[0] = "F32"  # gguf calls it ALL_F32
    assert names == gguf_meta.FILE_TYPES
    assert (gguf_meta._STRING, gguf_meta._ARRAY) == (GGUFValueType.STRING, GGUFValueType.ARRAY)
    widths = {t: struct.calcsize(fmt) for t, fmt in gguf_meta._SCALARS.items()}
    assert widths == {int(t): np.dtype(d).itemsize for t, d in GGUFReader.gguf_scalar_to_np.items()}


def test_reads_what_gguf_writes(tmp_path: Path) -> None:
    path = _write(tmp_path / "tiny.gguf")
    meta, tensors, data_offset = gguf_meta.read_gguf(str(path))
    want_meta, want_tensors, want_offset = _by_gguf(path)
    assert meta == want_meta
    assert isinstance(meta["tokenizer.ggml.tokens"], gguf_meta._ArrayLen)
    assert (tensors, data_offset) == (want_tensors, want_offset) and data_offset % 64 == 0
    s = gguf_meta.summarize(str(path))
    assert (s.architecture, s.name, s.quantization, s.context_length, s.vocab_size) == \
        ("llama", "tiny", "Q8_0", 4096, 300)
    assert (s.n_params, s.add_bos, s.chat_template) == (8 * 64 + 2 * 64 * 64, True, "{{ messages[0]['content'] }}")
    assert "tokenizer.ggml.tokens" not in s.metadata and s.metadata["test.text"] == "ünï"


def test_summary_errors(tmp_path: Path) -> None:
    no_tensors = _write(tmp_path / "kv-only.gguf", tensors=False)
    with pytest.raises(ModelFormatError, match="holds no tensors"):
        gguf_meta.summarize(str(no_tensors))
    full = _write(tmp_path / "full.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full[:-100])
    with pytest.raises(ModelFormatError, match=r"is truncated: its tensors need [\d,]+ bytes, the file has"):
        gguf_meta.summarize(str(cut))
    assert gguf_meta.summarize(str(cut), check_data=False).architecture == "llama"
    with pytest.raises(ModelFormatError, match="ends in the middle of its header"):
        gguf_meta.read_gguf(_cut_at(full, tmp_path, "test.text"))


def _cut_at(data: bytes, tmp_path: Path, key: str) -> str:
    path = tmp_path / "half.gguf"
    path.write_bytes(data[: data.index(key.encode()) + len(key) + 6])
    return str(path)


def test_split_models_add_up_their_parts(tmp_path: Path) -> None:
    from tests.gguf_split import split_model

    one = _write(tmp_path / "one.gguf")
    parts = split_model(one, tmp_path / "split", "tiny-Q8_0", 1)
    assert len(parts) == 3
    whole, first = gguf_meta.summarize(str(one)), gguf_meta.summarize(str(parts[0]))
    assert first.n_params == whole.n_params and first.file_size == sum(p.stat().st_size for p in parts)
    parts[2].unlink()
    with pytest.raises(ModelFormatError, match=r"part 3 of the split model .* is missing or unreadable"):
        gguf_meta.summarize(str(parts[0]))


# ---- hostile and broken headers -----------------------------------------------------------------------------

def _s(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def _head(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def _kv(key: str, vtype: int, body: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + body


def _array(itype: int, count: int, body: bytes = b"") -> bytes:
    return struct.pack("<IQ", itype, count) + body


ARCH = _kv("general.architecture", 8, _s("llama"))
HOSTILE = {
    "2^60 keys": (_head(0, 1 << 60), "claims 1152921504606846976 metadata keys"),
    "2^60 tensors": (_head(1 << 60, 1), "and 1152921504606846976 tensors"),
    "a 2^60-byte key": (_head(0, 1) + _s("k", 1 << 60), "a string of 1152921504606846976 bytes"),
    "a 2^40-byte value": (_head(0, 1) + _kv("k", 8, _s("v", 1 << 40)), "beyond any sane size"),
    "a string past the end": (_head(0, 1) + _kv("k", 8, _s("v", 1000)), "ends in the middle of its header"),
    "2^60 bytes in an array": (_head(0, 1) + _kv("k", 9, _array(0, 1 << 60)), "more than the file could hold"),
    "2^60 strings in an array": (_head(0, 1) + _kv("k", 9, _array(8, 1 << 60)), "more than the file could hold"),
    "strings past the end": (_head(0, 1) + _kv("k", 9, _array(8, 100, _s("a") * 10)) + bytes(120),
                             "ends in the middle of its header"),
    "a string of 2^40 bytes in a long array": (
        _head(0, 1) + _kv("k", 9, _array(8, 100, _s("a") + _s("b", 1 << 40))) + bytes(800), "beyond any sane size"),
    "2^28 floats in a small file": (_head(0, 1) + _kv("k", 9, _array(6, 1 << 28)), "more than the file could hold"),
    "1 MiB of floats past the end": (_head(0, 1) + _kv("k", 9, _array(6, 1 << 18)) + bytes(300_000),
                                     "ends in the middle of its header"),
    "100 kB of floats past the end": (_head(0, 1) + _kv("k", 9, _array(6, 25_000)) + bytes(90_000),
                                      "ends in the middle of its header"),
    "arrays nested 4 deep": (_head(0, 1) + _kv("k", 9, _array(9, 1, _array(9, 1, _array(9, 1, _array(9, 1))))),
                             "'k' holds an array of arrays, which llama.cpp does not read"),
    "200,000 empty arrays in an array": (_head(0, 1) + _kv("k", 9, _array(9, 200_000, _array(0, 0) * 200_000)),
                                         "'k' holds an array of arrays, which llama.cpp does not read"),
    "an unknown value type": (_head(0, 1) + _kv("k", 99, b""), "unknown metadata value type 99"),
    "an unknown array item type": (_head(0, 1) + _kv("k", 9, _array(77, 1)), "unknown array item type 77"),
    "2^31 dimensions": (_head(1, 1) + ARCH + _s("t") + struct.pack("<I", 1 << 31), "has 2147483648 dimensions"),
    "a tensor of 2^64 elements": (_head(1, 1) + ARCH + _s("t") + struct.pack("<IQQIQ", 2, 1 << 32, 1 << 32, 0, 0),
                                  "tensor 't' claims 2^63 elements or more, past what llama.cpp takes"),
    # llama.cpp refuses both; the last key taken would plan a model it never loads
    "a key twice": (_head(0, 2) + ARCH + ARCH, "the key 'general.architecture' appears twice in its header"),
    "a tensor twice": (_head(2, 1) + ARCH + (_s("t") + struct.pack("<IQIQ", 1, 4, 0, 0)) * 2,
                       "the tensor 't' appears twice in its table"),
    "alignment 3": (_head(0, 2) + ARCH + _kv("general.alignment", 4, struct.pack("<I", 3)), "bad alignment 3"),
    "alignment 0": (_head(0, 2) + ARCH + _kv("general.alignment", 4, struct.pack("<I", 0)), "bad alignment 0"),
    "version 1": (_head(0, 0, version=1), "unsupported GGUF version 1"),
    "a cut count": (_head(0, 0)[:-3], "ends in the middle of its header"),
    "empty": (b"", "the file is empty"),
    "text": (b"this is not a model\n", "is not a GGUF file (wrong magic bytes)"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_headers_are_one_line_format_errors(tmp_path: Path, name: str) -> None:
    data, needle = HOSTILE[name]
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(ModelFormatError) as caught:
            gguf_meta.read_gguf(str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert needle in message and str(path) in message and "\n" not in message, message
    assert peak < 1 << 20, f"{peak} bytes allocated for {name}"  # nothing sized by what the file claims


def test_paths_that_are_not_files(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match=r"is a folder, not a model file"):
        gguf_meta.read_gguf(str(tmp_path))
    with pytest.raises(ModelFormatError, match=r"cannot read .*missing\.gguf: No such file"):
        gguf_meta.read_gguf(str(tmp_path / "missing.gguf"))


def _model(*kvs: bytes) -> bytes:
    """A GGUF of the llama architecture with the key-values given and one F32 tensor of 4 values."""
    head = _head(1, 1 + len(kvs)) + ARCH + b"".join(kvs) + _s("token_embd.weight") + struct.pack("<IQIQ", 1, 4, 0, 0)
    return head + bytes(-len(head) % 32) + bytes(16)


OUT_OF_RANGE = {
    "head_count_kv 1e300": (_kv("llama.attention.head_count_kv", 12, struct.pack("<d", 1e300)),
                            "llama.attention.head_count_kv is 1e+300"),
    "key_length 1e300": (_kv("llama.attention.key_length", 12, struct.pack("<d", 1e300)),
                         "llama.attention.key_length is 1e+300"),
    "head_count -1": (_kv("llama.attention.head_count", 5, struct.pack("<i", -1)), "llama.attention.head_count is -1"),
    "embedding_length -1": (_kv("llama.embedding_length", 5, struct.pack("<i", -1)), "llama.embedding_length is -1"),
    "context_length -2^62": (_kv("llama.context_length", 11, struct.pack("<q", -(1 << 62))),
                             "llama.context_length is -4,611,686,018,427,387,904"),
    "context_length 2^40": (_kv("llama.context_length", 10, struct.pack("<Q", 1 << 40)),
                            "llama.context_length is 1,099,511,627,776"),
    "expert_used_count 2^40": (_kv("llama.expert_used_count", 10, struct.pack("<Q", 1 << 40)),
                               "llama.expert_used_count is 1,099,511,627,776"),
    "one layer's head count negative": (_kv("llama.attention.head_count", 9, _array(5, 2, struct.pack("<2i", 4, -4))),
                                        "llama.attention.head_count is -4"),
    "a head count as text": (_kv("llama.attention.head_count", 8, _s("12")), "llama.attention.head_count is '12'"),
}


@pytest.mark.parametrize("name", list(OUT_OF_RANGE))
def test_a_count_out_of_range_is_a_damaged_header_naming_the_key(tmp_path: Path, name: str) -> None:
    """Every number the planner reads is a whole number from 0 to 2^32 - 1 (what llama.cpp reads them as): 1e300 KV
    heads ended in an OverflowError printing the plan, a negative head count in a negative KV cache, a context of -1
    in `max_model_len: -1`."""
    kv, says = OUT_OF_RANGE[name]
    path = tmp_path / "bad.gguf"
    path.write_bytes(_model(kv))
    with pytest.raises(ModelFormatError) as caught:
        gguf_meta.summarize(str(path))
    assert str(caught.value) == (f"{path} is not a usable GGUF file: its header says {says}, not a whole number from "
                                 "0 to 4,294,967,295")


def test_a_per_layer_list_is_read_for_its_values_not_its_length(tmp_path: Path) -> None:
    """A model of 80 layers with a KV head count per layer (deci, Nemotron-H): its first value, 8, not the list's
    length (lists past 64 items kept only their length, and that was taken for the count)."""
    path = tmp_path / "per-layer.gguf"
    path.write_bytes(_model(_kv("llama.block_count", 4, struct.pack("<I", 80)),
                            _kv("llama.attention.head_count_kv", 9, _array(4, 80, struct.pack("<80I", *[8] * 80)))))
    s = gguf_meta.summarize(str(path))
    assert (s.n_layers, s.n_head_kv) == (80, 8)


def test_a_plan_after_a_summary_reads_no_header_again(tmp_path: Path, home: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """read_summary keeps the tensor table with the summary (a split model's, each part's), and the planner's layout()
    reads it from there: `fit` on a model with a large header read it twice."""
    from localgen.models import footprint
    from tests.gguf_split import split_model

    path = _write(tmp_path / "tiny.gguf")
    parts = split_model(path, tmp_path / "split", "tiny-Q8_0", 1)
    want = {str(p): footprint.layout(str(p)) for p in (path, parts[0])}
    for p in want:
        gguf_meta.read_summary(p)

    def read_again(path: str) -> None:
        raise AssertionError(f"{path} read again")

    monkeypatch.setattr(gguf_meta, "read_gguf", read_again)
    monkeypatch.setattr(footprint, "read_gguf", read_again, raising=False)
    assert {p: footprint.layout(p) for p in want} == want


def test_a_split_models_part_cut_short_is_truncated(tmp_path: Path) -> None:
    """Each part's tensor data must fit inside its file, as a single file's must: a part cut short was planned as
    whole."""
    from tests.gguf_split import split_model

    parts = split_model(_write(tmp_path / "one.gguf"), tmp_path / "split", "tiny-Q8_0", 1)
    parts[1].write_bytes(parts[1].read_bytes()[:-50])
    with pytest.raises(ModelFormatError, match=r"part 2 of the split model .*-00001-of-00003\.gguf is truncated: its "
                                               r"tensors need [\d,]+ bytes, the file has [\d,]+$"):
        gguf_meta.summarize(str(parts[0]))
    assert gguf_meta.summarize(str(parts[0]), check_data=False).architecture == "llama"  # `list` lists it all the same


def test_a_split_part_cut_short_after_its_summary_was_remembered_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The remembered summary was keyed by the first part alone: a later part cut short (or replaced) after a
    `show` was planned from the old summary. Each part's size and time are in its key now."""
    from tests.gguf_split import split_model

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    parts = split_model(_write(tmp_path / "one.gguf"), tmp_path / "split", "tiny-Q8_0", 1)
    assert gguf_meta.read_summary(str(parts[0])).architecture == "llama"
    parts[1].write_bytes(parts[1].read_bytes()[:-50])
    with pytest.raises(ModelFormatError, match=r"part 2 of the split model .* is truncated"):
        gguf_meta.read_summary(str(parts[0]))
