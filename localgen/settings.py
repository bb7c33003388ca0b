"""Every generation and load setting once: its type, range, meaning and spellings (the CLI's, OpenAI's,
llama.cpp's, Ollama's), and the one validation that flags, `/set`, JSONL lines, catalogue entries, saved chats
and HTTP requests all go through. The CLI's options and the HTTP routes' field names are derived from here."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localgen.errors import UsageError
from localgen.text import checked as checked_text
from localgen.types import KV_CACHE_TYPES, LoadParams, SamplingParams

INT, FLOAT, TEXTS, BIAS, BOOL = "int", "float", "texts", "bias", "bool"
INT32 = 2**31 - 1  # llama.cpp takes these as C ints: larger values would wrap (top_k 2**32 became 0, "off")
MAX_TEXTS, MAX_TEXT_CHARS = 64, 1000  # stop strings and DRY breakers: each is matched against every token


@dataclass(frozen=True)
class Knob:
    """One sampling setting: its kind, inclusive range (None: open on that side), one-line help, and how each
    front end spells it. The default is SamplingParams' field (types.py), so it too is written once."""

    name: str
    kind: str
    lo: float | None = None
    hi: float | None = None
    help: str = ""
    nullable: bool = False  # None is a value (seed: random)
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
    _k("seed", INT, 0, 2**32 - 1, "Random seed: the same seed gives the same text (default: a new one each run).",
       openai=True, ollama=True, nullable=True, flags=("--seed", "-s")),
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


def out_of_range(name: str, lo: float | None, hi: float | None, value: Any) -> str:
    """What a value past a setting's bounds is told, its numbers as they are typed (2,147,483,647, not
    2.14748e+09): `at least LO` where the top is only the type's (a C int's, or none)."""
    def num(v: float) -> str:
        return f"{v:,}" if isinstance(v, int) else f"{v:g}"

    if lo is not None and (hi is None or hi == INT32):
        if value < lo or hi is None:
            return f"{name} must be at least {num(lo)}, not {value!r}"
        return f"{name} must be at most {num(hi)} (llama.cpp takes it as a C int), not {value!r}"
    return f"{name} must be within {'-inf' if lo is None else num(lo)} to {'inf' if hi is None else num(hi)}, " \
           f"not {value!r}"


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
            raise UsageError(f"{shown} must be true or false, not {value!r}")
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
        return tuple(x for x in value if x)
    if k.kind == BIAS:
        return _check_bias(value, shown)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{shown} must be {'an integer' if k.kind == INT else 'a number'}, not {value!r}")
    if k.kind == INT:
        if not isinstance(value, int):
            raise UsageError(f"{shown} must be an integer, not {value!r}")
    else:
        value = float(value)
        if not math.isfinite(value):
            raise UsageError(f"{shown} must be a finite number, not {value!r}")
    if (k.lo is not None and value < k.lo) or (k.hi is not None and value > k.hi):
        raise UsageError(out_of_range(shown, k.lo, k.hi, value))
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
        raise UsageError(f"{shown} must be TOKEN(+|-)BIAS items or a token→bias object, not {value!r}")
    out = []
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise UsageError(f"bad {shown} item {item!r}")
        tok, bias = item
        if isinstance(tok, str) and tok.strip().isdigit():
            tok = int(tok)
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok <= INT32:
            raise UsageError(f"{shown}: a token id must be a non-negative integer, not {tok!r}")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(bias):
            raise UsageError(f"{shown}: the bias of token {tok} must be a number, not {bias!r}")
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
            out[key] = check(key, value, name)  # the message names the spelling given
        except UsageError as e:
            raise UsageError(f"{where}{e.message}") from None
    return out


def apply(base: SamplingParams, values: Mapping[str, Any], where: str = "") -> SamplingParams:
    """`base` with validated settings on top (each counted as asked for)."""
    checked = validate(values, where)
    return dataclasses.replace(base, **checked, asked=base.asked | frozenset(checked))


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


