"""The only place that talks to llama_cpp: load a model, build prompts, stream a generation."""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import dataclasses
import random
import re
import time
from collections.abc import Iterator
from typing import Any

from localgen import hardware
from localgen.engine import logs
from localgen.engine.template import ChatTemplate
from localgen.errors import (
    ContextOverflowError,
    GrammarError,
    ModelLoadError,
    TemplateError,
)
from localgen.types import KV_CACHE_TYPES, Chunk, FinishReason, LoadParams, ModelRef, SamplingParams, Stats

# the load line that says some weights went into a repacked layout ("CPU_REPACK model buffer size = 12.66 MiB")
_REPACK_BUFFER = re.compile(r"_REPACK model buffer size = *(?!0\.00 )[0-9.]+")


def common_prefix(a: Any, b: Any) -> int:
    """Length of the common leading run of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _llama_cpp() -> Any:
    import llama_cpp  # heavy: loads the shared library and numpy

    logs.install(llama_cpp)
    return llama_cpp


def backend_info() -> dict[str, Any]:
    """What this llama-cpp-python build offers (no model needed)."""
    lc = _llama_cpp()
    return {
        "llama_cpp_python": lc.__version__,
        "gpu_offload": bool(lc.llama_supports_gpu_offload()),
        "mmap": bool(lc.llama_supports_mmap()),
        "system_info": lc.llama_print_system_info().decode("utf-8", errors="replace").strip(),
    }


def grammar_from_json_schema(schema_text: str) -> str:
    """Convert a JSON schema to GBNF, or raise GrammarError."""
    import json

    try:
        json.loads(schema_text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
    _llama_cpp()
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(schema_text))
    except Exception as e:  # the converter raises bare Exceptions of many kinds for schemas it cannot handle
        raise GrammarError(f"cannot turn the JSON schema into a grammar: {e}") from None


class _NoTemplateCompile:
    """Stands in for the bindings' formatter during load: they compile every GGUF template in Llama(),
    so a broken one would make even --raw fail. We render templates ourselves (template.py)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def to_chat_handler(self) -> None:
        return None


