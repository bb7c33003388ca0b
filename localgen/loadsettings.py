"""Every load setting once: its flags, help, range, default (LoadParams') and Ollama's option (LOAD_KNOBS, which
the CLI's options are built from); and load settings as values: their names (a Modelfile's PARAMETER lines, a
preset), parsed and checked as a load would check them, and turned into LoadParams' fields. The sampling settings
are settings.py's."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localgen.errors import UsageError
from localgen.hostnames import host_fault
from localgen.settings import BOOL, FLOAT, INT, INT32, TEXTS, out_of_range, shown_value
from localgen.text import checked as checked_text
from localgen.types import KV_CACHE_TYPES, LoadParams


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
    LoadKnob("ctx", INT, ("--ctx", "--ctx-size", "-c"), "Context window in tokens, each sequence's: each of "
             "serve's -np slots has its own (0: the model's training context, which caps it unless RoPE scaling is "
             "set).",
             "n_ctx", lo=0, hi=INT32, envvar="LOCALGEN_CTX", ollama="num_ctx"),
    LoadKnob("threads", INT, ("--threads", "-t"), "CPU threads for generation (default: the model's tuning record, "
             "else the physical performance cores this process may use).", "n_threads", 1, 1024, ollama="num_thread"),
    LoadKnob("threads_batch", INT, ("--threads-batch", "-tb"), "CPU threads for prompt processing and batches "
             "(default: the model's tuning record, else every logical CPU this process may use).", "n_threads_batch",
             1, 1024),
    LoadKnob("gpu_layers", INT, ("--gpu-layers", "--n-gpu-layers", "-ngl"), "Layers to offload to the GPU; -1 all "
             "(default: as many as fit when this build can offload, else 0).", "n_gpu_layers", -1, INT32,
             ollama="num_gpu"),
    LoadKnob("batch_size", INT, ("--batch-size", "-b"), "Logical batch size.", "n_batch", 1, INT32, ollama="num_batch"),
    LoadKnob("ubatch_size", INT, ("--ubatch-size", "-ub"), "Physical batch size (default: the model's tuning "
             "record, else 512).", "n_ubatch", 1, INT32),
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
             "(default: a stream per sequence, on a CPU and on a GPU alike, as llama-server -np N and "
             "llama-batched-bench keep them; --exact always keeps a stream per sequence).",
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
             "n_cpu_moe", 0, INT32, panel=GPU, envvar="LLAMA_ARG_N_CPU_MOE", metavar="N"),
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
    "use_mmap", "low_vram", "f16_kv", "vocab_only", "penalize_newline", "tfs_z"} | {
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
    return key, check_load(key, value, f"PARAMETER {name}")  # -ot's and --rpc's errors name the line's setting


def check_load(key: str, value: Any, name: str | None = None) -> Any:
    """A load setting's value as its flag takes it, typed, in range, and one LoadParams accepts; UsageError
    otherwise (-ot's buffer types are checked where the model loads: they name this machine's devices). `name`:
    where the value was written (`PARAMETER override_tensor`), which -ot's and --rpc's errors name for their flag."""
    k = LOAD_KNOBS[key]
    if k.kind in (BOOL, SWITCH):
        if not isinstance(value, bool):
            raise UsageError(f"{key} must be true or false, not {shown_value(value)}")
    elif k.kind in (INT, FLOAT):
        if isinstance(value, bool) or not isinstance(value, int if k.kind == INT else (int, float)):
            raise UsageError(f"{key} must be {'an integer' if k.kind == INT else 'a number'}, not {shown_value(value)}")
        if not math.isfinite(value):
            raise UsageError(f"{key} must be a finite number, not {shown_value(value)}")
        if (k.lo is not None and value < k.lo) or (k.hi is not None and value > k.hi):
            raise UsageError(out_of_range(key, k.lo, k.hi, value))
    elif k.kind == TEXTS:
        if isinstance(value, str):
            value = (value,)
        if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
            raise UsageError(f"{key} must be a string or a list of strings, not {str(value)[:80]!r}")
        value = tuple(checked_text(x, key) for x in value)
    elif not isinstance(value, str):
        raise UsageError(f"{key} must be a string, not {shown_value(value)}")
    else:
        value = checked_text(value, key)
    LoadParams(**load_fields({key: value}, {key: name} if name else None))  # its own checks: patterns, ...
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


def rpc_servers(text: str | None, name: str = "--rpc") -> tuple[str, ...]:
    """--rpc's servers (HOST:PORT,...), each checked for its shape and port range before anything connects or
    loads: a usage error otherwise, which names `name` (the flag, or LLAMA_ARG_RPC where the value came from
    it). The host has no colon, as llama.cpp's own parser splits at the first."""
    servers = tuple(x.strip() for x in str(text or "").split(",") if x.strip())
    if text is not None and not servers:  # `--rpc ""` is never taken for the flag left out
        raise UsageError(f"{name} {text!r} names no server", hint="give HOST:PORT[,HOST:PORT...], or leave it out")
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or ":" in host or not (port.isascii() and port.isdigit()):
            raise UsageError(f"{name} takes HOST:PORT[,HOST:PORT...], not {server!r}",
                             hint="e.g. 10.0.0.5:50052, where localgen rpc-server listens")
        if not 1 <= int(port) <= 65535:
            raise UsageError(f"{name} {server}: the port must be 1 to 65535")
        if fault := host_fault(host):
            raise UsageError(f"{name} {server!r} has {fault}",
                             hint="e.g. 10.0.0.5:50052, where localgen rpc-server listens")
    repeated = next((x for i, x in enumerate(servers) if x in servers[:i]), None)
    if repeated is not None:  # llama.cpp would add it once: the layers planned for two servers would go to one
        raise UsageError(f"{name} names {repeated} twice", hint="give each server once")
    return servers


def load_fields(values: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """LoadParams' fields from load settings as their flags take them (the knobs absent stay out, so a layer
    of them can go over another's); --lora's files are the caller's (they are checked on disk). `sources`: the
    name a setting's errors give where not its flag (the variable its value came from, a preset's PARAMETER line)."""
    from localgen import placement

    said = {"rpc": "--rpc", "override_tensor": "--override-tensor", **(sources or {})}

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
        out["rpc"] = rpc_servers(values["rpc"], said["rpc"])
    if "override_tensor" in values:
        out["override_tensor"] = placement.parse(values["override_tensor"], said["override_tensor"])
    return out
