"""Models pulled from OCI registries as Docker Model Runner packages them (`docker model package`; Docker Hub's ai/
namespace): `oci:[HOST/]REPO[:TAG|@sha256:DIGEST]`, read as Docker reads an image reference (the host is docker.io
unless the first part has a '.' or ':' or is localhost; a one-part repo on docker.io is library/REPO; the tag is
latest). `localgen pull oci:...` (models/ocipull.py) stores them in localgen's data dir (pulled_root()):
manifests/HOST/REPO/@TAG (or @sha256:HEX) holds the image manifest as the registry sent it, blobs/sha256-HEX each
layer, and splits/HEX/model-0000I-of-0000N.gguf the symbolic links a GGUF split over several layers loads through
(llama.cpp finds a split's parts by file name; Docker Model Runner names them so, in the manifest's order), made by
the pull (a run makes them again where they are missing; list and show never write). A
layer's media type says what it is: application/vnd.docker.ai.gguf.v3 a GGUF (several: the parts of one split
model), .mmproj its projector, .chat.template.jinja a chat template used instead of the GGUF's own, .license a
license; the config blob (application/vnd.docker.ai.model.config.v0.*+json) gives format, quantization, parameters,
size and a context size. Nothing here touches the network."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen import paths
from localgen.errors import LocalgenError, ModelFormatError, ModelNotFoundError, UsageError
from localgen.types import MIN_CTX_FLAG, GGUFSummary, ModelRef
from localgen.unnamed import running

PREFIX = "oci:"
DEFAULT_HOST = "docker.io"
API_HOSTS = {"docker.io": "registry-1.docker.io"}  # where a host's registry API answers (Docker's own rule)
ALIASES = {"index.docker.io": "docker.io", "registry-1.docker.io": "docker.io"}
DEFAULT_TAG = "latest"
MAX_REPO = 255  # the distribution spec's limit for a repository name (with its host)
MAX_JSON = 1 << 20  # a manifest, a config or a chat template
GGUF = "application/vnd.docker.ai.gguf.v3"
MMPROJ = "application/vnd.docker.ai.mmproj"
TEMPLATE = "application/vnd.docker.ai.chat.template.jinja"
LICENSE = "application/vnd.docker.ai.license"
CONFIG_PREFIX = "application/vnd.docker.ai.model.config."  # v0.1+json, v0.2+json
USED = (GGUF, MMPROJ, TEMPLATE, LICENSE)  # the layers a pull downloads; others (safetensors, tar archives) are not
DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
# the distribution spec's grammar: a path component, a tag; a host name with an optional port
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                   r"(?::[0-9]{1,5})?")


@dataclass(frozen=True)
class OciName:
    """An image reference: host, repository and a tag or a digest (sha256:HEX)."""

    host: str
    repo: str
    tag: str | None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What follows /manifests/ in the registry's URL: the digest, else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    @property
    def short(self) -> str:
        """The name as `docker model` shows it (no docker.io/, no library/), with its tag or digest."""
        repo = self.repo.removeprefix("library/") if self.host == DEFAULT_HOST else f"{self.host}/{self.repo}"
        return f"{repo}@{self.digest}" if self.digest else f"{repo}:{self.tag}"

    @property
    def display(self) -> str:
        """The name as localgen shows it: oci: and the short form."""
        return PREFIX + self.short

    @property
    def api_host(self) -> str:
        """The host the registry's API answers on (docker.io's is registry-1.docker.io)."""
        return API_HOSTS.get(self.host, self.host)

    def parts(self) -> tuple[str, ...]:
        """The manifest's path below manifests/: the host, the repository's components, @TAG or @sha256:HEX."""
        return (self.host, *self.repo.split("/"), "@" + self.reference)


def parse_name(text: str) -> OciName:
    """The name after `oci:` (`oci://NAME`, as RamaLama writes one, too), read as Docker reads an image reference;
    a UsageError for one it would not take (upper case in the repository, '..', a bad tag or digest), so no part of
    it can leave the store's folders."""
    rest = text.strip().removeprefix("//")
    bad = UsageError(f"{PREFIX + text!r} is not an OCI image reference: use oci:REPO[:TAG], oci:NAMESPACE/REPO[:TAG] "
                     "or oci:HOST/REPO[:TAG] (or @sha256:DIGEST for the tag), e.g. oci:ai/smollm2")
    digest = None
    if "@" in rest:
        rest, _, digest = rest.rpartition("@")
        if DIGEST.fullmatch(digest) is None:
            raise bad
    tag: str | None = None
    if rest.rfind(":") > rest.rfind("/"):
        rest, _, tag = rest.rpartition(":")
        if _TAG.fullmatch(tag) is None:
            raise bad
    pieces = rest.split("/")
    host = DEFAULT_HOST
    if len(pieces) > 1 and ("." in pieces[0] or ":" in pieces[0] or pieces[0] == "localhost"):
        host = pieces.pop(0)
        if _HOST.fullmatch(host) is None:
            raise bad
        host = ALIASES.get(host.lower(), host)
    if host == DEFAULT_HOST and len(pieces) == 1:
        pieces.insert(0, "library")  # Docker's rule for an official image's one-part name
    repo = "/".join(pieces)
    if not all(_COMPONENT.fullmatch(p) for p in pieces) or len(host) + 1 + len(repo) > MAX_REPO:
        raise bad
    return OciName(host, repo, None if digest else (tag or DEFAULT_TAG), digest)


