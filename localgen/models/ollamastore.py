"""Models Ollama downloaded, used in place and read-only: `ollama:MODEL[:TAG]` resolves through Ollama's own
store ($OLLAMA_MODELS, else ~/.ollama/models and the Linux service's /usr/share/ollama/.ollama/models). A name's
manifest (manifests/HOST/NAMESPACE/MODEL/TAG, JSON) lists layers by media type and digest; each layer's bytes are
the blob blobs/sha256-HEX. The model layer is the GGUF; a projector layer is its mmproj; params give its default
settings (as a catalogue entry's sampling: only where no flag is given), system its system prompt, messages its
turns before the conversation, adapter a LoRA adapter; the Go template is not used (the GGUF's own template is).
Models `localgen pull ollama:NAME` downloaded (models/registry.py) are kept in the same layout in localgen's data
dir (pulled_root()), read after Ollama's store. A blob's size is checked against its manifest's (Ollama, or
localgen's pull, verified its SHA-256 when it was pulled); nothing here writes into a store or touches the network."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen import loadsettings, paths, settings
from localgen.errors import LocalgenError, ModelFormatError, ModelNotFoundError, UsageError
from localgen.types import MIN_CTX_FLAG, TRAINED_CTX, ModelRef

PREFIX = "ollama:"
DEFAULT_HOST = "registry.ollama.ai"  # Ollama's fill for a name's missing parts (types/model/name.go)
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MEDIA = "application/vnd.ollama.image."
MAX_PART = 80  # Ollama's limit for a namespace, a model and a tag (types/model/name.go isValidLen)
MAX_HOST = 350  # and for a host (which may hold :PORT)
MAX_JSON = 1 << 20  # a manifest, a params or messages layer: a few hundred bytes in Ollama's own
MAX_TEXT = 1 << 20  # a system prompt
DIGEST = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")
# types/model/name.go's isValidPart: a part starts with a letter, digit or '_'; '.' is not in a namespace and ':'
# only in a host (its port)
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}")  # MAX_PART in all
_NAMESPACE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}")  # MAX_PART in all
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}")  # MAX_HOST in all
SERVICE_STORE = Path("/usr/share/ollama/.ollama/models")  # the Linux install's service user's home

_report: dict[str, Callable[[str], None]] = {"warn": lambda s: None}
_warned: set[str] = set()


def warn_with(warn: Callable[[str], None]) -> None:
    """Where a params layer's settings that localgen has no knob for, and LM Studio settings that are not JSON, are
    said (each once, from now): the CLI's warnings."""
    _report["warn"] = warn
    _warned.clear()


def warn_once(text: str) -> None:
    """A warning about what a store holds, said once a process (LM Studio's store says its own here too)."""
    if text not in _warned:
        _warned.add(text)
        _report["warn"](text)


@dataclass(frozen=True)
class OllamaName:
    """A model name as Ollama reads it: [HOST/][NAMESPACE/]MODEL[:TAG], each part filled with Ollama's default."""

    host: str
    namespace: str
    model: str
    tag: str

    @property
    def display(self) -> str:
        """The name as localgen shows it: ollama: and Ollama's shortest form, with its tag (`ollama list`'s)."""
        if self.host.lower() != DEFAULT_HOST:
            head = f"{self.host}/{self.namespace}/"
        elif self.namespace.lower() != DEFAULT_NAMESPACE:
            head = f"{self.namespace}/"
        else:
            head = ""
        return f"{PREFIX}{head}{self.model}:{self.tag}"

    @property
    def ollama(self) -> str:
        """The name as the `ollama` command takes it."""
        return self.display[len(PREFIX):]

    def parts(self) -> tuple[str, str, str, str]:
        """The manifest's path below manifests/."""
        return (self.host, self.namespace, self.model, self.tag)


