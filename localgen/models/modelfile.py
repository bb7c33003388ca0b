"""The subset of Ollama's Modelfile that localgen reads and writes: FROM, PARAMETER, SYSTEM, TEMPLATE,
MESSAGE and ADAPTER (a LoRA adapter GGUF, by path: relative to the Modelfile's folder, absolute where the text
has no folder, as over HTTP). A relative FROM path starts at the Modelfile's folder too, as Ollama's.

Syntax as Ollama's: one instruction per line, its name in any case; `#` starts a comment line; a value is
bare text, a "quoted string" (with \\" \\\\, \\n and \\r escapes) or a \"\"\"multi-line string\"\"\". PARAMETER takes
Ollama's names (num_predict, mirostat_tau, ...) or localgen's; num_ctx, the context size to load with; and the
load settings of the table (loadsettings.py's LOAD_KNOBS) by Ollama's names where it has one (num_gpu, num_thread,
use_mmap, ...), else llama.cpp's (n_cpu_moe, cpu_moe, override_tensor, flash_attn, ...). `PARAMETER stop` and
`PARAMETER override_tensor` repeat. Every value is checked here (but -ot's buffer names, which name the devices of
the machine that loads), so a preset never fails for its settings at use. Ollama's ways are taken too: an integer
written 2048.0 (as /api/create's JSON numbers come), num_predict -2, numa true|false, and the options Ollama's API
takes that a preset has no use for (IGNORED), checked and let be."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen import loadsettings, settings
from localgen.errors import UsageError
from localgen.text import checked
from localgen.types import MIN_CTX_FLAG, TRAINED_CTX

INSTRUCTIONS = ("FROM", "PARAMETER", "SYSTEM", "TEMPLATE", "MESSAGE", "ADAPTER", "LICENSE", "REQUIRES")
NOT_KEPT = ("LICENSE", "REQUIRES")  # Ollama's, read (what `ollama show --modelfile` writes) and not kept
ROLES = ("system", "user", "assistant")
MIN_CTX = MIN_CTX_FLAG  # as --ctx
# localgen's field → Ollama's name, where they differ (what `show --modelfile` writes): the settings table's
OLLAMA_NAMES = {k.name: k.ollama for k in settings.KNOBS.values() if k.ollama and k.ollama != k.name}
REPEATED = ("stop", "dry_sequence_breaker", "logit_bias")
# the most of a Modelfile `create -f` reads: the longest chat template of llama.cpp's 70 (gpt-oss's) is 17 KB,
# and the longest system prompts published (some 25,000 tokens) about 100 KiB; past this it is not a Modelfile
MAX_MODELFILE = 1 << 20
# Ollama's options a preset has no use for: those a request's `options` let be (loadsettings.py's OLLAMA_LOAD_OPTIONS),
# and num_keep, per request here. A line of one is checked for its kind, then let be: the preset does not keep it
IGNORED = {"num_keep": settings.INT, "tfs_z": settings.FLOAT, "penalize_newline": settings.BOOL,
           "low_vram": settings.BOOL, "f16_kv": settings.BOOL, "vocab_only": settings.BOOL}
SWITCH_WORDS = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}  # as parse_load_text's
NUMA_ON = "distribute"  # Ollama's `numa true`: the strategy Ollama picks itself on a NUMA machine (without numactl)


@dataclass(frozen=True)
class Modelfile:
    """What a Modelfile says: the base model's name and the settings layered on it."""

    base: str
    parameters: dict[str, Any] = field(default_factory=dict)  # settings fields, typed and checked
    context: int | None = None
    system: str | None = None
    template: str | None = None
    messages: tuple[dict[str, str], ...] = ()
    adapters: tuple[str, ...] = ()  # LoRA adapter GGUFs, absolute paths, applied at scale 1 in this order
    load: dict[str, Any] = field(default_factory=dict)  # load settings by the table's names, as their flags take them


