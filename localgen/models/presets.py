"""Presets: a name for a model with settings layered on it, made from a Modelfile (`localgen create`) and
kept as one small JSON file each in the data dir. A preset's name works wherever a model name does: it
resolves to its base model with the preset's sampling defaults, system prompt, messages, context size, load
settings (n_cpu_moe, override_tensor, num_gpu, ...) and chat template, and its LoRA adapters. A preset never
owns model files (an adapter stays where ADAPTER named it), so removing one removes only the preset. As in
Ollama, NAME and NAME:latest are one preset, kept and listed as NAME (the name serve's clients send either way:
serve takes NAME:latest for a listed NAME)."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localgen import loadsettings, paths, settings
from localgen.errors import LocalgenError, ModelNotFoundError, NotDownloadedError, UsageError
from localgen.models import modelfile
from localgen.regular import Unreadable, read_regular
from localgen.text import Utf16File, config_text, mended
from localgen.types import ModelRef

# matched whole (fullmatch): `$` would also match before a final newline, and "bot\n" would be a file name
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}(:[A-Za-z0-9][A-Za-z0-9._-]{0,39})?")
FORMAT = 1
LATEST = ":latest"  # Ollama's tag for a name given without one
# the most of a preset file read: `create` (and /api/create) makes one from a Modelfile of at most
# modelfile.MAX_MODELFILE bytes, at most 3 bytes in JSON's escapes a byte (a 4-byte character is two \\u escapes,
# 12 bytes; paths made absolute and a parent's settings add more): what holds it is that save() writes none larger
MAX_FILE = 16 * modelfile.MAX_MODELFILE


class PresetExists(UsageError):
    """A preset of that name exists, and replacing it was not asked for."""


class PresetCycle(LocalgenError):
    """A preset whose base is, through other presets or none, itself (a file written so, or by an older version)."""

    def __init__(self, chain: list[str]) -> None:
        name = chain[0]
        super().__init__(f"the preset {name} is based on itself ({' → '.join([*chain, name])})",
                         hint=f"create it again FROM a model, or remove it with localgen rm {name}")


def cycle(name: str, base: str) -> list[str] | None:
    """The presets, from `name`, a preset `name` with base `base` would be based on in a ring back to itself (a
    preset's base is another preset's name where that model was removed and the name taken: rm NAME:q8_0, then
    create NAME:q8_0 FROM NAME); None when the bases end at a model."""
    chain = [canonical(name)]
    while (p := meant(base)) is not None:
        if p.name in chain:
            return chain[chain.index(p.name):]
        chain.append(p.name)
        base = p.base
    return None


@dataclass(frozen=True)
class Preset:
    """A named base model and the settings its Modelfile gave."""

    name: str
    spec: modelfile.Modelfile

    @property
    def base(self) -> str:
        """The base model's name (a catalogue name, a Hub repo or an absolute path)."""
        return self.spec.base


def presets_dir() -> Path:
    """One JSON file per preset."""
    return paths.data_dir() / "presets"


def _name_problem(name: str) -> str:
    """What of NAME's rule a name breaks, in words: the first character it does not allow, where that is it."""
    allowed = "ASCII letters (a-z, A-Z), digits, '.', '_' and '-'"
    base, colon, tag = name.partition(":")
    odd = next((c for c in name if not (c.isascii() and (c.isalnum() or c in "._-:"))), None)
    if odd is not None:
        code = ord(odd)  # a byte that was not UTF-8 (a Latin-1 terminal's é), kept in argv by surrogateescape
        shown = f"byte 0x{code - 0xDC00:02x}, not UTF-8," if 0xDC80 <= code <= 0xDCFF else repr(odd)
        return f"{shown} is not allowed: a name takes {allowed}, and one optional ':tag'"
    if ":" in tag:
        return "one ':tag' at most"
    for part, what, most in ((base, "the name", 80), (tag, "the tag", 40)):
        if (part and not part[0].isalnum()) or (not part and (what == "the name" or colon)):
            return f"{what} must start with a letter or a digit"
        if len(part) > most:
            return f"{what} is {len(part)} characters, more than {most}"
    return f"use {allowed}, and one optional ':tag'"


