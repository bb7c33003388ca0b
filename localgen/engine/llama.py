"""The only place that talks to llama_cpp: load a model and a context through llama.cpp's own API, and
keep the record of what the context's KV cache holds. Everything else asks the Engine."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localgen import hardware
from localgen.engine import logs
from localgen.engine.template import ChatTemplate
from localgen.errors import ContextOverflowError, GrammarError, LocalgenError, ModelLoadError, TemplateError
from localgen.types import KV_CACHE_TYPES, LoadParams, ModelRef, SamplingParams

# the load line that says some weights went into a repacked layout ("CPU_REPACK model buffer size = 12.66 MiB")
_REPACK_BUFFER = re.compile(r"_REPACK model buffer size = *(?!0\.00 )[0-9.]+")
_FA_AUTO = re.compile(r"Flash Attention (enabled|not supported)")
_SPLIT = {"none": 0, "layer": 1, "row": 2}
_ROPE = {None: -1, "none": 0, "linear": 1, "yarn": 2}
_NUMA = {"distribute": 1, "isolate": 2, "numactl": 3}
_LOAD_NONE, _LOAD_MMAP, _LOAD_MLOCK, _LOAD_MMAP_MLOCK = 0, 1, 2, 3

_lib: Any = None
_numa_done = False


def lib() -> Any:
    """The bindings, imported once: our log callback installed and llama.cpp's backends initialized."""
    global _lib
    if _lib is None:
        import llama_cpp  # heavy: loads the shared library and numpy

        logs.install(llama_cpp)
        llama_cpp.llama_backend_init()
        _lib = llama_cpp
    return _lib