class _Lines:
    """The file's lines and a cursor; errors name the line where the instruction starts."""

    def __init__(self, text: str, where: str) -> None:
        # lines end at \n (and \r\n, \r) only, as Ollama's parser reads them: a form feed, \x85 or U+2028 is text
        self.lines = re.split(r"\r\n|\r|\n", text.removesuffix("\n").removesuffix("\r"))
        self.where = where
        self.i = 0

    def error(self, number: int, message: str) -> UsageError:
        return UsageError(f"{self.where} line {number}: {message}")


def parse(text: str, where: str = "Modelfile", folder: Path | None = None,
          known: Callable[[str], bool] | None = None, there: bool = False) -> Modelfile:
    """Parse and check a Modelfile; a UsageError names the line of the first problem. `folder`: where a
    relative FROM or ADAPTER path starts (the Modelfile's own folder); None: ADAPTER takes absolute paths only,
    and a relative FROM path is left as it is (the current directory's). `known`: whether a name is a model here
    (models/resolve.py's known_name), which a bare FROM name beside a file of that name means. `there`: an absolute
    FROM path must be there, an error naming its line (on the command line: never for a saved preset read back,
    whose base may have moved since, nor for serve, whose clients are not to learn which files it has)."""
    # a byte order mark before the first line (Windows' editors write one): not part of FROM, as in Ollama
    src = _Lines(checked(text.removeprefix("\ufeff"), where), where)
    got = _Found()
    while src.i < len(src.lines):
        number = src.i + 1
        raw = src.lines[src.i]
        line = raw.strip()
        trail = raw[len(raw.rstrip()):]  # the first line's part of a """ string that runs on: its text
        src.i += 1
        if not line or line.startswith("#"):
            continue
        word, rest = _split(line)
        instr = word.upper()
        if instr not in INSTRUCTIONS:
            raise src.error(number, f"unknown instruction {word!r} (localgen reads {', '.join(INSTRUCTIONS)})")
        rest = rest.strip()
        if instr in ("PARAMETER", "MESSAGE"):
            key, rest = _split(rest)
            if not key:
                raise src.error(number, f"{instr} needs a name and a value")
            value = _value(src, rest.strip(), number, f"{instr} {key}", trail, empty=instr == "MESSAGE")
            if instr == "MESSAGE":
                if key.lower() not in ROLES:
                    raise src.error(number, f"MESSAGE takes a role ({', '.join(ROLES)}), not {key!r}")
                got.messages.append({"role": key.lower(), "content": value})
            else:
                _parameter(src, number, key, value, got)
            continue
        value = _value(src, rest, number, instr, trail, empty=instr in ("SYSTEM", "TEMPLATE", *NOT_KEPT))
        if instr in NOT_KEPT:
            continue
        if instr == "ADAPTER":
            got.adapters.append(_adapter(src, number, value, folder))
            continue
        if instr == "FROM":
            value = _from(src, number, value, folder, known, there)
        if instr in got.single:
            raise src.error(number, "a second FROM: a Modelfile has one base model" if instr == "FROM"
                            else f"a second {instr}")
        got.single[instr] = value
    if "FROM" not in got.single:
        raise UsageError(f"{where}: no FROM line: name the base model, e.g. FROM smollm2:135m")
    for name, values in got.repeated.items():
        try:
            got.params[name] = _repeated(name, values)
        except UsageError as e:
            raise UsageError(f"{where}: PARAMETER {name}: {e.message}") from None
    for key, texts in got.placed.items():  # override_tensor's lines, in order
        named = f"PARAMETER {loadsettings.modelfile_name(key)}"
        try:
            got.load[key] = loadsettings.check_load(key, tuple(texts), named)
        except UsageError as e:  # -ot's own checks name the line already (check_load's `name`)
            raise UsageError(f"{where}: {e.message}" if e.message.startswith(named) else
                             f"{where}: {named}: {e.message}") from None
    # an empty SYSTEM or TEMPLATE ("") sets none, as Ollama's create: the base's (a preset's, an Ollama model's) stays
    return Modelfile(base=got.single["FROM"], parameters=got.params, context=got.context,
                     system=got.single.get("SYSTEM") or None, template=got.single.get("TEMPLATE") or None,
                     messages=tuple(got.messages), adapters=tuple(got.adapters), load=got.load)