def check_name(name: str) -> str:
    """A preset name: letters, digits, `.`, `_`, `-`, and one optional `:tag`, as Ollama's names."""
    if not NAME.fullmatch(name):  # (a byte that was not UTF-8 shown as U+FFFD, not as '\udce8')
        raise UsageError(f"bad preset name {mended(name)!r}: {_name_problem(name)}", hint="e.g. mybot or mybot:short")
    if name.lower().endswith(".gguf"):  # models/names.py reads such a name as a file's path
        raise UsageError(f"bad preset name {name!r}: a name ending in .gguf means a file", hint="e.g. mybot")
    store = name.partition(":")[0]
    if store.lower() in ("ollama", "lmstudio", "oci"):  # models/names.py's STORES: the prefix says where a model is
        where = "an OCI registry" if store.lower() == "oci" else "another tool's store"
        raise UsageError(f"bad preset name {name!r}: {store}: names a model of {where}", hint="e.g. mybot")
    return name


def canonical(name: str) -> str:
    """The name a preset is kept under: NAME for Ollama's NAME:latest (the tag in any case), else the name."""
    return name[:-len(LATEST)] if name.lower().endswith(LATEST) and len(name) > len(LATEST) else name


def _file(name: str) -> Path:
    # '@' is never in a name; ':' is not in a Windows path
    return presets_dir() / f"{canonical(name).replace(':', '@')}.json"


def _files(name: str) -> list[Path]:
    """The files a preset of that name may be in: its own, then (for an untagged name) NAME@latest.json, where a
    preset made as NAME:latest was kept before the two names were one."""
    key = canonical(name)
    if ":" in key:
        return [_file(key)]
    d = presets_dir()
    tagged = sorted(d.glob(f"{glob.escape(key)}@*.json")) if d.is_dir() else []
    return [_file(key), *(f for f in tagged if f.stem[len(key) + 1:].lower() == LATEST[1:])]


def _apart(name: str) -> list[Path]:
    """The files that hold the preset `name` where there are two: NAME.json and NAME@latest.json, which an older
    localgen kept as two presets (before 11-29); else []."""
    held = [f for f in _files(name) if f.exists()]
    return held if len(held) > 1 else []


def check_one_file(name: str) -> None:
    """An error naming both files where an older localgen kept NAME and NAME:latest apart: replacing or removing
    the one preset would destroy the other's settings unawares."""
    held = _apart(name)
    if held:
        key = canonical(name)
        raise LocalgenError(f"the preset {key} is in two files, {held[0]} and {held[1]} (an older localgen kept "
                            f"{key} and {key}:latest apart)",
                            hint=f"move the one to keep out of {held[0].parent}, then run this again")


def find(name: str) -> Preset | None:
    """The preset of that name (NAME and NAME:latest alike), or None; a file that is not a valid preset is an
    error naming it. Where an older localgen kept NAME and NAME:latest in two files, NAME's is used, and a
    warning (warn_with's, once) names both."""
    if not NAME.fullmatch(name):
        return None
    held = _apart(name)
    if held:
        key = canonical(name)
        _say(f"the preset {key} is in two files, {held[0]} and {held[1]} (an older localgen kept {key} and "
             f"{key}:latest apart): {held[0].name} is used; move the other out of {held[0].parent} to keep it")
    for path in _files(name):
        try:
            raw = read_regular(path, MAX_FILE, whole=True, what="a preset")
        except FileNotFoundError:
            continue
        except Unreadable as e:  # a FIFO or a device there is never opened
            raise LocalgenError(f"cannot read the preset {path}: {e}") from None
        except OSError as e:
            from localgen.paths import os_reason

            raise LocalgenError(f"cannot read the preset {path}: {os_reason(e)}") from None
        try:
            return _from_json(canonical(name), _document(raw, path))
        except Utf16File:  # a hand edit saved as Notepad's "Unicode": not damage, and the one line says what to do
            raise
        except (ValueError, TypeError, KeyError, AttributeError, UsageError) as e:
            why = e.message if isinstance(e, UsageError) else str(e)
            raise LocalgenError(f"the preset file {path} is damaged: {why}",
                                hint=f"create it again, or remove it with localgen rm {name}") from None
    return None