def parse_name(text: str) -> OllamaName:
    """The name after `ollama:` (names.parse takes the prefix off, once: `ollama:ollama:x` is Ollama's model
    ollama:x), read as Ollama's types/model/name.go reads one: the tag after the last ':' that follows the last
    '/', then MODEL, NAMESPACE and HOST from the right (a host may hold :PORT). A UsageError for a name Ollama would
    not take (a part too long, starting with anything but a letter, digit or '_', '..'), so no part of it can leave
    the store's folders."""
    rest = text
    for scheme in ("https://", "http://"):
        if rest.lower().startswith(scheme):
            rest = rest[len(scheme):]
    bad = UsageError(f"{PREFIX + text!r} is not an Ollama model name: use ollama:MODEL[:TAG], ollama:USER/MODEL[:TAG] "
                     "or ollama:HOST/NAMESPACE/MODEL[:TAG]")
    if not rest or ".." in rest:
        raise bad
    tag = DEFAULT_TAG
    if rest.rfind(":") > rest.rfind("/"):
        rest, _, tag = rest.rpartition(":")
    pieces = rest.rsplit("/", 2)
    model = pieces[-1]
    namespace = pieces[-2] if len(pieces) >= 2 else DEFAULT_NAMESPACE
    host = pieces[-3] if len(pieces) == 3 else DEFAULT_HOST
    if not (_PART.fullmatch(model) and _PART.fullmatch(tag) and _NAMESPACE.fullmatch(namespace)
            and _HOST.fullmatch(host)):
        raise bad
    return OllamaName(host, namespace, model, tag)


def roots() -> list[Path]:
    """Where Ollama's models are: Ollama's store ($OLLAMA_MODELS alone when set, as Ollama reads it, else the user's
    store and the Linux service's), then the models localgen pulled (pulled_root())."""
    env = os.environ.get("OLLAMA_MODELS")
    home = paths.user_home()  # none (HOME unset, no password entry): no user store to read
    ollama = [Path(env).expanduser()] if env else [*([home / ".ollama" / "models"] if home else []), SERVICE_STORE]
    return [*ollama, pulled_root()]


def pulled_root() -> Path:
    """The store of the models `localgen pull ollama:NAME` downloaded, in Ollama's layout; never Ollama's own."""
    return paths.data_dir() / "ollama"


def is_pulled(m: Manifest) -> bool:
    """Whether a manifest is one localgen pulled (rather than Ollama's)."""
    return m.path.is_relative_to(pulled_root())


def in_ollamas_store(name: OllamaName) -> bool:
    """Whether Ollama's own store holds the model (Ollama updates it); False for one only localgen pulled, or none."""
    try:
        return not is_pulled(manifest(name))
    except ModelNotFoundError:
        return False


def _refetch(m: Manifest) -> str:
    """How to fetch a damaged model again: Ollama's pull for Ollama's store, localgen's for its own."""
    return f"`localgen pull {m.name.display}` fetches it again" if is_pulled(m) else (
        f"`ollama pull {m.name.ollama}` fetches it again")


def _store(m: Manifest) -> str:
    return "localgen's pulled models" if is_pulled(m) else "Ollama's store"


@dataclass(frozen=True)
class Layer:
    """One layer of a manifest: what it is, its blob and the size the manifest gives."""

    media: str  # after application/vnd.ollama.image.: model, projector, params, system, template, adapter, ...
    blob: Path
    size: int
    digest: str


@dataclass(frozen=True)
class Manifest:
    """A model's manifest, read and checked: its file and its layers in order."""

    name: OllamaName
    path: Path
    layers: tuple[Layer, ...] = field(default=())

    def of(self, media: str) -> list[Layer]:
        """The layers of one kind."""
        return [x for x in self.layers if x.media == media]


def find_manifest(root: Path, name: OllamaName) -> Path | None:
    """The manifest file for a name below root/manifests, its parts matched without regard to case, as Ollama's
    names compare."""
    here = root / "manifests"
    for part in name.parts():
        exact = here / part
        if exact.exists():
            here = exact
            continue
        try:
            here = next(p for p in here.iterdir() if p.name.lower() == part.lower())
        except (OSError, StopIteration):
            return None
    return here if here.is_file() else None