@dataclass(frozen=True)
class LoadKnob:
    """One load setting as the CLI takes it: the command's parameter `name`, the LoadParams field it sets
    (its default is that field's, so it is written once), its flags (ours, then llama.cpp's), help, and
    Ollama's option for it. `kind` is INT, FLOAT, BOOL, TEXT, TEXTS (repeatable), or SWITCH (--x/--no-x, unset by
    default)."""

    name: str
    kind: str
    flags: tuple[str, ...]
    help: str
    field: str | None = None  # None: not one LoadParams field as it stands (the CLI's shape differs)
    lo: float | None = None
    hi: float | None = None
    panel: str = "model"  # or "gpu": GPU, memory and long context
    envvar: str | None = None
    metavar: str | None = None
    ollama: str | None = None  # Ollama's `options` key (serve loads before requests: it is not taken per request)
    cli_default: Any = None  # where `field` is None

    @property
    def default(self) -> Any:
        return getattr(_LOAD_DEFAULTS, self.field) if self.field else self.cli_default


TEXT, SWITCH = "text", "switch"
_LOAD_DEFAULTS = LoadParams()
_KV = ", ".join(KV_CACHE_TYPES)
GPU = "gpu"

LOAD_KNOBS: dict[str, LoadKnob] = {k.name: k for k in (
    LoadKnob("ctx", INT, ("--ctx", "--ctx-size", "-c"), "Context window in tokens (0: the model's training "
             "context, which caps it unless RoPE scaling is set).",
             "n_ctx", lo=0, envvar="LOCALGEN_CTX", ollama="num_ctx"),
    LoadKnob("threads", INT, ("--threads", "-t"), "CPU threads for generation (default: the model's tuning record, "
             "else the physical performance cores this process may use).", "n_threads", 1, 1024, ollama="num_thread"),
    LoadKnob("threads_batch", INT, ("--threads-batch", "-tb"), "CPU threads for prompt processing and batches "
             "(default: the model's tuning record, else every logical CPU this process may use).", "n_threads_batch",
             1, 1024),
    LoadKnob("gpu_layers", INT, ("--gpu-layers", "--n-gpu-layers", "-ngl"), "Layers to offload to the GPU; -1 all "
             "(default: as many as fit when this build can offload, else 0).", "n_gpu_layers", -1, ollama="num_gpu"),
    LoadKnob("batch_size", INT, ("--batch-size", "-b"), "Logical batch size.", "n_batch", 1, ollama="num_batch"),
    LoadKnob("ubatch_size", INT, ("--ubatch-size", "-ub"), "Physical batch size (default: the model's tuning "
             "record, else 512).", "n_ubatch", 1),
    LoadKnob("flash_attn", TEXT, ("--flash-attn", "-fa"), "Flash attention (default: the model's tuning record, "
             "else on; `localgen tune` measures which is faster here). auto: llama.cpp decides. A bare -fa means on.",
             metavar="on|off|auto"),
    LoadKnob("no_flash_attn", BOOL, ("--no-flash-attn", "-nofa"), "Same as -fa off.", cli_default=False),
    LoadKnob("cache_type_k", TEXT, ("--cache-type-k", "-ctk"), f"KV-cache type for keys: {_KV}.", "cache_type_k"),
    LoadKnob("cache_type_v", TEXT, ("--cache-type-v", "-ctv"), f"KV-cache type for values: {_KV}.", "cache_type_v"),
    LoadKnob("prefix_reuse", TEXT, ("--prefix-reuse",), "What a cached prefix gives back: exact keeps only what gives "
             "a fresh evaluation's logits bit for bit (a conversation's last answer is evaluated again each turn); "
             "all keeps every token it holds, answers too, as llama.cpp does: faster turns on a CPU with a big "
             "model, and an answer may differ from a fresh run's where two tokens nearly tie.", "prefix_reuse",
             metavar="exact|all"),
    LoadKnob("kv_unified", SWITCH, ("--kv-unified/--no-kv-unified", "-kvu/-no-kvu"), "The KV cells of the "
             "sequences batched for throughput (run --file, serve, bench -npl), as llama.cpp's -kvu: one pool shared "
             "by every sequence, or a stream of cells per sequence "
             "(default: one pool for serve and run --file with layers on a GPU, else a stream per sequence, as "
             "llama-server -np N and llama-batched-bench keep them; --exact always keeps a stream per sequence).",
             "kv_unified", envvar="LLAMA_ARG_KV_UNIFIED"),
    LoadKnob("repack", SWITCH, ("--repack/--no-repack",), "llama.cpp's repacked CPU weight layouts (default: the "
             "model's tuning record, else on where at least half the weights are of a repackable type, off on a "
             "GPU).", "repack"),
    LoadKnob("mlock", BOOL, ("--mlock",), "Keep the model in RAM (no swapping).", panel=GPU, ollama="use_mlock",
             cli_default=False),
    LoadKnob("no_mmap", BOOL, ("--no-mmap",), "Read the model into memory instead of mapping it (slower load, no "
             "page faults).", panel=GPU, cli_default=False),
    LoadKnob("numa", TEXT, ("--numa",), "NUMA strategy on multi-socket machines.", "numa", panel=GPU,
             metavar="distribute|isolate|numactl", ollama="numa"),
    LoadKnob("split_mode", TEXT, ("--split-mode", "-sm"), "How to split the model over several GPUs.", "split_mode",
             panel=GPU, metavar="none|layer|row"),
    LoadKnob("tensor_split", TEXT, ("--tensor-split", "-ts"), "Proportions of the model per GPU (and RPC device), "
             "e.g. 3,1.", panel=GPU, metavar="N,N,..."),
    LoadKnob("main_gpu", INT, ("--main-gpu", "-mg"), "The GPU for the whole model with --split-mode none (and for "
             "scratch with row).", "main_gpu", 0, INT32, panel=GPU, ollama="main_gpu"),
    LoadKnob("n_cpu_moe", INT, ("--n-cpu-moe", "-ncmoe"), "Keep the mixture-of-experts weights of the first N "
             "layers in RAM, the rest of those layers on the GPU (default: as the plan finds room; `localgen fit`).",
             "n_cpu_moe", 0, panel=GPU, envvar="LLAMA_ARG_N_CPU_MOE", metavar="N"),
    LoadKnob("cpu_moe", BOOL, ("--cpu-moe", "-cmoe"), "Keep every layer's mixture-of-experts weights in RAM.",
             "cpu_moe", panel=GPU, envvar="LLAMA_ARG_CPU_MOE"),
    LoadKnob("override_tensor", TEXTS, ("--override-tensor", "-ot"), "Put the tensors whose names match a regular "
             "expression in a buffer type (CPU, CUDA0, ...), as llama.cpp's -ot; comma-separated, repeatable; the "
             "first match wins.", panel=GPU, envvar="LLAMA_ARG_OVERRIDE_TENSOR", metavar="PATTERN=BUFFER,..."),
    LoadKnob("rope_scaling", TEXT, ("--rope-scaling",), "RoPE scaling for contexts beyond training (YaRN for Qwen "
             "2.5/3 past 32k).", "rope_scaling", panel=GPU, metavar="none|linear|yarn"),
    LoadKnob("rope_freq_base", FLOAT, ("--rope-freq-base",), "RoPE base frequency; 0 from the model.",
             "rope_freq_base", 0.0, panel=GPU),
    LoadKnob("rope_freq_scale", FLOAT, ("--rope-freq-scale",), "RoPE frequency scale (1/N stretches the context N "
             "times); 0 from the model.", "rope_freq_scale", 0.0, panel=GPU),
    LoadKnob("yarn_orig_ctx", INT, ("--yarn-orig-ctx",), "YaRN: the model's original training context; 0 from the "
             "model.", "yarn_orig_ctx", 0, INT32, panel=GPU),
    LoadKnob("lora", TEXT, ("--lora",), "LoRA adapters (GGUF) to apply over the model, comma-separated; each "
             "is made for one base model.", metavar="FILE,..."),
    LoadKnob("lora_scaled", TEXT, ("--lora-scaled",), "LoRA adapters with a scale each (0 turns one off, 1 is "
             "--lora's).", metavar="FILE:SCALE,..."),
    LoadKnob("rpc", TEXT, ("--rpc",), "llama.cpp RPC servers (localgen rpc-server) whose devices take part of the "
             "model.", panel=GPU, envvar="LLAMA_ARG_RPC", metavar="HOST:PORT,..."),
)}
# Ollama's options that only mean something when a model loads, which `serve` did at start: taken and let be. Ollama
# has no option for tensor placement (api/types.go's Runner: num_ctx, num_batch, num_gpu, main_gpu, use_mmap,
# num_thread) and ignores one it does not know; llama.cpp's names for it are let be alike
OLLAMA_LOAD_OPTIONS = frozenset({k.ollama for k in LOAD_KNOBS.values() if k.ollama} | {
    "num_keep", "use_mmap", "low_vram", "f16_kv", "vocab_only", "penalize_newline", "tfs_z"} | {
    "n_cpu_moe", "cpu_moe", "override_tensor", "kv_unified"})


