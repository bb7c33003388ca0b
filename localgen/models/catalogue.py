"""The model catalogue: models.toml shipped with localgen, plus the user's models.toml on top."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from localgen import paths, settings
from localgen.errors import LocalgenError, UsageError
from localgen.regular import Unreadable, read_regular
from localgen.text import Utf16File, config_text
from localgen.types import MIN_CTX_FLAG

SHIPPED = Path(__file__).with_name("models.toml")  # package data; the repo's top-level models.toml links here
MAX_FILE = 4 << 20  # the most of a models.toml read: the shipped one, of every model localgen names, is 9 KB


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
    window: int | None = None  # the user's own `context`: the window the model loads with where --ctx is not given


def user_file() -> Path:
    """The user's additions and overrides."""
    return paths.config_dir() / "models.toml"


@dataclass(frozen=True)
class Catalogue:
    """The entries that can be used, and what in the user's file cannot: an entry that is not right is left out
    and is an error only where it is used (`broken`, by name); a file that cannot be read leaves out all of its
    entries (`unreadable`)."""

    entries: dict[str, CatalogueEntry]
    broken: dict[str, UsageError] = field(default_factory=dict)
    unreadable: UsageError | None = None


_report: dict[str, Callable[[str], None]] = {"warn": lambda s: None}
_said: set[str] = set()


def warn_with(warn: Callable[[str], None]) -> None:
    """Where read() says what of the user's file it leaves out (each thing once, from now): the CLI's warnings."""
    _report["warn"] = warn
    _said.clear()


def _say(text: str) -> None:
    if text not in _said:
        _said.add(text)
        _report["warn"](text)


def _read(path: Path, required: bool = False) -> dict[str, Any]:
    """The [models] table of a file ({} where an optional one is missing); UsageError where it cannot be read."""
    try:  # a byte order mark an editor wrote is dropped; UTF-16 (Notepad's "Unicode") is Utf16File, a UsageError
        text = config_text(read_regular(path, MAX_FILE, whole=True, what="a catalogue"), path, "TOML")
        data = tomllib.loads(text)
    except FileNotFoundError:
        if required:
            raise LocalgenError(f"internal error: the model catalogue shipped with localgen is missing ({path})",
                                hint="reinstall localgen") from None
        return {}
    except UnicodeDecodeError:
        raise UsageError(f"the model catalogue {path} is not UTF-8 text") from None
    except (OSError, tomllib.TOMLDecodeError, Unreadable) as e:  # Unreadable: a FIFO there is never opened
        from localgen.paths import os_reason

        why = os_reason(e) if isinstance(e, OSError) else str(e)  # not "[Errno 13] ...: 'PATH'"
        raise UsageError(f"cannot read the model catalogue {path}: {why}") from None
    for key in (str(k) for k in data if k != "models"):  # a typo of [models.NAME] is never ignored in silence
        _say(f"{path}: {_shown(key)} at the top level is ignored (localgen reads only [models.NAME] tables)")
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise UsageError(f"{path}: [models] must be a table of model entries")
    return models


def _head(name: str) -> str:
    """The entry's TOML table header, as the user would write it."""
    return f"[models.{name}]" if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'[models."{name}"]'


KEYS = ("description", "repo", "embedded", "default_quant", "context", "files", "sampling")  # an entry's


def _unknown_keys(source: Path, name: str, raw: dict[str, Any]) -> None:
    """Say each key of an entry that localgen does not read (a typo would otherwise be ignored in silence), with
    the key it most likely means."""
    import difflib

    for key in (str(k) for k in raw):
        if key in KEYS:
            continue
        if settings.field_name(key) is not None:
            guess = f"a sampling setting goes under {_head(name)[:-1]}.sampling]"
        else:
            close = [k for k in KEYS if len(key) > 2 and key.lower() in k] or \
                difflib.get_close_matches(key.lower(), KEYS, n=1, cutoff=0.6)
            guess = f"did you mean {close[0]}?" if close else f"an entry's keys are {', '.join(KEYS)}"
        _say(f"{source}: {_head(name)} has an unknown key {_shown(key)}, which is ignored ({guess})")