@dataclass
class _Found:
    """What the lines read so far say."""

    single: dict[str, str] = field(default_factory=dict)  # FROM, SYSTEM, TEMPLATE
    params: dict[str, Any] = field(default_factory=dict)
    repeated: dict[str, list[str]] = field(default_factory=dict)
    context: int | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    adapters: list[str] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)
    placed: dict[str, list[str]] = field(default_factory=dict)  # a repeated load setting's lines (-ot)
    unset: set[str] = field(default_factory=set)  # load settings a line turned off (numa false): none kept


def _parameter(src: _Lines, number: int, key: str, value: str, got: _Found) -> None:
    """One PARAMETER line: num_ctx, a load setting, a repeated sampling setting, one given once, or one of
    Ollama's that is let be (IGNORED)."""
    name = key.lower()
    if name in IGNORED:
        _ignored(src, number, key, IGNORED[name], value)
        return
    knob = loadsettings.load_name(name)
    if knob == "ctx":
        if got.context is not None:  # (the last one won, unsaid: every other setting given twice is refused)
            raise src.error(number, f"PARAMETER {key} is given twice")
        got.context = _context(src, number, value)
        return
    if knob is not None:
        _load_parameter(src, number, key, knob, value, got)
        return
    fieldname = settings.field_name(name)
    if fieldname is None:
        close = settings.guess(name, [*loadsettings.LOAD_ALIASES, *IGNORED])
        raise src.error(number, f"unknown PARAMETER {key!r}{close}")
    if fieldname in REPEATED:
        got.repeated.setdefault(fieldname, []).append(value)
        return
    if fieldname in got.params:
        raise src.error(number, f"PARAMETER {key} is given twice")
    if settings.KNOBS[fieldname].kind == settings.INT:
        value = _whole(value)
        if name == "num_predict" and value.strip() == "-2":  # Ollama's "fill the context": -1 here, as its options'
            value = "-1"
    try:
        got.params[fieldname] = settings.parse_text(fieldname, value, key)[1]  # errors name what the line says
    except UsageError as e:
        raise src.error(number, e.message) from None


def _said(key: str, e: UsageError) -> str:
    """A load setting's error as its line's: -ot's and --rpc's own checks name `PARAMETER KEY` already."""
    return e.message if e.message.startswith(f"PARAMETER {key} ") else f"PARAMETER {key}: {e.message}"


def _load_parameter(src: _Lines, number: int, key: str, knob: str, value: str, got: _Found) -> None:
    """A load setting's line (n_cpu_moe, num_gpu, override_tensor, ...), checked as its flag is."""
    if loadsettings.LOAD_KNOBS[knob].kind == settings.TEXTS:  # repeats, as the flag does
        try:
            loadsettings.parse_load_text(key, value)
        except UsageError as e:
            raise src.error(number, _said(key, e)) from None
        got.placed.setdefault(knob, []).append(value)
        return
    if knob in got.load or knob in got.unset:
        raise src.error(number, f"PARAMETER {key} is given twice")
    if knob == "numa" and (on := SWITCH_WORDS.get(value.strip().lower())) is not None:  # Ollama's numa is a switch
        if not on:  # off: localgen's default, so nothing is kept
            got.unset.add(knob)
            return
        value = NUMA_ON
    if loadsettings.LOAD_KNOBS[knob].kind == settings.INT:
        value = _whole(value)
    try:
        got.load[knob] = loadsettings.parse_load_text(key, value)[1]
    except UsageError as e:
        raise src.error(number, _said(key, e)) from None


def _ignored(src: _Lines, number: int, key: str, kind: str, value: str) -> None:
    """One of Ollama's options a preset lets be (IGNORED): an error only where its value is not of its kind."""
    t = value.strip()
    if kind == settings.BOOL:
        if t.lower() not in SWITCH_WORDS:
            raise src.error(number, f"PARAMETER {key} takes true or false, not {value!r}")
        return
    try:
        x = int(_whole(t)) if kind == settings.INT else float(t)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise src.error(number, f"PARAMETER {key} takes {'an integer' if kind == settings.INT else 'a number'}, "
                                f"not {value!r}")