# ---- load settings as values: a Modelfile's PARAMETER lines, a preset, LoadParams --------------------------

# Load settings that a Modelfile spells otherwise: the context is num_ctx's line; an adapter is ADAPTER's; -nofa
# is flash_attn off
NOT_IN_MODELFILE = {"ctx": "num_ctx", "lora": "ADAPTER", "lora_scaled": "ADAPTER", "no_flash_attn": "flash_attn off"}
INVERTED = {"use_mmap": "no_mmap"}  # Ollama's option → the knob it sets to the opposite value


def _load_spellings() -> dict[str, str]:
    """Every name of a load setting → its knob: the knob's, Ollama's, llama.cpp's long flags with underscores
    (n_gpu_layers, ctx_size), and the LoadParams field."""
    out: dict[str, str] = {}
    for k in LOAD_KNOBS.values():
        flags = [f.lstrip("-").replace("-", "_") for part in k.flags for f in part.split("/") if f.startswith("--")]
        for n in (k.name, k.ollama, k.field, *(f for f in flags if f == k.name or not f.startswith("no_"))):
            if n:  # (not --no-repack, the switch's other half)
                out.setdefault(n, k.name)
    return out


LOAD_ALIASES = _load_spellings()


def load_name(name: str) -> str | None:
    """The load knob a user's name means (any spelling in LOAD_ALIASES, or Ollama's use_mmap), or None."""
    key = name.strip().lower().replace("-", "_")
    return INVERTED.get(key) or LOAD_ALIASES.get(key)


