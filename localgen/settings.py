"""Every sampling setting once: its type, range, meaning and spellings (the CLI's, OpenAI's, llama.cpp's,
Ollama's), and the one validation that flags, `/set`, JSONL lines, catalogue entries, saved chats and HTTP
requests all go through. The CLI's options and the HTTP routes' field names are derived from here; the load
settings, in the same kinds (INT, FLOAT, BOOL, TEXTS, ...), are loadsettings.py's."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from localgen.errors import UsageError
from localgen.text import checked as checked_text
from localgen.types import SamplingParams

INT, FLOAT, TEXTS, BIAS, BOOL = "int", "float", "texts", "bias", "bool"
INT32 = 2**31 - 1  # llama.cpp takes these as C ints: larger values would wrap (top_k 2**32 became 0, "off")
MAX_TEXTS, MAX_TEXT_CHARS = 64, 1000  # stop strings and DRY breakers: each is matched against every token
MAX_BIAS = 1 << 18  # logit bias entries, as many as the largest vocabularies' tokens: each is applied every token


@dataclass(frozen=True)
class Knob:
    """One sampling setting: its kind, inclusive range (None: open on that side), one-line help, and how each
    front end spells it. The default is SamplingParams' field (types.py), so it too is written once."""

    name: str
    kind: str
    lo: float | None = None
    hi: float | None = None
    help: str = ""
    nullable: bool = False  # None is a value (seed: random), and so is -1, which means it (llama.cpp's, Ollama's)
    flags: tuple[str, ...] = ()  # the CLI's (ours first, then llama.cpp's); default: --name-with-dashes
    openai: str | None = None  # OpenAI's request field, where OpenAI has one
    llamacpp: str | None = None  # llama-server's request field (its extension where OpenAI has none)
    ollama: str | None = None  # Ollama's `options` key, where Ollama has one
    also: tuple[str, ...] = ()  # other names requests and JSONL lines use
    anthropic: str | None = None  # Anthropic's Messages field, where it names the knob otherwise than OpenAI
    responses: str | None = None  # OpenAI's Responses field, where it names the knob otherwise than chat's

    @property
    def cli(self) -> tuple[str, ...]:
        return self.flags or ("--" + self.name.replace("_", "-"),)

    @property
    def default(self) -> Any:
        return getattr(_DEFAULTS, self.name)


_DEFAULTS = SamplingParams()


def _k(name: str, kind: str, lo: float | None = None, hi: float | None = None, help: str = "", *,
       openai: bool = False, ollama: bool | str = False, llamacpp: str | None = None, **kw: Any) -> Knob:
    """A knob spelled `name` by every front end that has it, unless told otherwise: OpenAI's field where
    `openai`, Ollama's option where `ollama` (a string: its own spelling); llama-server's field always."""
    return Knob(name, kind, lo, hi, help, openai=name if openai else None, llamacpp=llamacpp or name,
                ollama=(ollama if isinstance(ollama, str) else name) if ollama else None, **kw)


