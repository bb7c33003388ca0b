"""What `localgen run` does, as a short pipeline: the flags become a checked plan (runplan.py: every usage
error before any download or load), the model is resolved and loaded into a backend, then one stream, beam
search, or many prompts, and the output."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from localgen.cli import flagfiles, presetflow
from localgen.cli.knobs import Knobs
from localgen.cli.output import ErrWriter, TextWriter
from localgen.cli.runoptions import ReportOptions, RunArgs
from localgen.cli.runplan import RunPlan, check
from localgen.errors import UsageError
from localgen.types import GenerationRequest, Message, SamplingParams, thinking_args

if TYPE_CHECKING:
    from localgen.backend import Backend
    from localgen.engine.local import LocalBackend


def execute(f: RunArgs) -> None:
    """Run the command."""
    from localgen.cli import logflow

    many = f.many.file is not None or f.many.each_line
    continuing = f.log.continue_ or f.log.cid
    if continuing and (many or f.raw):
        raise UsageError(f"{'--continue' if f.log.continue_ else '--cid'} continues a chat: it cannot be combined "
                         f"with {'--file/--each-line' if many else '--raw'}")
    thread = None if many else logflow.thread_for(f.log)
    if thread is not None:
        f = logflow.continue_with(f, thread)
    plan = check(f)
    f.knobs.sampling()  # the flags alone are valid, before the catalogue's defaults are known
    err = ErrWriter()
    toolbox = None
    if f.tools.any:
        from localgen.cli.toolflow import open_toolbox

        toolbox = open_toolbox(f.tools)
    try:
        backend: Backend = remote_backend(f, plan) if plan.endpoints else open_backend(f, plan, err)
    except BaseException:
        if toolbox is not None:
            toolbox.close()
        raise
    try:
        if not plan.endpoints:
            backend.check_generates()  # type: ignore[attr-defined]  # LocalBackend: an encoder cannot
        if thread is None:  # --file / --each-line
            raise typer.Exit(run_many(f, plan, backend, err))
        request = single_request(f, plan, backend, thread.turns)
        if f.report.verbose_prompt:
            err.line("prompt:\n" + backend.render(_as_sent(f, backend, request, toolbox)))
        if f.decoding.beams:
            text, stats, finish = run_beams(f, backend, request, err)  # type: ignore[arg-type]  # local only
        elif toolbox is not None:
            from localgen.cli.toolflow import run_with_tools

            text, stats, finish = run_with_tools(f.tools, f.report, backend, request, toolbox, err, thread.cid)
        else:
            gen, text = stream(f.report, backend, request, err, thread.cid)
            stats, finish = gen.stats, str(gen.finish_reason)
        logflow.record(err, backend, request, thread.cid, text, stats, finish, model=f.model, no_log=f.log.no_log,
                       remote=bool(plan.endpoints))
    finally:
        backend.close()
        if toolbox is not None:
            toolbox.close()


def _as_sent(f: RunArgs, backend: Backend, request: GenerationRequest, toolbox: Any) -> GenerationRequest:
    """The request as the model gets it first: with the tools (in the template, or the system prompt)."""
    if toolbox is None:
        return request
    from localgen.cli.toolflow import first_plan
    from localgen.tools.loop import plan_for
    from localgen.tools.plan import with_tools
    from localgen.tools.stream import template_of

    template = template_of(backend)
    plan = first_plan(f.tools, template, toolbox) or plan_for(template, toolbox)
    return with_tools(plan, request) if plan is not None else request


def remote_backend(f: RunArgs, plan: RunPlan) -> Backend:
    """The endpoints as a backend, with the model they serve (the only one, when -m is not given)."""
    from localgen.remote.backend import RemoteBackend, pick_model

    model = plan.model or pick_model(list(plan.endpoints))
    return RemoteBackend(list(plan.endpoints), model, assumed_ctx=f.knobs.get("ctx") if f.knobs.given("ctx") else None)


def open_backend(f: RunArgs, plan: RunPlan, err: ErrWriter) -> LocalBackend:
    """Resolve (pulling if needed) and load the model, and the draft model for --draft."""
    from localgen.cli.progress import make_progress
    from localgen.engine.local import LocalBackend
    from localgen.models.load import open_engine
    from localgen.models.resolve import resolve

    override: dict[str, Any] = {}
    if plan.speculative:
        # llama.cpp's flash-attention kernel and its repacked CPU weights compute a batch of tokens with a
        # different rounding than one token; checking drafts in a batch would then drift from plain
        # decoding. Without them the two agree exactly (at temperature 0).
        for on, name in ((plan.flash_attn_on, "flash-attn"), (plan.repack_on, "repack")):
            if on:
                err.warn(f"with --{name}, speculative output can differ slightly from plain decoding")
        if not plan.flash_attn_given:
            override["flash_attn"] = False
        if not plan.repack_given:
            override["repack"] = False
    load = f.knobs.load(**override)
    ref = flagfiles.with_template(resolve(f.model, offline=f.offline, progress=make_progress()), f.mmproj,
                                  f.chat_template_file)
    load = presetflow.load_params(ref, load, f.knobs.given)
    draft = f.decoding.draft
    draft_ref = resolve(draft, offline=f.offline, progress=make_progress()) if draft else None
    err.status(f"loading {ref.name} ({ref.quantization or 'unknown quantization'}) ...")
    engine = open_engine(ref, load, verbose=f.verbose, warn=err.warn, kv_tokens=_kv_tokens(f, plan, load.n_ctx))
    from localgen.cli.hints import tune_tip

    tune_tip(err.tty, err.line, ref.name, ref.path, engine.origins)
    drafter: Any = None
    try:
        if f.decoding.lookup:
            from localgen.engine.speculative import LookupDrafter

            drafter = LookupDrafter()
        elif draft_ref is not None:
            from localgen.engine.speculative import ModelDrafter

            err.status(f"loading the draft model {draft_ref.name} ...")
            drafter = ModelDrafter(engine, open_engine(draft_ref, load, verbose=f.verbose, warn=err.warn))
    except BaseException:
        engine.close()
        raise
    return LocalBackend(engine, drafter=drafter, draft_max=f.decoding.draft_max, warn=err.warn)


def _kv_tokens(f: RunArgs, plan: RunPlan, n_ctx: int) -> int | None:
    """KV cells the run holds at once, for the memory estimate, when it is not one window."""
    if plan.many and f.many.parallel > 1:
        return int(f.many.parallel) * n_ctx
    if f.decoding.beams:
        from localgen.engine.beams import kv_cells

        return kv_cells(0, int(f.decoding.beams), int(f.knobs.get("max_tokens")), n_ctx) + n_ctx
    return None


def base_sampling(knobs: Knobs, backend: Backend, grammar: str | None) -> SamplingParams:
    """The flags over the catalogue's recommended settings for this model."""
    return knobs.sampling(backend.defaults, grammar=grammar)