def meant(name: str) -> Preset | None:
    """The preset a model's name means, as models/resolve.py reads it: none where a catalogue entry of that name
    wins (a preset file of a catalogue model's name, written by hand or before create refused such a name)."""
    from localgen.models import catalogue

    if NAME.fullmatch(name):
        cat = catalogue.read(using=name)
        if name in cat.entries or name in cat.broken:
            return None
    return find(name)


def _document(raw: bytes, path: Path) -> dict[str, Any]:
    """A preset file's JSON object; a ValueError in words (empty, not UTF-8, not JSON, not an object), Utf16File
    naming `path` where it is UTF-16 text."""
    if not raw.strip():
        raise ValueError("it is empty")
    try:
        doc = json.loads(config_text(raw, path, "JSON"))
    except UnicodeDecodeError as e:
        at = e.start + len(raw) - len(e.object)  # the file's offset: the codec counts after a byte order mark
        raise ValueError(f"byte 0x{raw[at]:02x} at offset {at:,} is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"it is not JSON ({e.msg}: line {e.lineno}, column {e.colno})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"it holds a JSON {type(doc).__name__.replace('dict', 'object')}, not a preset's object")
    return doc


_report: dict[str, Callable[[str], None]] = {"warn": lambda s: None}
_said: set[str] = set()


def warn_with(warn: Callable[[str], None]) -> None:
    """Where all_presets() says which preset files it leaves out (damaged), each once from now (a server lists
    them on every request): the CLI's warnings."""
    _report["warn"] = warn
    _said.clear()


def left_out(e: LocalgenError) -> None:
    """Say (each once, warn_with's) that a listing leaves out a preset, and why: damaged, or based on itself."""
    _say(f"{e.message} (left out{f'; {e.hint}' if e.hint else ''})")


def _say(said: str) -> None:
    if said not in _said:
        _said.add(said)
        _report["warn"](said)


def all_presets() -> list[Preset]:
    """Every readable preset, by name, once; a damaged file is left out with a warning naming it (warn_with),
    and `show` and `rm` name it too."""
    found: dict[str, Preset] = {}
    d = presets_dir()
    for path in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            p = find(path.stem.replace("@", ":"))
        except LocalgenError as e:
            left_out(e)
            continue
        if p is not None:
            found.setdefault(p.name, p)
    return list(found.values())


def _to_json(p: Preset) -> dict[str, Any]:
    s = p.spec
    return {"format": FORMAT, "name": p.name, "base": s.base,
            "parameters": {k: settings.jsonable(v) for k, v in s.parameters.items()},
            "context": s.context, "system": s.system, "template": s.template, "messages": list(s.messages),
            "adapters": list(s.adapters), "load": {k: settings.jsonable(v) for k, v in s.load.items()}}


def _from_json(name: str, d: dict[str, Any]) -> Preset:
    """Read back through the Modelfile parser's checks, so a hand-edited file is held to the same rules."""
    kept = d.get("name")
    if d.get("format") != FORMAT or not isinstance(kept, str) or canonical(kept) != name:
        raise ValueError("not a localgen preset of this version")
    _check_shape(d)
    params = {k: tuple(tuple(x) for x in v) if k == "logit_bias" else v
              for k, v in (d.get("parameters") or {}).items()}
    spec = modelfile.Modelfile(base=d["base"], parameters=settings.validate(params), context=d.get("context"),
                               system=d.get("system"), template=d.get("template"),
                               messages=tuple({"role": str(m["role"]), "content": str(m["content"])}
                                              for m in d.get("messages") or ()),
                               adapters=tuple(str(a) for a in d.get("adapters") or ()),
                               load={k: loadsettings.check_load(k, tuple(v) if isinstance(v, list) else v,
                                                                f"PARAMETER {loadsettings.modelfile_name(k)}")
                                     for k, v in (d.get("load") or {}).items()})
    modelfile.parse(modelfile.write(spec))  # every value as create checks it
    return Preset(name, spec)