def modelfile_name(knob: str) -> str:
    """How a Modelfile writes a load setting: Ollama's name where it has one, else llama.cpp's flag's
    (n_cpu_moe, cpu_moe, override_tensor)."""
    k = LOAD_KNOBS[knob]
    return k.ollama or k.name


def parse_load_text(name: str, text: str) -> tuple[str, Any]:
    """A load setting typed as text (`PARAMETER n_cpu_moe 4`): (knob, value as its flag takes it), checked as a
    load would check it; UsageError otherwise."""
    key = load_name(name)
    if key is None or key in NOT_IN_MODELFILE:
        raise UsageError(f"unknown load setting {name!r}" if key is None else
                         f"a Modelfile says this with {NOT_IN_MODELFILE[key]}")
    k = LOAD_KNOBS[key]
    t = text.strip()
    value: Any
    if k.kind in (BOOL, SWITCH):
        if t.lower() not in ("on", "off", "true", "false", "1", "0"):
            raise UsageError(f"{name} takes true or false, not {text!r}")
        value = (t.lower() in ("on", "true", "1")) != (name.strip().lower().replace("-", "_") in INVERTED)
    elif k.kind in (INT, FLOAT):
        try:
            value = int(t) if k.kind == INT else float(t)
        except ValueError:
            raise UsageError(f"{name} takes {'an integer' if k.kind == INT else 'a number'}, not {text!r}") from None
    elif k.kind == TEXTS:
        value = (t,)
    else:
        value = t
    return key, check_load(key, value)


