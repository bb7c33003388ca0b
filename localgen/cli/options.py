"""Options shared by run, chat and bench: each defined once, with its default, range and env var."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from localgen.types import KV_CACHE_TYPES, LoadParams, SamplingParams

_D = SamplingParams()
_L = LoadParams()
MODEL_PANEL = "Model and loading"
SAMPLING_PANEL = "Sampling"
OUTPUT_PANEL = "Output"

Model = Annotated[
    str | None,
    typer.Option(
        "--model", "-m", envvar="LOCALGEN_MODEL", rich_help_panel=MODEL_PANEL, show_default=False,
        help="Model name (e.g. smollm2:135m, the default) or path to a .gguf file.",
    ),
]
Ctx = Annotated[
    int,
    typer.Option(
        "--ctx", "-c", min=16, envvar="LOCALGEN_CTX", rich_help_panel=MODEL_PANEL,
        help="Context window in tokens (capped at the model's training context).",
    ),
]
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads", "-t", min=1, max=1024, rich_help_panel=MODEL_PANEL, show_default=False,
        help="CPU threads (default: the cores this process may use).",
    ),
]
GpuLayers = Annotated[
    int | None,
    typer.Option(
        "--gpu-layers", "-ngl", min=-1, rich_help_panel=MODEL_PANEL, show_default=False,
        help="Layers to offload to the GPU; -1 all (default: all when this build can offload, else 0).",
    ),
]
Batch = Annotated[
    int, typer.Option("--batch-size", "-b", min=1, rich_help_panel=MODEL_PANEL, help="Logical batch size.")
]
UBatch = Annotated[
    int, typer.Option("--ubatch-size", "-ub", min=1, rich_help_panel=MODEL_PANEL, help="Physical batch size.")
]
FlashAttn = Annotated[
    bool,
    typer.Option(
        "--flash-attn/--no-flash-attn", "-fa/-nofa", rich_help_panel=MODEL_PANEL,
        help="Flash attention (faster prefill and decode; needed for a quantized V cache).",
    ),
]
Repack = Annotated[
    bool,
    typer.Option("--repack/--no-repack", rich_help_panel=MODEL_PANEL,
                 help="llama.cpp's repacked CPU weight layouts (faster prompt processing for some quantizations)."),
]
_kv_help = "KV-cache type for {}: " + ", ".join(KV_CACHE_TYPES) + "."
CacheK = Annotated[
    str, typer.Option("--cache-type-k", "-ctk", rich_help_panel=MODEL_PANEL, help=_kv_help.format("keys"))
]
CacheV = Annotated[
    str, typer.Option("--cache-type-v", "-ctv", rich_help_panel=MODEL_PANEL, help=_kv_help.format("values"))
]
Verbose = Annotated[
    bool, typer.Option("--verbose", rich_help_panel=OUTPUT_PANEL, help="Show llama.cpp's log lines on stderr.")
]

Temperature = Annotated[
    float,
    typer.Option("--temperature", "--temp", min=0.0, max=5.0, rich_help_panel=SAMPLING_PANEL,
                 help="Randomness; 0 is greedy."),
]
TopK = Annotated[
    int, typer.Option("--top-k", min=0, rich_help_panel=SAMPLING_PANEL, help="Keep the K likeliest tokens; 0 off.")
]
TopP = Annotated[
    float,
    typer.Option("--top-p", min=0.0, max=1.0, rich_help_panel=SAMPLING_PANEL,
                 help="Nucleus sampling: smallest set with this probability mass; 1 off."),
]
MinP = Annotated[
    float,
    typer.Option("--min-p", min=0.0, max=1.0, rich_help_panel=SAMPLING_PANEL,
                 help="Drop tokens below this fraction of the likeliest one's probability; 0 off."),
]
TypicalP = Annotated[
    float,
    typer.Option("--typical-p", "--typical", min=0.0, max=1.0, rich_help_panel=SAMPLING_PANEL,
                 help="Locally typical sampling; 1 off."),
]
RepeatPenalty = Annotated[
    float,
    typer.Option("--repeat-penalty", min=0.0, max=10.0, rich_help_panel=SAMPLING_PANEL,
                 help="Penalize tokens seen in the last --repeat-last-n; 1 off."),
]
RepeatLastN = Annotated[
    int,
    typer.Option("--repeat-last-n", min=-1, rich_help_panel=SAMPLING_PANEL,
                 help="Window for the penalties; 0 off, -1 the whole context."),
]
PresencePenalty = Annotated[
    float,
    typer.Option("--presence-penalty", min=-2.0, max=2.0, rich_help_panel=SAMPLING_PANEL,
                 help="Flat penalty on tokens already present; 0 off."),
]
FrequencyPenalty = Annotated[
    float,
    typer.Option("--frequency-penalty", min=-2.0, max=2.0, rich_help_panel=SAMPLING_PANEL,
                 help="Penalty growing with each repeat; 0 off."),
]
Seed = Annotated[
    int | None,
    typer.Option("--seed", "-s", min=0, max=2**32 - 1, rich_help_panel=SAMPLING_PANEL, show_default=False,
                 help="Random seed: the same seed gives the same text (default: a new one each run)."),
]
MaxTokens = Annotated[
    int,
    typer.Option("--max-tokens", "-n", min=-1, rich_help_panel=SAMPLING_PANEL,
                 help="Most tokens to generate; -1 until the model stops or the context is full."),
]
Stop = Annotated[
    list[str] | None,
    typer.Option("--stop", rich_help_panel=SAMPLING_PANEL, show_default=False,
                 help="Stop before this text (repeatable)."),
]
System = Annotated[
    str | None,
    typer.Option("--system", rich_help_panel=SAMPLING_PANEL, show_default=False, help="System prompt."),
]
GrammarFile = Annotated[
    Path | None,
    typer.Option("--grammar", exists=True, dir_okay=False, readable=True, rich_help_panel=SAMPLING_PANEL,
                 show_default=False, help="Constrain output to a GBNF grammar file."),
]
JsonSchemaFile = Annotated[
    Path | None,
    typer.Option("--json-schema", exists=True, dir_okay=False, readable=True, rich_help_panel=SAMPLING_PANEL,
                 show_default=False, help="Constrain output to JSON matching this JSON-schema file."),
]

Offline = Annotated[
    bool,
    typer.Option("--offline", envvar="LOCALGEN_OFFLINE", rich_help_panel=MODEL_PANEL,
                 help="Use only models already on disk; never touch the network (also HF_HUB_OFFLINE=1)."),
]

DEFAULTS = _D
LOAD_DEFAULTS = _L


SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
                  "presence_penalty", "frequency_penalty", "seed", "max_tokens", "stop")


def sampling_flags(values: dict[str, Any]) -> dict[str, Any]:
    """The sampling flags from a command's parameters (pass `locals()`), by their SamplingParams names."""
    flags = {k: values[k] for k in SAMPLING_FLAGS}
    flags["stop"] = tuple(flags["stop"] or ())
    return flags