def _whole(text: str) -> str:
    """An integer's text, where `text` writes one as a whole number with a point or an exponent (2048.0, 4e1): what
    /api/create writes of a JSON number a client sent as a float, which Ollama takes. Any other text as it is."""
    try:
        x = float(text)
    except ValueError:
        return text
    return str(int(x)) if math.isfinite(x) and x.is_integer() and not text.strip().lstrip("+-").isdigit() else text


def _from(src: _Lines, number: int, value: str, folder: Path | None, known: Callable[[str], bool] | None,
          there_now: bool = True) -> str:
    """FROM's model; a relative file path starts at the Modelfile's folder, as Ollama's (kept absolute). A path is
    a name that looks like one (./m.gguf, m.gguf: models/names.py) or a file there that is not also the name of a
    model known here (a preset's own Modelfile beside this one: the preset, as `run -m NAME` takes it; ./NAME is
    the file); anything else is a model name. Without a folder (stdin) a path is left to the current directory."""
    from localgen.models.names import looks_like_path

    path = Path(value).expanduser()
    if folder is None or path.is_absolute():
        if there_now and looks_like_path(value) and not os.path.exists(path):  # (False for a name no file can have)
            raise src.error(number, f"FROM {value}: no such model file: {path}")
        return value
    there = folder / path
    if not looks_like_path(value) and (not there.exists() or (known is not None and known(value))):
        return value
    if not there.exists():
        raise src.error(number, f"FROM {value}: no such model file: {there} (a relative FROM starts at the "
                                "Modelfile's folder)")
    return str(there.resolve())


def _adapter(src: _Lines, number: int, value: str, folder: Path | None) -> str:
    """ADAPTER's path, absolute (create checks the file against the base; a load checks it again)."""
    path = Path(value).expanduser()
    if not path.is_absolute():
        if folder is None:
            raise src.error(number, f"ADAPTER takes an absolute path here, not {value!r}")
        path = folder / path
    if path.suffix.lower() != ".gguf" or path.is_dir():
        raise src.error(number, f"ADAPTER {path} is not a .gguf file: localgen applies LoRA adapters in GGUF "
                                "(llama.cpp's convert_lora_to_gguf.py makes one from a PEFT folder)")
    return str(path.resolve())


def _split(text: str) -> tuple[str, str]:
    """The first word and the rest (any whitespace between)."""
    parts = text.split(None, 1)
    return (parts[0], parts[1] if len(parts) > 1 else "") if parts else ("", "")


def _repeated(name: str, values: list[str]) -> Any:
    if name == "dry_sequence_breaker" and [v.lower() for v in values] == ["none"]:  # no breakers, as the flag's none
        return settings.check(name, ())
    if name == "logit_bias":
        return settings.check(name, [settings.parse_bias(v) for v in values])
    return settings.check(name, values)


def _context(src: _Lines, number: int, value: str) -> int:
    try:
        n = int(_whole(value))
    except ValueError:
        raise src.error(number, f"num_ctx takes an integer, not {value!r}") from None
    if (n != TRAINED_CTX and n < MIN_CTX) or n > settings.INT32:  # 0: the model's training context, as --ctx 0
        raise src.error(number, f"num_ctx must be 0 (the model's training context) or within {MIN_CTX} to "
                                f"{settings.INT32:,}, not {settings.shown_value(n)}")
    return n


