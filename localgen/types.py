"""Value types shared by every layer: settings in, chunks and stats out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

FinishReason = Literal["stop", "eos", "length", "context", "cancelled"]

# llama.cpp KV-cache types a user may pick, with their GGML_TYPE_* values.
KV_CACHE_TYPES: dict[str, int] = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}


DRY_BREAKERS = ("\n", ":", "\"", "*")
MAX_DEVICES = 16  # llama.cpp's most devices (llama_max_devices): -ts proportions, --gpu-memory cards


@dataclass(frozen=True)
class SamplingParams:
    """Every sampling knob, with its default defined once (llama.cpp's defaults). Ranges and types live in
    settings.KNOBS; the sampler chain that applies them is native/sampler.py."""

    temperature: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exp: float = 1.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = -1  # -1: until end of generation or the context is full; 0: nothing
    reasoning_budget: int = -1  # tokens of thinking before the block is closed for the model (engine/budget.py)
    stop: tuple[str, ...] = ()
    mirostat: int = 0
    mirostat_lr: float = 0.1
    mirostat_ent: float = 5.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breaker: tuple[str, ...] = DRY_BREAKERS
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    top_n_sigma: float = -1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    grammar: str | None = None  # GBNF text (a JSON schema is converted before it gets here)
    grammar_triggers: tuple[str, ...] = ()  # regexes: the grammar waits for one to match (lazy), then constrains
    # the settings someone set (a flag, a model's recommended values, /set, a JSON line's own): a remote server
    # is sent these even where they equal the defaults above, and left its own defaults for the rest
    asked: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def greedy(self) -> bool:
        """Whether sampling picks the likeliest token every time."""
        return self.temperature <= 0 or (self.top_k == 1 and self.mirostat == 0)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON output (valid JSON: a bias of ±inf is the string "-inf" or "inf")."""
        d = asdict(self)
        del d["asked"]
        d["stop"] = list(self.stop)
        d["dry_sequence_breaker"] = list(self.dry_sequence_breaker)
        # a ban (-inf) as JSON can carry it: the string "-inf", as --logit-bias spells it (and reads it back)
        d["logit_bias"] = [[tok, str(bias) if math.isinf(bias) else bias] for tok, bias in self.logit_bias]
        return d


SPLIT_MODES = ("none", "layer", "row")
ROPE_SCALINGS = ("none", "linear", "yarn")
NUMA_MODES = ("distribute", "isolate", "numactl")
PREFIX_REUSE = ("exact", "all")  # what a reused prefix keeps: engine/tokens.py, reusable_prefix


TRAINED_CTX = 0  # --ctx 0: the model's trained context, as llama.cpp's -c 0
MIN_CTX_FLAG = 16  # the least --ctx other than 0
MAX_CTX = 2**31 - 1  # the most --ctx: llama.cpp takes it as a C int
# the most cells a context gets: the largest multiple of 256 (llama.cpp pads a context to one) a C int holds, so
# --ctx 2147483647, padded up, is not 2**31
MAX_CELLS = MAX_CTX // 256 * 256
# the load settings llama.cpp takes as C ints, with their flags: at most MAX_CTX (2**32 wrapped to 0 in ctypes)
C_INT_FIELDS = {"n_ctx": "--ctx", "n_batch": "--batch-size", "n_ubatch": "--ubatch-size",
                "n_gpu_layers": "--gpu-layers", "n_cpu_moe": "--n-cpu-moe", "main_gpu": "--main-gpu",
                "yarn_orig_ctx": "--yarn-orig-ctx"}


@dataclass(frozen=True)
class LoadParams:
    """How a model is loaded: context, threads, offload, batching, attention, KV cache, memory, RoPE."""

    n_ctx: int = 4096  # TRAINED_CTX (0): the model's trained context (for_model)
    n_threads: int | None = None  # None: the physical cores this process may use
    n_threads_batch: int | None = None  # None: every logical CPU this process may use
    n_gpu_layers: int | None = None  # None: as many as fit when this build can offload, else 0
    n_batch: int = 512
    n_ubatch: int | None = None  # None: tuned, else 512
    # None: this machine's tuning record for the model, else localgen's rule (tuning.py); "auto": llama.cpp's
    flash_attn: bool | str | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    use_mmap: bool = True
    use_mlock: bool = False
    numa: str | None = None
    repack: bool | None = None  # llama.cpp's repacked CPU weight layouts; None: where they pay (engine.repack)
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = 0
    rope_scaling: str | None = None  # None: from the model
    rope_freq_base: float = 0.0  # 0: from the model
    rope_freq_scale: float = 0.0  # 0: from the model
    yarn_orig_ctx: int = 0  # 0: from the model
    rpc: tuple[str, ...] = ()  # llama.cpp RPC servers (HOST:PORT) whose devices join the load
    lora: tuple[tuple[str, float], ...] = ()  # LoRA adapters (GGUF path, scale) applied over the model's own
    # tensor placement (placement.py): -ot's (pattern, buffer type) pairs; --cpu-moe; --n-cpu-moe N (None: the
    # planner's, models/fit.py: experts stay in RAM only where the GPU has no room for them)
    override_tensor: tuple[tuple[str, str], ...] = ()
    cpu_moe: bool = False
    n_cpu_moe: int | None = None
    # "exact": keep of a cached prefix only what gives a fresh evaluation's logits bit for bit (never an answer's
    # tokens); "all": every common token but the prompt's last, as llama.cpp keeps them
    prefix_reuse: str = "exact"
    # the throughput scheduler's KV cells (llama.cpp's kv_unified): True one pool shared by every sequence, False a
    # stream of cells per sequence; None: engine/batchmode.py's kv_pool rule
    kv_unified: bool | None = None
    streams: int = 1  # sequences decoded together (serve's --parallel): which tuning record applies

    def for_model(self, trained: int | None) -> LoadParams:
        """These settings for a model trained on `trained` tokens: a window of TRAINED_CTX is that context (the
        default window where the GGUF names none)."""
        if self.n_ctx != TRAINED_CTX:
            return self
        return replace(self, n_ctx=trained or LoadParams.n_ctx)

    def __post_init__(self) -> None:
        from localgen.errors import UsageError

        if self.n_ctx != TRAINED_CTX and self.n_ctx < MIN_CTX_FLAG:
            raise UsageError(f"--ctx takes {TRAINED_CTX} (the model's trained context) or {MIN_CTX_FLAG} tokens or "
                             f"more, not {self.n_ctx}")
        for name, flag in C_INT_FIELDS.items():
            value = getattr(self, name)
            if value is not None and value > MAX_CTX:  # worded as settings.out_of_range words a C int's top
                raise UsageError(f"{flag} must be at most {MAX_CTX:,} (llama.cpp takes it as a C int), not {value}")
        for name in (self.cache_type_k, self.cache_type_v):
            if name not in KV_CACHE_TYPES:
                raise UsageError(f"unknown KV-cache type {name!r}; choose from {', '.join(KV_CACHE_TYPES)}")
        if self.flash_attn not in (None, True, False, "auto"):
            raise UsageError(f"--flash-attn takes on, off or auto, not {self.flash_attn!r}")
        if self.cache_type_v not in ("f16", "f32", "bf16") and self.flash_attn is False:
            raise UsageError(
                f"a quantized V cache ({self.cache_type_v}) needs flash attention",
                hint="drop --no-flash-attn, or use --cache-type-v f16",
            )
        if self.split_mode not in SPLIT_MODES:
            raise UsageError(f"unknown split mode {self.split_mode!r}; choose from {', '.join(SPLIT_MODES)}")
        if self.rope_scaling is not None and self.rope_scaling not in ROPE_SCALINGS:
            raise UsageError(f"unknown RoPE scaling {self.rope_scaling!r}; choose from {', '.join(ROPE_SCALINGS)}")
        if self.numa is not None and self.numa not in NUMA_MODES:
            raise UsageError(f"unknown NUMA strategy {self.numa!r}; choose from {', '.join(NUMA_MODES)}")
        if self.prefix_reuse not in PREFIX_REUSE:
            raise UsageError(f"--prefix-reuse takes {' or '.join(PREFIX_REUSE)}, not {self.prefix_reuse!r}")
        if self.n_cpu_moe is not None and self.n_cpu_moe < 0:
            raise UsageError(f"--n-cpu-moe takes a number of layers, 0 or more, not {self.n_cpu_moe}")
        split = self.tensor_split
        if any(not math.isfinite(x) or x < 0 for x in split) or (split and not sum(split) > 0):
            raise UsageError("--tensor-split takes finite proportions, 0 or more and not all 0, e.g. 3,1")
        if split and not math.isfinite(sum(split)):  # each finite, their sum not: llama.cpp divides by it
            raise UsageError(f"--tensor-split {','.join(f'{x:g}' for x in split)}: the proportions are too large "
                             "(their sum overflows); give smaller ones, e.g. 3,1")
        if len(self.tensor_split) > MAX_DEVICES:
            raise UsageError(f"--tensor-split takes at most {MAX_DEVICES} proportions (llama.cpp's most devices)")


@dataclass(frozen=True)
class GGUFSummary:
    """What a bounded read of a GGUF header tells about a model, without loading weights."""

    architecture: str
    name: str | None
    quantization: str | None
    context_length: int | None
    n_layers: int | None
    n_embd: int | None
    n_head: int | None
    n_head_kv: int | None
    head_dim_k: int | None
    head_dim_v: int | None
    vocab_size: int | None
    n_params: int
    tensor_bytes: int
    file_size: int
    chat_template: str | None
    license: str | None
    add_bos: bool | None
    repackable_share: float | None = None  # share of weight bytes llama.cpp would repack on this CPU
    exact_rows: int = 0  # most rows per batch whose CPU matmuls compute each row as alone (0: any number)
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def encoder_only(self) -> bool:
        """Whether the header says the model is an encoder alone (attention not causal: BERT and kin; a T5
        encoder): it embeds or scores, and cannot generate. The loaded model's own word is Engine.encoder_only."""
        causal = self.metadata.get(f"{self.architecture}.attention.causal")
        return causal is False or str(causal).lower() == "false" or self.architecture in ("bert", "t5encoder")


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: where its file is, what name the user gave, where it came from."""

    name: str
    path: str
    source: str  # "embedded" | "path" | "hf"
    summary: GGUFSummary
    repo: str | None = None
    sha256: str | None = None  # known without hashing for cache blobs
    sampling_defaults: dict[str, Any] = field(default_factory=dict, compare=False)
    mmproj: str | None = None  # the multimodal projector's file (images, audio), when the model has one
    # a preset's (models/presets.py): the default system prompt, turns before the conversation, the context size
    system: str | None = None
    messages: tuple[dict[str, str], ...] = field(default=(), compare=False)
    context: int | None = None
    adapters: tuple[tuple[str, float], ...] = ()  # a preset's LoRA adapters (GGUF path, scale): ADAPTER lines
    # a preset's load settings (n_cpu_moe, override_tensor, num_gpu, ...) by the table's names, as their flags take
    # them (loadsettings.py's LOAD_KNOBS); a flag given wins over each (cli/options/preset.py)
    load: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def quantization(self) -> str | None:
        """The file's quantization, e.g. Q4_K_M."""
        return self.summary.quantization

    @property
    def file(self) -> str:
        """`path` as valid text, for JSON, logs and the API (`path` itself opens the file): see shown_path."""
        return shown_path(self.path)


def shown_path(path: str) -> str:
    """A file name or path as valid text: a byte that is not UTF-8 (which Python keeps as a lone surrogate in a
    name from argv or the disk) written as \\xe8, any other lone surrogate as \\ud800. Such a string was a raw
    byte in JSON output, and sqlite's and Starlette's UnicodeEncodeError."""
    if not any("\ud800" <= c <= "\udfff" for c in path):
        return path
    return "".join((f"\\x{ord(c) - 0xDC00:02x}" if "\udc80" <= c <= "\udcff" else f"\\u{ord(c):04x}")
                   if "\ud800" <= c <= "\udfff" else c for c in path)


def path_from_shown(text: str) -> str:
    """The path a model spec that shown_path escaped names (the log holds only valid text): its \\xNN (80..ff) and
    \\udNNN escapes made the lone surrogates Python reads such bytes as, where a file has that name; else `text`
    as written (a backslash in a name, as in a Windows path, is no escape: shown_path leaves it as it is)."""
    import os
    import re

    escape = re.compile(r"\\x([89a-f][0-9a-f])|\\u(d[89a-f][0-9a-f]{2})")
    if not escape.search(text) or os.path.lexists(text):
        return text
    path = escape.sub(lambda m: chr(0xDC00 + int(m[1], 16)) if m[1] else chr(int(m[2], 16)), text)
    return path if os.path.lexists(path) else text


Message = dict[str, Any]  # role and content; an assistant's tool_calls, a tool result's tool_call_id


def final_text(messages: Sequence[Message]) -> str | None:
    """The text of the final assistant message a prompt can continue: None when the conversation ends with
    another role, or with an assistant's tool calls or media."""
    last = messages[-1] if messages else None
    if last is None or last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    content = last.get("content")
    return content if isinstance(content, str) else None


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate: a conversation (rendered with the model's chat template) or a raw prompt (a plain
    completion), how to sample it, and what to report. The same request goes to any backend."""

    messages: tuple[Message, ...] = ()
    prompt: str | None = None  # a plain completion; then `messages` is empty
    sampling: SamplingParams = field(default_factory=SamplingParams)
    logprobs: int | None = None  # None: off; N: each token's log-probability and its N likeliest alternatives
    shared: str | None = None  # the leading text of the last message (or prompt) that repeats across requests
    prompt_cache: bool = False  # keep the KV state of `shared` on disk and reuse it (local backends)
    json_schema: str | None = None  # the schema behind sampling.grammar, for a remote server's response_format
    exact: bool = False  # served beside a throughput batch: the answer `run` gives alone (a request's "exact")
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI tool objects, given to the chat template as `tools`
    template_args: tuple[tuple[str, Any], ...] = ()  # more template variables (enable_thinking)
    # a final assistant message's text is continued (the answer goes on from it), not closed as a turn
    continue_final: bool = False
    # Ollama's truncation: a prompt past a slot's window keeps this many tokens at its start (a BOS besides) and
    # as many at its end as fit, the middle cut out (serve/prepare.py); None: it is refused
    truncate_keep: int | None = None

    @property
    def raw(self) -> bool:
        """A plain completion, no chat template."""
        return self.prompt is not None

    @property
    def prefill(self) -> str | None:
        """The text the answer continues: a final assistant message's, when the request continues it."""
        return final_text(self.messages) if self.continue_final and self.prompt is None else None


@dataclass(frozen=True)
class Chunk:
    """A piece of streamed text, with the token count so far."""

    text: str
    n_tokens: int


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability under the model, with the likeliest alternatives."""

    text: str  # a token that is part of a character shows U+FFFD here; its bytes are in `raw`
    token: int
    logprob: float
    top: tuple[tuple[str, float], ...] = ()
    raw: bytes | None = None  # the token's own bytes; None: the text's UTF-8
    top_raw: tuple[bytes, ...] = ()  # each alternative's, in `top`'s order (none: their texts' UTF-8)

    def alternatives(self) -> list[tuple[str, float, bytes]]:
        """`top` with each alternative's own bytes."""
        raws = self.top_raw if len(self.top_raw) == len(self.top) else [t.encode("utf-8") for t, _ in self.top]
        return [(t, lp, raw) for (t, lp), raw in zip(self.top, raws, strict=True)]

    @property
    def own_bytes(self) -> bytes:
        """The token's bytes: those of a part of a character too (OpenAI's `bytes`, to join split characters)."""
        return self.text.encode("utf-8") if self.raw is None else self.raw

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's shape: token, logprob, bytes, top_logprobs."""
        return {"token": self.text, "logprob": round(self.logprob, 5), "bytes": list(self.own_bytes),
                "top_logprobs": [{"token": t, "logprob": round(lp, 5), "bytes": list(raw)}
                                 for t, lp, raw in self.alternatives()]}


def token_key(raw: bytes) -> str:
    """A token as the legacy completions' `tokens` and `top_logprobs` keys name it: its text, or, for a part of a
    character, OpenAI's `bytes:\\xe4\\xbd` (as U+FFFD, the alternatives that are such parts were one key)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


@dataclass(frozen=True)
class Stats:
    """Numbers for one generation; the same shape in `run --json`, chat footers and bench."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    load_s: float
    ttft_s: float | None
    prefill_tps: float | None
    decode_tps: float | None
    total_s: float
    finish_reason: FinishReason
    drafted: int | None = None  # speculative decoding: tokens proposed by the drafter
    accepted: int | None = None  # ... and kept by the main model
    itl_p50_ms: float | None = None  # remote: the gaps between streamed pieces, measured by the client
    itl_p99_ms: float | None = None
    media_tokens: int | None = None  # images and audio: the embeddings they take in the prompt
    encode_s: float | None = None  # ... and the encoder's time for this request (0: reused from the cache)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, rounded for reading."""
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
        return d


def turn_stats(steps: list[Stats]) -> Stats:
    """One turn's stats from its steps (a turn with tool calls generates once per round): one step's as they are;
    several steps' tokens summed, their rates over all their tokens, time to first token the first step's (the
    turn's), total the model's time over the steps (the tools' time is not in it), the stop the last step's. A
    remote server's inter-token gaps stay each step's own (percentiles do not add up); media tokens are the
    last step's (each round sends the same media again)."""
    if len(steps) == 1:
        return steps[0]
    first, last = steps[0], steps[-1]

    def rate(pairs: list[tuple[int, float | None]]) -> float | None:
        timed = [(n, n / tps) for n, tps in pairs if tps and n > 0]
        seconds = sum(t for _, t in timed)
        return sum(n for n, _ in timed) / seconds if seconds > 0 else None

    def total(values: list[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    encode = [s.encode_s for s in steps if s.encode_s is not None]
    return Stats(
        prompt_tokens=sum(s.prompt_tokens for s in steps), cached_tokens=sum(s.cached_tokens for s in steps),
        completion_tokens=sum(s.completion_tokens for s in steps), load_s=first.load_s, ttft_s=first.ttft_s,
        prefill_tps=rate([(s.prompt_tokens - s.cached_tokens, s.prefill_tps) for s in steps]),
        decode_tps=rate([(s.completion_tokens - 1, s.decode_tps) for s in steps]),  # the first comes with the prompt
        total_s=sum(s.total_s for s in steps), finish_reason=last.finish_reason,
        drafted=total([s.drafted for s in steps]), accepted=total([s.accepted for s in steps]),
        media_tokens=last.media_tokens, encode_s=sum(encode) if encode else None)


def thinking_args(on: bool | None) -> tuple[tuple[str, Any], ...]:
    """GenerationRequest.template_args for the template's thinking switch (None: the template's default)."""
    return (("enable_thinking", on),) if on is not None else ()
