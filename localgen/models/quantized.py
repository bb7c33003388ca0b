"""Models quantized here (`localgen quantize`, `create -q`): one GGUF each in the data dir's `quantized` folder, named
`BASE:TYPE` (`smollm2-135m:q4_k_m`), the name `list` shows and `run -m` takes. The file is `BASE@TYPE.gguf` (':' is
not in a Windows path), with a hidden record of what it was made from beside it (`.BASE@TYPE.gguf.origin.json`). A
quantized model is its own file: removing it removes nothing else (but that record)."""

from __future__ import annotations

import re
from pathlib import Path

from localgen import paths
from localgen.errors import UsageError
from localgen.models.quant import SPLIT_RE, quant_tag

BASE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}$")
TYPE = re.compile(r"^[a-z0-9_]{1,20}$")


def folder() -> Path:
    """Where quantized models live."""
    return paths.data_dir() / "quantized"


def name_of(base: str, type_name: str) -> str:
    """The model name of `base` quantized to `type_name` (lower case: smollm2-135m:q4_k_m)."""
    return f"{base}:{type_name.lower()}"


def check_base(base: str) -> str:
    """A base name for quantized models: lower-case letters, digits, '.', '_' and '-'."""
    if not BASE.match(base):
        raise UsageError(f"bad model name {base!r}: use lower-case letters, digits, '.', '_' and '-' "
                         "(the type is added: NAME:q4_k_m)")
    return base


def base_for(source: str) -> str:
    """A base name from what the user named as the source: a file's name without its extension and type tag
    (SmolLM2-135M-Instruct-F16.gguf → smollm2-135m-instruct), a repo's name without -GGUF, a catalogue or quantized
    model's name without its tag (smollm2:135m → smollm2-135m, mine:q8_0 → mine)."""
    text = source.strip().rstrip("/")
    if text.lower().endswith(".gguf"):
        stem = SPLIT_RE.sub("", Path(text).name)
        stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
        tag = quant_tag(stem + ".gguf")
        if tag:
            stem = re.sub(rf"[-_.]?{re.escape(tag)}$", "", stem, flags=re.IGNORECASE)
    else:
        head, _, tail = text.rpartition("/")
        stem = tail if head else text
        base, _, tag = stem.partition(":")
        typed = tag and (quant_tag(f"x-{tag}.gguf") or tag.lower() == "copy")  # COPY: quantize's type too
        stem = base if typed else stem.replace(":", "-")  # a type tag goes
        stem = re.sub(r"[-_.]gguf$", "", stem, flags=re.IGNORECASE)
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")
    return cleaned[:80] or "model"


def _file(name: str) -> Path | None:
    base, sep, type_name = name.partition(":")
    if not sep or not BASE.match(base) or not TYPE.match(type_name):
        return None
    return folder() / f"{base}@{type_name}.gguf"


def path_for(name: str) -> Path:
    """Where the model `name` (BASE:TYPE) is kept."""
    path = _file(name)
    if path is None:
        raise UsageError(f"bad quantized model name {name!r}")
    return path


def find(name: str) -> Path | None:
    """The file of the quantized model `name`, or None."""
    path = _file(name)
    return path if path is not None and path.is_file() else None


def origin_path(path: Path) -> Path:
    """The hidden record beside a quantized model's file of what it was made from (quant/quantize.py's)."""
    return path.with_name(f".{path.name}.origin.json")


def all_models() -> list[tuple[str, Path]]:
    """Every quantized model here: (name, file), by name."""
    d = folder()
    out = []
    for path in sorted(d.glob("*@*.gguf")) if d.is_dir() else []:
        base, _, type_name = path.name[:-5].partition("@")
        if BASE.match(base) and TYPE.match(type_name):
            out.append((f"{base}:{type_name}", path))
    return out


def remove(name: str) -> int:
    """Remove a quantized model's file; the bytes freed (0 when there was none)."""
    path = find(name)
    if path is None:
        return 0
    size = path.stat().st_size
    path.unlink()
    origin_path(path).unlink(missing_ok=True)
    return size