def manifest(name: OllamaName) -> Manifest:
    """The name's manifest from the first store that has it; a ModelNotFoundError naming where it looked."""
    places = roots()
    for root in places:
        try:
            path = find_manifest(root, name)
        except OSError as e:  # the service's store, unreadable to this user
            raise LocalgenError(f"cannot read Ollama's store {root}: {e.strerror or e}") from None
        if path is not None:  # named as the store spells it (`list`'s name)
            return read_manifest(OllamaName(*path.relative_to(root / "manifests").parts), root, path)
    looked = " or ".join(str(r / "manifests" / "/".join(name.parts())) for r in places if _is_dir(r)) or (
        " or ".join(str(r) for r in places) + " (no such folder)")
    raise ModelNotFoundError(f"no Ollama model {name.ollama}: no manifest at {looked}",
                             hint=f"`localgen pull {name.display}` downloads it from {name.host}; `ollama list` "
                                  "shows Ollama's models, OLLAMA_MODELS names another store")


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a folder this user may not read (the Linux service's store): not one to look in
        return False


def read_manifest(name: OllamaName, root: Path, path: Path) -> Manifest:
    """A manifest's layers, each with its blob's path; a LocalgenError naming the file when it is not one."""
    def damaged(why: str) -> LocalgenError:
        return LocalgenError(f"Ollama's manifest {path} is damaged: {why}", hint=_refetch(Manifest(name, path)))

    doc = _json(path, damaged)
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
        raise damaged("it has no list of layers")
    layers = []
    for raw in doc["layers"]:
        if not isinstance(raw, dict) or not isinstance(raw.get("mediaType"), str):
            raise damaged("a layer without a mediaType")
        digest, size = raw.get("digest"), raw.get("size")
        m = DIGEST.fullmatch(digest) if isinstance(digest, str) else None
        if m is None:
            raise damaged(f"a layer's digest is not sha256:HEX: {str(digest)[:80]!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise damaged(f"a layer's size is not a byte count: {str(size)[:40]!r}")
        media = raw["mediaType"].removeprefix(MEDIA) if raw["mediaType"].startswith(MEDIA) else raw["mediaType"]
        layers.append(Layer(media, root / "blobs" / f"sha256-{m.group(1).lower()}", size, f"sha256:{m.group(1)}"))
    return Manifest(name, path, tuple(layers))


def _json(path: Path, damaged: Callable[[str], LocalgenError]) -> Any:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON + 1)
    except OSError as e:
        raise LocalgenError(f"cannot read {path}: {e.strerror or e}") from None
    if len(raw) > MAX_JSON:
        raise damaged(f"it is over {MAX_JSON:,} bytes")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise damaged("it is not JSON") from None


def checked_blob(m: Manifest, layer: Layer) -> Path:
    """A layer's blob, there and of the manifest's size (its SHA-256 Ollama checked when it pulled it; hashing
    gigabytes at each use would not do)."""
    try:
        size = layer.blob.stat().st_size
    except OSError:
        raise LocalgenError(f"the {layer.media} layer of {m.name.display} is missing from {_store(m)} "
                            f"({layer.blob})", hint=_refetch(m)) from None
    if not layer.blob.is_file():
        raise LocalgenError(f"the {layer.media} layer of {m.name.display} is damaged: {layer.blob} is not a file",
                            hint=_refetch(m))
    if size != layer.size:
        raise LocalgenError(f"the {layer.media} layer of {m.name.display} is damaged: {layer.blob} holds "
                            f"{size:,} bytes, its manifest says {layer.size:,}", hint=_refetch(m))
    return layer.blob


def model_layer(m: Manifest) -> Layer:
    """The GGUF layer (the last, where a manifest has two: Ollama's server/images.go GetModel keeps the last); a
    LocalgenError for a manifest without one (a model Ollama runs another way)."""
    found = m.of("model")
    if not found:
        raise LocalgenError(f"{m.name.display} has no GGUF model layer in its manifest ({m.path}): "
                            "localgen cannot run it")
    return found[-1]


@dataclass
class Parts:
    """What a manifest's layers give a model, each read and checked."""

    blob: Path
    layer: Layer
    projector: Path | None
    adapters: tuple[tuple[str, float], ...]
    sampling: dict[str, Any]
    load: dict[str, Any]
    context: int | None
    system: str | None
    messages: tuple[dict[str, str], ...]


def read_parts(m: Manifest, warn: bool = True) -> Parts:
    """A manifest's layers read: its GGUF, projector, adapters, params, system prompt and messages; a LocalgenError
    naming the first damaged one. `warn`: say each params setting left out (run and show do; a listing does not)."""
    layer = model_layer(m)
    blob = checked_blob(m, layer)
    proj = [checked_blob(m, x) for x in m.of("projector")[:1]]
    adapters = tuple((str(checked_blob(m, x)), 1.0) for x in m.of("adapter"))
    sampling: dict[str, Any] = {}
    load: dict[str, Any] = {}
    context = None
    for x in m.of("params"):
        context = _params(m, x, sampling, load, context, warn)
    system = None
    for x in m.of("system"):
        system = _text(m, x)
    messages: tuple[dict[str, str], ...] = ()
    for x in m.of("messages"):
        messages = _messages(m, x)
    return Parts(blob, layer, proj[0] if proj else None, adapters, sampling, load, context, system or None, messages)


def resolve(text: str) -> ModelRef:
    """An Ollama model (the name after `ollama:`) as a ModelRef: its GGUF blob, projector, settings, system prompt,
    messages and adapter."""
    from localgen.models.gguf_meta import read_summary

    m = manifest(parse_name(text))
    p = read_parts(m)
    try:
        summary = read_summary(str(p.blob))
    except ModelFormatError as e:  # damaged, or a GGUF of Ollama's own conversion llama.cpp cannot read
        raise ModelFormatError(f"{m.name.display}: its model blob is not a GGUF llama.cpp can load: {e.message}",
                               hint=refused_hint(m.name.display, is_pulled(m))) from None
    if (p.system or p.messages) and not summary.chat_template:
        what = " and ".join(x for x, on in (("system prompt", p.system), ("messages", p.messages)) if on)
        warn_once(f"{m.name.display}: Ollama's {what} are not used: the model has no chat template, so prompts go "
                   "to it as plain completions")
    return ModelRef(name=m.name.display, path=str(p.blob), source="ollama", summary=summary,
                    sha256=p.layer.digest.split(":", 1)[1].lower(), sampling_defaults=p.sampling,
                    mmproj=str(p.projector) if p.projector else None, system=p.system, messages=p.messages,
                    context=p.context, adapters=p.adapters, load=p.load)


def refused_hint(name: str, pulled: bool = False) -> str:
    """What to do about an Ollama model's GGUF that llama.cpp refuses (damaged, or Ollama's own conversion); `name`
    as localgen shows it (ollama:...), or a preset's; `pulled`: one localgen pulled (its pull fetches it again)."""
    try:
        parsed = parse_name(name.partition(':')[2])
        how = f"localgen pull {parsed.display}" if pulled else f"ollama pull {parsed.ollama}"
        pull = f"`{how}` fetches it again if it is damaged; "
    except UsageError:  # a preset of the model
        pull = ""
    return (f"{pull}some of Ollama's library models are Ollama's own conversion, which llama.cpp cannot load: run "
            "the same model's GGUF from Hugging Face (localgen run -m OWNER/REPO)")


def _params(m: Manifest, layer: Layer, sampling: dict[str, Any], load: dict[str, Any], ctx: int | None,
            warn: bool = True) -> int | None:
    """A params layer's settings into `sampling` and `load` (by Ollama's names: settings.py's spellings); returns
    the context (num_ctx). A setting localgen has no knob for, or a value it would refuse, is said once and left
    out: the model works without it."""
    blob = checked_blob(m, layer)
    doc = _json(blob, lambda why: _damaged(m, layer, why))
    if not isinstance(doc, dict):
        raise _damaged(m, layer, "not a JSON object")
    ollama = settings.spellings("ollama")
    said = warn_once if warn else (lambda text: None)
    for key, value in doc.items():
        name = str(key).lower()
        try:
            if name == "num_ctx":
                ctx = _context(value)
            elif name in ollama:
                sampling[ollama[name]] = settings.check(ollama[name], value, name)
            elif (knob := loadsettings.load_name(name)) is not None and knob not in loadsettings.NOT_IN_MODELFILE:
                if name in loadsettings.INVERTED and isinstance(value, bool):
                    value = not value
                load[knob] = loadsettings.check_load(knob, tuple(value) if isinstance(value, list) else value)
            else:
                said(f"{m.name.display}: Ollama's parameter {key!r} has no localgen setting; it is left out")
        except UsageError as e:
            said(f"{m.name.display}: Ollama's parameter {key!r} is left out: {e.message}")
    return ctx


def _damaged(m: Manifest, layer: Layer, why: str) -> LocalgenError:
    return LocalgenError(f"the {layer.media} layer of {m.name.display} ({layer.blob}) is damaged: {why}",
                         hint=_refetch(m))


def _context(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (value != TRAINED_CTX and value < MIN_CTX_FLAG) or (
            value > settings.INT32):
        raise UsageError(f"num_ctx must be 0 or within {MIN_CTX_FLAG} to {settings.INT32:,}, not "
                         f"{settings.shown_value(value)}")
    return value


def _text(m: Manifest, layer: Layer) -> str:
    blob = checked_blob(m, layer)
    if layer.size > MAX_TEXT:
        raise LocalgenError(f"the {layer.media} layer of {m.name.display} is over {MAX_TEXT:,} bytes ({blob})")
    try:
        return blob.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LocalgenError(f"cannot read the {layer.media} layer of {m.name.display} ({blob}): {e}") from None


def _messages(m: Manifest, layer: Layer) -> tuple[dict[str, str], ...]:
    blob = checked_blob(m, layer)
    doc = _json(blob, lambda why: _damaged(m, layer, why))
    if not isinstance(doc, list) or not all(isinstance(x, dict) and isinstance(x.get("role"), str) and isinstance(
            x.get("content"), str) for x in doc):
        raise _damaged(m, layer, "not a list of messages")
    return tuple({"role": x["role"], "content": x["content"]} for x in doc)


def manifest_digest(name: str) -> str | None:
    """The digest Ollama gives a model in its listings (`ollama list`'s ID, /api/tags' `digest`): the SHA-256 of its
    manifest file's bytes (Ollama's ParseNamedManifest), not of the model's blob. `name` as localgen shows it
    (ollama:...); None where the manifest cannot be found or read (a listing shows what it can)."""
    import hashlib

    try:
        path = manifest(parse_name(name.removeprefix(PREFIX))).path
        with open(path, "rb") as f:
            return hashlib.sha256(f.read(MAX_JSON + 1)).hexdigest()
    except (LocalgenError, OSError):
        return None


def all_manifests() -> Iterator[Manifest]:
    """Every readable manifest of every store, each name once (the first store's); one that is not JSON is left
    for `show` and `run` to name."""
    seen: set[str] = set()
    for root in roots():
        top = root / "manifests"
        if not _is_dir(top):
            continue
        try:
            found = sorted(top.glob("*/*/*/*"))
        except OSError:
            continue
        for path in found:
            rel = path.relative_to(top).parts
            try:
                name = parse_name("/".join(rel[:3]) + ":" + rel[3])  # a host's :PORT: before the last '/'
            except UsageError:
                continue
            try:
                if name.display.lower() in seen or not path.is_file():
                    continue
                m = read_manifest(name, root, path)
            except LocalgenError:
                continue
            seen.add(name.display.lower())
            yield m


def refuse_removal(text: str) -> UsageError:
    """`rm`'s answer for an Ollama model (the name after `ollama:`): Ollama owns its store. A ModelNotFoundError
    where Ollama has no such model."""
    name = manifest(parse_name(text)).name
    return UsageError(f"{name.display} is Ollama's model: remove it with `ollama rm {name.ollama}`",
                      hint="localgen never changes Ollama's store")