def _check_shape(d: dict[str, Any]) -> None:
    """Each field of a hand-edited preset of the type it must have, said in words (a `messages` string leaked
    Python's "string indices must be integers")."""
    if not isinstance(d.get("base"), str) or not d["base"]:
        raise ValueError("its base must be a model's name")
    for key in ("parameters", "load"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise ValueError(f"its {key} must be an object")
    messages, adapters = d.get("messages") or [], d.get("adapters") or []
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise ValueError('its messages must be a list of {"role": ..., "content": ...} objects')
    if not isinstance(adapters, list) or not all(isinstance(a, str) for a in adapters):
        raise ValueError("its adapters must be a list of file paths")


def save(p: Preset, replace: bool) -> None:
    """Write a preset; a PresetExists (a UsageError) when one of that name exists and `replace` is not given.
    Written whole to a temporary file, then put in place in one step: a reader sees the old preset or the new
    one, never half of one. Without `replace` that step is a hard link, which fails when the name exists, so of
    saves racing for one name (two /api/create, or one beside `localgen create`) exactly one succeeds. A write
    that fails (a full or read-only disk) is an error naming the preset's file."""
    path = _file(p.name)
    try:
        _write(p, replace, path)
    except OSError as e:
        raise LocalgenError(f"cannot write the preset {path}: {paths.os_cause(e)}") from None


def check_writable(name: str) -> None:
    """The error save() would give for a presets folder it cannot write in (read-only, not a folder), asked before
    work that comes first (create -q's quantization)."""
    path = _file(name)
    try:
        paths.make_dirs(path.parent)
        with tempfile.NamedTemporaryFile(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent):
            pass
    except OSError as e:
        raise LocalgenError(f"cannot write the preset {path}: {paths.os_cause(e)}") from None


def _write(p: Preset, replace: bool, path: Path) -> None:
    paths.make_dirs(path.parent)
    exists = _exists(p.name)
    if not replace and any(f.exists() for f in _files(p.name)):
        raise exists
    if replace:
        check_one_file(p.name)
    text = json.dumps(_to_json(p), indent=2) + "\n"
    if len(text) > MAX_FILE:  # ASCII (JSON's escapes): a character is a byte
        raise UsageError(f"the preset {p.name} would be {len(text):,} bytes, more than the "
                         f"{MAX_FILE >> 20} MiB a preset is read to")
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # one per writer
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if replace:
            os.replace(tmp, path)
            for old in _files(p.name)[1:]:  # NAME:latest kept apart before (alone: check_one_file): replaced
                with contextlib.suppress(OSError):
                    old.unlink()
            return
        try:
            os.link(tmp, path)  # atomic, and refused when the name exists: the check and the write are one
        except FileExistsError:
            raise exists from None
        except OSError:  # a file system without hard links: an exclusive create (O_EXCL), written in place
            try:
                with open(path, "x", encoding="utf-8") as f:
                    f.write(text)
            except FileExistsError:
                raise exists from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _check_new_name(name: str, using: str) -> None:
    """`using`: the model the preset is made from (NAME[@QUANT]), whose bad user catalogue entry is then its error
    alone, not a warning too."""
    from localgen.models import catalogue, quantized

    check_name(name)
    cat = catalogue.read(using=using.partition("@")[0])
    # every spelling `show NAME` (models/resolve.py's _latest) would look up, NAME and NAME:latest alike
    key = canonical(name)
    spellings = list(dict.fromkeys((name, key, f"{key}{LATEST}")))
    for held in spellings:
        if held in cat.entries or held in cat.broken:
            whose = (f"a catalogue model's name{f' ({held})' if held != name else ''}"
                     if held in catalogue.shipped_names() else
                     f"the name of your catalogue entry {held} ({catalogue.user_file()})")
            raise UsageError(f"{name!r} is {whose}; a preset needs a name of its own")
    for held in spellings:
        path = quantized.find(held)
        if path is not None:
            raise UsageError(f"{name!r} is the name of the quantized model {held} ({path}); a preset needs a name "
                             "of its own")


def check_quantized_name(name: str) -> None:
    """A UsageError when the name of a model to quantize is a catalogue model's or a preset's (here, not in
    models/quantized.py, which presets.py reads: a preset never takes a quantized model's name either)."""
    from localgen.models import catalogue

    if name in catalogue.load() or exists(name):
        raise UsageError(f"{name!r} is already a catalogue model or a preset", hint="give another --name")


# The model a name means, from what is on this machine (models/resolve.py's resolve, offline, given by the
# caller: resolve() reads presets, so this module does not import it)
BaseLookup = Callable[[str], ModelRef]


def create_preset(name: str, text: str, lookup: BaseLookup, where: str = "Modelfile", force: bool = False,
                  folder: Path | None = None, known: Callable[[str], bool] | None = None) -> Preset:
    """Parse a Modelfile, check its base is on this machine (without the network) and its adapters are made for
    that base, and save it as `name` (`--force`: replacing a preset of that name). `folder`: the Modelfile's,
    where relative ADAPTER paths start; `known`: modelfile.parse's. The function `localgen create` calls."""
    preset = made(name, text, lookup, where, folder, known)
    save(preset, force)
    return preset


def made(name: str, text: str, lookup: BaseLookup, where: str = "Modelfile", folder: Path | None = None,
         known: Callable[[str], bool] | None = None) -> Preset:
    """The preset a Modelfile makes, every check done (create_preset's), not saved yet: /api/create checks all
    before it unloads a model of that name."""
    check_name(name)
    # `known` comes from the command line only: there, FROM /a/path not there is an error naming its line
    spec = modelfile.parse(text, where, folder, known, there=known is not None)
    _check_new_name(name, using=spec.base)
    named = spec.base
    spec = _on_base(spec, where, lookup, known, name)
    if spec.adapters:
        from localgen.models import lora

        ref = _found(spec.base, f"{where}: FROM {named}", lookup, None, named)
        for path in spec.adapters:
            try:
                lora.check(path, ref.summary.architecture, spec.base)
            except UsageError as e:
                raise UsageError(f"{where}: ADAPTER: {e.message}", hint=e.hint) from None
    if spec.template is not None:
        _check_template(spec.template, where)
    return Preset(canonical(name), spec)


def copy(src: str, dst: str, lookup: BaseLookup, force: bool = False) -> Preset:
    """`localgen cp`: a preset copied, or a model (any name `run` takes) given a preset name of its own."""
    preset = copied(src, dst, lookup)
    save(preset, force)
    return preset


def copied(src: str, dst: str, lookup: BaseLookup) -> Preset:
    """The preset `cp` makes, checked, not saved yet."""
    _check_new_name(dst, using=src)
    p = meant(src)
    spec = _on_base(modelfile.Modelfile(base=src), "cp", lookup, name=dst, from_line=False)
    return Preset(canonical(dst), spec if p is None else p.spec)


def _exists(name: str) -> PresetExists:
    return PresetExists(f"a preset named {name!r} exists", hint="--force replaces it; localgen rm removes it")


def refuse_existing(name: str, replace: bool) -> None:
    """A PresetExists when a preset of that name is here and `replace` is not given: what save refuses, asked
    before work that comes first (create -q's quantization); with `replace`, check_one_file's error."""
    if not replace and exists(name):
        raise _exists(name)
    if replace:
        check_one_file(name)


def stamp(name: str) -> tuple[int, ...] | None:
    """What tells a preset's file changed (a save puts a new file in place): its inode, size and modification time,
    one stat; None when there is no preset of that name."""
    if not NAME.fullmatch(name):
        return None
    paths = [_file(name)]
    for i, path in enumerate(paths):
        try:
            st = path.stat()
        except OSError:
            if i == 0:  # a preset kept apart as NAME:latest (before the two names were one)
                paths += _files(name)[1:]
            continue
        return (st.st_ino, st.st_size, st.st_mtime_ns)
    return None


def exists(name: str) -> bool:
    """Whether a preset file of that name (NAME and NAME:latest alike) is here (readable or not)."""
    return bool(NAME.fullmatch(name)) and any(f.exists() for f in _files(name))


def remove(name: str) -> bool:
    """Remove a preset's file (never a model's); False when there is no such preset. Where an older localgen
    kept NAME and NAME:latest in two files, an error naming both (check_one_file), and neither is removed."""
    if not NAME.fullmatch(name):
        return False
    check_one_file(name)
    removed = False
    for path in _files(name):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except IsADirectoryError:  # `list` leaves a folder out; an empty one goes, one holding files is the user's
            try:
                path.rmdir()
            except OSError:
                raise LocalgenError(f"{path} is a folder that holds files, not a preset: it was left as it is",
                                    hint="remove it yourself if it is not needed") from None
        removed = True
    return removed


def _on_base(spec: modelfile.Modelfile, where: str, lookup: BaseLookup,
             known: Callable[[str], bool] | None = None, name: str | None = None,
             from_line: bool = True) -> modelfile.Modelfile:
    """FROM another preset: that preset's settings under this one's. FROM a model: it must be on this machine
    (checked offline); a path is kept absolute, a name known here (`known`) as its name, whatever file of that
    name the current folder holds. Either way the model at the end of the bases must be here, and the preset
    `name` must not be among them (a preset based on itself: every use of it would fail). Errors begin with `where`
    and, `from_line`, the FROM line (cp's has none: its SOURCE is said by the error)."""
    lead = f"{where}: FROM {spec.base}" if from_line else where
    parent = meant(spec.base)
    if parent is not None:
        up = parent.spec
        merged = modelfile.Modelfile(
            base=up.base, parameters={**up.parameters, **spec.parameters},
            context=spec.context if spec.context is not None else up.context,
            system=spec.system if spec.system is not None else up.system,
            template=spec.template if spec.template is not None else up.template,
            messages=spec.messages or up.messages, adapters=(*up.adapters, *spec.adapters),
            load={**up.load, **spec.load})
        _found(merged.base, f"{where}: {'FROM ' if from_line else ''}{spec.base} (a preset of {up.base})", lookup,
               name, spec.base)
        return merged
    from localgen.models import names

    ref = _found(spec.base, lead, lookup, name)
    if ref.summary.chat_template is None and spec.template is None and (spec.system or spec.messages):
        raise UsageError(f"{where}: {spec.base} has no chat template, so SYSTEM and MESSAGE cannot apply; "
                         "give a TEMPLATE")
    named = known is not None and not names.looks_like_path(spec.base) and known(spec.base)
    if isinstance(names.parse(spec.base), names.PathSpec) and not named:
        return dataclasses.replace(spec, base=str(Path(ref.path).resolve()))
    return spec


def base_ref(base: str, what: str, lookup: BaseLookup, named: str) -> ModelRef:
    """The model at the end of a preset's bases, `base`, for a Modelfile whose FROM is `named` (looked up where
    `base` is not found so: serve's lookup never takes a path, and a preset's base may be one)."""
    return _found(base, what, lookup, None, named)


def _found(base: str, what: str, lookup: BaseLookup, name: str | None, via: str | None = None) -> ModelRef:
    """The model `base` is, on this machine (or, where it is not found so, `via`: the preset whose base it is);
    `what` begins the error when it is not here, or when the preset `name` would be among the presets it goes
    through."""
    ring = cycle(name, base) if name is not None else None
    if ring is not None:
        if ring[0] != canonical(str(name)):  # a ring already on disk, which it would go through
            e = PresetCycle(ring)
            raise LocalgenError(f"{what}: {e.message}", hint=e.hint)
        raise UsageError(f"{what}: the preset {ring[0]} would be based on itself ({' → '.join([*ring, ring[0]])})",
                         hint="name a model, or a preset of one, in FROM")
    try:
        try:
            return lookup(base)
        except (ModelNotFoundError, PresetCycle):
            if via is None:
                raise
            return lookup(via)  # serve's lookup never takes a path (a preset's base may be one): the preset's name
    except NotDownloadedError as e:  # a model pull can fetch: say the command
        raise LocalgenError(f"{what}: {e.message}", hint=f"pull it first: localgen pull {e.name}") from None
    except ModelNotFoundError as e:  # no catalogue name, no file: pull could not fetch it either
        raise LocalgenError(f"{what}: {e.message}", hint=e.hint) from None
    except PresetCycle as e:  # a ring already on disk, which `name` would go through
        raise LocalgenError(f"{what}: {e.message}", hint=e.hint) from None


def _check_template(source: str, where: str) -> None:
    """A TEMPLATE is a Jinja chat template, as in a GGUF (not Ollama's Go template): it must compile, and render a
    sample conversation as `run` renders a prompt."""
    from localgen.engine.template import ChatTemplate
    from localgen.errors import TemplateError

    if "{{ ." in source or "{{." in source:
        raise UsageError(f"{where}: TEMPLATE looks like an Ollama Go template; localgen takes a Jinja chat "
                         "template, as GGUF files carry")
    try:
        template = ChatTemplate(source, "<s>", "</s>")
    except TemplateError as e:
        raise UsageError(f"{where}: TEMPLATE does not compile: {e.message.split(': ', 1)[-1]}") from None
    # rendered once, in the sandbox and under the limits `run` renders it in: what run would refuse (an unsafe
    # attribute, no end, an absurd prompt) is refused now. A template may refuse a system message (some
    # models take none): a failure of its own is looked at again without one.
    for sample in (SAMPLE_CONVERSATION, SAMPLE_CONVERSATION[1:]):
        try:
            template.render([dict(m) for m in sample])
            return
        except TemplateError as e:
            said = e.message.removeprefix("the model's chat template ")
            if not said.startswith("failed: ") or sample is not SAMPLE_CONVERSATION:
                raise UsageError(f"{where}: TEMPLATE fails when rendered, so run would refuse it: {said}") from None


SAMPLE_CONVERSATION = ({"role": "system", "content": "You are a helpful assistant."},
                       {"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi! How can I help?"},
                       {"role": "user", "content": "Name a colour."})


def apply(p: Preset, ref: ModelRef) -> ModelRef:
    """The base model as the preset makes it: its settings over the base's sampling defaults, its template in
    place of the GGUF's."""
    s = p.spec
    summary = dataclasses.replace(ref.summary, chat_template=s.template) if s.template else ref.summary
    # a base with settings of its own (an Ollama model's params, system prompt, adapter): the preset's over them
    return dataclasses.replace(ref, name=p.name, summary=summary,
                               sampling_defaults={**ref.sampling_defaults, **s.parameters},
                               system=s.system if s.system is not None else ref.system,
                               messages=s.messages or ref.messages,
                               context=s.context if s.context is not None else ref.context,
                               adapters=(*ref.adapters, *((a, 1.0) for a in s.adapters)), load={**ref.load, **s.load})


def window_source(model: str | None, ref: ModelRef) -> str:
    """Where a model's own window (ref.context) comes from: "preset" (a preset's num_ctx), "ollama" (an Ollama
    model's params layer), or "models.toml" (the context of the user's models.toml entry for the model, or for
    a preset's base, where no preset on the way sets num_ctx: models/catalogue.py's window)."""
    found = find(model) if model is not None and exists(model) else None
    if found is not None and found.spec.context is not None:
        return "preset"
    return {"ollama": "ollama", "hf": "models.toml", "embedded": "models.toml"}.get(ref.source, "preset")


# how each source of a window is named where it is said (fit's plan line, run's warning of a cap)
WINDOW_WORDS = {"preset": "the preset's num_ctx", "ollama": "its Ollama params' num_ctx",
                "models.toml": "its models.toml context"}