class Engine:
    """One loaded model, used by one thread. Keeps its KV cache between generations (prefix reuse)."""

    def __init__(self, model: ModelRef, params: LoadParams, verbose: bool = False) -> None:
        self.model = model
        self.requested = params
        lc = _llama_cpp()
        self._lc = lc
        # During Llama() the bindings point fds 1 and 2 at /dev/null: lines are buffered, shown after.
        logs.set_echo(False)
        train_ctx = model.summary.context_length
        # llama.cpp rounds the window up to a multiple of 256, but the bindings size their token buffer
        # from the number passed in: pass the rounded number so the two agree.
        n_ctx = -(-params.n_ctx // 256) * 256
        if train_ctx:
            n_ctx = min(n_ctx, train_ctx)
        threads = params.n_threads or hardware.usable_cores()
        n_gpu = params.n_gpu_layers
        if n_gpu is None:
            n_gpu = -1 if lc.llama_supports_gpu_offload() else 0
        self.params = LoadParams(
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=params.n_threads_batch or threads,
            n_gpu_layers=n_gpu,
            n_batch=min(params.n_batch, n_ctx),
            n_ubatch=min(params.n_ubatch, params.n_batch, n_ctx),
            flash_attn=params.flash_attn,
            cache_type_k=params.cache_type_k,
            cache_type_v=params.cache_type_v,
            use_mmap=params.use_mmap,
            repack=params.repack,
        )
        logs.clear()
        t0 = time.perf_counter()
        from llama_cpp import llama_chat_format

        original = llama_chat_format.Jinja2ChatFormatter
        llama_chat_format.Jinja2ChatFormatter = _NoTemplateCompile  # type: ignore[misc,assignment]
        default_params = lc.llama_cpp.llama_model_default_params
        if not params.repack:  # the bindings do not expose use_extra_bufts: set it on their default params
            def no_repack() -> Any:
                p = default_params()
                p.use_extra_bufts = False
                return p

            lc.llama_cpp.llama_model_default_params = no_repack
        try:
            self.llm = lc.Llama(
                model.path,
                n_ctx=n_ctx,
                n_threads=self.params.n_threads,
                n_threads_batch=self.params.n_threads_batch,
                n_gpu_layers=n_gpu,
                n_batch=self.params.n_batch,
                n_ubatch=self.params.n_ubatch,
                flash_attn=params.flash_attn,
                type_k=KV_CACHE_TYPES[params.cache_type_k],
                type_v=KV_CACHE_TYPES[params.cache_type_v],
                use_mmap=params.use_mmap,
                seed=random.getrandbits(31),
                verbose=False,
            )
        except ValueError as e:
            raise self._load_error(str(e)) from None
        finally:
            llama_chat_format.Jinja2ChatFormatter = original  # type: ignore[misc]
            lc.llama_cpp.llama_model_default_params = default_params
        self.load_s = time.perf_counter() - t0
        # Which kernels this load uses, as far as batch invariance goes: llama.cpp's repacked CPU layouts
        # compute 4+ rows of a batch differently from fewer, and GPU kernels change with the batch size.
        self.repacked = any(_REPACK_BUFFER.search(line) for line in logs.lines(last=1000))
        self.offloaded = n_gpu != 0 and bool(lc.llama_supports_gpu_offload())
        if verbose:
            logs.dump_to_stderr()
            logs.set_echo(True)
        self.n_ctx = min(self.llm.n_ctx(), n_ctx)
        self.params = dataclasses.replace(self.params, n_ctx=self.n_ctx)
        self._vocab = lc.llama_model_get_vocab(self.llm.model)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._template: ChatTemplate | None = None
        self._add_bos = bool(lc.llama_vocab_get_add_bos(self._vocab))

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

    # ---- prompts -------------------------------------------------------------------------------------

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return str(self.llm.detokenize([token], special=True).decode("utf-8", errors="replace"))

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
            self._template = ChatTemplate(
                source, self._token_text(self.llm.token_bos()), self._token_text(self.llm.token_eos())
            )
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

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """Text to tokens; special-token text such as <|im_end|> becomes the control token."""
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=True))

    def piece(self, token: int) -> bytes:
        """One token's bytes, leading space kept (detokenizing one token alone would strip it)."""
        buf = self._piece_buf
        n = self._lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <|im_end|>, ...)."""
        return bool(self._lc.llama_vocab_is_eog(self._vocab, token))

    def check_grammar(self, gbnf: str) -> None:
        """Parse a GBNF grammar natively; the bindings never check whether the parse failed."""
        with _capture_fd2() as captured:
            sampler = self._lc.llama_sampler_init_grammar(self._vocab, gbnf.encode("utf-8"), b"root")
        if not sampler:
            why = next((ln.strip() for ln in captured() if "error" in ln), "")
            why = why.split("error parsing grammar:", 1)[-1].strip().rstrip(":")
            raise GrammarError("the grammar does not parse" + (f": {why}" if why else ""))
        self._lc.llama_sampler_free(sampler)

    # ---- generation ----------------------------------------------------------------------------------

    def cached_prefix(self, tokens: list[int]) -> int:
        """How many leading prompt tokens the KV cache already holds and generate() will reuse."""
        n = common_prefix(self.llm._input_ids, tokens)
        if n == len(tokens) and n > 0:
            n -= 1  # the last prompt token is evaluated again to refresh the logits
        return n

    def generate(self, tokens: list[int], sampling: SamplingParams, started: float | None = None,
                 drafter: Any = None, draft_max: int = 6) -> Generation:
        """Start streaming a completion of `tokens`. Raises ContextOverflowError before any work.
        `started` (a perf_counter time) is when the request began, if prompt work was done before this
        call (a prompt cache loaded or filled), so time to first token counts it."""
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
        return Generation(self, tokens, sampling, started, drafter, draft_max)

    def perf(self) -> Any:
        """llama.cpp's perf counters for this context."""
        return self._lc.llama_perf_context(self.llm.ctx)

    def reset_perf(self) -> None:
        """The bindings reset counters only in verbose mode; every request starts from zero here."""
        self._lc.llama_perf_context_reset(self.llm.ctx)

    def close(self) -> None:
        """Free the model and context."""
        with contextlib.suppress(Exception):
            self.llm.close()


