"""`localgen chat`: the REPL on a terminal; one message per line when stdin is not a terminal. This module is
the Typer signature; chatflow.py runs the conversation and slash.py holds the slash commands."""

from __future__ import annotations

from typing import Annotated

import typer

from localgen.cli import options as o


def chat(
    ctx_: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(show_default=False,
                       help="Conversation name (default: one from the clock). With --resume: the one to go on with."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", "-r", help="Continue the last conversation, or NAME (a saved chat, or a "
                                                  "conversation id from `localgen logs`).")
    ] = False,
    list_: Annotated[bool, typer.Option("--list", "-l", help="List saved conversations and exit.")] = False,
    plain: Annotated[
        bool, typer.Option("--plain", rich_help_panel=o.OUTPUT_PANEL,
                           help="No Markdown rendering or colour (also with NO_COLOR).")
    ] = False,
    stats: Annotated[
        bool, typer.Option("--stats", rich_help_panel=o.OUTPUT_PANEL,
                           help="When scripted (stdin not a terminal): print each answer's stats to stderr.")
    ] = False,
    model: o.Model = None,
    functions: o.Functions = None,
    mcp: o.Mcp = None,
    yes: o.Yes = False,
    tool_choice: o.ToolChoice = "auto",
    tool_steps: o.ToolSteps = 8,
    tool_timeout: o.ToolTimeout = 30.0,
    offline: o.Offline = False,
    chat_template_file: o.ChatTemplateFile = None,
    mmproj: o.MmProj = None,
    system: o.System = None,
    no_log: o.NoLog = False,
    verbose: o.Verbose = False,
    temperature: o.Temperature = o.DEFAULTS.temperature,
    top_k: o.TopK = o.DEFAULTS.top_k,
    top_p: o.TopP = o.DEFAULTS.top_p,
    min_p: o.MinP = o.DEFAULTS.min_p,
    typical_p: o.TypicalP = o.DEFAULTS.typical_p,
    repeat_penalty: o.RepeatPenalty = o.DEFAULTS.repeat_penalty,
    repeat_last_n: o.RepeatLastN = o.DEFAULTS.repeat_last_n,
    presence_penalty: o.PresencePenalty = o.DEFAULTS.presence_penalty,
    frequency_penalty: o.FrequencyPenalty = o.DEFAULTS.frequency_penalty,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = o.DEFAULTS.max_tokens,
    stop: o.Stop = None,
    mirostat: o.Mirostat = o.DEFAULTS.mirostat,
    mirostat_lr: o.MirostatLr = o.DEFAULTS.mirostat_lr,
    mirostat_ent: o.MirostatEnt = o.DEFAULTS.mirostat_ent,
    dry_multiplier: o.DryMultiplier = o.DEFAULTS.dry_multiplier,
    dry_base: o.DryBase = o.DEFAULTS.dry_base,
    dry_allowed_length: o.DryAllowedLength = o.DEFAULTS.dry_allowed_length,
    dry_penalty_last_n: o.DryPenaltyLastN = o.DEFAULTS.dry_penalty_last_n,
    dry_sequence_breaker: o.DrySequenceBreaker = None,
    xtc_probability: o.XtcProbability = o.DEFAULTS.xtc_probability,
    xtc_threshold: o.XtcThreshold = o.DEFAULTS.xtc_threshold,
    top_n_sigma: o.TopNSigma = o.DEFAULTS.top_n_sigma,
    logit_bias: o.LogitBias = None,
    ignore_eos: o.IgnoreEos = False,
    grammar: o.GrammarFile = None,
    json_schema: o.JsonSchema = None,
    json_schema_file: o.JsonSchemaFile = None,
    ctx: o.Ctx = o.LOAD_DEFAULTS.n_ctx,
    threads: o.Threads = None,
    threads_batch: o.ThreadsBatch = None,
    gpu_layers: o.GpuLayers = None,
    batch_size: o.Batch = o.LOAD_DEFAULTS.n_batch,
    ubatch_size: o.UBatch = o.LOAD_DEFAULTS.n_ubatch,
    flash_attn: o.FlashAttn = None,
    no_flash_attn: o.NoFlashAttn = False,
    cache_type_k: o.CacheK = o.LOAD_DEFAULTS.cache_type_k,
    cache_type_v: o.CacheV = o.LOAD_DEFAULTS.cache_type_v,
    repack: o.Repack = None,
    mlock: o.Mlock = False,
    no_mmap: o.NoMmap = False,
    numa: o.Numa = None,
    split_mode: o.SplitMode = o.LOAD_DEFAULTS.split_mode,
    tensor_split: o.TensorSplit = None,
    main_gpu: o.MainGpu = 0,
    rope_scaling: o.RopeScaling = None,
    rope_freq_base: o.RopeFreqBase = 0.0,
    rope_freq_scale: o.RopeFreqScale = 0.0,
    yarn_orig_ctx: o.YarnOrigCtx = 0,
    rpc: o.Rpc = None,
    endpoint: o.Endpoint = None,
    api_key_env: o.ApiKeyEnv = None,
) -> None:
    """Chat with a model. Type /help inside for commands.

    Every conversation is saved as it goes; --resume continues one. With --functions or --mcp the model
    may call tools; each call is shown and runs only once you approve it (y / n / always), unless --yes.
    --grammar, --json-schema and --json-schema-file constrain every answer.
    With stdin not a terminal, each line is a message (a block between two \"\"\" lines is one message;
    lines starting with / are commands) and answers are printed plainly.
    """
    from localgen.cli.chatflow import start

    start(o.Flags(ctx_, dict(locals())))