KNOBS: dict[str, Knob] = {k.name: k for k in (
    _k("temperature", FLOAT, 0.0, 5.0, "Randomness; 0 is greedy.", openai=True, ollama=True,
       flags=("--temperature", "--temp")),
    _k("dynatemp_range", FLOAT, 0.0, 5.0, "Dynamic temperature: the temperature moves within ± this range with the "
                                          "entropy of the candidates; 0 off."),
    _k("dynatemp_exp", FLOAT, 0.0, 10.0, "Dynamic temperature's exponent.", llamacpp="dynatemp_exponent",
       flags=("--dynatemp-exp",)),
    _k("top_k", INT, 0, INT32, "Keep the K likeliest tokens; 0 off.", ollama=True),
    _k("top_p", FLOAT, 0.0, 1.0, "Nucleus sampling: smallest set with this probability mass; 1 off.", openai=True,
       ollama=True),
    _k("min_p", FLOAT, 0.0, 1.0, "Drop tokens below this fraction of the likeliest one's probability; 0 off.",
       ollama=True),
    _k("typical_p", FLOAT, 0.0, 1.0, "Locally typical sampling; 1 off.", ollama=True,
       flags=("--typical-p", "--typical")),
    _k("repeat_penalty", FLOAT, 0.0, 10.0, "Penalize tokens seen in the last --repeat-last-n; 1 off.", ollama=True),
    _k("repeat_last_n", INT, -1, INT32, "Window for the penalties; 0 off, -1 the whole context.", ollama=True),
    _k("presence_penalty", FLOAT, -2.0, 2.0, "Flat penalty on tokens already present; 0 off.", openai=True,
       ollama=True),
    _k("frequency_penalty", FLOAT, -2.0, 2.0, "Penalty growing with each repeat; 0 off.", openai=True, ollama=True),
    _k("seed", INT, -1, 2**32 - 1, "Random seed: the same seed gives the same text (default, or -1: a new one each "
                                   "run).", openai=True, ollama=True, nullable=True, flags=("--seed", "-s")),
    _k("max_tokens", INT, -1, INT32, "Most tokens to generate; 0 none, -1 until the model stops or the context is "
                                     "full.", openai=True, ollama="num_predict", llamacpp="n_predict",
       flags=("--max-tokens", "--n-predict", "-n"), also=("max_completion_tokens",), responses="max_output_tokens"),
    _k("stop", TEXTS, help="Stop before this text (repeatable); it is never printed.", openai=True, ollama=True,
       anthropic="stop_sequences"),
    _k("reasoning_budget", INT, -1, INT32, "Most tokens a reasoning model may think: past them its thinking is "
                                           "closed (the end tag put in) and it answers; -1 no limit, 0 none."),
    _k("mirostat", INT, 0, 2, "Mirostat sampling: 1 or 2 (replaces top-k/p, min-p, typical, XTC); 0 off.",
       ollama=True),
    _k("mirostat_lr", FLOAT, 0.0, 1.0, "Mirostat learning rate (eta).", ollama="mirostat_eta",
       llamacpp="mirostat_eta"),
    _k("mirostat_ent", FLOAT, 0.0, 100.0, "Mirostat target entropy (tau).", ollama="mirostat_tau",
       llamacpp="mirostat_tau"),
    _k("dry_multiplier", FLOAT, 0.0, 100.0, "DRY repetition penalty strength; 0 off."),
    _k("dry_base", FLOAT, 1.0, 10.0, "DRY penalty base."),
    _k("dry_allowed_length", INT, 0, INT32, "DRY: repeats up to this length go unpenalized."),
    _k("dry_penalty_last_n", INT, -1, INT32, "DRY window in tokens; -1 the whole context, 0 off."),
    _k("dry_sequence_breaker", TEXTS, help="DRY sequence breakers (repeatable; replaces the defaults; 'none' for "
                                           "none).", llamacpp="dry_sequence_breakers"),
    _k("xtc_probability", FLOAT, 0.0, 1.0, "XTC: chance of removing the top choices; 0 off."),
    _k("xtc_threshold", FLOAT, 0.0, 1.0, "XTC: tokens above this probability count as top choices."),
    _k("top_n_sigma", FLOAT, -1.0, 100.0, "Keep tokens within N standard deviations of the top logit; -1 off."),
    _k("logit_bias", BIAS, help="TOKEN(+|-)BIAS, e.g. 15043+1.5 or 15043-inf (repeatable).", openai=True),
    _k("ignore_eos", BOOL, help="Never stop at end-of-generation tokens."),
)}


def spellings(api: str) -> dict[str, str]:
    """A front end's names for the knobs → the knobs' names. api: "openai" (OpenAI's fields, then
    llama-server's for the rest, as llama-server's /v1 takes them), "anthropic" and "responses" (the same,
    with the API's own name first where it has one), "ollama" (Ollama's options; llama-server's names where
    Ollama has none), "llamacpp", or "any" (every name anyone uses: JSONL lines, /set)."""
    out: dict[str, str] = {}
    for k in KNOBS.values():
        names: tuple[str | None, ...]
        if api in ("openai", "anthropic", "responses"):
            own = k.anthropic if api == "anthropic" else k.responses if api == "responses" else None
            names = (own, k.openai, k.llamacpp, *k.also)
        elif api == "ollama":
            names = (k.ollama,) if k.ollama else (k.llamacpp,)
        elif api == "llamacpp":
            names = (k.llamacpp,)
        else:
            names = (k.name, k.openai, k.llamacpp, k.ollama, *k.also,
                     *(f.lstrip("-").replace("-", "_") for f in k.cli if f.startswith("--")))
        for n in names:
            if n:
                out.setdefault(n, k.name)
    return out


# Names people type (llama.cpp's, Ollama's, OpenAI's, and ours with dashes) → the field.
ALIASES = spellings("any")


