"""The local implementation of the generation protocol (backend.py): requests become tokens through the
model's chat template, go through one Engine, and come back as streams; many requests go through the
continuous-batching ParallelContext; beam search is a local extra."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from localgen.backend import Completion, Indexed
from localgen.engine.llama import Engine
from localgen.engine.promptcache import MIN_PREFIX
from localgen.engine.tokens import common_prefix
from localgen.errors import BiasOutsideVocabulary, LocalgenError, WrongModel
from localgen.native.prompt import Prompt
from localgen.types import GenerationRequest

SIZE_CHECKED = 1 << 20  # characters: a prompt past this, and past what the window could hold, is refused by its size


class LocalBackend:
    """A loaded model behind the Backend protocol."""

    def __init__(self, engine: Engine, drafter: Any = None, draft_max: int = 6,
                 warn: Callable[[str], None] = lambda s: None) -> None:
        self.engine = engine
        self.drafter = drafter
        self.draft_max = draft_max
        self.warn = warn
        self.name = engine.model.name
        self.defaults = dict(engine.model.sampling_defaults)  # the catalogue's recommended sampling
        self._embedder: Any = None
        self._scorer: Any = None  # the reranking context
        self._projector: Any = None  # native/mtmd.py's Projector, loaded with the first image or clip

    def check_generates(self) -> None:
        """A UsageError for a model that cannot generate text (an encoder: embeddings and scores only)."""
        if self.engine.encoder_only:
            raise WrongModel(f"{self.name} is an encoder model: it makes embeddings (or rerank scores), not text",
                             hint="use `localgen embed` or `localgen rerank` with it")

    @property
    def n_ctx(self) -> int:
        """The context window in tokens."""
        return self.engine.n_ctx

    def window_cap(self) -> int | None:
        """The largest window any --ctx loads the model with (Engine.window_cap)."""
        return self.engine.window_cap()

    def prompt(self, request: GenerationRequest) -> Prompt:
        """The request's prompt as the engine takes it (chat template for messages; BOS as the model asks for
        raw). With images or audio, libmtmd's (native/mtmd.py): their positions hold placeholders, and its
        spans evaluate them. A logit bias on a token the vocabulary lacks is refused first."""
        n_vocab = self.engine.n_vocab
        outside = [t for t, _ in request.sampling.logit_bias if t >= n_vocab]
        if outside:
            raise BiasOutsideVocabulary(f"logit bias on token {outside[0]}: this model's vocabulary has {n_vocab:,} "
                                        f"tokens (0 to {n_vocab - 1:,})")
        if request.prompt is not None:
            return Prompt.text(self.engine.raw_tokens(request.prompt))
        if _has_media(request.messages):
            from localgen import media

            proj = self.projector()
            messages, found = media.split(request.messages, proj.marker)
            proj.check(found, self.name)
            # a final assistant message that holds media is closed as a turn, not continued (final_text): an
            # answer cannot go on from an image, whose tokens give no logits to sample from
            text, add_special = self.engine.chat_text(template_messages(messages), request.prefill is not None,
                                                      **template_extra(request))
            prompt: Prompt = proj.tokenize(text, found, add_special)
            return prompt
        text, add_special = self.engine.chat_text(template_messages(request.messages), request.prefill is not None,
                                                  **template_extra(request))
        self._check_chars(len(text))  # the template's own text counts too (a preset's thousands of MESSAGE turns)
        return Prompt.text(self.engine.tokenize(text, add_special))

    def check_size(self, request: GenerationRequest) -> None:
        """A prompt whose text cannot fit the window whatever the tokenizer makes of it is refused by its size,
        before the template writes it out or the tokenizer reads it (tens of megabytes piped in)."""

        def chars_of(content: Any) -> int:  # a message's text (its images and audio are not text)
            if isinstance(content, list):
                return sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
            return len(content) if isinstance(content, str) else 0

        self._check_chars(len(request.prompt) if request.prompt is not None else sum(
            chars_of(m.get("content")) for m in request.messages or ()))

    def _check_chars(self, chars: int) -> None:
        """A prompt of `chars` characters the window cannot hold whatever the tokenizer makes of them: an overflow."""
        from localgen.text import CHARS_PER_TOKEN

        most = CHARS_PER_TOKEN * self.engine.n_ctx
        if chars > max(most, SIZE_CHECKED):  # below a megabyte the tokenizer is quick, and says the tokens exactly
            raise self.engine.overflow(f"the prompt is {chars:,} characters; the context window of "
                                       f"{self.engine.n_ctx:,} tokens holds at most {most:,}",
                                       -(-chars // CHARS_PER_TOKEN))  # at least this many tokens

    def render(self, request: GenerationRequest) -> str:
        """The prompt text the model sees (media as libmtmd's marker)."""
        if request.prompt is not None:
            return request.prompt
        messages = request.messages
        if _has_media(messages):
            from localgen import media

            messages = tuple(media.split(messages, media.MARKER)[0])
        return self.engine.template.render(template_messages(messages), continue_final=request.prefill is not None,
                                           **template_extra(request))

    def check_media(self, found: list[Any]) -> None:
        """A MediaError now, as they are attached, for images or audio this model cannot read."""
        self.projector().check(found, self.name)

    def projector(self) -> Any:
        """The model's projector, loaded on first use; a UsageError for a model without one."""
        if self._projector is None:
            path = self.engine.model.mmproj
            if not path:
                raise WrongModel(f"{self.name} reads text only: it has no multimodal projector",
                                 hint="give its mmproj file with --mmproj, or pick a vision model "
                                      "(`localgen list --catalogue`)", param="messages")
            from localgen.native.mtmd import Projector, available

            missing = available()
            if missing:
                raise LocalgenError(missing, hint="reinstall with scripts/install.sh (it builds libmtmd)")
            e = self.engine
            self._projector = Projector(e.model_ptr, path, e.params.n_threads_batch or e.params.n_threads or 1,
                                        e.flash_attn, use_gpu=e.offloaded)
            self._projector.n_ctx = e.n_ctx  # a video's frames are bounded by it before any is read
        return self._projector

    def count(self, request: GenerationRequest) -> int:
        """Prompt tokens."""
        return len(self.prompt(request).tokens)

    def generate(self, request: GenerationRequest, started: float | None = None) -> Any:
        """A stream of the answer; the shared prefix comes from (or goes to) the prompt cache first, once the
        stream begins, so that cancelling the stream stops that evaluation too (a chat's first Ctrl-C)."""
        self.check_generates()
        started = started if started is not None else time.perf_counter()
        self.check_size(request)
        prompt = self.prompt(request)
        # a prompt shorter than the least cached prefix holds none: its lead is not rendered (most one-shot runs)
        lead = _lead(request) if MIN_PREFIX <= len(prompt.tokens) < self.engine.n_ctx else None
        drafter = self.drafter
        if drafter is not None and prompt.spans:
            drafter = None  # the draft model cannot see the image
            self.warn("speculative decoding is off for a prompt with images or audio")
        prefix = functools.partial(self._hold_lead, request, lead) if lead is not None and not prompt.spans else None
        gen = self.engine.generate(prompt, request.sampling, started=started, drafter=drafter,
                                   draft_max=self.draft_max, logprobs=request.logprobs, lead=prefix)
        gen.prompt_cache = "skipped" if request.prompt_cache else "off"
        return gen

    def _hold_lead(self, request: GenerationRequest, lead: GenerationRequest, gen: Any) -> None:
        """Before `gen` evaluates its prompt: the KV cache holds the prompt's shared prefix (`lead`'s tokens), from
        the prompt cache or evaluated, unless `gen` is cancelled meanwhile; `gen` learns the cache's status and
        how many tokens were held before (the rest count as this answer's evaluation, not as cached)."""
        from localgen.engine import promptcache

        tokens = gen.prompt.tokens
        self.engine.reset_perf()  # a prefix evaluated here is this answer's prompt work: its rate counts it
        shared = common_prefix(self.prompt(lead).tokens, tokens)
        if shared >= MIN_PREFIX and common_prefix(self.engine.kv.held, tokens) >= shared:
            # held already, by an earlier turn or tool step: evaluating it again would drop what follows it
            gen.prompt_cache = "hit" if request.prompt_cache else gen.prompt_cache
        elif request.prompt_cache:
            attached = promptcache.attach_prefix(self.engine, tokens[:shared], self.warn, gen.cancelled)
            gen.prompt_cache, gen.held_before = attached.status, attached.held_before
        elif shared >= MIN_PREFIX:
            # Evaluated in the same two pieces as with the cache: llama.cpp's kernels round a row
            # differently in batches of other sizes, and the text must not depend on the cache.
            gen.held_before = self.engine.kv.evaluate(Prompt.text(tokens[:shared]), logits=False,
                                                      cancelled=gen.cancelled)

    def run_many(self, requests: Iterable[Indexed], parallel: int, on_done: Callable[[Completion], None],
                 exact: bool | None = None) -> dict[str, Any]:
        """Continuous batching over one ParallelContext (engine/batch.py), in the mode `exact` asks for (the
        default: exact where that is free, else the throughput scheduler)."""
        self.check_generates()
        from localgen.engine.batch import ParallelContext
        from localgen.engine.batchmode import batching_mode
        from localgen.engine.batchseq import Request

        def prepared() -> Iterator[Request]:
            for item in requests:
                try:
                    self.check_size(item.request)
                    prompt = self.prompt(item.request)
                except LocalgenError as e:
                    on_done(Completion(item.index, "", f"error: {e.message}", 0, 0, 0.0, 0.0, item.seed, error=e))
                    continue
                yield Request(item.index, prompt, item.request.sampling, item.seed, item.request.logprobs)

        self.engine.release_context()  # its KV cache would sit unused beside the parallel one
        mode = batching_mode(self.engine, exact, self.lookup)
        pc = ParallelContext(self.engine, parallel, self.engine.n_ctx, pooled=mode.throughput,
                             draft_max=self.draft_max if self.lookup else 0)
        pc.ctrl_c = True  # a Ctrl-C stops a step of prompts where it is (on the main thread, under our handler)
        try:
            if pc.draft_max:
                pc.calibrate()
            pc.run(prepared(), on_done, exact=mode.exact, serial_exact=self.engine.offloaded, reuse=mode.throughput)
        finally:
            pc.close()
        return {"steps": pc.steps, "rows": pc.rows, "throughput": float(mode.throughput),
                "shared": float(pc.slots.shared), "kv_unified": float(pc.one_pool), "why": mode.why,
                **({"drafted": pc.drafted, "accepted": pc.accepted, "row_cost": round(pc.costs.row or 0.0, 3)}
                   if pc.draft_max else {})}

    @property
    def lookup(self) -> bool:
        """Whether it drafts by prompt lookup (--lookup)."""
        from localgen.engine.speculative import LookupDrafter

        return isinstance(self.drafter, LookupDrafter)

    def exactness(self, exact: bool | None, greedy: bool) -> str:
        """What a batched answer promises against running alone (engine/batchmode.py `exactness`)."""
        from localgen.engine.batchmode import exactness

        return exactness(self.engine, exact, greedy, self.lookup)

    def beams(self, request: GenerationRequest, n: int, length_penalty: float) -> Any:
        """Beam search (engine/beams.py) on the request's prompt."""
        self.check_generates()
        from localgen.engine.beams import search

        s = request.sampling
        return search(self.engine, self.prompt(request), n, s.max_tokens, length_penalty, s.stop)

    def save_conversation(self, name: str) -> None:
        """Keep the KV state of a conversation for a later resume."""
        from localgen.engine import promptcache

        promptcache.save_chat(self.engine, name)

    def restore_conversation(self, name: str, request: GenerationRequest) -> int:
        """Load a conversation's saved KV state if it matches; returns the tokens reused."""
        from localgen.engine import promptcache

        return promptcache.restore_chat(self.engine, name, self.prompt(request).tokens)

    def describe(self) -> dict[str, Any]:
        """The model and how it was loaded."""
        ref = self.engine.model
        load = dataclasses.asdict(self.engine.params)
        load["flash_attn"] = self.engine.flash_attn
        load["tensor_split"] = list(load["tensor_split"])
        load["rpc"] = list(load["rpc"])
        load["override_tensor"] = [list(x) for x in load["override_tensor"]]
        # where the weights went, by buffer (weights_mib); "offloaded 31/31 layers to GPU" (None on the CPU alone);
        # what -ot, --cpu-moe and --n-cpu-moe moved (moved: buffer → tensors, experts, MiB): llama.cpp's log's
        load.update(self.engine.load_report.record())
        load["origins"] = dict(self.engine.origins)  # each tunable setting: flag, tuned on DATE, or rule: why
        return {
            "model": {"name": ref.name, "file": ref.file, "source": ref.source, "quantization": ref.quantization,
                      "architecture": ref.summary.architecture, "parameters": ref.summary.n_params,
                      "file_size": ref.summary.file_size},
            "load": load,
        }

    def embedder(self, pooling: str | None = None) -> Any:
        """The model's embeddings context (made on first use, again when another pooling is asked for)."""
        from localgen.engine.embed import Embedder

        current = self._embedder
        if current is None or (pooling is not None and current.pooling != pooling):
            if current is not None:
                current.close()
            self._embedder = None
            self._embedder = Embedder(self.engine, pooling)
        return self._embedder

    def embed(self, texts: list[str], pooling: str | None = None, normalize: bool = True,
              dimensions: int | None = None, truncate: bool = False) -> list[Any]:
        """One Embedding per text, in order (engine/embed.py)."""
        emb = self.embedder(pooling)
        return list(emb.embed([emb.tokens(t, truncate) for t in texts], normalize, dimensions))

    def scorer(self) -> Any:
        """The model's reranking context (made on first use)."""
        from localgen.engine.embed import Embedder

        if self._scorer is None:
            self._scorer = Embedder(self.engine, scores=True)
        return self._scorer

    def rerank(self, query: str, documents: list[str], truncate: bool = False) -> list[tuple[float, int]]:
        """Each document's relevance score for the query (a reranker model), in order, with its tokens."""
        sc = self.scorer()
        out = sc.embed([sc.pair_tokens(query, d, truncate) for d in documents], normalize=False)
        return [(e.vector[0], e.tokens) for e in out]

    def close(self) -> None:
        """Free the embeddings contexts, the draft model (if any) and the engine."""
        try:
            if self._projector is not None:
                self._projector.close()
                self._projector = None
            for ctx in (self._embedder, self._scorer):
                if ctx is not None:
                    ctx.close()
            if self.drafter is not None:
                self.drafter.close()
        finally:
            self.engine.close()


def template_messages(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: a tool call's arguments as an object, not OpenAI's JSON string
    (templates write them with `tojson`; llama.cpp's server converts them the same way)."""
    import json

    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for c in calls:
                fn = dict(c.get("function", {}))
                if isinstance(fn.get("arguments"), str):
                    with contextlib.suppress(ValueError):
                        fn["arguments"] = json.loads(fn["arguments"])
                fixed.append({**c, "function": fn})
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


def template_extra(request: GenerationRequest) -> dict[str, Any]:
    """The template variables a request adds: its tools, and any others it sets (enable_thinking)."""
    extra: dict[str, Any] = dict(request.template_args)
    if request.tools:
        extra["tools"] = list(request.tools)
    return extra


def _with_text(request: GenerationRequest, text: str) -> GenerationRequest:
    """The same request with the last message's text (or the raw prompt) replaced."""
    if request.prompt is not None:
        return dataclasses.replace(request, prompt=text)
    last = {**request.messages[-1], "content": text}
    return dataclasses.replace(request, messages=(*request.messages[:-1], last))


def _lead(request: GenerationRequest) -> GenerationRequest | None:
    """The part of a request that repeats across requests, as a request whose tokens begin as its own do: with
    `shared` (documents, piped text), the last message (or raw prompt) cut to it; otherwise what comes before
    the first user message's text (the system prompt, the tools). None where nothing does (a raw prompt)."""
    if request.shared:
        return _with_text(request, request.shared)
    first = next((i for i, m in enumerate(request.messages) if m.get("role") == "user"), None)
    if request.prompt is not None or first is None:
        return None
    question = {**request.messages[first], "content": ""}
    return dataclasses.replace(request, messages=(*request.messages[:first], question))


def _has_media(messages: Iterable[dict[str, Any]]) -> bool:
    """Whether a message holds images or audio. Only list content can (a text-only request never imports
    media.py, which a plain run does not need); media.has_media decides for the rest."""
    if not any(isinstance(m.get("content"), list) for m in messages):
        return False
    from localgen import media

    return media.has_media(messages)