def given(ctx: typer.Context, param: str) -> bool:
    """Whether the user set this option (command line or env var), as opposed to its default."""
    from typer._click.core import ParameterSource  # type: ignore[import-not-found]

    try:
        return ctx.get_parameter_source(param) not in (ParameterSource.DEFAULT, None)
    except Exception:
        return False


def sampling_params(ctx: typer.Context, flags: dict[str, Any], *layers: dict[str, Any]) -> SamplingParams:
    """Flags win where given; otherwise the last layer that sets a knob (catalogue defaults, then a chat's
    saved /set values), otherwise the built-in default."""
    values = dict(flags)
    for key in values:
        if given(ctx, key):
            continue
        for layer in layers:
            if key in layer:
                values[key] = tuple(layer[key]) if key == "stop" else layer[key]
    return SamplingParams(**values)


def load_params(
    ctx: int, threads: int | None, gpu_layers: int | None, batch: int, ubatch: int, flash_attn: bool,
    cache_type_k: str, cache_type_v: str, repack: bool = True,
) -> LoadParams:
    """LoadParams from the shared flags."""
    return LoadParams(
        n_ctx=ctx, n_threads=threads, n_threads_batch=threads, n_gpu_layers=gpu_layers, n_batch=batch,
        n_ubatch=ubatch, flash_attn=flash_attn, cache_type_k=cache_type_k.lower(),
        cache_type_v=cache_type_v.lower(), repack=repack,
    )