def field_name(name: str) -> str | None:
    """The SamplingParams field a user's name means, or None."""
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    return key if key in KNOBS else None


def guess(name: str, others: Iterable[str] = ()) -> str:
    """"; did you mean X?" for a misspelt setting (a name of KNOBS, any spelling of ALIASES, or `others`),
    else ""."""
    key = name.strip().lower().replace("-", "_")
    close = difflib.get_close_matches(key, [*KNOBS, *ALIASES, *others], n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def shown_value(value: Any) -> str:
    """A value as an error quotes it: repr, but true and false as JSON and TOML write them (a client sent `true`,
    not `True`), and an integer of more than 21 digits (`1e300` written in a Modelfile, made whole) in exponent
    form, never hundreds of digits."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 21:
        try:
            return f"{float(value):g}"
        except OverflowError:
            return "a number past 1e+308"
    return repr(value)


def out_of_range(name: str, lo: float | None, hi: float | None, value: Any, typed: str | None = None) -> str:
    """What a value past a setting's bounds is told, its numbers as they are typed (2,147,483,647, not
    2.14748e+09): `at least LO` where the top is only the type's (a C int's, or none). `typed`: the value as the
    user typed it (`/set temperature -1` says -1, not -1.0)."""
    def num(v: float) -> str:
        return f"{v:,}" if isinstance(v, int) else f"{v:g}"

    said = typed if typed is not None else shown_value(value)
    if lo is not None and (hi is None or hi == INT32):
        if value < lo or hi is None:
            return f"{name} must be at least {num(lo)}, not {said}"
        return f"{name} must be at most {num(hi)} (llama.cpp takes it as a C int), not {said}"
    return f"{name} must be within {'-inf' if lo is None else num(lo)} to {'inf' if hi is None else num(hi)}, " \
           f"not {said}"


def check(name: str, value: Any, label: str | None = None) -> Any:
    """One setting's value, typed and in range; UsageError otherwise. An int field takes only an int
    (never a float or a bool); a float field takes an int or a finite float. Messages name it `label` (the
    spelling the value came under: a client's field, a JSONL key), default `name`."""
    k = KNOBS[name]
    shown = label or name
    if value is None and k.nullable:
        return None
    if k.kind == BOOL:
        if not isinstance(value, bool):
            raise UsageError(f"{shown} must be true or false, not {shown_value(value)}")
        return value
    if k.kind == TEXTS:
        if isinstance(value, str):  # OpenAI accepts one stop string as well as a list
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
            raise UsageError(f"{shown} must be a string or a list of strings, not {str(value)[:80]!r}")
        if len(value) > MAX_TEXTS or any(len(x) > MAX_TEXT_CHARS for x in value):
            raise UsageError(f"{shown}: at most {MAX_TEXTS} strings of at most {MAX_TEXT_CHARS} characters each")
        for x in value:
            checked_text(x, shown)
        if name == "stop" and "" in value:  # it would end every answer before its first token
            raise UsageError(f"{shown} holds an empty string: give the text, or leave it out")
        return tuple(x for x in value if x)
    if k.kind == BIAS:
        return _check_bias(value, shown)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{shown} must be {'an integer' if k.kind == INT else 'a number'}, not {shown_value(value)}")
    if k.kind == INT:
        if not isinstance(value, int):
            raise UsageError(f"{shown} must be an integer, not {shown_value(value)}")
    else:
        value = as_float(value)
        if not math.isfinite(value):
            raise UsageError(f"{shown} must be a finite number, not {shown_value(value)}")
    if (k.lo is not None and value < k.lo) or (k.hi is not None and value > k.hi):
        raise UsageError(out_of_range(shown, k.lo, k.hi, value))
    if k.nullable and value == -1:  # llama.cpp's and Ollama's default seed: a fresh one, as none given
        return None
    return value


def _check_bias(value: Any, shown: str = "logit_bias") -> tuple[tuple[int, float], ...]:
    """A logit bias as (token, bias) pairs; messages name it `shown` (as the client spelled it)."""
    items: list[Any]
    if isinstance(value, Mapping):  # OpenAI's {"token id": bias}
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = [parse_bias(x) if isinstance(x, str) else x for x in value]
    elif isinstance(value, str):
        items = [parse_bias(value)]
    else:
        raise UsageError(f"{shown} must be TOKEN(+|-)BIAS items or a token→bias object, not {shown_value(value)}")
    if len(items) > MAX_BIAS:
        raise UsageError(f"{shown}: at most {MAX_BIAS:,} entries (one a token), not {len(items):,}")
    out = []
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise UsageError(f"bad {shown} item {item!r}")
        tok, bias = item
        if isinstance(tok, str) and tok.strip().isascii() and tok.strip().isdigit():  # "²" is a digit int() refuses
            tok = int(tok)
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise UsageError(f"{shown}: a token id must be a non-negative integer, not {tok!r}")
        if tok > INT32:  # a vocabulary's ids are a C int's
            raise UsageError(f"{shown}: a token id must be at most {INT32:,}, not {shown_value(tok)}")
        if isinstance(bias, str) and bias.strip().lower() in ("-inf", "inf", "+inf"):  # run --json's spelling
            bias = float(bias)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(as_float(bias)):
            raise UsageError(f"{shown}: the bias of token {tok} must be a number, not {bias!r}")
        out.append((tok, as_float(bias)))
    return tuple(out)


def as_float(value: float) -> float:
    """A number read from JSON (a request, a JSONL line) as a float. JSON allows an integer past a float's
    range (a 1 and 400 zeros), where float() raises OverflowError: it is ±inf here, as `1e400` is read, so each
    caller's finiteness check refuses both alike (a bias may be infinite: -inf bans a token)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def parse_bias(text: str) -> tuple[int, float]:
    """llama.cpp's TOKEN(+|-)BIAS: "15043+1.5", "15043-inf"."""
    s = text.strip()
    for i in range(1, len(s)):
        if s[i] in "+-" and s[:i].isascii() and s[:i].isdigit():
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
            raise UsageError(f"{where}unknown setting {name!r}{guess(name)}")
        try:
            out[key] = check(key, value, name)  # the message names the spelling given
        except UsageError as e:
            raise UsageError(f"{where}{e.message}") from None
    return out


def apply(base: SamplingParams, values: Mapping[str, Any], where: str = "") -> SamplingParams:
    """`base` with validated settings on top (each counted as asked for)."""
    checked = validate(values, where)
    return dataclasses.replace(base, **checked, asked=base.asked | frozenset(checked))


def parse_text(name: str, text: str, label: str | None = None) -> tuple[str, Any]:
    """A setting typed as text (`/set top_k 40`); returns (field, typed value). Messages name it `label` (the
    spelling it was written in: a Modelfile's num_predict), default the field's name."""
    key = field_name(name)
    if key is None:
        raise UsageError(f"unknown setting {name!r}{guess(name) or '; settable: ' + ', '.join(sorted(KNOBS))}")
    k = KNOBS[key]
    shown = label or key
    t = text.strip()
    if k.kind == TEXTS:
        value: Any = () if t.lower() in ("", "none", "off") else tuple(v for v in t.split("|") if v)
    elif k.kind == BIAS:
        value = () if t.lower() in ("", "none", "off") else [parse_bias(x) for x in t.split(",")]
    elif k.kind == BOOL:
        if t.lower() not in ("on", "off", "true", "false", "1", "0"):
            raise UsageError(f"{shown} takes on or off")
        value = t.lower() in ("on", "true", "1")
    elif k.nullable and t.lower() in ("none", "random", "off"):
        value = None
    else:
        try:
            value = int(t) if k.kind == INT else float(t)
        except ValueError:
            kind = "an integer" if k.kind == INT else "a number"
            raise UsageError(f"{shown} takes {kind}, not {text!r}") from None
        if (k.lo is not None and value < k.lo) or (k.hi is not None and value > k.hi):
            raise UsageError(out_of_range(shown, k.lo, k.hi, value, typed=t))
    return key, check(key, value, shown)


def as_text(key: str, value: Any) -> str:
    """A setting's value as `/set` takes it (parse_text's inverse): `a|b`, `15+1.5`, on/off, none, 0.8; not
    Python's ('a', 'b'), None or False. Control characters in a text are shown escaped (\\n)."""
    k = KNOBS[key]
    if k.kind == TEXTS:
        return "|".join(v.encode("unicode_escape").decode("ascii") for v in value) if value else "none"
    if k.kind == BIAS:
        return ",".join(f"{tok}{bias:+g}" for tok, bias in value) if value else "none"
    if k.kind == BOOL:
        return "on" if value else "off"
    if value is None:
        return "random" if key == "seed" else "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def jsonable(value: Any) -> Any:
    """A setting's value as saved in JSON (tuples become lists)."""
    if isinstance(value, tuple):
        return [jsonable(v) for v in value]
    return value
