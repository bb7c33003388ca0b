"""Multimodal projectors (mmproj GGUFs): which file of a Hub repo is one, what it reads (images, audio),
and whether it fits a model: its projection width must equal the text model's embedding width, checked
from the two headers before anything loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localgen.errors import ModelFormatError, UsageError
from localgen.models.quant import quant_tag
from localgen.types import GGUFSummary, ModelRef

_PREFER = ("Q8_0", "F16", "BF16", "F32")  # llama.cpp's own repos ship these; Q8_0 loses nothing visible


@dataclass(frozen=True)
class ProjectorInfo:
    """What a projector's header says."""

    path: str
    modalities: tuple[str, ...]  # "image", "audio"
    n_embd: int | None  # the width of the embeddings it makes
    projector_type: str | None


def is_mmproj(name: str) -> bool:
    """Whether a repo file is a projector (llama.cpp's convention: the name starts with mmproj)."""
    base = name.rsplit("/", 1)[-1].lower()
    return base.endswith(".gguf") and base.startswith("mmproj")


def choose(names: list[str]) -> str | None:
    """The projector to fetch among a repo's files (Q8_0, else F16, ...), or None."""
    found = sorted(n for n in names if is_mmproj(n))
    # the tag as a whole token of the name: "f16" is inside "bf16"
    tags = {n: (quant_tag(n) or "").removeprefix("UD-") for n in found}
    for tag in _PREFER:
        for n in found:
            if tags[n] == tag:
                return n
    return found[0] if found else None


def in_folder(folder: Path) -> Path | None:
    """The projector beside a cached model (the same snapshot), if one was pulled."""
    try:
        names = [p.name for p in folder.iterdir() if p.is_file()]
    except OSError:
        return None
    pick = choose(names)
    return folder / pick if pick else None


def read(path: str) -> ProjectorInfo:
    """A projector's header; a ModelFormatError for a file that is not one."""
    from localgen.models.gguf_meta import read_gguf

    p = Path(path)
    if not p.is_file():  # (a device or a FIFO is there, and is no file to read a header from)
        raise UsageError(f"no such projector file: {path}" if not p.exists() else
                         f"the projector {path} is not a regular file (a GGUF file is)")
    meta, _, _ = read_gguf(str(p))
    if meta.get("general.architecture") != "clip":
        raise ModelFormatError(f"{path} is not a multimodal projector (mmproj) GGUF: its architecture is "
                               f"{meta.get('general.architecture')!r}, not 'clip'")
    mods = []
    if meta.get("clip.has_vision_encoder"):
        mods.append("image")
    if meta.get("clip.has_audio_encoder"):
        mods.append("audio")
    dims = [meta.get(f"clip.{m}.projection_dim") for m in ("vision", "audio")]
    n = next((int(d) for d in dims if isinstance(d, int) and d > 0), None)
    kind = meta.get("clip.projector_type") or meta.get("clip.vision.projector_type") or meta.get(
        "clip.audio.projector_type")
    return ProjectorInfo(str(p), tuple(mods), n, kind if isinstance(kind, str) else None)


def attach(ref: ModelRef, path: str) -> ModelRef:
    """The model with the projector at `path`, once its header says it fits (--mmproj): a file that is no projector's
    GGUF is a ModelFormatError (exit 1, as a model file's: docs/ci.md) whose hint names the file to give instead."""
    import dataclasses

    try:
        info = read(path)
    except ModelFormatError as e:
        if isinstance(e, UsageError):
            raise
        raise ModelFormatError(e.message, hint="give --mmproj the mmproj-*.gguf file from the model's repo") from None
    check_fits(info, ref.summary, ref.name)
    return dataclasses.replace(ref, mmproj=path)


def modalities(ref: ModelRef) -> list[str]:
    """What the model reads besides text, from its projector's header (none without one)."""
    return list(read(ref.mmproj).modalities) if ref.mmproj else []


def check_fits(info: ProjectorInfo, model: GGUFSummary, model_name: str) -> None:
    """A UsageError when the projector was made for a model of another width."""
    if not info.modalities:
        raise UsageError(f"{info.path} has neither a vision nor an audio encoder")
    if info.n_embd and model.n_embd and info.n_embd != model.n_embd:
        raise UsageError(f"the projector {Path(info.path).name} makes embeddings of {info.n_embd} values, but "
                         f"{model_name} takes {model.n_embd}: it belongs to another model",
                         hint="use the mmproj file from the same repo as the model")