def pulled_root() -> Path:
    """Where `localgen pull oci:NAME` keeps its models."""
    return paths.data_dir() / "oci"


def manifest_path(root: Path, name: OciName) -> Path:
    return root / "manifests" / Path(*name.parts())


@dataclass(frozen=True)
class Layer:
    """One layer of a manifest: its media type, blob, size and digest (sha256:HEX)."""

    media: str
    blob: Path
    size: int
    digest: str


@dataclass(frozen=True)
class Manifest:
    """A pulled model's manifest, read and checked: its file, config blob and layers in order."""

    name: OciName
    path: Path
    config: Layer | None
    layers: tuple[Layer, ...] = field(default=())

    def of(self, media: str) -> list[Layer]:
        return [x for x in self.layers if x.media == media]


def _damaged(path: Path, why: str, name: OciName) -> LocalgenError:
    return LocalgenError(f"the manifest {path} is damaged: {why}", hint=f"`localgen pull {name.display}` fetches "
                                                                        "it again")


def read_manifest(name: OciName, root: Path, path: Path) -> Manifest:
    """A stored manifest's config and layers, each with its blob's path; a LocalgenError naming the file when it is
    not one."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON + 1)
    except OSError as e:
        raise LocalgenError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_JSON else None
    except (UnicodeDecodeError, ValueError):
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
        raise _damaged(path, "it is not an image manifest with a list of layers", name)

    def layer(x: Any) -> Layer:
        if not isinstance(x, dict) or not isinstance(x.get("mediaType"), str):
            raise _damaged(path, "a layer without a mediaType", name)
        digest, size = x.get("digest"), x.get("size")
        m = DIGEST.fullmatch(digest) if isinstance(digest, str) else None
        if m is None or isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise _damaged(path, "a layer without a sha256 digest and a size", name)
        return Layer(x["mediaType"], root / "blobs" / f"sha256-{m.group(1)}", size, m.group(0))

    config = layer(doc["config"]) if isinstance(doc.get("config"), dict) else None
    used = [x for x in doc["layers"] if not isinstance(x, dict) or x.get("mediaType") in USED]  # as a pull takes them
    return Manifest(name, path, config, tuple(layer(x) for x in used))


def find(name: OciName) -> Manifest | None:
    """The pulled manifest of a name, or None."""
    root = pulled_root()
    path = manifest_path(root, name)
    return read_manifest(name, root, path) if path.is_file() else None


def manifest(name: OciName) -> Manifest:
    """The pulled manifest of a name; a ModelNotFoundError saying how to pull it."""
    found = find(name)
    if found is None:
        raise ModelNotFoundError(f"no OCI model {name.display} is pulled",
                                 hint=f"`localgen pull {name.display}` downloads it from {name.host}")
    return found


def checked_blob(m: Manifest, layer: Layer) -> Path:
    """A layer's blob, there and of its manifest's size (its SHA-256 was checked as it was pulled)."""
    try:
        size = layer.blob.stat().st_size
    except OSError:
        size = -1
    if size != layer.size:
        what = "missing" if size < 0 else f"damaged: {size:,} bytes, its manifest says {layer.size:,}"
        raise LocalgenError(f"the {layer.media} layer of {m.name.display} is {what} ({layer.blob})",
                            hint=f"`localgen pull {m.name.display}` fetches it again")
    return layer.blob


def split_folder(root: Path, ggufs: list[Path]) -> tuple[Path, list[Path]]:
    """Where a split's links are: splits/HEX (HEX the SHA-256 of its blobs' names, so that one split's links serve
    every manifest that names it), and each link's path, model-0000I-of-0000N.gguf in the manifest's order."""
    key = hashlib.sha256("\n".join(p.name for p in ggufs).encode()).hexdigest()
    folder = root / "splits" / key
    return folder, [folder / name for name in _link_names(len(ggufs))]


def _link_names(n: int) -> list[str]:
    return [f"model-{i + 1:05d}-of-{n:05d}.gguf" for i in range(n)]


def _whole(folder: Path, links: list[Path], ggufs: list[Path]) -> bool:
    """Whether a split's folder holds its links, each naming its blob, and nothing else."""
    try:
        if sorted(os.listdir(folder)) != sorted(x.name for x in links):
            return False
        return all(os.readlink(link) == os.path.relpath(blob, folder) for link, blob in zip(links, ggufs, strict=True))
    except OSError:
        return False


