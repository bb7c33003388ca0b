"""Value types shared by every layer: settings in, chunks and stats out."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "eos", "length", "context", "cancelled"]

# llama.cpp KV-cache types a user may pick, with their GGML_TYPE_* values.
KV_CACHE_TYPES: dict[str, int] = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}


# Valid ranges, shared by the CLI flags and chat's /set (None: unbounded on that side).
SAMPLING_RANGES: dict[str, tuple[float | None, float | None]] = {
    "temperature": (0.0, 5.0), "top_k": (0, None), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0),
    "typical_p": (0.0, 1.0), "repeat_penalty": (0.0, 10.0), "repeat_last_n": (-1, None),
    "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0), "seed": (0, 2**32 - 1),
    "max_tokens": (-1, None),
}


def in_range(key: str, value: Any) -> bool:
    """Whether a value is a number within the knob's range."""
    lo, hi = SAMPLING_RANGES[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (lo is None or value >= lo) and (hi is None or value <= hi)


@dataclass(frozen=True)
class SamplingParams:
    """Every sampling knob, with its default defined once (llama.cpp's defaults)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = -1  # -1: until end of generation or the context is full
    stop: tuple[str, ...] = ()
    grammar: str | None = None  # GBNF text (a JSON schema is converted before it gets here)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON output and saved sessions."""
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


@dataclass(frozen=True)
class LoadParams:
    """How a model is loaded: context, threads, offload, batching, attention, KV cache."""

    n_ctx: int = 4096
    n_threads: int | None = None  # None: from the CPU affinity
    n_threads_batch: int | None = None
    n_gpu_layers: int | None = None  # None: all layers when this build can offload, else 0
    n_batch: int = 512
    n_ubatch: int = 512
    flash_attn: bool = True
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    use_mmap: bool = True
    repack: bool = True  # llama.cpp's repacked CPU weight layouts (faster; batches round differently)

    def __post_init__(self) -> None:
        from localgen.errors import UsageError

        for name in (self.cache_type_k, self.cache_type_v):
            if name not in KV_CACHE_TYPES:
                raise UsageError(f"unknown KV-cache type {name!r}; choose from {', '.join(KV_CACHE_TYPES)}")
        if self.cache_type_v not in ("f16", "f32", "bf16") and not self.flash_attn:
            raise UsageError(
                f"a quantized V cache ({self.cache_type_v}) needs flash attention",
                hint="drop --no-flash-attn, or use --cache-type-v f16",
            )


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
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


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

    @property
    def quantization(self) -> str | None:
        """The file's quantization, e.g. Q4_K_M."""
        return self.summary.quantization


@dataclass(frozen=True)
class Chunk:
    """A piece of streamed text, with the token count so far."""

    text: str
    n_tokens: int


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

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, rounded for reading."""
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
        return d