def check_load(key: str, value: Any) -> Any:
    """A load setting's value as its flag takes it, typed, in range, and one LoadParams accepts; UsageError
    otherwise (-ot's buffer types are checked where the model loads: they name this machine's devices)."""
    k = LOAD_KNOBS[key]
    if k.kind in (BOOL, SWITCH):
        if not isinstance(value, bool):
            raise UsageError(f"{key} must be true or false, not {value!r}")
    elif k.kind in (INT, FLOAT):
        if isinstance(value, bool) or not isinstance(value, int if k.kind == INT else (int, float)):
            raise UsageError(f"{key} must be {'an integer' if k.kind == INT else 'a number'}, not {value!r}")
        if not math.isfinite(value):
            raise UsageError(f"{key} must be a finite number, not {value!r}")
        if (k.lo is not None and value < k.lo) or (k.hi is not None and value > k.hi):
            raise UsageError(out_of_range(key, k.lo, k.hi, value))
    elif k.kind == TEXTS:
        if isinstance(value, str):
            value = (value,)
        if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
            raise UsageError(f"{key} must be a string or a list of strings, not {str(value)[:80]!r}")
        value = tuple(checked_text(x, key) for x in value)
    elif not isinstance(value, str):
        raise UsageError(f"{key} must be a string, not {value!r}")
    else:
        value = checked_text(value, key)
    LoadParams(**load_fields({key: value}))  # its own checks: cache types, split modes, patterns, ...
    return value


def flash_attn_value(flash_attn: Any, no_flash_attn: bool = False) -> bool | str | None:
    """-fa on|off|auto and --no-flash-attn, as LoadParams wants them (None: not given)."""
    if no_flash_attn:
        return False
    if flash_attn is None:
        return None  # the tuning record's, else the rule's (engine/defaults.py)
    v = str(flash_attn).lower()
    if v in ("on", "1", "true", "enabled"):
        return True
    if v in ("off", "0", "false", "disabled"):
        return False
    if v == "auto":
        return "auto"
    raise UsageError(f"--flash-attn takes on, off or auto, not {flash_attn!r}")


def rpc_servers(text: str | None) -> tuple[str, ...]:
    """--rpc's servers (HOST:PORT,...), each checked for its shape and port range before anything connects or
    loads: a usage error otherwise. The host has no colon, as llama.cpp's own parser splits at the first."""
    servers = tuple(x.strip() for x in str(text or "").split(",") if x.strip())
    if text is not None and not servers:  # `--rpc ""` is never taken for the flag left out
        raise UsageError(f"--rpc {text!r} names no server", hint="give HOST:PORT[,HOST:PORT...], or leave it out")
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or ":" in host or not (port.isascii() and port.isdigit()):
            raise UsageError(f"--rpc takes HOST:PORT[,HOST:PORT...], not {server!r}",
                             hint="e.g. 10.0.0.5:50052, where localgen rpc-server listens")
        if not 1 <= int(port) <= 65535:
            raise UsageError(f"--rpc {server}: the port must be 1 to 65535")
    return servers


def load_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """LoadParams' fields from load settings as their flags take them (the knobs absent stay out, so a layer
    of them can go over another's); --lora's files are the caller's (they are checked on disk)."""
    from localgen import placement

    out: dict[str, Any] = {k.field: values[k.name] for k in LOAD_KNOBS.values() if k.field and k.name in values}
    for name in ("cache_type_k", "cache_type_v", "prefix_reuse"):
        if name in out:
            out[name] = str(out[name]).lower()
    if "flash_attn" in values or values.get("no_flash_attn"):
        out["flash_attn"] = flash_attn_value(values.get("flash_attn"), bool(values.get("no_flash_attn")))
    if "tensor_split" in values:
        text = values["tensor_split"]
        try:
            out["tensor_split"] = tuple(float(x) for x in str(text or "").replace("/", ",").split(",") if x.strip())
        except ValueError:
            raise UsageError(f"--tensor-split takes numbers, e.g. 3,1, not {text!r}") from None
    if "no_mmap" in values:
        out["use_mmap"] = not values["no_mmap"]
    if "mlock" in values:
        out["use_mlock"] = bool(values["mlock"])
    if "rpc" in values:
        out["rpc"] = rpc_servers(values["rpc"])
    if "override_tensor" in values:
        out["override_tensor"] = placement.parse(values["override_tensor"])
    return out