def _value(src: _Lines, rest: str, number: int, what: str, trail: str = "", empty: bool = False) -> str:
    """The instruction's value: bare, "quoted" or \"\"\"multi-line\"\"\" (which may run over the next lines).
    `trail`: the whitespace the line ended with (stripped from `rest`), text of a \"\"\" string not closed there.
    `empty`: a quoted empty value ("") is taken, as Ollama's parser takes it (SYSTEM, TEMPLATE, MESSAGE's text)."""
    if rest.startswith('"""'):
        body = rest[3:] if '"""' in rest[3:] else rest[3:] + trail
        parts: list[str] = []
        while '"""' not in body:
            parts.append(body)
            if src.i >= len(src.lines):
                raise src.error(number, f'{what}: the """ string is never closed')
            body = src.lines[src.i]
            src.i += 1
        end = body.index('"""')
        parts.append(body[:end])
        if body[end + 3:].strip():
            raise src.error(src.i if parts[1:] else number, f'{what}: text after the closing """')
        value = "\n".join(parts)
    elif rest.startswith('"'):
        value, tail = _quoted(src, rest, number, what)
        if tail.strip():
            raise src.error(number, f"{what}: text after the closing quote")
    else:
        value = rest
    if not value and not (empty and rest.startswith('"')):  # a quoted value may be only whitespace (stop "\n")
        raise src.error(number, f"{what} needs a value")
    return value


def _quoted(src: _Lines, rest: str, number: int, what: str) -> tuple[str, str]:
    out: list[str] = []
    i = 1
    while i < len(rest):
        c = rest[i]
        if c == "\\" and i + 1 < len(rest):
            nxt = rest[i + 1]
            out.append({"n": "\n", "r": "\r", "t": "\t"}.get(nxt, nxt))
            i += 2
            continue
        if c == '"':
            return "".join(out), rest[i + 1:]
        out.append(c)
        i += 1
    raise src.error(number, f"{what}: the quoted string is never closed")


# ---- writing ------------------------------------------------------------------------------------------


def quote(text: str) -> str:
    """A value as a Modelfile writes it: bare when that reads back the same, else quoted."""
    if text and "\n" not in text and "\r" not in text and text == text.strip() and not text.startswith(('"', "#")):
        return text
    if "\n" in text and "\r" not in text and '"""' not in text and not text.endswith('"') and text.strip():
        return f'"""{text}"""'
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
               .replace("\t", "\\t"))
    return f'"{escaped}"'


def _setting_text(name: str, value: Any) -> list[str]:
    if name in REPEATED:
        if name == "dry_sequence_breaker" and not value:  # no breakers (not the defaults, as no line would be)
            return ["none"]
        if name == "logit_bias":
            return [f"{tok}{_signed(bias)}" for tok, bias in value]
        return [quote(v) for v in value]
    if value is None:
        return ["none"]
    if isinstance(value, bool):
        return ["true" if value else "false"]
    return [repr(value) if isinstance(value, float) else str(value)]


def _signed(bias: float) -> str:
    """A bias with its sign, short (+1.5, -inf) where that reads back the same, else every digit repr keeps."""
    short = f"{bias:+g}"
    return short if float(short) == bias else f"{'+' if bias >= 0 else ''}{bias!r}"


def load_lines(knob: str, value: Any) -> list[tuple[str, str]]:
    """A load setting as PARAMETER lines' names and values: Ollama's name where it has one (use_mmap for
    --no-mmap, the opposite value), else llama.cpp's; -ot one line a value."""
    if knob == "no_mmap":
        return [("use_mmap", "false" if value else "true")]
    name = loadsettings.modelfile_name(knob)
    if isinstance(value, tuple):
        return [(name, quote(v)) for v in value]
    if isinstance(value, bool):
        return [(name, "true" if value else "false")]
    return [(name, quote(value) if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value))]


def write(m: Modelfile) -> str:
    """The Modelfile text that parses back to `m`."""
    lines = [f"FROM {quote(m.base)}", *(f"ADAPTER {quote(a)}" for a in m.adapters)]
    if m.context is not None:
        lines.append(f"PARAMETER num_ctx {m.context}")
    for knob, value in m.load.items():
        lines += [f"PARAMETER {name} {text}" for name, text in load_lines(knob, value)]
    for name, value in m.parameters.items():
        for text in _setting_text(name, value):
            lines.append(f"PARAMETER {OLLAMA_NAMES.get(name, name)} {text}")
    if m.system is not None:
        lines.append(f"SYSTEM {quote(m.system)}")
    if m.template is not None:
        lines.append(f"TEMPLATE {quote(m.template)}")
    for msg in m.messages:
        lines.append(f"MESSAGE {msg['role']} {quote(msg['content'])}")
    return "\n".join(lines) + "\n"