def single_request(f: RunArgs, plan: RunPlan, backend: Backend,
                   turns: list[Message] | None = None) -> GenerationRequest:
    """The one prompt as a request: earlier turns of a continued conversation, then documents and piped
    text, the question last."""
    text = "\n\n".join(plan.parts)
    shared = "\n\n".join(plan.parts[:-1]) + "\n\n" if len(plan.parts) > 1 else None
    remote = bool(plan.endpoints)
    sampling = base_sampling(f.knobs, backend, None if remote else plan.grammar)
    schema = plan.schema if remote else None
    cache = f.prompt_cache and not remote
    if f.raw:
        return GenerationRequest(prompt=text, sampling=sampling, logprobs=f.report.logprobs, shared=shared,
                                 prompt_cache=cache, json_schema=schema)
    thinking = thinking_args(f.think)
    content: Any = text
    if plan.media:
        from localgen import media

        content = media.content(text, list(plan.media))
    messages = presetflow.head(backend, f.system, continued=bool(turns)) + list(turns or []) + [
        {"role": "user", "content": content}]
    return GenerationRequest(messages=tuple(messages), sampling=sampling, logprobs=f.report.logprobs, shared=shared,
                             prompt_cache=cache, json_schema=schema, template_args=thinking)


def stream(report: ReportOptions, backend: Backend, request: GenerationRequest, err: ErrWriter,
           cid: str | None = None) -> tuple[Any, str]:
    """Stream one answer to stdout (or one JSON object at the end), its reasoning apart (to stderr with
    --show-thinking); returns the finished Generation and the answer without the reasoning."""
    from localgen.cli.output import AnswerWriter
    from localgen.errors import RemoteError
    from localgen.tools.stream import answer_stream, template_of

    gen = backend.generate(request, started=time.perf_counter())
    writer = AnswerWriter(err, json_out=report.json_out, show_thinking=report.show_thinking)
    answer = answer_stream(None, template_of(backend), request.template_args, split_reasoning=not request.raw)
    try:
        for chunk in gen:
            if not writer.show(answer.feed(chunk.text)):  # the reader went away (`| head -1`): stop quietly
                gen.close()
                raise typer.Exit(0)
        writer.show(answer.finish())
    except KeyboardInterrupt:
        gen.close()
        writer.end()
        err.interrupted()
        raise typer.Exit(130) from None
    except RemoteError as e:
        writer.end()
        if report.json_out and e.partial:  # what arrived, marked as partial, then the one-line error
            import json

            TextWriter(sys.stdout).write(json.dumps({"text": gen.text, "partial": True, "error": e.message},
                                                    ensure_ascii=False) + "\n")
        raise
    writer.end()
    assert gen.stats is not None
    if gen.finish_reason == "context":
        err.warn(f"stopped: the context window ({backend.n_ctx:,} tokens) is full; raise --ctx for more")
    if report.stats:
        err.stats(gen.stats)
        placement = getattr(getattr(backend, "engine", None), "placement", {})
        if len(placement) > 1:
            err.line("weights: " + " · ".join(f"{dev} {mib:,.1f} MiB" for dev, mib in placement.items()))
    if report.json_out:
        from localgen.cli.output import answer_json

        extra = {"text": answer.content, "reasoning": answer.reasoning} if answer.reasoning else {}
        TextWriter(sys.stdout).write(answer_json(backend, gen, request.sampling, cid, extra) + "\n")
    return gen, answer.content