def _shown(value: Any) -> str:
    """A value of the TOML file as TOML writes it where Python's repr differs (true, not True)."""
    text = ("true" if value else "false") if isinstance(value, bool) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _entry(name: str, raw: Any, source: Path) -> CatalogueEntry:
    """One entry, each field checked for its type; UsageError naming the file, the entry and the field."""
    from localgen.models.embedded import EMBEDDED

    where = f"{source}: {_head(name)}"
    if not isinstance(raw, dict):
        raise UsageError(f"{where} must be a table")
    _unknown_keys(source, name, raw)  # said first: a typo is said beside a field's error, not after it is fixed

    def field_of(key: str, kind: type | tuple[type, ...], what: str, default: Any = None) -> Any:
        value = raw.get(key, default)
        if value is not default and (not isinstance(value, kind) or isinstance(value, bool) != (kind is bool)):
            raise UsageError(f"{where} {key} must be {what}, not {_shown(value)}")
        return value

    description = field_of("description", str, "a string", "")
    repo = field_of("repo", str, 'a Hugging Face repo, e.g. "owner/Name-GGUF"')
    embedded = field_of("embedded", bool, "true or false", False)
    default_quant = field_of("default_quant", str, 'a quantization, e.g. "Q4_K_M"', "Q4_K_M")
    context = field_of("context", int, "a whole number of tokens")
    files = field_of("files", dict, 'a table of quantization = "file name.gguf"', {})
    sampling = field_of("sampling", dict, "a table", {})
    if repo is not None and not repo.strip():
        raise UsageError(f"{where} repo is empty")
    if not default_quant.strip():
        raise UsageError(f"{where} default_quant is empty")
    if context is not None and not MIN_CTX_FLAG <= context <= settings.INT32:  # as a Modelfile's num_ctx
        raise UsageError(f"{where} context must be a whole number of tokens within {MIN_CTX_FLAG} to "
                         f"{settings.INT32:,}, not {_shown(context)}")
    for quant, file in files.items():
        if not isinstance(file, str) or not file.strip():
            raise UsageError(f"{where} files.{quant} must be a file name, not {_shown(file)}")
    if embedded and name not in EMBEDDED:
        raise UsageError(f"{where} embedded = true is only for the models that ship inside packages "
                         f"({', '.join(EMBEDDED)})")
    try:
        sampling = settings.validate(sampling)
    except UsageError as e:
        raise UsageError(f"{where} sampling: {e.message}") from None
    if not embedded and not repo:
        raise UsageError(f"{where} needs a repo")
    return CatalogueEntry(
        name=name, description=description, repo=repo, embedded=embedded, default_quant=default_quant,
        context=context, files={q.upper(): f for q, f in files.items()}, sampling=dict(sampling),
    )


def _over(shipped: Any, mine: Any) -> Any:
    """A user's entry laid over the shipped entry of its name, field by field (`sampling` and `files` key by
    key), so `context = 2048` alone changes the window and keeps the rest. A `repo` of the user's is another
    model: the shipped entry's files, and its `embedded` (which means its own repo), are not kept then."""
    if not isinstance(shipped, dict) or not isinstance(mine, dict):
        return mine
    base = dict(shipped)
    if "repo" in mine:
        base.pop("files", None)
        base.pop("embedded", None)
    merged = {**base, **mine}
    for key in ("sampling", "files"):
        if isinstance(base.get(key), dict) and isinstance(mine.get(key), dict):
            merged[key] = {**base[key], **mine[key]}
    return merged


def read(using: str | None = None, quiet: bool = False) -> Catalogue:
    """The shipped catalogue with the user's file on top (a user's entry of a shipped name laid over it: _over).
    What of the user's file cannot be used is said through warn_with()'s warning, once, and left out: the rest
    works. `using`: the name the caller is about to use, whose fault is its error rather than a warning. `quiet`:
    nothing said (a look that uses no model: what is then used says it)."""
    say = (lambda text: None) if quiet else _say
    shipped = _read(SHIPPED, required=True)
    entries = {name: _entry(name, raw, SHIPPED) for name, raw in shipped.items()}
    path = user_file()
    try:
        mine = _read(path)
    except Utf16File as e:  # an error where it declares the name about to be used (read as UTF-16), else a warning
        if using is not None and _declares(e.text, using):
            raise
        say(f"{e.message} (save it as UTF-8): its models are not used")
        return Catalogue(entries, unreadable=e)
    except UsageError as e:
        say(f"{e.message}: its models are not used")
        return Catalogue(entries, unreadable=e)
    broken: dict[str, UsageError] = {}
    for name, raw in mine.items():
        try:
            entry = _entry(name, _over(shipped.get(name), raw), path)
            # (a shipped entry's context is the length its authors give; one of the user's is the window wanted)
            entries[name] = replace(entry, window=entry.context) if isinstance(raw, dict) and "context" in raw \
                else entry
        except UsageError as e:
            entries.pop(name, None)
            broken[name] = e
            if name != using:
                say(f"{e.message} ({name} cannot be used until this is fixed)")
    return Catalogue(entries, broken)


def _declares(text: str, name: str) -> bool:
    """Whether a catalogue's text (one that could not be read as UTF-8) has an entry `name`: its [models] table's
    key, or, where the text is not TOML either, a [models.NAME] header that appears to be one."""
    try:
        models = tomllib.loads(text).get("models")
        return isinstance(models, dict) and name in models
    except tomllib.TOMLDecodeError:
        key = f"[\"']?{re.escape(name)}[\"']?"
        return re.search(rf"^\s*\[\s*models\s*\.\s*{key}\s*[].]", text, re.MULTILINE) is not None


def shipped_names() -> set[str]:
    """The names of the catalogue shipped with localgen (the user's file may lay entries over them)."""
    return set(_read(SHIPPED, required=True))


def load() -> dict[str, CatalogueEntry]:
    """All entries that can be used, by name (see read())."""
    return read().entries


def for_name(name: str) -> Catalogue:
    """The catalogue read for using `name`: the error of the user's entry `name` where it cannot be used (a name
    nothing defines is not checked), else every entry that can."""
    cat = read(using=name)
    if name in cat.broken:
        raise cat.broken[name]
    return cat
