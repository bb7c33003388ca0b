"""What a user may type as a model, parsed without touching disk or network.

  smollm2:135m, qwen2.5:7b@Q8_0       catalogue name, optional @QUANT
  owner/repo, owner/repo:Q4_K_M       Hugging Face repo, optional :QUANT (also hf.co/..., huggingface.co/...)
  owner/repo/path/file.gguf           one file of a repo
  ollama:llama3.2:1b, lmstudio:owner/repo  a model Ollama or LM Studio downloaded, used in place
  oci:ai/smollm2, oci:HOST/REPO:TAG   a model from an OCI registry (Docker Model Runner's), pulled by localgen
  ./model.gguf, /abs/model.gguf, ~/m.gguf, model.gguf, dir/model.gguf, or any existing file: a local path
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localgen.errors import LocalgenError, ModelNotFoundError, UsageError
from localgen.models.hfcache import check_repo_id, safe_filename
from localgen.text import mended

# a path's most on Linux (PATH_MAX), and longer than any repo id (96) and file in it: a longer name is refused
# before it reaches the file system (ENAMETOOLONG) or the Hub
MAX_NAME = 4096
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


@dataclass(frozen=True)
class StoreSpec:
    """A model another tool downloaded, used in place: `store` is "ollama" or "lmstudio", `name` the rest (its
    store's module parses it: models/ollamastore.py, models/lmstudio.py); or "oci", a model of an OCI registry
    (models/oci.py)."""

    store: str
    name: str


STORES = ("ollama", "lmstudio", "oci")
Spec = PathSpec | CatalogueSpec | HubSpec | StoreSpec


def parse(text: str, local: bool = True) -> Spec:
    """Classify a model name; raises ModelNotFoundError for something that cannot be any of them, UsageError
    for an empty name, a name too long or a repo's file path that leaves the repo. Without `local` (a name a
    client sent the server), a name is never a file on this machine, and no file is looked for."""
    name = text.strip()
    if not name:
        raise UsageError("empty model name")
    if len(name) > MAX_NAME:
        raise UsageError(f"a model name is at most {MAX_NAME:,} characters; this one is {len(name):,}")
    if "\0" in name:
        raise UsageError("a model name cannot hold a NUL character")
    store, colon, rest = name.partition(":")
    if colon and store.lower() in STORES:  # before a file's name: the prefix says where the model is
        if not rest.strip():
            raise UsageError(f"{_short(name)} names no model: e.g. "
                             f"{'oci:ai/smollm2' if store.lower() == 'oci' else store.lower() + ':llama3.2'}")
        return StoreSpec(store.lower(), rest.strip())
    if not local:
        if name.startswith(("/", "./", "../", "~", "file:")):
            raise UsageError(f"{_short(name)} is a file path; name a model of the catalogue or a Hub repo "
                             "(owner/repo)")
    else:
        p = Path(name).expanduser()
        if looks_like_path(name) or _exists(p):
            return PathSpec(p)
    lowered = name.lower()
    for prefix in HF_PREFIXES:
        if lowered.startswith(prefix):
            return _hub(name[len(prefix):], text)
    if "/" not in name:
        base, at, quant = name.partition("@")
        if at and not quant.strip():  # `qwen2.5:7b@`: the entry's default was pulled, as though no @ were typed
            raise UsageError(f"{_short(name)} names no quantization after @: e.g. {base}@Q4_K_M")
        return CatalogueSpec(base, quant or None)
    return _hub(name, text)


def looks_like_path(text: str) -> bool:
    """Whether a name is a file path by its look alone, there or not: it starts with /, ./, ../ or ~, or it ends in
    .gguf with at most one '/' (nope.gguf, models/foo.gguf; owner/repo/file.gguf is a Hub repo's file). Such a
    name that is not there is "no such model file", never an unknown catalogue model."""
    name = text.strip()
    if name.lower().startswith(HF_PREFIXES):
        return False
    return name.startswith(("/", "./", "../", "~")) or (name.lower().endswith(".gguf") and name.count("/") <= 1)


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except OSError:  # a name no file can have (too long for the file system)
        return False


def _short(text: str) -> str:
    """A typed name quoted in an error: at most 80 characters, a byte that is not UTF-8 as U+FFFD, as `unknown
    model` quotes it (never Python's \\udce8 escape)."""
    return repr(mended(text if len(text) <= 80 else text[:77] + "..."))


def _hub(ref: str, original: str) -> HubSpec:
    try:
        return _hub_spec(ref, original)
    except ModelNotFoundError:
        raise
    except LocalgenError:  # a repo id or file path that is not one (a path trick: .., //, \\)
        raise UsageError(f"{_short(original)} is not a model name: use a catalogue name, owner/repo, "
                         "owner/repo:QUANT or owner/repo/file.gguf (no '..' or empty parts)") from None


def _hub_spec(ref: str, original: str) -> HubSpec:
    ref = ref.split("?", 1)[0].rstrip("/")
    for marker in ("/resolve/", "/blob/"):  # a pasted file URL: owner/repo/resolve/REV/file.gguf
        if marker in ref:
            repo, _, rest = ref.partition(marker)
            revision, _, filename = rest.partition("/")
            if revision in (".", "..") or "\\" in revision:  # a path trick, refused before any request
                raise LocalgenError(f"unsafe revision name {revision!r}")
            return HubSpec(check_repo_id(repo), filename=safe_filename(filename), revision=revision or "main")
    parts = ref.split("/")
    if len(parts) < 2:
        raise ModelNotFoundError(f"{_short(original)} is not owner/repo")
    repo = "/".join(parts[:2])
    if len(parts) > 2:
        return HubSpec(check_repo_id(repo), filename=safe_filename("/".join(parts[2:])))
    repo, colon, quant = repo.partition(":")
    if colon and not quant:  # owner/repo: names no quantization; it does not mean "any"
        raise LocalgenError(f"{original!r} has an empty quantization after ':'")
    return HubSpec(check_repo_id(repo), quant=quant or None)