def split_links(root: Path, ggufs: list[Path], make: bool = True) -> Path:
    """The path llama.cpp loads a model from: the one GGUF's blob, or, for a model split over several layers, the
    first of its links (split_folder), made if they are not there and `make` (a pull, a run); without `make` (list,
    show) nothing is written and the path is where they are, or will be."""
    if len(ggufs) == 1:
        return ggufs[0]
    folder, links = split_folder(root, ggufs)
    if make and not _whole(folder, links, ggufs):
        _make_links(folder, links, ggufs)
    return links[0]


def _make_links(folder: Path, links: list[Path], ggufs: list[Path]) -> None:
    """Make a split's folder whole, atomically: its links go into a folder of this process's own, renamed into
    place, so that a run starting meanwhile finds the whole folder or none (never some of its links); a damaged
    folder there is moved aside first. A LocalgenError when the store cannot be written."""
    import shutil

    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        paths.make_dirs(tmp)
        for link, blob in zip(links, ggufs, strict=True):
            os.symlink(os.path.relpath(blob, folder), tmp / link.name)  # relative to splits/, as tmp is too
        for _ in range(3):
            try:
                os.rename(tmp, folder)  # fails when a folder is there (ENOTEMPTY, EEXIST)
                return
            except OSError:
                if _whole(folder, links, ggufs):  # another process made it meanwhile
                    return
            aside = folder.with_name(f".{folder.name}.{os.getpid()}.old")
            with contextlib.suppress(FileNotFoundError):  # gone meanwhile: the next rename puts ours there
                os.rename(folder, aside)
            shutil.rmtree(aside, ignore_errors=True)
        raise OSError(f"{folder} kept changing while localgen made it")
    except OSError as e:
        raise LocalgenError(f"cannot make the links a split model loads through in {folder.parent}: "
                            f"{e.strerror or e}", hint="localgen pull makes them; run it where the data dir is "
                                                       "writable") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prune_splits(root: Path) -> None:
    """Remove the split folders whose links name a blob that is gone (after rm), each renamed away before it is
    emptied (a run never finds some of its links), and those a process that has ended left half made."""
    import shutil

    top = root / "splits"
    if not top.is_dir():
        return
    for folder in top.iterdir():
        if folder.name.startswith("."):  # another process's folder being made (or moved aside): its own
            pid = folder.name.rsplit(".", 2)[-2] if folder.name.count(".") >= 3 else ""
            if pid.isascii() and pid.isdigit() and not running(int(pid)):
                shutil.rmtree(folder, ignore_errors=True)
            continue
        links = list(folder.glob("*.gguf")) if folder.is_dir() else []
        if any(not p.exists() for p in links) or not links:
            gone = folder.with_name(f".{folder.name}.{os.getpid()}.old")
            try:
                os.rename(folder, gone)
            except OSError:
                continue
            shutil.rmtree(gone, ignore_errors=True)




def config(m: Manifest) -> dict[str, Any]:
    """The config blob's `config` object (format, quantization, parameters, architecture, size, context_size);
    {} where there is none or it is not Docker's model config."""
    if m.config is None or not m.config.media.startswith(CONFIG_PREFIX):
        return {}
    try:
        raw = checked_blob(m, m.config).read_bytes()[:MAX_JSON + 1]
        doc = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_JSON else None
    except (LocalgenError, OSError, UnicodeDecodeError, ValueError):
        return {}
    inner = doc.get("config") if isinstance(doc, dict) else None
    return inner if isinstance(inner, dict) else {}


def shown_config(m: Manifest) -> dict[str, Any]:
    """What `show` says of the config: its format, quantization, parameters, architecture, size, context size."""
    c = config(m)
    return {k: c[k] for k in ("format", "quantization", "parameters", "architecture", "size", "context_size")
            if isinstance(c.get(k), str | int) and not isinstance(c.get(k), bool)}


