"""Write a real split GGUF (model-00001-of-0000N.gguf ...) from a single-file model, for tests."""

from __future__ import annotations

from pathlib import Path


def split_model(src: Path, out_dir: Path, stem: str, max_tensors: int) -> list[Path]:
    """Re-write `src` as a split GGUF with at most `max_tensors` tensors per part; returns the parts."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(out_dir / f"{stem}.gguf", arch, split_max_tensors=max_tensors)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment") or key.startswith("split."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=list(t.data.shape),
                          raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(out_dir.glob(f"{stem}-*-of-*.gguf"))