def run_beams(f: RunArgs, backend: LocalBackend, request: GenerationRequest,
              err: ErrWriter) -> tuple[str, Any, str]:
    """Beam search; the best hypothesis (or all, with --json). Returns its text, stats and finish reason."""
    import json

    from localgen.types import Stats

    t0 = time.perf_counter()
    beams = f.decoding.beams
    assert beams is not None  # run_beams runs for --beams
    result = backend.beams(request, beams, f.decoding.length_penalty)
    best = result.beams[0]
    total = time.perf_counter() - t0
    st = Stats(prompt_tokens=result.prompt_tokens, cached_tokens=0, completion_tokens=len(best.tokens),
               load_s=backend.engine.load_s, ttft_s=total,
               prefill_tps=result.prompt_tokens / result.prefill_s if result.prefill_s else None,
               decode_tps=result.decoded_tokens / result.decode_s if result.decode_s else None, total_s=total,
               finish_reason=best.finish_reason)  # type: ignore[arg-type]
    if f.report.stats:
        err.stats(st)
    out = TextWriter(sys.stdout)
    if f.report.json_out:
        info = backend.describe()
        doc = {"text": best.text, "finish_reason": best.finish_reason,
               "model": {"name": info["model"]["name"], "file": info["model"]["file"]},
               "beams": [{"text": h.text, "score": round(h.score, 5), "logprob": round(h.logprob, 5),
                          "tokens": len(h.tokens), "finish_reason": h.finish_reason} for h in result.beams],
               "length_penalty": f.decoding.length_penalty, "load": info["load"], "stats": st.to_dict()}
        out.write(json.dumps(doc, ensure_ascii=False) + "\n")
    else:
        out.write(best.text)
        out.end()
    return best.text, st, best.finish_reason


def run_many(f: RunArgs, plan: RunPlan, backend: Backend, err: ErrWriter) -> int:
    """--file / --each-line; returns the exit status."""
    from localgen.cli.batchrun import BatchOptions, run_batch

    remote = bool(plan.endpoints)
    base = base_sampling(f.knobs, backend, None if remote else plan.grammar)
    system = presetflow.system(backend, f.system)
    many, report = f.many, f.report
    opts = BatchOptions(instruction=f.prompt, system=system, raw=f.raw, parallel=many.parallel,
                        json_out=report.json_out, stats=report.stats, exact=many.exact, logprobs=report.logprobs,
                        json_schema=plan.schema if remote else None, resume_from=many.resume_from, think=f.think)
    source_path: Path | None = many.file
    try:
        if source_path is not None:
            with open(source_path, encoding="utf-8", errors="replace") as source:
                return run_batch(backend, source, base, opts)
        return run_batch(backend, sys.stdin, base, opts)
    except KeyboardInterrupt:
        err.interrupted()
        return 130
