"""Every sampling setting once: its type, range and meaning, and the one validation that flags, `/set`,
JSONL lines, catalogue entries, saved chats and HTTP requests all go through. Stdlib only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localgen.errors import UsageError
from localgen.text import checked as checked_text
from localgen.types import SamplingParams

INT, FLOAT, TEXTS, BIAS, BOOL = "int", "float", "texts", "bias", "bool"
INT32 = 2**31 - 1  # llama.cpp takes these as C ints: larger values would wrap (top_k 2**32 became 0, "off")
MAX_TEXTS, MAX_TEXT_CHARS = 64, 1000  # stop strings and DRY breakers: each is matched against every token


@dataclass(frozen=True)
class Knob:
    """One sampling setting: its kind, inclusive range (None: open on that side), and one-line help."""

    name: str
    kind: str
    lo: float | None = None
    hi: float | None = None
    help: str = ""
    nullable: bool = False  # None is a value (seed: random)


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("temperature", FLOAT, 0.0, 5.0, "Randomness; 0 is greedy."),
    Knob("top_k", INT, 0, INT32, "Keep the K likeliest tokens; 0 off."),
    Knob("top_p", FLOAT, 0.0, 1.0, "Nucleus sampling: smallest set with this probability mass; 1 off."),
    Knob("min_p", FLOAT, 0.0, 1.0, "Drop tokens below this fraction of the likeliest one's probability; 0 off."),
    Knob("typical_p", FLOAT, 0.0, 1.0, "Locally typical sampling; 1 off."),
    Knob("repeat_penalty", FLOAT, 0.0, 10.0, "Penalize tokens seen in the last --repeat-last-n; 1 off."),
    Knob("repeat_last_n", INT, -1, INT32, "Window for the penalties; 0 off, -1 the whole context."),
    Knob("presence_penalty", FLOAT, -2.0, 2.0, "Flat penalty on tokens already present; 0 off."),
    Knob("frequency_penalty", FLOAT, -2.0, 2.0, "Penalty growing with each repeat; 0 off."),
    Knob("seed", INT, 0, 2**32 - 1, "Random seed: the same seed gives the same text (default: a new one each run).",
         nullable=True),
    Knob("max_tokens", INT, -1, INT32, "Most tokens to generate; 0 none, -1 until the model stops or the context "
                                      "is full."),
    Knob("stop", TEXTS, help="Stop before this text (repeatable); it is never printed."),
    Knob("mirostat", INT, 0, 2, "Mirostat sampling: 1 or 2 (replaces top-k/p, min-p, typical, XTC); 0 off."),
    Knob("mirostat_lr", FLOAT, 0.0, 1.0, "Mirostat learning rate (eta)."),
    Knob("mirostat_ent", FLOAT, 0.0, 100.0, "Mirostat target entropy (tau)."),
    Knob("dry_multiplier", FLOAT, 0.0, 100.0, "DRY repetition penalty strength; 0 off."),
    Knob("dry_base", FLOAT, 1.0, 10.0, "DRY penalty base."),
    Knob("dry_allowed_length", INT, 0, INT32, "DRY: repeats up to this length go unpenalized."),
    Knob("dry_penalty_last_n", INT, -1, INT32, "DRY window in tokens; -1 the whole context, 0 off."),
    Knob("dry_sequence_breaker", TEXTS, help="DRY sequence breakers (repeatable; replaces the defaults; 'none' "
                                             "for none)."),
    Knob("xtc_probability", FLOAT, 0.0, 1.0, "XTC: chance of removing the top choices; 0 off."),
    Knob("xtc_threshold", FLOAT, 0.0, 1.0, "XTC: tokens above this probability count as top choices."),
    Knob("top_n_sigma", FLOAT, -1.0, 100.0, "Keep tokens within N standard deviations of the top logit; -1 off."),
    Knob("logit_bias", BIAS, help="TOKEN(+|-)BIAS, e.g. 15043+1.5 or 15043-inf (repeatable)."),
    Knob("ignore_eos", BOOL, help="Never stop at end-of-generation tokens."),
)}

# Names people type (llama.cpp's, Ollama's, OpenAI's, and ours with dashes) → the field.
ALIASES = {
    "temp": "temperature", "typical": "typical_p", "num_predict": "max_tokens", "n_predict": "max_tokens",
    "max_completion_tokens": "max_tokens", "mirostat_eta": "mirostat_lr", "mirostat_tau": "mirostat_ent",
    "repeat_last_n": "repeat_last_n", "dry_sequence_breakers": "dry_sequence_breaker",
}


def field_name(name: str) -> str | None:
    """The SamplingParams field a user's name means, or None."""
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    return key if key in KNOBS else None


def _bounds(k: Knob) -> str:
    lo = "-inf" if k.lo is None else f"{k.lo:g}"
    hi = "inf" if k.hi is None else f"{k.hi:g}"
    return f"{lo} to {hi}"