def common_prefix(a: Any, b: Any) -> int:
    """Length of the common leading run of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def backend_info() -> dict[str, Any]:
    """What this llama-cpp-python build offers (no model needed)."""
    from localgen.engine import devices

    lc = lib()
    return {
        "llama_cpp_python": lc.__version__,
        "gpu_offload": devices.has_gpu(),
        "mmap": bool(lc.llama_supports_mmap()),
        "rpc": bool(lc.llama_supports_rpc()) if hasattr(lc, "llama_supports_rpc") else False,
        "system_info": lc.llama_print_system_info().decode("utf-8", errors="replace").strip(),
    }


def grammar_from_json_schema(schema_text: str) -> str:
    """Convert a JSON schema to GBNF, or raise GrammarError."""
    import json

    try:
        json.loads(schema_text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
    lib()
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(schema_text))
    except Exception as e:  # the converter raises bare Exceptions of many kinds for schemas it cannot handle
        raise GrammarError(f"cannot turn the JSON schema into a grammar: {e}") from None


def default_repack(model: ModelRef, params: LoadParams) -> bool:
    """Whether to use llama.cpp's repacked CPU weight layouts when the user did not say.

    Repacking speeds up prompt processing for the types it covers, but a model whose repackable share is
    small gains nothing, and repacked weights compute 4+ rows of a batch differently from fewer, which
    costs exact batching most of its speed. So: on where at least half the weights are of a repackable
    type (Q4_0, IQ4_NL, Q4_K on x86 with AVX2; more on ARM), off otherwise and when layers go to a GPU."""
    if params.n_gpu_layers not in (None, 0):
        return False
    share = model.summary.repackable_share
    return share is None or share >= 0.5


class Engine:
    """One loaded model and its context, used by one thread. Keeps its KV cache between generations:
    `held` says which tokens the cache holds, and only the methods below change it."""

    def __init__(self, model: ModelRef, params: LoadParams, verbose: bool = False, cpu_only: bool = False) -> None:
        self.model = model
        self.requested = params
        lc = lib()
        self.lib = lc
        logs.set_echo(verbose)
        train_ctx = model.summary.context_length
        # llama.cpp rounds the window up to a multiple of 256; ask for the rounded number so both agree.
        n_ctx = -(-params.n_ctx // 256) * 256
        if train_ctx and not params.rope_scaling and not params.rope_freq_scale:
            n_ctx = min(n_ctx, train_ctx)
        threads = params.n_threads or hardware.physical_cores()
        from localgen.engine import devices

        n_gpu = 0 if cpu_only else params.n_gpu_layers
        if n_gpu is None:
            n_gpu = -1 if devices.has_gpu() else 0
        repack = params.repack if params.repack is not None else default_repack(model, params)
        self.params = LoadParams(
            n_ctx=n_ctx, n_threads=threads, n_threads_batch=params.n_threads_batch or hardware.usable_cores(),
            n_gpu_layers=n_gpu, n_batch=min(params.n_batch, n_ctx),
            n_ubatch=min(params.n_ubatch, params.n_batch, n_ctx),
            flash_attn=params.flash_attn, cache_type_k=params.cache_type_k, cache_type_v=params.cache_type_v,
            use_mmap=params.use_mmap, use_mlock=params.use_mlock, numa=params.numa, repack=repack,
            split_mode=params.split_mode, tensor_split=params.tensor_split, main_gpu=params.main_gpu,
            rope_scaling=params.rope_scaling, rope_freq_base=params.rope_freq_base,
            rope_freq_scale=params.rope_freq_scale, yarn_orig_ctx=params.yarn_orig_ctx, rpc=params.rpc,
        )
        self._keep: list[Any] = []  # ctypes arrays the params point at, alive until the load is done
        logs.clear()
        t0 = time.perf_counter()
        self.model_ptr = self._load_model(lc, self.params, cpu_only)
        try:
            self.ctx = self._new_context(lc, self.params)
        except BaseException:
            lc.llama_model_free(self.model_ptr)
            raise
        self.load_s = time.perf_counter() - t0
        self._keep.clear()
        load_log = logs.lines(last=1000)
        # Which kernels this load uses, as far as batch invariance goes: llama.cpp's repacked CPU layouts
        # compute 4+ rows of a batch differently from fewer, and GPU kernels change with the batch size.
        self.repacked = any(_REPACK_BUFFER.search(line) for line in load_log)
        self.offloaded = n_gpu != 0 and (devices.has_gpu() or bool(params.rpc))
        if self.params.flash_attn is None:
            chosen = next((m.group(1) for line in load_log if (m := _FA_AUTO.search(line))), None)
            self.flash_attn = chosen == "enabled"
        else:
            self.flash_attn = bool(self.params.flash_attn)
        self.vocab = lc.llama_model_get_vocab(self.model_ptr)
        self.n_ctx = int(lc.llama_n_ctx(self.ctx))
        self.n_batch = self.params.n_batch
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        self.params = LoadParams(**{**self.params.__dict__, "n_ctx": self.n_ctx})
        self._batch = lc.llama_batch_init(max(self.n_batch, 1), 0, 1)
        self._mem = lc.llama_get_memory(self.ctx)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._held: list[int] = []
        self._live = False  # logits of the last held token are available (row -1)
        self._template: ChatTemplate | None = None
        self._eog: tuple[int, ...] | None = None
        self._add_bos = bool(lc.llama_vocab_get_add_bos(self.vocab))

    # ---- loading -------------------------------------------------------------------------------------

    def _load_model(self, lc: Any, p: LoadParams, cpu_only: bool) -> Any:
        global _numa_done
        if p.numa and not _numa_done:
            lc.llama_numa_init(_NUMA[p.numa])
            _numa_done = True
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = p.n_gpu_layers if p.n_gpu_layers is not None else 0
        mp.use_extra_bufts = bool(p.repack)
        mp.split_mode = _SPLIT[p.split_mode]
        mp.main_gpu = p.main_gpu
        if p.tensor_split:
            n = max(int(lc.llama_max_devices()), len(p.tensor_split))
            split = (ctypes.c_float * n)(*p.tensor_split)
            self._keep.append(split)
            mp.tensor_split = ctypes.cast(split, ctypes.POINTER(ctypes.c_float))
        if p.use_mlock:
            mp.load_mode = _LOAD_MMAP_MLOCK if p.use_mmap else _LOAD_MLOCK
        elif not p.use_mmap:
            mp.load_mode = _LOAD_NONE
        if cpu_only:  # no devices at all: nothing of the GPU backend is touched, not even for compute buffers
            none = (ctypes.c_void_p * 1)(None)
            self._keep.append(none)
            mp.devices = ctypes.cast(none, ctypes.c_void_p)
        elif p.rpc:
            from localgen.engine import devices

            devices.register_rpc(p.rpc)  # registered devices join the load, as with llama.cpp's --rpc
        ptr = lc.llama_model_load_from_file(os.fsencode(self.model.path), mp)
        if not ptr:
            raise self._load_error("failed to load model")
        return ptr

    def _new_context(self, lc: Any, p: LoadParams) -> Any:
        cp = lc.llama_context_default_params()
        cp.n_ctx = p.n_ctx
        cp.n_batch = p.n_batch
        cp.n_ubatch = p.n_ubatch
        cp.n_seq_max = 1
        cp.n_threads = p.n_threads
        cp.n_threads_batch = p.n_threads_batch
        cp.flash_attn_type = -1 if p.flash_attn is None else int(bool(p.flash_attn))
        cp.type_k = KV_CACHE_TYPES[p.cache_type_k]
        cp.type_v = KV_CACHE_TYPES[p.cache_type_v]
        cp.rope_scaling_type = _ROPE[p.rope_scaling]
        cp.rope_freq_base = p.rope_freq_base
        cp.rope_freq_scale = p.rope_freq_scale
        cp.yarn_orig_ctx = p.yarn_orig_ctx
        cp.no_perf = False
        ctx = lc.llama_init_from_model(self.model_ptr, cp)
        if not ctx:
            raise self._load_error("failed to create llama_context")
        return ctx

    def _load_error(self, what: str) -> ModelLoadError:
        reason = logs.first_error()
        path = self.model.path
        if "context" in what:
            return ModelLoadError(
                f"llama.cpp could not create a context for {self.model.name}: {reason or what}",
                hint="try a smaller --ctx, or the default KV-cache types",
                log=logs.lines(),
            )
        detail = reason or what
        if "unknown model architecture" in detail:
            arch = self.model.summary.architecture
            return ModelLoadError(
                f"this llama.cpp build does not know the architecture {arch!r} of {path}",
                hint="upgrade llama-cpp-python (scripts/install.sh) or pick a supported model",
                log=logs.lines(),
            )
        return ModelLoadError(f"llama.cpp could not load {path}: {detail}", log=logs.lines())

    @property
    def identity(self) -> str:
        """What a saved KV state depends on: the model file, the settings that change the numbers in the
        cache or how they were computed, and the llama.cpp build. States of any other identity are never
        restored into this context."""
        path = Path(self.model.path).resolve()
        st = path.stat()
        p = self.params
        return "|".join(str(x) for x in (
            path, st.st_size, st.st_mtime_ns, p.cache_type_k, p.cache_type_v, self.flash_attn, p.n_batch, p.n_ubatch,
            p.repack, p.n_gpu_layers if self.offloaded else 0, p.rope_scaling, p.rope_freq_base, p.rope_freq_scale,
            self.lib.__version__,
        ))

    # ---- tokens --------------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """Text to tokens; special-token text such as <|im_end|> becomes the control token."""
        lc = self.lib
        data = text.encode("utf-8")
        cap = len(data) + 8
        while True:
            arr = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, True)
            if n >= 0:
                return list(arr[:n])
            cap = -n

    def piece(self, token: int, special: bool = False) -> bytes:
        """One token's bytes, leading space kept (detokenizing one token alone would strip it)."""
        buf = self._piece_buf
        n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def token_text(self, token: int) -> str:
        """A token as text, control tokens spelled out (<|im_end|>)."""
        return self.piece(token, special=True).decode("utf-8", errors="replace") if token >= 0 else ""

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <|im_end|>, ...)."""
        return bool(self.lib.llama_vocab_is_eog(self.vocab, token))

    @property
    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token of the vocabulary (for --ignore-eos)."""
        if self._eog is None:
            self._eog = tuple(t for t in range(self.n_vocab) if self.is_eog(t))
        return self._eog

    @property
    def template(self) -> ChatTemplate:
        """The model's chat template, compiled once; TemplateError when it has none or it is broken."""
        if self._template is None:
            source = self.model.summary.chat_template
            if not source:
                raise TemplateError(
                    f"{self.model.name} has no chat template (it may be a base model)",
                    hint="use --raw to send the prompt as a plain completion",
                )
            lc = self.lib
            self._template = ChatTemplate(source, self.token_text(lc.llama_vocab_bos(self.vocab)),
                                          self.token_text(lc.llama_vocab_eos(self.vocab)))
        return self._template

    def chat_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        """Render the conversation with the model's template and tokenize it (special tokens parsed)."""
        text = self.template.render(messages)
        bos = self.template.bos_token
        add_special = not (bos and text.startswith(bos))
        return self.tokenize(text, add_special=add_special)

    def raw_tokens(self, text: str) -> list[int]:
        """Tokenize a plain completion prompt (BOS as the model asks)."""
        return self.tokenize(text, add_special=True)

    def check_grammar(self, gbnf: str) -> None:
        """Parse a GBNF grammar natively, so a bad one is an error before any work."""
        with _capture_fd2() as captured:
            sampler = self.lib.llama_sampler_init_grammar(self.vocab, gbnf.encode("utf-8"), b"root")
        if not sampler:
            why = next((ln.strip() for ln in captured() if "error" in ln), "")
            why = why.split("error parsing grammar:", 1)[-1].strip().rstrip(":")
            raise GrammarError("the grammar does not parse" + (f": {why}" if why else ""))
        self.lib.llama_sampler_free(sampler)

    def sampler(self, s: SamplingParams, seed: int) -> Any:
        """A sampler chain for this model (engine/sampling.py); free it with free_sampler."""
        from localgen.engine import sampling

        return sampling.build(self.lib, self.vocab, self.n_vocab, s, seed, self.n_ctx,
                              self.eog_tokens if s.ignore_eos else ())

    def free_sampler(self, chain: Any) -> None:
        """Release a sampler chain."""
        self.lib.llama_sampler_free(chain)

    def sample(self, chain: Any, row: int = -1) -> int:
        """Sample from the logits of one output row of the last decode (-1: the last row)."""
        return int(self.lib.llama_sampler_sample(chain, self.ctx, row))

    def logits(self, row: int = -1) -> Any:
        """A numpy view of one output row's logits (valid until the next decode)."""
        import numpy as np

        return np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))

    # ---- the KV cache --------------------------------------------------------------------------------

    @property
    def held(self) -> list[int]:
        """The tokens whose KV entries the cache holds, in position order (a copy)."""
        return list(self._held)

    def cached_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens of `tokens` evaluate() will reuse (the last is always re-evaluated
        unless its logits are still live)."""
        n = common_prefix(self._held, tokens)
        if n == len(tokens) and n > 0 and not (self._live and n == len(self._held)):
            n -= 1
        return n

    def truncate(self, n: int) -> None:
        """Forget every held token from position n on."""
        if n < len(self._held):
            if not self.lib.llama_memory_seq_rm(self._mem, -1, n, -1):
                self.clear()  # recurrent models cannot drop a tail: start over
                return
            del self._held[n:]
            self._live = False

    def clear(self) -> None:
        """Empty the KV cache."""
        self.lib.llama_memory_clear(self._mem, True)
        self._held = []
        self._live = False

    def evaluate(self, tokens: list[int], logits: bool = True) -> int:
        """Make the cache hold exactly `tokens`, evaluating only what it does not hold yet, in n_batch
        pieces (llama.cpp rounds a row differently in batches of other sizes, so the pieces are always
        cut the same way). With `logits`, the last token's logits are live afterwards. Returns how many
        tokens were reused. Interrupted between pieces, the record stays true."""
        if len(tokens) > self.n_ctx:
            raise ContextOverflowError(f"{len(tokens):,} tokens do not fit the context window of {self.n_ctx:,}")
        keep = self.cached_prefix(tokens) if logits else common_prefix(self._held, tokens)
        self.truncate(keep)
        for start in range(keep, len(tokens), self.n_batch):
            self._decode(tokens[start:start + self.n_batch], all_logits=False)
        return keep

    def decode(self, tokens: list[int], all_logits: bool = True) -> None:
        """Evaluate tokens after the held ones in one llama_decode (logits for every row, or the last)."""
        if len(self._held) + len(tokens) > self.n_ctx:
            raise ContextOverflowError(f"the context window of {self.n_ctx:,} tokens is full")
        self._decode(tokens, all_logits)

    def _decode(self, tokens: list[int], all_logits: bool) -> None:
        b = self._batch
        pos = len(self._held)
        n = len(tokens)
        if n > self.n_batch:
            raise LocalgenError(f"internal: a batch of {n} tokens exceeds n_batch {self.n_batch}")
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if (all_logits or i == n - 1) else 0
        b.n_tokens = n
        rc = self.lib.llama_decode(self.ctx, b)
        if rc != 0:
            self._live = False
            raise LocalgenError(f"llama_decode failed ({rc})", hint="the context may be full; raise --ctx")
        self._held.extend(tokens)
        self._live = True

    def save_state(self, path: Path) -> int:
        """Write the context's KV state and its tokens atomically; returns the file size."""
        lc = self.lib
        tokens = self._held
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        arr = (lc.llama_token * max(1, len(tokens)))(*tokens)
        try:
            if not lc.llama_state_save_file(self.ctx, os.fsencode(tmp), arr, len(tokens)):
                raise OSError(f"llama.cpp could not write {tmp}")
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return path.stat().st_size

    def load_state(self, path: Path) -> list[int] | None:
        """Restore a saved state; returns its tokens, or None (the cache is then empty) if it does not load."""
        lc = self.lib
        cap = self.n_ctx
        out = (lc.llama_token * cap)()
        count = ctypes.c_size_t(0)
        try:
            ok = bool(lc.llama_state_load_file(self.ctx, os.fsencode(path), out, cap, ctypes.byref(count)))
        except OSError:
            ok = False
        n = int(count.value)
        if not ok or n == 0 or n > cap:
            self.clear()
            return None
        self._held = list(out[:n])
        self._live = False  # the logits are not restored: evaluate() re-evaluates the last token
        return self.held

    # ---- counters and lifetime -----------------------------------------------------------------------

    def perf(self) -> Any:
        """llama.cpp's perf counters for this context."""
        return self.lib.llama_perf_context(self.ctx)

    def reset_perf(self) -> None:
        """Every request starts its counters from zero."""
        self.lib.llama_perf_context_reset(self.ctx)

    def synchronize(self) -> None:
        """Wait for queued work (benchmarks time the device, not the queue)."""
        self.lib.llama_synchronize(self.ctx)

    def generate(self, tokens: list[int], sampling: SamplingParams, started: float | None = None,
                 drafter: Any = None, draft_max: int = 6, logprobs: int | None = None) -> Any:
        """Start streaming a completion of `tokens` (a Generation). Raises ContextOverflowError before any
        work. `started` (a perf_counter time) is when the request began, if prompt work was done before
        this call (a prompt cache loaded or filled), so time to first token counts it."""
        from localgen.engine.generate import Generation

        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(tokens):,} tokens; the context window is {self.n_ctx:,}",
                hint="shorten the prompt or raise --ctx"
                + (
                    f" (this model was trained on up to {self.model.summary.context_length:,})"
                    if self.model.summary.context_length
                    else ""
                ),
            )
        if sampling.grammar:
            self.check_grammar(sampling.grammar)
        return Generation(self, tokens, sampling, started, drafter, draft_max, logprobs)

    def close(self) -> None:
        """Free the context, the model and the batch (idempotent)."""
        lc = self.lib
        if getattr(self, "ctx", None):
            lc.llama_batch_free(self._batch)
            lc.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model_ptr", None):
            lc.llama_model_free(self.model_ptr)
            self.model_ptr = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


@contextlib.contextmanager
def _capture_fd2() -> Iterator[Any]:
    """Capture what native code writes straight to fd 2 (llama.cpp's grammar parser uses fprintf)."""
    import sys
    import tempfile

    lines: list[str] = []
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield lambda: lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode("utf-8", errors="replace").splitlines())


__all__ = ["Engine", "backend_info", "common_prefix", "grammar_from_json_schema", "lib"]