@dataclass
class Parts:
    """What a manifest's layers give a model."""

    path: Path  # what llama.cpp loads: the GGUF's blob, or a split's first link
    ggufs: tuple[Layer, ...]
    projector: Path | None
    template: str | None
    context: int | None

    def summary(self, check_data: bool = True) -> GGUFSummary:
        """The model's GGUF header (a split's: all its parts). A split whose links are not there (a store that
        cannot be written, a listing) is read through links in a temporary folder of its own: reading the store
        never writes in it."""
        from localgen.models.gguf_meta import read_summary

        if len(self.ggufs) == 1 or os.path.lexists(self.path):
            return read_summary(str(self.path), check_data=check_data)
        import tempfile

        names = _link_names(len(self.ggufs))
        with tempfile.TemporaryDirectory(prefix="localgen-split-") as tmp:
            for name, layer in zip(names, self.ggufs, strict=True):
                os.symlink(layer.blob.absolute(), Path(tmp) / name)
            return read_summary(str(Path(tmp) / names[0]), check_data=check_data, use_cache=False)


def read_parts(m: Manifest, make: bool = True) -> Parts:
    """A manifest's GGUF layers (a split's links made, with `make`), projector, chat template and context size; a
    LocalgenError for a damaged or missing one."""
    ggufs = m.of(GGUF)
    if not ggufs:
        raise LocalgenError(f"{m.name.display} has no GGUF layer in its manifest ({m.path}): localgen cannot run it")
    blobs = [checked_blob(m, x) for x in ggufs]
    path = split_links(pulled_root(), blobs, make)
    proj = [checked_blob(m, x) for x in m.of(MMPROJ)[:1]]
    template = None
    for x in m.of(TEMPLATE)[-1:]:
        if x.size > MAX_JSON:
            raise LocalgenError(f"the chat template layer of {m.name.display} is over {MAX_JSON:,} bytes")
        try:
            template = checked_blob(m, x).read_bytes().decode("utf-8") or None
        except (OSError, UnicodeDecodeError) as e:
            raise LocalgenError(f"cannot read the chat template layer of {m.name.display}: {e}") from None
    ctx = config(m).get("context_size")
    context = ctx if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx >= MIN_CTX_FLAG else None
    return Parts(path, tuple(ggufs), proj[0] if proj else None, template, context)


def resolve(text: str, make: bool = True) -> ModelRef:
    """A pulled OCI model (the name after `oci:`) as a ModelRef: its GGUF (a split's first part), projector, chat
    template (the layer's, else the GGUF's) and context size (the config's). `make`: make a split's links where
    they are missing (a run); without it (show) nothing is written."""
    import dataclasses

    m = manifest(parse_name(text))
    p = read_parts(m, make)
    try:
        summary = p.summary()
    except ModelFormatError as e:
        raise ModelFormatError(f"{m.name.display}: its GGUF layer is not one llama.cpp can load: {e.message}",
                               hint=f"`localgen pull {m.name.display}` fetches it again if it is damaged") from None
    if p.template:
        summary = dataclasses.replace(summary, chat_template=p.template)
    first = p.ggufs[0].digest.split(":", 1)[1]
    return ModelRef(name=m.name.display, path=str(p.path), source="oci", summary=summary,
                    sha256=first if len(p.ggufs) == 1 else None, mmproj=str(p.projector) if p.projector else None,
                    context=p.context)


def name_of(root: Path, path: Path) -> OciName | None:
    """The name a stored manifest's path spells, or None for a file that is not one."""
    parts = path.relative_to(root / "manifests").parts
    if len(parts) < 3 or not parts[-1].startswith("@"):
        return None
    ref = parts[-1][1:]
    try:  # the host first, always: parse_name reads a first part with a '.' or ':' (docker.io too) as one
        name = parse_name("/".join(parts[:-1]) + (f"@{ref}" if ref.startswith("sha256:") else f":{ref}"))
    except UsageError:
        return None
    return name if name.parts() == parts else None


def all_manifests() -> Iterator[Manifest]:
    """Every readable pulled manifest, in name order; a damaged one is left for `show` and `run` to name."""
    root = pulled_root()
    top = root / "manifests"
    if not top.is_dir():
        return
    for path in sorted(top.rglob("@*")):
        name = name_of(root, path) if path.is_file() else None
        if name is None:
            continue
        try:
            yield read_manifest(name, root, path)
        except LocalgenError:
            continue
