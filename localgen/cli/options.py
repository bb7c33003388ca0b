"""Options shared by run, chat, bench and serve: each defined once, its range and help taken from the
one settings table (settings.KNOBS), with llama.cpp's spellings as aliases. `Flags` wraps a command's
parameters; `load_params` and `sampling` turn them into the engine's types through the one validation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from localgen.settings import KNOBS
from localgen.types import KV_CACHE_TYPES, LoadParams, SamplingParams

_D = SamplingParams()
_L = LoadParams()
MODEL_PANEL = "Model and loading"
SAMPLING_PANEL = "Sampling"
OUTPUT_PANEL = "Output"
GPU_PANEL = "GPU, memory and long context"


def _knob(name: str, *flags: str, **kw: Any) -> Any:
    """A typer.Option for a sampling knob: flags, range and help from the table."""
    k = KNOBS[name]
    limits: dict[str, Any] = {}
    if k.kind in ("int", "float"):
        limits = {"min": k.lo, "max": k.hi}
    return typer.Option(*flags, help=k.help, rich_help_panel=SAMPLING_PANEL, **limits, **kw)  # type: ignore[misc]


Model = Annotated[
    str | None,
    typer.Option(
        "--model", "-m", envvar="LOCALGEN_MODEL", rich_help_panel=MODEL_PANEL, show_default=False,
        help="Model name (e.g. smollm2:135m, the default), owner/repo[:QUANT], or path to a .gguf file.",
    ),
]
Ctx = Annotated[
    int,
    typer.Option(
        "--ctx", "--ctx-size", "-c", min=16, envvar="LOCALGEN_CTX", rich_help_panel=MODEL_PANEL,
        help="Context window in tokens (capped at the model's training context unless RoPE scaling is set).",
    ),
]
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads", "-t", min=1, max=1024, rich_help_panel=MODEL_PANEL, show_default=False,
        help="CPU threads for generation (default: the model's tuning record, else the physical performance "
             "cores this process may use).",
    ),
]
ThreadsBatch = Annotated[
    int | None,
    typer.Option(
        "--threads-batch", "-tb", min=1, max=1024, rich_help_panel=MODEL_PANEL, show_default=False,
        help="CPU threads for prompt processing and batches (default: the model's tuning record, else every "
             "logical CPU this process may use).",
    ),
]
GpuLayers = Annotated[
    int | None,
    typer.Option(
        "--gpu-layers", "--n-gpu-layers", "-ngl", min=-1, rich_help_panel=MODEL_PANEL, show_default=False,
        help="Layers to offload to the GPU; -1 all (default: as many as fit when this build can offload, else 0).",
    ),
]
Batch = Annotated[
    int, typer.Option("--batch-size", "-b", min=1, rich_help_panel=MODEL_PANEL, help="Logical batch size.")
]
UBatch = Annotated[
    int | None,
    typer.Option("--ubatch-size", "-ub", min=1, rich_help_panel=MODEL_PANEL, show_default=False,
                 help="Physical batch size (default: the model's tuning record, else 512)."),
]
FlashAttn = Annotated[
    str | None,
    typer.Option(
        "--flash-attn", "-fa", rich_help_panel=MODEL_PANEL, show_default=False, metavar="on|off|auto",
        help="Flash attention (default: the model's tuning record, else on; `localgen tune` measures "
             "which is faster here). auto: llama.cpp decides. A bare -fa means on.",
    ),
]
NoFlashAttn = Annotated[
    bool, typer.Option("--no-flash-attn", "-nofa", rich_help_panel=MODEL_PANEL, help="Same as -fa off.")
]
Repack = Annotated[
    bool | None,
    typer.Option("--repack/--no-repack", rich_help_panel=MODEL_PANEL, show_default=False,
                 help="llama.cpp's repacked CPU weight layouts (default: the model's tuning record, else on "
                      "where at least half the weights are of a repackable type, off on a GPU)."),
]
_kv_help = "KV-cache type for {}: " + ", ".join(KV_CACHE_TYPES) + "."
CacheK = Annotated[
    str, typer.Option("--cache-type-k", "-ctk", rich_help_panel=MODEL_PANEL, help=_kv_help.format("keys"))
]
CacheV = Annotated[
    str, typer.Option("--cache-type-v", "-ctv", rich_help_panel=MODEL_PANEL, help=_kv_help.format("values"))
]
Mlock = Annotated[
    bool, typer.Option("--mlock", rich_help_panel=GPU_PANEL, help="Keep the model in RAM (no swapping).")
]
NoMmap = Annotated[
    bool, typer.Option("--no-mmap", rich_help_panel=GPU_PANEL,
                       help="Read the model into memory instead of mapping it (slower load, no page faults).")
]
Numa = Annotated[
    str | None,
    typer.Option("--numa", rich_help_panel=GPU_PANEL, show_default=False, metavar="distribute|isolate|numactl",
                 help="NUMA strategy on multi-socket machines."),
]
SplitMode = Annotated[
    str, typer.Option("--split-mode", "-sm", rich_help_panel=GPU_PANEL, metavar="none|layer|row",
                      help="How to split the model over several GPUs.")
]
TensorSplit = Annotated[
    str | None,
    typer.Option("--tensor-split", "-ts", rich_help_panel=GPU_PANEL, show_default=False, metavar="N,N,...",
                 help="Proportions of the model per GPU (and RPC device), e.g. 3,1."),
]
MainGpu = Annotated[
    int, typer.Option("--main-gpu", "-mg", min=0, rich_help_panel=GPU_PANEL,
                      help="The GPU for the whole model with --split-mode none (and for scratch with row).")
]
RopeScaling = Annotated[
    str | None,
    typer.Option("--rope-scaling", rich_help_panel=GPU_PANEL, show_default=False, metavar="none|linear|yarn",
                 help="RoPE scaling for contexts beyond training (YaRN for Qwen 2.5/3 past 32k)."),
]
RopeFreqBase = Annotated[
    float, typer.Option("--rope-freq-base", min=0.0, rich_help_panel=GPU_PANEL,
                        help="RoPE base frequency; 0 from the model.")
]
RopeFreqScale = Annotated[
    float, typer.Option("--rope-freq-scale", min=0.0, rich_help_panel=GPU_PANEL,
                        help="RoPE frequency scale (1/N stretches the context N times); 0 from the model.")
]
YarnOrigCtx = Annotated[
    int, typer.Option("--yarn-orig-ctx", min=0, rich_help_panel=GPU_PANEL,
                      help="YaRN: the model's original training context; 0 from the model.")
]
Rpc = Annotated[
    str | None,
    typer.Option("--rpc", envvar="LLAMA_ARG_RPC", rich_help_panel=GPU_PANEL, show_default=False,
                 metavar="HOST:PORT,...",
                 help="llama.cpp RPC servers (localgen rpc-server) whose devices take part of the model."),
]
REMOTE_PANEL = "Remote endpoints"
Endpoint = Annotated[
    list[str] | None,
    typer.Option("--endpoint", envvar="LOCALGEN_ENDPOINT", rich_help_panel=REMOTE_PANEL, show_default=False,
                 metavar="URL",
                 help="An OpenAI-compatible server (vLLM, llama-server, Ollama, localgen serve, ...) to send the work "
                      "to instead of loading a model here; -m names its model. Repeat to spread run --file lines."),
]
ApiKeyEnv = Annotated[
    str | None,
    typer.Option("--api-key-env", rich_help_panel=REMOTE_PANEL, show_default=False, metavar="NAME",
                 help="The environment variable holding the endpoint's API key (none is read unless named)."),
]
# flags that only mean something where the model is loaded here
LOCAL_ONLY = {
    "threads": "--threads", "threads_batch": "--threads-batch", "gpu_layers": "--n-gpu-layers",
    "batch_size": "--batch-size", "ubatch_size": "--ubatch-size", "flash_attn": "--flash-attn",
    "no_flash_attn": "--no-flash-attn", "cache_type_k": "--cache-type-k", "cache_type_v": "--cache-type-v",
    "repack": "--repack", "mlock": "--mlock", "no_mmap": "--no-mmap", "numa": "--numa", "split_mode": "--split-mode",
    "tensor_split": "--tensor-split", "main_gpu": "--main-gpu", "rope_scaling": "--rope-scaling",
    "rope_freq_base": "--rope-freq-base", "rope_freq_scale": "--rope-freq-scale", "yarn_orig_ctx": "--yarn-orig-ctx",
    "rpc": "--rpc", "offline": "--offline", "verbose": "--verbose", "dry_sequence_breaker": "--dry-sequence-breaker",
}


def remote_conflicts(f: Flags, extra: dict[str, str] | None = None) -> list[str]:
    """The flags given that a remote endpoint cannot honour (the load happens on the server)."""
    names = {**LOCAL_ONLY, **(extra or {})}
    return [flag for key, flag in names.items() if key in f._values and f.given(key) and f._values[key]
            not in (None, False, [], ())]


Verbose = Annotated[
    bool, typer.Option("--verbose", rich_help_panel=OUTPUT_PANEL, help="Show llama.cpp's log lines on stderr.")
]

Temperature = Annotated[float, _knob("temperature", "--temperature", "--temp")]
TopK = Annotated[int, _knob("top_k", "--top-k")]
TopP = Annotated[float, _knob("top_p", "--top-p")]
MinP = Annotated[float, _knob("min_p", "--min-p")]
TypicalP = Annotated[float, _knob("typical_p", "--typical-p", "--typical")]
RepeatPenalty = Annotated[float, _knob("repeat_penalty", "--repeat-penalty")]
RepeatLastN = Annotated[int, _knob("repeat_last_n", "--repeat-last-n")]
PresencePenalty = Annotated[float, _knob("presence_penalty", "--presence-penalty")]
FrequencyPenalty = Annotated[float, _knob("frequency_penalty", "--frequency-penalty")]
Seed = Annotated[int | None, _knob("seed", "--seed", "-s", show_default=False)]
MaxTokens = Annotated[int, _knob("max_tokens", "--max-tokens", "--n-predict", "-n")]
Stop = Annotated[list[str] | None, _knob("stop", "--stop", show_default=False)]
Mirostat = Annotated[int, _knob("mirostat", "--mirostat")]
MirostatLr = Annotated[float, _knob("mirostat_lr", "--mirostat-lr")]
MirostatEnt = Annotated[float, _knob("mirostat_ent", "--mirostat-ent")]
DryMultiplier = Annotated[float, _knob("dry_multiplier", "--dry-multiplier")]
DryBase = Annotated[float, _knob("dry_base", "--dry-base")]
DryAllowedLength = Annotated[int, _knob("dry_allowed_length", "--dry-allowed-length")]
DryPenaltyLastN = Annotated[int, _knob("dry_penalty_last_n", "--dry-penalty-last-n")]
DrySequenceBreaker = Annotated[list[str] | None, _knob("dry_sequence_breaker", "--dry-sequence-breaker",
                                                       show_default=False)]
XtcProbability = Annotated[float, _knob("xtc_probability", "--xtc-probability")]
XtcThreshold = Annotated[float, _knob("xtc_threshold", "--xtc-threshold")]
TopNSigma = Annotated[float, _knob("top_n_sigma", "--top-n-sigma")]
# no -l: chat's -l is --list, and a short option means one thing in every command
LogitBias = Annotated[list[str] | None, _knob("logit_bias", "--logit-bias", show_default=False)]
IgnoreEos = Annotated[bool, _knob("ignore_eos", "--ignore-eos")]
LOG_PANEL = "Log"
NoLog = Annotated[
    bool, typer.Option("--no-log", rich_help_panel=LOG_PANEL,
                       help="Keep this out of the log of prompts and answers (`localgen logs`).")
]

System = Annotated[
    str | None,
    typer.Option("--system", "--system-prompt", "-sys", rich_help_panel=SAMPLING_PANEL, show_default=False,
                 help="System prompt."),
]
GrammarFile = Annotated[
    str | None,
    typer.Option("--grammar", "--grammar-file", rich_help_panel=SAMPLING_PANEL, show_default=False,
                 help="Constrain output to a GBNF grammar: the path of a file, or the grammar itself "
                      "(root ::= \"yes\" | \"no\")."),
]
JsonSchema = Annotated[
    str | None,
    typer.Option("--json-schema", "-j", rich_help_panel=SAMPLING_PANEL, show_default=False,
                 help="Constrain output to JSON matching this JSON schema (inline, or the path of a file)."),
]
JsonSchemaFile = Annotated[
    Path | None,
    typer.Option("--json-schema-file", "-jf", exists=True, dir_okay=False, readable=True,
                 rich_help_panel=SAMPLING_PANEL, show_default=False, help="A file holding the JSON schema."),
]
Logprobs = Annotated[
    int | None,
    typer.Option("--logprobs", min=0, max=20, rich_help_panel=OUTPUT_PANEL, show_default=False,
                 help="With --json (and JSONL output): each token's log-probability and its N likeliest "
                      "alternatives."),
]

ChatTemplateFile = Annotated[
    Path | None,
    typer.Option("--chat-template-file", exists=True, dir_okay=False, readable=True, rich_help_panel=MODEL_PANEL,
                 show_default=False,
                 help="A Jinja chat template to use instead of the model's own (e.g. one that renders tools)."),
]
MmProj = Annotated[
    Path | None,
    typer.Option("--mmproj", dir_okay=False, rich_help_panel=MODEL_PANEL, show_default=False,
                 help="A multimodal projector (mmproj GGUF) for the model: lets it read images or audio."),
]
TOOLS_PANEL = "Tools"
Functions = Annotated[
    list[Path] | None,
    typer.Option("--functions", exists=True, dir_okay=False, readable=True, rich_help_panel=TOOLS_PANEL,
                 show_default=False,
                 help="A Python file whose public functions the model may call; type hints and docstrings make "
                      "each tool's schema (repeatable)."),
]
Mcp = Annotated[
    list[str] | None,
    typer.Option("--mcp", rich_help_panel=TOOLS_PANEL, show_default=False,
                 help="An MCP server whose tools the model may call: a command line (\"uvx some-server\", over "
                      "stdio) or an http(s) URL (streamable HTTP). Repeatable."),
]
ToolChoice = Annotated[
    str, typer.Option("--tool-choice", rich_help_panel=TOOLS_PANEL,
                      help="auto (the model decides), required (its first answer must call a tool), none, or a "
                           "tool's name (its first answer calls that tool).")
]
ToolSteps = Annotated[
    int, typer.Option("--tool-steps", min=1, max=100, rich_help_panel=TOOLS_PANEL,
                      help="At most this many rounds of tool calls for one prompt.")
]
Yes = Annotated[
    bool, typer.Option("--yes", "-y", rich_help_panel=TOOLS_PANEL,
                       help="Run the model's tool calls without asking first.")
]
ToolTimeout = Annotated[
    float, typer.Option("--tool-timeout", min=0.1, rich_help_panel=TOOLS_PANEL,
                        help="Seconds one tool call may take before it fails.")
]


def with_template(f: Flags, ref: Any) -> Any:
    """The model with --chat-template-file's template in place of its own, and --mmproj's projector (checked
    against the model's width from the two headers, before anything loads)."""
    import dataclasses

    proj = f.get("mmproj")
    if proj is not None:
        from localgen.models import mmproj

        ref = mmproj.attach(ref, str(proj))
    path = f.get("chat_template_file")
    if path is None:
        return ref
    from localgen.errors import UsageError

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read the chat template {path}: {e}") from None
    if not text.strip():
        raise UsageError(f"the chat template file {path} is empty")
    return dataclasses.replace(ref, summary=dataclasses.replace(ref.summary, chat_template=text))


def output_grammar(f: Flags) -> tuple[str | None, str | None]:
    """The GBNF grammar of --grammar, -j/--json-schema or -jf/--json-schema-file, and the JSON schema it came
    from (a remote server takes the schema itself); (None, None) without them."""
    from localgen.errors import UsageError

    if len([x for x in (f.get("grammar"), f.get("json_schema"), f.get("json_schema_file")) if x]) > 1:
        raise UsageError("--grammar, --json-schema and --json-schema-file cannot be combined")
    if f.get("grammar") is not None:
        return _gbnf(str(f.grammar)), None
    schema: str | None = None
    if f.get("json_schema_file"):
        schema = Path(f.json_schema_file).read_text(encoding="utf-8", errors="replace")
    elif f.get("json_schema"):
        schema = f.json_schema
        if not schema.lstrip().startswith(("{", "[")) and Path(schema).expanduser().is_file():
            schema = Path(schema).expanduser().read_text(encoding="utf-8", errors="replace")
    if schema is None:
        return None, None
    from localgen.engine.grammar import grammar_from_json_schema

    return grammar_from_json_schema(schema), schema


def _gbnf(value: str) -> str:
    """--grammar's GBNF: the file it names when one exists, else the value itself when it has a rule (llama.cpp
    parses it when the model loads, where a vocabulary is at hand)."""
    from localgen.errors import UsageError

    if not value.strip():
        raise UsageError("--grammar is empty: give a GBNF file or the grammar itself (root ::= ...)")
    path = Path(value).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise UsageError(f"cannot read the grammar file {value}: {e.strerror or e}") from None
        if not text.strip():
            raise UsageError(f"the grammar file {value} is empty")
        return text
    if "::=" in value:
        return value
    what = "is a directory" if path.is_dir() else "does not exist"
    raise UsageError(f"--grammar {value[:100]!r}: the file {what}, and the text is not GBNF (a grammar has rules, "
                     "such as root ::= \"yes\" | \"no\")")


Offline = Annotated[
    bool,
    typer.Option("--offline", envvar="LOCALGEN_OFFLINE", rich_help_panel=MODEL_PANEL,
                 help="Use only models already on disk; never touch the network (also HF_HUB_OFFLINE=1)."),
]

DEFAULTS = _D
LOAD_DEFAULTS = _L
SAMPLING_FLAGS = tuple(KNOBS)


class Flags:
    """A command's parameters by name, and whether the user gave each one (command line or env var)."""

    def __init__(self, ctx: typer.Context, values: dict[str, Any]) -> None:
        self._ctx = ctx
        self._values = values

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def get(self, name: str, default: Any = None) -> Any:
        """A parameter, or `default` where the command has none."""
        return self._values.get(name, default)

    def given(self, name: str) -> bool:
        """Whether the user set this parameter, as opposed to its default."""
        source = self._ctx.get_parameter_source(name)  # None: no such parameter
        return source is not None and source.name != "DEFAULT"  # command line, env var, default map, prompt


def flash_attn(f: Flags) -> bool | str | None:
    """-fa on|off|auto and --no-flash-attn, as LoadParams wants them (None: not given)."""
    from localgen.errors import UsageError

    if f.get("no_flash_attn"):
        return False
    value = f.get("flash_attn")
    if value is None:
        return None  # the tuning record's, else the rule's (engine/defaults.py)
    v = str(value).lower()
    if v in ("on", "1", "true", "enabled"):
        return True
    if v in ("off", "0", "false", "disabled"):
        return False
    if v == "auto":
        return "auto"
    raise UsageError(f"--flash-attn takes on, off or auto, not {value!r}")


def load_params(f: Flags, **override: Any) -> LoadParams:
    """LoadParams from the shared flags (those a command lacks keep their defaults)."""
    from localgen.errors import UsageError

    split: tuple[float, ...] = ()
    if f.get("tensor_split"):
        try:
            split = tuple(float(x) for x in str(f.tensor_split).replace("/", ",").split(",") if x.strip())
        except ValueError:
            raise UsageError(f"--tensor-split takes numbers, e.g. 3,1, not {f.tensor_split!r}") from None
    rpc = tuple(x.strip() for x in str(f.get("rpc") or "").split(",") if x.strip())
    values: dict[str, Any] = dict(
        n_ctx=f.get("ctx", _L.n_ctx), n_threads=f.get("threads"), n_threads_batch=f.get("threads_batch"),
        n_gpu_layers=f.get("gpu_layers"), n_batch=f.get("batch_size", _L.n_batch),
        n_ubatch=f.get("ubatch_size"), flash_attn=flash_attn(f),
        cache_type_k=str(f.get("cache_type_k", _L.cache_type_k)).lower(),
        cache_type_v=str(f.get("cache_type_v", _L.cache_type_v)).lower(), repack=f.get("repack"),
        use_mmap=not f.get("no_mmap", False), use_mlock=bool(f.get("mlock", False)), numa=f.get("numa"),
        split_mode=f.get("split_mode", _L.split_mode), tensor_split=split, main_gpu=f.get("main_gpu", 0),
        rope_scaling=f.get("rope_scaling"), rope_freq_base=f.get("rope_freq_base", 0.0),
        rope_freq_scale=f.get("rope_freq_scale", 0.0), yarn_orig_ctx=f.get("yarn_orig_ctx", 0), rpc=rpc,
    )
    values.update(override)
    return LoadParams(**values)


def sampling(f: Flags, *layers: dict[str, Any], grammar: str | None = None) -> SamplingParams:
    """Flags win where given; otherwise the last layer that sets a knob (catalogue defaults, then a chat's
    saved /set values), otherwise the built-in default. Everything goes through settings.validate."""
    from localgen import settings

    values: dict[str, Any] = {}
    for layer in layers:
        values.update(settings.validate(layer))
    for key in SAMPLING_FLAGS:
        if key in f._values and (f.given(key) or key not in values):
            v = f._values[key]
            if key in ("stop", "dry_sequence_breaker", "logit_bias"):
                if v is None:
                    if key in values:
                        continue
                    v = getattr(_D, key)
                elif key == "dry_sequence_breaker" and [x.lower() for x in v] == ["none"]:
                    v = ()
            values[key] = v
    checked = settings.validate(values)
    return SamplingParams(**checked, grammar=grammar)
