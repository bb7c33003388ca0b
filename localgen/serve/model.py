"""Loading a served model: its engine, the ParallelContext for its slots and its batching mode, in the
thread that will decode (serve/worker.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localgen.errors import LocalgenError
from localgen.types import LoadParams, ModelRef


def open_model(ref: ModelRef, load: LoadParams, parallel: int, exact: bool | None, share_prefixes: bool,
               cache_ram: int, warn: Callable[[str], None], warm: bool, lookup: int = 0,
               draft: ModelRef | None = None) -> tuple[Any, Any, Any]:
    """The LocalBackend, the ParallelContext of `parallel` slots, and the batching Mode; nothing held when it
    fails. `warm`: decode a warm-up now (only in the thread that decodes from now on: llama.cpp's CPU backend
    (OpenMP) keeps a team of threads per calling thread, and a warm-up decode in the loading thread made every
    later step in the worker thread much slower (docs/benchmarks.md, Warm-up); the worker warms a preloaded
    model itself). `lookup`: tokens drafted per step at most (0: none), by prompt lookup or, with `draft`, by
    that model (serve --draft), loaded with the same settings where the slots draft at all (not with --exact,
    nor for a recurrent model): a UsageError when its vocabulary differs (found from the two files' vocabularies
    before either model loads) or its memory cannot drop drafts."""
    import dataclasses

    from localgen.engine.batch import ParallelContext
    from localgen.engine.batchmode import batching_mode
    from localgen.engine.local import LocalBackend
    from localgen.models.load import for_draft, open_engine

    if draft is not None and exact is not True:  # a draft that cannot draft for it is refused before either loads
        from localgen.engine.speculative import check_vocab_files

        check_vocab_files(ref.path, draft.path, draft.name)
    engine = open_engine(ref, load, warn=warn, kv_tokens=parallel * load.n_ctx)
    engine.release_context()  # the slots have their own
    backend = LocalBackend(engine, warn=warn)
    pc = None
    try:
        mode = batching_mode(engine, exact, lookup > 0)
        if draft is not None:  # the start-up line names the draft model where it names --lookup
            mode = dataclasses.replace(mode, why=mode.why.replace("--lookup", f"--draft {draft.name}"))
        pc = ParallelContext(engine, parallel, engine.n_ctx, pooled=mode.throughput, share_prefixes=share_prefixes,
                             cache_ram=cache_ram, draft_max=lookup)
        if draft is not None and pc.draft_max:
            pc.drafter = _drafter(engine, draft, dataclasses.replace(for_draft(load), lora=(), n_ctx=pc.n_ctx_seq),
                                  parallel, pc.n_ctx_seq, warn)
        if warm:  # a job waits for this load: it need not pay for ignore_eos's token scan
            pc.warm_up(eog=False)
    except BaseException:
        if pc is not None:
            pc.close()
        backend.close()  # a failed load holds nothing: the next job loads again
        raise
    return backend, pc, mode


def _drafter(engine: Any, ref: ModelRef, load: LoadParams, parallel: int, n_ctx_seq: int,
             warn: Callable[[str], None]) -> Any:
    """The draft model loaded for the slots (engine/speculative.py, SlotDrafter), once it is found fit to draft
    for `engine`: a memory that can drop the drafts not kept (its vocabulary was checked before the loads)."""
    from localgen.engine.speculative import SlotDrafter
    from localgen.errors import UsageError
    from localgen.models.load import open_engine
    from localgen.native import model as native_model

    d = open_engine(ref, load, warn=warn, kv_tokens=parallel * n_ctx_seq)  # placed for the cells SlotDrafter makes
    try:
        if d.encoder_only or native_model.has_encoder(d.model_ptr) or native_model.whole_states_only(d.model_ptr):
            raise UsageError(f"--draft {ref.name}: a recurrent, hybrid or encoder model cannot draft (its memory "
                             "cannot drop the drafts not kept)", hint="pick a small transformer of the same family")
        return SlotDrafter(d, parallel, n_ctx_seq, engine.n_vocab)
    except BaseException:
        d.close()
        raise


def warm_template(backend: Any) -> None:
    """Compile now what the first chat request would: the chat template (with jinja's import), and the check
    whether its generation prompt opens a thinking block (cached for the event loop, which asks it of every
    request), so the first chat request's time to first token is llama-server's, not more (docs/benchmarks.md,
    Warm-up; scripts/bench_first_request.py)."""
    from localgen.tools.plan import thinking_opened_by

    try:
        template = backend.engine.template
    except LocalgenError:
        return  # a base model (raw prompts only), or a broken template that each chat request reports
    thinking_opened_by(template.source)


def footprint(ref: ModelRef, load: LoadParams, parallel: int, draft: ModelRef | None = None) -> int:
    """The bytes loading `ref` for `parallel` slots will take on every device, by the plan the load follows
    (models/fit.py): what serve's residency (serve/residency.py) sets against its budget; with a `draft`
    model (serve --draft), its bytes for as many slots too."""
    import dataclasses

    from localgen.models import fit
    from localgen.models import footprint as fp
    from localgen.models.load import for_draft
    from localgen.native.devices import backend_info

    machine = fit.this_machine(bool(backend_info()["gpu_offload"]))
    plan = fit.plan(ref.summary, fp.layout(ref.path), machine, load, ctx=load.n_ctx, parallel=parallel)
    adapters = sum(_size(path) for path, _ in (*ref.adapters, *load.lora))  # LoRA weights load beside the model's
    own = plan.footprint.total + adapters
    return own + (footprint(draft, dataclasses.replace(for_draft(load), lora=()), parallel) if draft is not None else 0)


def embeddings_footprint(ref: ModelRef, load: LoadParams, n_ctx: int | None = None) -> int:
    """The bytes a model's embeddings context (engine/embed.py, made on its first embeddings or rerank request)
    takes beside what `footprint` counts, at `n_ctx` (default: the context its plan loads it with):
    models/footprint.py's estimate of its KV cache, output and compute buffers."""
    from localgen.models import fit
    from localgen.models import footprint as fp
    from localgen.native.devices import backend_info

    if n_ctx is None:
        machine = fit.this_machine(bool(backend_info()["gpu_offload"]))
        n_ctx = fit.plan(ref.summary, fp.layout(ref.path), machine, load, ctx=load.n_ctx).ctx
    return fp.embeddings_bytes(ref.summary, n_ctx, flash=load.flash_attn is not False)


def embeds(ref: ModelRef) -> bool:
    """Whether a model is made for embeddings or reranking (an encoder, or a GGUF that names its pooling): the
    context for them is counted from its load on, not first when a request asks for it."""
    s = ref.summary
    pooling = s.metadata.get(f"{s.architecture}.pooling_type")
    return s.encoder_only or (isinstance(pooling, int) and not isinstance(pooling, bool) and pooling > 0)


def reranks(ref: ModelRef) -> bool:
    """Whether a model's GGUF names rank pooling (llama.cpp's LLAMA_POOLING_TYPE_RANK): a reranker, which scores."""
    s = ref.summary
    return s.metadata.get(f"{s.architecture}.pooling_type") == 4


def _size(path: str) -> int:
    import os

    try:
        return os.path.getsize(path)
    except OSError:
        return 0  # the load says the file is missing
