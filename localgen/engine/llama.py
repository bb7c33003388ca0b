"""The Engine: a model and its context loaded through llama.cpp's own API (the native layer's wrappers), and its
vocabulary: tokens, end-of-generation tokens, the chat template, grammars checked against the vocabulary. The
record of what the context's KV cache holds is its `kv` (engine/kvcache.py). Everything above the engine asks
the Engine."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localgen.engine import adapters, loading
from localgen.engine.kvcache import KVCache
from localgen.engine.template import ChatTemplate
from localgen.errors import ContextOverflowError, EmptyPrompt, LocalgenError, TemplateError
from localgen.native import context, logs
from localgen.native import model as native_model
from localgen.native import sampler as chains
from localgen.native import vocab as native_vocab
from localgen.native.lib import logits_row, ready, version
from localgen.native.prompt import Prompt
from localgen.native.report import last_load
from localgen.text import problem
from localgen.types import KV_CACHE_TYPES, LoadParams, ModelRef, SamplingParams

_ROPE = {None: -1, "none": 0, "linear": 1, "yarn": 2}


class Engine:
    """One loaded model and its context, used by one thread. Keeps its KV cache between generations: `kv`
    (a KVCache) says which tokens the cache holds, and only its methods change it. The sampler chains and
    the logits read the context's last decode; the tokens and the chat template are its vocabulary's."""

    def __init__(self, model: ModelRef, params: LoadParams, verbose: bool = False, cpu_only: bool = False) -> None:
        self.model = model
        self.requested = params
        ready()  # the bindings and llama.cpp's backends, before anything of this load is logged
        logs.set_echo(verbose)
        from localgen.engine.defaults import resolve

        self.params, self.origins = resolve(model, params, cpu_only)  # origins: setting → flag, tuned, rule
        n_gpu = self.params.n_gpu_layers or 0
        logs.clear()
        t0 = time.perf_counter()
        self.model_ptr = loading.load_model(self.model, self.params, cpu_only)
        try:
            self.adapters = adapters.load(self.model_ptr, self.model, self.params.lora)
            self._adapter_ids = adapters.identity(self.adapters)  # as the files were when they loaded
            self._file = _file_identity(Path(self.model.path), fresh=True)  # the file as it loaded (it may go)
            self._ctx = self._new_context(self.params)
        except BaseException:
            with logs.unbroken():  # a Ctrl-C between the two would leave it for close() (from __del__) to free again
                native_model.free(self.model_ptr)
                self.model_ptr = None
            raise
        self.load_s = time.perf_counter() - t0
        try:
            logs.raise_deferred()  # a Ctrl-C during the load (which logs throughout)
        except BaseException:
            self.close()  # now, not when the half-made engine is collected (at exit, perhaps after llama.cpp's end)
            raise
        self.load_report = last_load()  # what llama.cpp's log said about this load (native/report.py)
        # Which kernels this load uses, as far as batch invariance goes: llama.cpp's repacked CPU layouts
        # compute 4+ rows of a batch differently from fewer, and GPU kernels change with the batch size.
        from localgen.native import devices

        self.repacked = self.load_report.repacked
        # where the weights went: device → MiB ("CPU_Mapped", "CUDA0", "RPC0[host:port]"), from llama.cpp's log
        self.placement = self.load_report.placement
        # the most rows per call that compute each row as alone (0: any): repacked layouts take another
        # kernel from 4 rows, ggml's tiled K-/IQ-quant matmul from 8 (models/gguf_meta.py)
        rows = self.model.summary.exact_rows
        self.exact_rows = 3 if self.repacked else rows
        self.offloaded = n_gpu != 0 and (devices.has_gpu() or bool(params.rpc))
        if self.params.flash_attn == "auto":
            self.flash_attn = self.load_report.flash_attn_auto is True
        else:
            self.flash_attn = bool(self.params.flash_attn)
        self.vocab = native_vocab.of_model(self.model_ptr)
        self.n_ctx = context.n_ctx(self._ctx)
        self.n_batch = self.params.n_batch
        self.n_vocab = native_vocab.n_tokens(self.vocab)
        self.params = dataclasses.replace(self.params, n_ctx=self.n_ctx)
        self.kv = KVCache(_context_of(self), self.n_ctx, self.n_batch,  # what the context's KV cache holds
                          min(self.params.n_ubatch or 512, self.n_batch), self.params.prefix_reuse == "all")
        self._piece_buf = native_vocab.piece_buffer()
        self._template: ChatTemplate | None = None
        self._eog: tuple[int, ...] | None = None

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        """Text to tokens; special-token text such as <|im_end|> becomes the control token (with
        `parse_special`, the default)."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # the input boundary refuses these; never a traceback from here either
            raise TemplateError(f"the text is not valid UTF-8: {problem(text)}") from None
        return native_vocab.tokenize(self.vocab, data, add_special, parse_special)

    def piece(self, token: int, special: bool = False) -> bytes:
        """One token's bytes, leading space kept (detokenizing one token alone would strip it)."""
        return native_vocab.piece(self.vocab, token, self._piece_buf, special)

    def token_text(self, token: int) -> str:
        """A token as text, control tokens spelled out (<|im_end|>)."""
        return self.piece(token, special=True).decode("utf-8", errors="replace") if token >= 0 else ""

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <|im_end|>, ...)."""
        return native_vocab.is_eog(self.vocab, token)

    @property
    def bos(self) -> int:
        """The beginning-of-sequence token (-1 where the vocabulary has none)."""
        return native_vocab.bos(self.vocab)

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
            self._template = ChatTemplate(source, self.token_text(native_vocab.bos(self.vocab)),
                                          self.token_text(native_vocab.eos(self.vocab)))
        return self._template

    def chat_tokens(self, messages: list[dict[str, Any]], continue_final: bool = False, **extra: Any) -> list[int]:
        """Render the conversation with the model's template (and `extra` variables: tools) and tokenize it
        (special tokens parsed); `continue_final`: a final assistant message is continued (template.py)."""
        return self.tokenize(*self.chat_text(messages, continue_final, **extra))

    def chat_text(self, messages: list[dict[str, Any]], continue_final: bool = False,
                  **extra: Any) -> tuple[str, bool]:
        """The rendered conversation, and whether tokenizing it adds BOS (not when the template wrote it)."""
        text = self.template.render(messages, continue_final=continue_final, **extra)
        bos = self.template.bos_token
        return text, not (bos and text.startswith(bos))

    def raw_tokens(self, text: str) -> list[int]:
        """Tokenize a plain completion prompt (BOS as the model asks)."""
        return self.tokenize(text, add_special=True)

    def check_grammar(self, gbnf: str) -> None:
        """Parse a GBNF grammar natively, so a bad one is an error before any work."""
        from localgen.native.grammar import check_grammar

        check_grammar(self.vocab, gbnf)

    @functools.cached_property
    def uses_encode(self) -> bool:
        """Whether the model runs through llama_encode (an encoder with no decoder: a T5 encoder)."""
        m = self.model_ptr
        return native_model.has_encoder(m) and not native_model.has_decoder(m)

    @functools.cached_property
    def encoder_only(self) -> bool:
        """Whether the model is an encoder alone: a T5 encoder, or one whose attention is not causal (BERT and
        kin). It embeds and scores, and cannot generate. Read once: every generate asks."""
        if self.uses_encode:
            return True
        causal = native_model.meta_str(self.model_ptr, f"{self.model.summary.architecture}.attention.causal")
        return causal is not None and causal.lower() == "false"

    def gpu_weight_bytes(self) -> int:
        """Bytes of weights on GPU and RPC devices (not the CPU's buffers), from llama.cpp's load log."""
        return int(sum(mib for dev, mib in self.placement.items() if not dev.upper().startswith("CPU")) * 2**20)

    # ---- loading -------------------------------------------------------------------------------------

    def _new_context(self, p: LoadParams) -> Any:
        ctx = context.new(
            self.model_ptr, n_ctx=p.n_ctx, n_batch=p.n_batch, n_ubatch=p.n_ubatch, n_seq_max=1,
            n_threads=p.n_threads, n_threads_batch=p.n_threads_batch,
            flash_attn_type=-1 if p.flash_attn == "auto" else int(bool(p.flash_attn)),
            type_k=KV_CACHE_TYPES[p.cache_type_k], type_v=KV_CACHE_TYPES[p.cache_type_v],
            rope_scaling_type=_ROPE[p.rope_scaling], rope_freq_base=p.rope_freq_base,
            rope_freq_scale=p.rope_freq_scale, yarn_orig_ctx=p.yarn_orig_ctx, no_perf=False)
        if not ctx:
            raise loading.error(self.model, "failed to create llama_context")
        return ctx

    @property
    def ctx(self) -> Any:
        """The llama.cpp context (created again after release_context)."""
        if self._ctx is None:
            if self.model_ptr is None:
                raise LocalgenError("internal: the engine is closed")
            self._ctx = self._new_context(self.params)
        return self._ctx

    @property
    def alive(self) -> bool:
        """Whether the model and its context are loaded (not closed, not released)."""
        return getattr(self, "model_ptr", None) is not None and getattr(self, "_ctx", None) is not None

    def release_context(self) -> None:
        """Free the context and its KV cache while another context on the same model (batching, beam
        search) does the work; the next use creates it again."""
        if self._ctx is not None:
            with logs.unbroken():  # never freed and still held (close() would free it again)
                context.free(self._ctx)
                self._ctx = None
            self.kv.reset()

    @property
    def identity(self) -> str:
        """What a saved KV state depends on: the model file, the settings that change the numbers in the
        cache or how they were computed, and the llama.cpp build. States of any other identity are never
        restored into this context."""
        p = self.params
        return "|".join(str(x) for x in (
            self._file, p.cache_type_k, p.cache_type_v, self.flash_attn, p.n_batch, p.n_ubatch,
            p.repack, p.n_gpu_layers if self.offloaded else 0, p.rope_scaling, p.rope_freq_base, p.rope_freq_scale,
            version(), *self._adapter_ids,
        ))

    @property
    def file_gone(self) -> bool:
        """Whether the model file is no longer there as it loaded (removed, or replaced by another): what it
        computed is then kept for no file."""
        try:
            return _file_identity(Path(self.model.path)) != self._file
        except OSError:
            return True

    # ---- sampling (as ParallelContext.sampler and .logits do for its slots) --------------------------

    def sampler(self, s: SamplingParams, seed: int, history: list[int] | tuple[int, ...] = ()) -> Any:
        """A sampler chain for this model; native/sampler.py's accept() takes a token chosen without it,
        free() releases it."""
        return chains.build(self.vocab, self.n_vocab, s, seed, self.n_ctx,
                              self.eog_tokens if s.ignore_eos else (), history)

    def sample(self, chain: Any, row: int = -1) -> int:
        """Sample from the logits of one output row of the last decode (-1: the last row), as
        llama_sampler_sample does (a greedy chain by the row's argmax: native/sampler.py)."""
        return chains.pick(self.ctx, chain, row, self.n_vocab)

    def logits(self, row: int = -1) -> Any:
        """A numpy view of one output row's logits (valid until the next decode)."""
        return logits_row(self.ctx, row, self.n_vocab)

    # ---- counters, generation and lifetime -----------------------------------------------------------

    def perf(self) -> context.Perf:
        """llama.cpp's perf counters for this context."""
        return context.perf(self.ctx)

    def reset_perf(self) -> None:
        """Every request starts its counters from zero."""
        context.reset_perf(self.ctx)

    def generate(self, prompt: Prompt, sampling: SamplingParams, started: float | None = None,
                 drafter: Any = None, draft_max: int = 6, logprobs: int | None = None,
                 lead: Callable[[Any], None] | None = None) -> Any:
        """Start streaming a completion of the prompt (a Generation). Raises EmptyPrompt or ContextOverflowError
        before any work. `started` (a perf_counter time) is when the request began, so time to first token counts
        what was done since. `lead(generation)`, where given, runs as the stream begins, before the prompt is
        evaluated: prompt work of its own (a prompt cache loaded or filled), stopped where the generation is
        cancelled; it sets the generation's `held_before`, how many of the tokens the KV cache holds it held
        before that work (the rest count as evaluated for this answer, not cached), and resets the perf counters
        itself before that work, so that the prefill rate counts it."""
        from localgen.engine.generate import Generation

        if not prompt.tokens:  # nothing to decode: llama.cpp would abort the process on the empty batch
            raise EmptyPrompt()
        if len(prompt.tokens) >= self.n_ctx:
            raise self.overflow(f"the prompt is {len(prompt.tokens):,} tokens; the context window is {self.n_ctx:,}",
                                len(prompt.tokens))
        if sampling.grammar:
            self.check_grammar(sampling.grammar)
        return Generation(self, prompt, sampling, started, drafter, draft_max, logprobs, lead)

    def window_cap(self) -> int | None:
        """The largest window any --ctx loads this model with: the context it was trained on, where the load caps
        it (defaults.resolve); None where nothing caps it (no trained context named, or RoPE scaling stretches it)."""
        from localgen.engine.defaults import stretched

        trained = self.model.summary.context_length
        return trained if trained and not stretched(self.params) else None

    def overflow(self, message: str, needed: int | None = None) -> ContextOverflowError:
        """The error for a prompt of `needed` tokens (None: not counted) past the window, with what can help
        (defaults.overflow_hint): a larger --ctx only where one could hold it, else a shorter prompt (or RoPE
        scaling)."""
        from localgen.engine.defaults import overflow_hint

        return ContextOverflowError(message, hint=overflow_hint(self.n_ctx, self.window_cap(), needed))

    def close(self) -> None:
        """Free the context, the model and the batch (idempotent, and whole: a Ctrl-C during it is raised at its end,
        never between a free and the reference's clearing, which a later close() would free again)."""
        with logs.unbroken():
            if getattr(self, "kv", None) is not None:
                self.kv.close()  # idempotent
            if getattr(self, "_ctx", None) is not None:
                context.free(self._ctx)
                self._ctx = None
            if getattr(self, "model_ptr", None):
                native_model.free(self.model_ptr)
                self.model_ptr = None

    def __del__(self) -> None:
        """A press pending as the collector runs (one noted inside llama.cpp's abort check, which waits for the decode
        it stops) is not raised here (logs.finalising): Python drops an exception from a finaliser, and keep_ctrl_c
        handed it on at a moment no code chose. One that comes while it frees is, as before."""
        with contextlib.suppress(Exception), logs.finalising():
            self.close()


def _context_of(engine: Engine) -> Callable[[], Any]:
    """engine.ctx for its KVCache, through a weak reference: a strong one would make a cycle, and the engine
    (its model and context) would then be freed by the garbage collector instead of when its last user lets
    go of it."""
    ref = weakref.ref(engine)

    def ctx() -> Any:
        eng = ref()
        if eng is None:
            raise LocalgenError("internal: the engine is closed")
        return eng.ctx

    return ctx


__all__ = ["Engine"]


def _file_identity(path: Path, fresh: bool = False) -> str:
    """A model file as a saved KV state depends on it: its real path, size, modification time and a sample of its
    bytes (localgen/fileid.py: a file rewritten in place, its mtime set back as `cp -p` or `touch -d` sets it, is
    another file; a new hard link or a chmod is not)."""
    from localgen import fileid

    return fileid.identity(path, fresh)
