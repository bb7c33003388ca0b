"""What a user may type as a model, parsed without touching disk or network.

  smollm2:135m, qwen2.5:7b@Q8_0       catalogue name, optional @QUANT
  owner/repo, owner/repo:Q4_K_M       Hugging Face repo, optional :QUANT (also hf.co/..., huggingface.co/...)
  owner/repo/path/file.gguf           one file of a repo
  ./model.gguf, /abs/model.gguf, ~/m.gguf, or any existing file: a local path
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localgen.errors import ModelNotFoundError
from localgen.models.hfcache import check_repo_id, safe_filename

HF_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf.co/")


@dataclass(frozen=True)
class PathSpec:
    """A local file."""

    path: Path


@dataclass(frozen=True)
class CatalogueSpec:
    """A catalogue name and an optional quantization."""

    name: str
    quant: str | None


@dataclass(frozen=True)
class HubSpec:
    """A Hugging Face repo, with an optional quantization tag or file name, at a revision."""

    repo: str
    quant: str | None = None
    filename: str | None = None
    revision: str = "main"

    @property
    def display(self) -> str:
        """How the name is shown back."""
        if self.filename:
            return f"{self.repo}/{self.filename}"
        return f"{self.repo}:{self.quant.upper()}" if self.quant else self.repo


Spec = PathSpec | CatalogueSpec | HubSpec


def parse(text: str) -> Spec:
    """Classify a model name; raises ModelNotFoundError for something that cannot be any of them."""
    name = text.strip()
    if not name:
        raise ModelNotFoundError("empty model name")
    p = Path(name).expanduser()
    if name.startswith(("/", "./", "../", "~")) or p.exists():
        return PathSpec(p)
    lowered = name.lower()
    for prefix in HF_PREFIXES:
        if lowered.startswith(prefix):
            return _hub(name[len(prefix):], text)
    if "/" not in name:
        base, _, quant = name.partition("@")
        return CatalogueSpec(base, quant or None)
    if name.lower().endswith(".gguf") and name.count("/") == 1:
        return PathSpec(p)  # models/foo.gguf: a relative path that does not exist
    return _hub(name, text)


def _hub(ref: str, original: str) -> HubSpec:
    ref = ref.split("?", 1)[0].rstrip("/")
    for marker in ("/resolve/", "/blob/"):  # a pasted file URL: owner/repo/resolve/REV/file.gguf
        if marker in ref:
            repo, _, rest = ref.partition(marker)
            revision, _, filename = rest.partition("/")
            return HubSpec(check_repo_id(repo), filename=safe_filename(filename), revision=revision or "main")
    parts = ref.split("/")
    if len(parts) < 2:
        raise ModelNotFoundError(f"{original!r} is not owner/repo")
    repo = "/".join(parts[:2])
    if len(parts) > 2:
        return HubSpec(check_repo_id(repo), filename=safe_filename("/".join(parts[2:])))
    repo, _, quant = repo.partition(":")
    return HubSpec(check_repo_id(repo), quant=quant or None)
