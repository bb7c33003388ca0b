"""Turn what the user typed into a ModelRef: an embedded model name or a path to a .gguf file."""

from __future__ import annotations

from pathlib import Path

from localgen.errors import ModelNotFoundError
from localgen.models import embedded
from localgen.models.gguf_meta import summarize
from localgen.types import ModelRef


def resolve(name: str | None) -> ModelRef:
    """Resolve a model name or path; reads the GGUF header (bounded) to validate and summarize it."""
    name = name or embedded.DEFAULT_MODEL
    if name in embedded.EMBEDDED:
        path = embedded.locate(embedded.EMBEDDED[name])
        return ModelRef(name=name, path=str(path), source="embedded", summary=summarize(str(path)))
    p = Path(name).expanduser()
    if p.exists():
        return ModelRef(name=p.name, path=str(p), source="path", summary=summarize(str(p)))
    if name.endswith(".gguf") or "/" in name or name.startswith("."):
        raise ModelNotFoundError(f"no such model file: {name}")
    known = ", ".join(sorted(embedded.EMBEDDED))
    raise ModelNotFoundError(f"unknown model {name!r}", hint=f"known models: {known}; or pass a path to a .gguf")