def check(name: str, value: Any) -> Any:
    """One setting's value, typed and in range; UsageError otherwise. An int field takes only an int
    (never a float or a bool); a float field takes an int or a finite float."""
    k = KNOBS[name]
    if value is None and k.nullable:
        return None
    if k.kind == BOOL:
        if not isinstance(value, bool):
            raise UsageError(f"{name} must be true or false, not {value!r}")
        return value
    if k.kind == TEXTS:
        if isinstance(value, str):  # OpenAI accepts one stop string as well as a list
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
            raise UsageError(f"{name} must be a string or a list of strings, not {str(value)[:80]!r}")
        if len(value) > MAX_TEXTS or any(len(x) > MAX_TEXT_CHARS for x in value):
            raise UsageError(f"{name}: at most {MAX_TEXTS} strings of at most {MAX_TEXT_CHARS} characters each")
        for x in value:
            checked_text(x, name)
        return tuple(x for x in value if x)
    if k.kind == BIAS:
        return _check_bias(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{name} must be a number, not {value!r}")
    if k.kind == INT:
        if not isinstance(value, int):
            raise UsageError(f"{name} must be an integer, not {value!r}")
    else:
        value = float(value)
        if not math.isfinite(value):
            raise UsageError(f"{name} must be a finite number, not {value!r}")
    if (k.lo is not None and value < k.lo) or (k.hi is not None and value > k.hi):
        raise UsageError(f"{name} must be within {_bounds(k)}, not {value!r}")
    return value


def _check_bias(value: Any) -> tuple[tuple[int, float], ...]:
    items: list[Any]
    if isinstance(value, Mapping):  # OpenAI's {"token id": bias}
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = [parse_bias(x) if isinstance(x, str) else x for x in value]
    elif isinstance(value, str):
        items = [parse_bias(value)]
    else:
        raise UsageError(f"logit_bias must be TOKEN(+|-)BIAS items or a token→bias object, not {value!r}")
    out = []
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise UsageError(f"bad logit_bias item {item!r}")
        tok, bias = item
        if isinstance(tok, str) and tok.strip().isdigit():
            tok = int(tok)
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok <= INT32:
            raise UsageError(f"logit_bias: a token id must be a non-negative integer, not {tok!r}")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(bias):
            raise UsageError(f"logit_bias: the bias of token {tok} must be a number, not {bias!r}")
        out.append((tok, float(bias)))
    return tuple(out)


def parse_bias(text: str) -> tuple[int, float]:
    """llama.cpp's TOKEN(+|-)BIAS: "15043+1.5", "15043-inf"."""
    s = text.strip()
    for i in range(1, len(s)):
        if s[i] in "+-" and s[:i].isdigit():
            try:
                return int(s[:i]), float(s[i:])
            except ValueError:
                break
    raise UsageError(f"bad logit bias {text!r}: use TOKEN_ID followed by +BIAS or -BIAS, e.g. 15043+1 or 15043-inf")


def validate(values: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """Check a mapping of settings (any spelling in ALIASES); returns {field: typed value}. `where` prefixes
    the message ("line 3: ", "models.toml entry 'x': ")."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        key = field_name(name)
        if key is None:
            raise UsageError(f"{where}unknown setting {name!r}")
        try:
            out[key] = check(key, value)
        except UsageError as e:
            raise UsageError(f"{where}{e.message}") from None
    return out


def apply(base: SamplingParams, values: Mapping[str, Any], where: str = "") -> SamplingParams:
    """`base` with validated settings on top."""
    return dataclasses.replace(base, **validate(values, where))


def parse_text(name: str, text: str) -> tuple[str, Any]:
    """A setting typed as text (`/set top_k 40`); returns (field, typed value)."""
    key = field_name(name)
    if key is None:
        raise UsageError(f"unknown setting {name!r}; settable: {', '.join(sorted(KNOBS))}")
    k = KNOBS[key]
    t = text.strip()
    if k.kind == TEXTS:
        value: Any = () if t.lower() in ("", "none", "off") else tuple(v for v in t.split("|") if v)
    elif k.kind == BIAS:
        value = () if t.lower() in ("", "none", "off") else [parse_bias(x) for x in t.split(",")]
    elif k.kind == BOOL:
        if t.lower() not in ("on", "off", "true", "false", "1", "0"):
            raise UsageError(f"{key} takes on or off")
        value = t.lower() in ("on", "true", "1")
    elif k.nullable and t.lower() in ("none", "random", "off"):
        value = None
    else:
        try:
            value = int(t) if k.kind == INT else float(t)
        except ValueError:
            kind = "an integer" if k.kind == INT else "a number"
            raise UsageError(f"{key} takes {kind}, not {text!r}") from None
    return key, check(key, value)


def jsonable(value: Any) -> Any:
    """A setting's value as saved in JSON (tuples become lists)."""
    if isinstance(value, tuple):
        return [jsonable(v) for v in value]
    return value
