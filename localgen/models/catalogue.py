"""The model catalogue: models.toml shipped with localgen, plus the user's models.toml on top."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen import paths, settings
from localgen.errors import LocalgenError, UsageError

SHIPPED = Path(__file__).with_name("models.toml")  # package data; the repo's top-level models.toml links here


@dataclass(frozen=True)
class CatalogueEntry:
    """A named model: where it comes from, its default quantization, context and sampling defaults."""

    name: str
    description: str = ""
    repo: str | None = None
    embedded: bool = False
    default_quant: str = "Q4_K_M"
    context: int | None = None
    files: dict[str, str] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)


def user_file() -> Path:
    """The user's additions and overrides."""
    return paths.config_dir() / "models.toml"


def _read(path: Path, required: bool = False) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        if required:
            raise LocalgenError(f"internal error: the model catalogue shipped with localgen is missing ({path})",
                                hint="reinstall localgen") from None
        return {}
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise LocalgenError(f"cannot read the model catalogue {path}: {e}") from None
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise LocalgenError(f"{path}: [models] must be a table of model entries")
    return models


def _entry(name: str, raw: Any, source: Path) -> CatalogueEntry:
    if not isinstance(raw, dict):
        raise LocalgenError(f"{source}: entry {name!r} must be a table")
    sampling = raw.get("sampling", {}) or {}
    if not isinstance(sampling, dict):
        raise LocalgenError(f"{source}: entry {name!r}: sampling must be a table")
    try:
        sampling = settings.validate(sampling)
    except UsageError as e:
        raise LocalgenError(f"{source}: entry {name!r}: {e.message}") from None
    if not raw.get("embedded") and not raw.get("repo"):
        raise LocalgenError(f"{source}: entry {name!r} needs a repo")
    return CatalogueEntry(
        name=name, description=str(raw.get("description", "")), repo=raw.get("repo"),
        embedded=bool(raw.get("embedded", False)), default_quant=str(raw.get("default_quant", "Q4_K_M")),
        context=raw.get("context"), files=dict(raw.get("files", {}) or {}), sampling=dict(sampling),
    )


def load() -> dict[str, CatalogueEntry]:
    """All entries by name; the user's file wins over the shipped one."""
    entries: dict[str, CatalogueEntry] = {}
    for path, required in ((SHIPPED, True), (user_file(), False)):
        for name, raw in _read(path, required).items():
            entries[name] = _entry(name, raw, path)
    return entries
