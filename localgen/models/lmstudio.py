"""Models LM Studio downloaded, used in place and read-only: `lmstudio:PUBLISHER/REPO[:QUANT]` is a GGUF of
~/.lmstudio/models/PUBLISHER/REPO (LM Studio's documented layout; the older ~/.cache/lm-studio/models too), or of
the models folder LM Studio's settings name instead (downloadsFolder). QUANT
picks among the folder's files as a Hub repo's tag does (models/quant.py); an mmproj file beside them is the
model's projector. Nothing here writes into the store or touches the network."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from localgen import paths
from localgen.errors import LocalgenError, ModelNotFoundError, UsageError
from localgen.models import mmproj
from localgen.models.quant import QuantOption, RemoteFile, best_that_fits, group_options, pick
from localgen.types import ModelRef

PREFIX = "lmstudio:"
DEFAULT_QUANT = "Q4_K_M"  # as a Hub repo without a tag: Q4_K_M where the folder has it, else the best that fits
_PART = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class LmStudioName:
    """A publisher's repo folder, and the quantization asked for (None: the default)."""

    publisher: str
    repo: str
    quant: str | None

    @property
    def folder(self) -> str:
        """publisher/repo."""
        return f"{self.publisher}/{self.repo}"


def parse_name(text: str) -> LmStudioName:
    """The name after `lmstudio:` (names.parse takes the prefix off, once): PUBLISHER/REPO[:QUANT], no part '.' or
    '..' (nothing outside the store)."""
    folder, colon, quant = text.partition(":")
    parts = folder.split("/")
    if len(parts) != 2 or not all(_PART.fullmatch(p) and p not in (".", "..") for p in parts) or (
            colon and not _PART.fullmatch(quant)):
        raise UsageError(f"{PREFIX + text!r} is not an LM Studio model name: use lmstudio:PUBLISHER/REPO[:QUANT], as "
                         "`localgen list` shows them")
    return LmStudioName(parts[0], parts[1], quant or None)


def roots() -> list[Path]:
    """Where LM Studio keeps its models: the models folder its settings name (`downloadsFolder` in
    ~/.lmstudio/settings.json, where My Models' "Models Directory" is kept), else ~/.lmstudio/models; then the
    older ~/.cache/lm-studio's the same way. Each folder once."""
    out: list[Path] = []
    if (home := paths.user_home()) is None:  # HOME unset and no password entry: no LM Studio to read
        return out
    for top in (home / ".lmstudio", home / ".cache" / "lm-studio"):
        folder = _settings_folder(top / "settings.json") or top / "models"
        if folder not in out:
            out.append(folder)
    return out


def _settings_folder(settings: Path) -> Path | None:
    """The models folder an LM Studio settings file names (`downloadsFolder`), or None where it names none (no
    file, no such key). A file that is not JSON is left out, said once as a warning."""
    import json

    from localgen.models.ollamastore import warn_once

    try:
        doc = json.loads(settings.read_bytes())
    except OSError:  # none (or unreadable): LM Studio's default folder
        return None
    except ValueError as e:  # UnicodeDecodeError too
        warn_once(f"LM Studio's settings {settings} are not JSON ({e}): its default models folder is used")
        return None
    folder = doc.get("downloadsFolder") if isinstance(doc, dict) else None
    return Path(folder).expanduser() if isinstance(folder, str) and folder.strip() else None


def _options(folder: Path) -> list[QuantOption]:
    files = []
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.name.lower().endswith(".gguf"):
            files.append(RemoteFile(p.name, p.stat().st_size, None))
    return group_options(files)


def _folder(name: LmStudioName) -> Path:
    places = roots()
    for root in places:
        folder = root / name.publisher / name.repo
        try:
            if folder.is_dir():
                return folder
        except OSError as e:
            raise LocalgenError(f"cannot read LM Studio's store {root}: {e.strerror or e}") from None
    raise ModelNotFoundError(f"no LM Studio model {name.folder}: no folder "
                             f"{' or '.join(str(r / name.publisher / name.repo) for r in places)}",
                             hint="`localgen list` shows LM Studio's models by the names run takes")


def resolve(text: str) -> ModelRef:
    """An LM Studio model as a ModelRef: the GGUF the tag picks, and the projector beside it."""
    from localgen.models.gguf_meta import read_summary

    name = parse_name(text)
    folder = _folder(name)
    try:
        options = _options(folder)
    except OSError as e:
        raise LocalgenError(f"cannot read {folder}: {e.strerror or e}") from None
    if not options:
        raise ModelNotFoundError(f"LM Studio's folder {folder} holds no GGUF model")
    if name.quant is not None:
        chosen = pick(options, name.quant)
        if chosen is None:
            raise ModelNotFoundError(f"LM Studio's {name.folder} has no quantization {name.quant.upper()}",
                                     hint="it has: " + ", ".join(o.tag for o in options))
    else:
        chosen = pick(options, DEFAULT_QUANT) or best_that_fits(options)  # as pull picks a Hub repo's
    path = folder / chosen.first.name
    proj = mmproj.in_folder(folder)
    return ModelRef(name=f"{PREFIX}{name.folder}:{chosen.tag}", path=str(path), source="lmstudio",
                    summary=read_summary(str(path)), mmproj=str(proj) if proj else None)


def all_models() -> Iterator[tuple[str, Path, int]]:
    """Every model of LM Studio's stores: its name (lmstudio:PUBLISHER/REPO:QUANT), first file and size; each
    name once (the first store's)."""
    seen: set[str] = set()
    for root in roots():
        try:
            folders = sorted(p for p in root.glob("*/*") if p.is_dir()) if root.is_dir() else []
        except OSError:  # a store this user may not read
            continue
        for folder in folders:
            try:
                name = parse_name(f"{folder.parent.name}/{folder.name}")
                options = _options(folder)
            except (UsageError, OSError):
                continue
            for o in options:
                shown = f"{PREFIX}{name.folder}:{o.tag}"
                if shown.lower() not in seen:
                    seen.add(shown.lower())
                    yield shown, folder / o.first.name, o.size


def refuse_removal(text: str) -> UsageError:
    """`rm`'s answer for an LM Studio model (the name after `lmstudio:`): LM Studio owns its store. A
    ModelNotFoundError where LM Studio has no such model."""
    name = parse_name(text)
    _folder(name)
    return UsageError(f"lmstudio:{name.folder} is LM Studio's model: remove it in LM Studio (My Models)",
                      hint="localgen never changes LM Studio's store")