class Generation:
    """A lazy stream: iterate for Chunks; read .text, .finish_reason and .stats when it is done."""

    def __init__(self, engine: Engine, tokens: list[int], sampling: SamplingParams,
                 started: float | None = None, drafter: Any = None, draft_max: int = 6) -> None:
        self.engine = engine
        self.prompt = tokens
        self.seed = sampling.seed if sampling.seed is not None else random.getrandbits(31)
        self.sampling = sampling
        self.text = ""
        self.tokens: list[int] = []
        self.finish_reason: FinishReason | None = None
        self.stats: Stats | None = None
        self._cancel = False
        self._started = started
        self.drafter = drafter
        self.draft_max = draft_max
        self.counters: Any = None
        self._iter = self._run()

    def __iter__(self) -> Iterator[Chunk]:
        return self._iter

    def cancel(self) -> None:
        """Stop after the token being decoded; the text so far is kept."""
        self._cancel = True

    def _run(self) -> Iterator[Chunk]:
        eng, s = self.engine, self.sampling
        llm = eng.llm
        cached = eng.cached_prefix(self.prompt)
        llm.set_seed(self.seed)
        llm.last_n_tokens_size = s.repeat_last_n if s.repeat_last_n >= 0 else eng.n_ctx
        grammar = None
        if s.grammar:
            from llama_cpp.llama_grammar import LlamaGrammar

            grammar = LlamaGrammar.from_string(s.grammar, verbose=False)
        eng.reset_perf()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        stops = [x for x in s.stop if x]
        hold = max((len(x) for x in stops), default=0)
        emitted = 0
        t0 = self._started if self._started is not None else time.perf_counter()
        t_first: float | None = None
        reason: FinishReason = "length"
        budget = eng.n_ctx - len(self.prompt)
        limit = min(s.max_tokens, budget) if s.max_tokens > 0 else budget
        t_last: float | None = None
        if self.drafter is not None:
            from localgen.engine import speculative

            self.counters = speculative.Counters()
            gen: Any = speculative.tokens(eng, self.prompt, s, self.seed, self.drafter, self.draft_max,
                                          self.counters)
        else:
            gen = llm.generate(
                self.prompt, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, typical_p=s.typical_p,
                temp=s.temperature, repeat_penalty=s.repeat_penalty, frequency_penalty=s.frequency_penalty,
                presence_penalty=s.presence_penalty, grammar=grammar,
            )
        finished = False
        try:
            try:
                for token in gen if limit > 0 else ():
                    t_last = time.perf_counter()
                    if t_first is None:
                        t_first = t_last
                    if eng.is_eog(token):
                        reason = "eos"
                        break
                    self.tokens.append(token)
                    self.text += decoder.decode(eng.piece(token))
                    if stops:
                        hit = _find_stop(self.text, stops, max(0, emitted - hold))
                        if hit is not None:
                            self.text = self.text[:hit]
                            reason = "stop"
                            if hit > emitted:
                                yield Chunk(self.text[emitted:], len(self.tokens))
                            emitted = len(self.text)
                            break
                        safe = len(self.text) - _partial_stop(self.text, stops)
                    else:
                        safe = len(self.text)
                    if safe > emitted:
                        yield Chunk(self.text[emitted:safe], len(self.tokens))
                        emitted = safe
                    if self._cancel:
                        reason = "cancelled"
                        break
                    if len(self.tokens) >= limit:
                        at_max = s.max_tokens > 0 and len(self.tokens) >= s.max_tokens
                        reason = "length" if at_max else "context"
                        break
                else:
                    if limit <= 0:
                        reason = "context"
            finally:
                gen.close()
            if reason != "stop":
                # flush held-back text that turned out not to start a stop sequence
                self.text += decoder.decode(b"", final=True)
                if len(self.text) > emitted:
                    tail, emitted = self.text[emitted:], len(self.text)
                    yield Chunk(tail, len(self.tokens))
            finished = True
        finally:
            self.finish_reason = reason if finished else "cancelled"
            self.stats = self._stats(t0, t_first, t_last, cached)

    def close(self) -> None:
        """Stop the stream (if still running) and settle the stats as cancelled."""
        self._iter.close()  # type: ignore[attr-defined]

    def _stats(self, t0: float, t_first: float | None, t_last: float | None, cached: int) -> Stats:
        perf = self.engine.perf()
        total = time.perf_counter() - t0
        prefill = perf.n_p_eval / (perf.t_p_eval_ms / 1000) if perf.t_p_eval_ms > 0 else None
        decode = perf.n_eval / (perf.t_eval_ms / 1000) if perf.t_eval_ms > 0 and perf.n_eval > 0 else None
        c = self.counters
        if c is not None:  # verification batches count as prompt work in llama.cpp's counters: use the clock
            n = len(self.tokens)
            decode = (n - 1) / (t_last - t_first) if t_first and t_last and t_last > t_first and n > 1 else None
            prefill = (len(self.prompt) - cached) / (t_first - t0) if t_first and t_first > t0 else None
        assert self.finish_reason is not None
        return Stats(
            prompt_tokens=len(self.prompt),
            cached_tokens=cached,
            completion_tokens=len(self.tokens),
            load_s=self.engine.load_s,
            ttft_s=(t_first - t0) if t_first is not None else None,
            prefill_tps=prefill,
            decode_tps=decode,
            total_s=total,
            finish_reason=self.finish_reason,
            drafted=c.drafted if c is not None else None,
            accepted=c.accepted if c is not None else None,
        )


@contextlib.contextmanager
def _capture_fd2() -> Iterator[Any]:
    """Capture what native code writes straight to fd 2 (llama.cpp's grammar parser uses fprintf)."""
    import os
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


def _find_stop(text: str, stops: list[str], start: int) -> int | None:
    best: int | None = None
    for stop in stops:
        i = text.find(stop, start)
        if i != -1 and (best is None or i < best):
            best = i
    return best


def _partial_stop(text: str, stops: list[str]) -> int:
    """Length of the longest tail of text that could begin a stop sequence (held back until known)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


__all__ = ["Engine", "Generation", "backend_info", "grammar_from_json_schema"]
