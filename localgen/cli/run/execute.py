"""What `localgen run` does with its checked plan (plan.py: every usage error before any download or load):
the model is resolved and loaded into a backend, then one stream, beam search, tools, or many prompts, and
the output."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer

from localgen.cli.echo import EchoOff
from localgen.cli.hints import model_gone
from localgen.cli.inputfile import shown_input
from localgen.cli.options import ToolOptions, files, preset
from localgen.cli.options.plan import RAG_NEEDS, LoadPlan
from localgen.cli.output import ErrWriter, TextWriter
from localgen.cli.run.options import DecodingOptions, ReportOptions
from localgen.cli.run.plan import ManyPlan, RunPlan
from localgen.cli.run.window import past_cap
from localgen.cli.signals import ended_by_term, ignoring_ctrl_c, term_as_interrupt, writable
from localgen.errors import (
    ContextOverflowError,
    LocalgenError,
    ModelNotFoundError,
    UsageError,
    no_chat_template,
)
from localgen.types import GenerationRequest, Message, thinking_args

if TYPE_CHECKING:
    from localgen.backend import Backend
    from localgen.engine.local import LocalBackend


def execute(plan: RunPlan) -> None:
    """Run the command's checked plan: load, then one prompt (streamed, beams, or with tools) or many."""
    from localgen.cli.log import conversation

    load, send = plan.load, plan.send
    err = ErrWriter()
    toolbox = None
    if send.tools is not None:
        from localgen.cli.options.tools import open_toolbox

        toolbox = open_toolbox(send.tools)
    try:
        _typed_models(plan)  # before --rag's search loads its embedding model
        hits = retrieve(plan, err) if send.rag is not None else None  # before the model loads: one at a time
        backend = _opened(plan, err)
    except BaseException:
        if toolbox is not None:
            toolbox.close()
        raise
    request: GenerationRequest | None = None
    try:
        if not load.remote:
            backend.check_generates()  # type: ignore[attr-defined]  # LocalBackend: an encoder cannot
            if hits is not None:
                _needs_template(backend)
            plan = plain_completion(plan, backend, toolbox, err)
        if plan.many is not None:  # --file / --each-line
            raise typer.Exit(run_many(plan.many, plan, backend, err))
        assert plan.thread is not None  # one prompt belongs to a conversation
        thread = plan.thread
        sources = None
        if hits is not None:  # the excerpts first: older turns leave the window before excerpts do, as in chat
            plan, sources = _with_excerpts(plan, backend, None, hits, err, toolbox)
        if thread.turns and not load.remote:
            thread = dataclasses.replace(thread, turns=_fitted_turns(plan, backend, thread.turns, err, toolbox))
        request = single_request(plan, backend, thread.turns)
        if plan.report.verbose_prompt:
            err.line("prompt:\n" + backend.render(_as_sent(send.tools, backend, request, toolbox)))
        seed = None  # the seed the answer was drawn with, as --json's "seed" (beams draw none)

        def cut_off(g: Any, said: str, finish: str) -> None:
            """An answer cut off (Ctrl-C, its reader gone, a remote stream broken): logged as far as it came, as
            chat's is."""
            conversation.record(err, backend, request, thread.cid, said, g.stats, finish, model=load.model,
                                no_log=plan.no_log, remote=load.remote, seed=g.seed)

        if plan.decoding.beams:
            text, stats, finish = run_beams(plan.decoding, plan.report, backend, request, err)  # type: ignore[arg-type]
        elif toolbox is not None:
            from localgen.cli.run.tools import run_with_tools

            assert send.tools is not None
            text, stats, finish, seed = run_with_tools(send.tools, plan.report, backend, request, toolbox, err,
                                                       thread.cid, cut_off)
        else:
            extra = {"sources": [{"id": h.id, "score": h.shown_score} for h in sources]} if sources is not None else {}
            gen, text = stream(plan.report, backend, request, err, thread.cid, extra, cut_off)
            stats, finish, seed = gen.stats, str(gen.finish_reason), gen.seed
            if sources is not None and (err.tty or load.verbose) and not plan.report.json_out:
                from localgen.embeddings.retrieve import sources_line

                err.line(sources_line(sources))
        conversation.record(err, backend, request, thread.cid, text, stats, finish, model=load.model,
                            no_log=plan.no_log, remote=load.remote, seed=seed)
    except KeyboardInterrupt:  # between whole lines: an answer under way ends its line and says it itself
        err.interrupted(at_line_start=True)
        raise typer.Exit(130) from None
    except ContextOverflowError as e:  # a system prompt that takes the window is said as chat says it
        if request is None:
            raise
        raise _with_system_share(e, plan, backend, request, toolbox) from None
    finally:
        backend.close()
        if toolbox is not None:
            toolbox.close()


def _opened(plan: RunPlan, err: ErrWriter) -> Backend:
    """The model loaded (or the endpoint's client); a conversation's model that is gone, and a Ctrl-C while it
    loads, said in one line."""
    load = plan.load
    try:
        return remote_backend(load, err) if load.remote else open_backend(plan, err)
    except ModelNotFoundError as e:
        thread = plan.thread
        if thread is not None and thread.turns and not load.model_given:  # the conversation's model is gone
            raise model_gone(thread.cid, load.model, e, "continue") from None
        raise
    except KeyboardInterrupt:
        err.interrupted(at_line_start=True)  # loading prints whole lines (loading ..., a tip, a warning)
        raise typer.Exit(130) from None


def retrieve(plan: RunPlan, err: ErrWriter) -> list[Any]:
    """--rag: the question's excerpts, found with the collection's embedding model, which is freed at once (the
    generation model loads after it). The question is the prompt's last part (the argument, -p, or stdin)."""
    from localgen.cli.options.rag import Rag

    assert plan.send.rag is not None and plan.parts
    if not plan.parts[-1].strip():  # as an empty one is refused: nothing to search for
        raise UsageError("the question is blank: --rag searches the collection for it",
                         hint="give the question as an argument or with -p")
    try:
        rag = Rag(plan.send.rag, plan.load, err.warn)
        try:
            err.status(f"searching {plan.send.rag.collection} ...")
            return rag.search(plan.parts[-1])
        finally:
            rag.close()
    except KeyboardInterrupt:
        err.interrupted(at_line_start=True)
        raise typer.Exit(130) from None


def _needs_template(backend: Backend) -> None:
    """--rag writes the excerpts into a chat message: a model without a chat template (a base model) is refused."""
    from localgen.tools.stream import template_of

    if not template_of(backend):
        raise no_chat_template(backend.name, RAG_NEEDS, hint="use a chat model, or give --chat-template-file")


def _fitted_turns(plan: RunPlan, backend: Backend, turns: list[Message], err: ErrWriter,
                  toolbox: Any = None) -> list[Message]:
    """A continued conversation's logged turns that fit the window with the prompt, the tools as sent, and room
    for the answer (as chat's window: whole exchanges, the oldest left out first, said in one line); all of them
    where they fit. The log keeps every turn. A prompt too long even alone goes without them, to the model's own
    error. A thread of megabytes is cut by its characters first, then by its tokens: never tokenized whole."""
    import bisect

    from localgen.chat.runner import answer_room
    from localgen.errors import ContextOverflowError
    from localgen.media import text_of
    from localgen.text import CHARS_PER_TOKEN

    n_ctx = int(backend.n_ctx)
    limit = n_ctx - answer_room(n_ctx, plan.send.sampling.params(backend.defaults).max_tokens)
    after = [0] * (len(turns) + 1)  # after[i]: the characters of turns[i:]
    for i in range(len(turns) - 1, -1, -1):
        after[i] = after[i + 1] + len(text_of(turns[i].get("content")))

    def fits(start: int) -> bool:
        if after[start] > CHARS_PER_TOKEN * limit:  # more tokens than the window holds whatever the tokenizer makes
            return False
        request = _as_sent(plan.send.tools, backend, single_request(plan, backend, turns[start:]), toolbox)
        try:
            return int(backend.count(request)) <= limit
        except ContextOverflowError:  # past what the window holds by its size: too long, not an error here
            return False

    if fits(0):
        return turns
    if not fits(len(turns)):  # the prompt alone is too long: the model's own error says so, with no turn sent
        return []
    starts = [i for i, m in enumerate(turns) if m["role"] == "user" and i > 0] + [len(turns)]
    # the first start that fits (the last, every turn left out, does): fewer turns never fit worse; those whose
    # characters alone are too many are passed over without a count
    low = bisect.bisect_left(starts, True, hi=len(starts) - 1, key=lambda i: after[i] <= CHARS_PER_TOKEN * limit)
    start = starts[bisect.bisect_left(starts, True, lo=low, hi=len(starts) - 1, key=fits)]
    err.line(f"the conversation's first {start:,} of {len(turns):,} logged messages are left out to fit the "
             f"{n_ctx:,}-token context window (the log keeps them; a larger --ctx sends more)")
    return turns[start:]


def _with_system_share(e: ContextOverflowError, plan: RunPlan, backend: Backend, request: GenerationRequest,
                       toolbox: Any) -> ContextOverflowError:
    """A prompt past the window that holds a system prompt (a continued conversation's own, say): the error says the
    system prompt's share of the tokens, as chat's does, where "the prompt is N tokens" blamed the prompt alone."""
    if request.messages is None or not any(m["role"] == "system" for m in request.messages):
        return e
    alone = dataclasses.replace(request, messages=tuple(m for m in request.messages if m["role"] != "system"))
    try:
        need, without = (int(backend.count(_as_sent(plan.send.tools, backend, r, toolbox))) for r in (request, alone))
    except LocalgenError:  # past the window by its characters alone: that error says so
        return e
    n_ctx = int(backend.n_ctx)
    if need <= n_ctx:  # not the prompt's overflow
        return e
    thread = plan.thread
    inherited = thread is not None and bool(thread.turns) and thread.system is not None \
        and thread.system == plan.send.system
    whose = "the conversation's" if inherited else "the"
    cap = past_cap(backend, need)
    more = (f": this prompt is longer than the {cap:,} tokens the model was trained on, past which --ctx does not go"
            if cap else ", or raise --ctx")
    return ContextOverflowError(
        f"this prompt needs {need:,} tokens with {whose} system prompt ({need - without:,} of them); the context "
        f"window is {n_ctx:,}",
        hint=("a continued conversation (--continue, --cid) is sent with its system prompt: give a shorter one "
              f"with --system{more}"
              if inherited else f"shorten the system prompt or the prompt{more}"))


def _with_excerpts(plan: RunPlan, backend: Backend, turns: list[Message] | None, hits: list[Any],
                   err: ErrWriter, toolbox: Any = None) -> tuple[RunPlan, list[Any]]:
    """The plan whose question carries the excerpts that fit the window with the tools as sent and room for the
    answer (the lowest-scoring left out first, said in one line); and those excerpts, the sources."""
    from localgen.chat.runner import answer_room
    from localgen.cli.options.rag import fitted

    *before, question = plan.parts
    room = answer_room(int(backend.n_ctx), plan.send.sampling.params(backend.defaults).max_tokens)

    def with_message(message: str) -> RunPlan:
        return dataclasses.replace(plan, parts=(*before, message))

    def fits(message: str) -> bool:
        request = single_request(with_message(message), backend, turns)
        return int(backend.count(_as_sent(plan.send.tools, backend, request, toolbox))) + room <= backend.n_ctx

    message, kept = fitted(question, hits, fits, err.line)
    return with_message(message), kept


def plain_completion(plan: RunPlan, backend: Backend, toolbox: Any, err: ErrWriter) -> RunPlan:
    """A model here without a chat template (a base model) answers the prompt as a plain completion, as with
    --raw (and as Ollama's /api/generate does), said once on stderr. What needs the template (--system,
    earlier turns, images or audio, tools) is one error naming it."""
    from localgen.tools.stream import template_of

    if plan.raw or template_of(backend):
        return plan
    turns = plan.thread.turns if plan.thread is not None else None
    needs = [what for what, on in (("--system", bool(plan.send.system)), ("an earlier conversation", bool(turns)),
                                   ("images and audio", bool(plan.media)), ("tools", toolbox is not None)) if on]
    if needs:  # a model that cannot do what was asked: a usage error, as a model without a projector (exit 2)
        one = needs == ["--system"] or needs == ["an earlier conversation"]
        raise no_chat_template(backend.name, f"{' and '.join(needs)} need{'s' if one else ''}",
                               hint=f"without {'it' if len(needs) == 1 else 'them'} the prompt goes to it as a plain "
                              "completion; --chat-template-file gives it a template")
    err.line(f"{backend.name} has no chat template (it may be a base model): the prompt goes to it as a plain "
             "completion, as with --raw")
    return dataclasses.replace(plan, raw=True)


def _as_sent(tools: ToolOptions | None, backend: Backend, request: GenerationRequest,
             toolbox: Any) -> GenerationRequest:
    """The request as the model gets it first: with the tools (in the template, or the system prompt)."""
    if toolbox is None or tools is None:
        return request
    from localgen.cli.run.tools import first_plan
    from localgen.tools.loop import plan_for
    from localgen.tools.plan import with_tools
    from localgen.tools.stream import template_of

    template = template_of(backend)
    plan = first_plan(tools, template, toolbox) or plan_for(template, toolbox)
    return with_tools(plan, request) if plan is not None else request


def remote_backend(load: LoadPlan, err: ErrWriter) -> Backend:
    """The endpoints as a backend, with the model they serve (the only one, when -m is not given); `err` hears of an
    endpoint that is down, passed over for the next."""
    from localgen.remote.backend import RemoteBackend, pick_model

    model = load.model or pick_model(list(load.endpoints))
    return RemoteBackend(list(load.endpoints), model, assumed_ctx=load.assumed_ctx, warn=err.warn)


def _typed_models(plan: RunPlan) -> None:
    """A model path typed (-m, LOCALGEN_MODEL, --draft) that is not there: a usage error, as any input file's; with
    --rag, a name that is no model: its error, before the collection's embedding model loads."""
    from localgen.cli.inputfile import check_model

    if not plan.load.remote:
        if plan.load.model_given:  # else a continued conversation's own model (gone: model_gone says so)
            check_model("-m/--model", plan.load.model)
        check_model("-md/--draft", plan.decoding.draft)
        if plan.send.rag is not None and plan.load.model_given:
            from localgen.cli.options.rag import answering_model_there

            answering_model_there(plan.load.model)


def _ctx_asker(load: Any, ref: Any) -> str | None:
    """Who asked for the window the model loads with: --ctx, LOCALGEN_CTX, the model's preset or models.toml
    entry (in the words fit says them), or None (--ctx's default, capped unsaid as llama.cpp's tools cap it)."""
    from localgen.models.presets import WINDOW_WORDS, window_source

    if load.ctx_given:
        return "--ctx" if load.ctx_typed else "LOCALGEN_CTX"
    return WINDOW_WORDS[window_source(load.model, ref)] if ref.context is not None else None


def open_backend(plan: RunPlan, err: ErrWriter) -> LocalBackend:
    """Resolve (pulling if needed) and load the model, and the draft model for --draft."""
    from localgen.cli.progress import make_progress
    from localgen.engine.defaults import past_training
    from localgen.engine.local import LocalBackend
    from localgen.models.load import for_draft, open_engine
    from localgen.models.resolve import resolve

    load, decoding = plan.load, plan.decoding
    for warning in plan.warnings:
        err.warn(warning)
    ref = files.with_template(resolve(load.model, offline=load.offline, progress=make_progress()), load.mmproj,
                                  load.template_file)
    params = preset.load_params(ref, load.params, load.load_given.__contains__)
    trained = ref.summary.context_length
    if past_training(params, trained):
        asked = _ctx_asker(load, ref)  # the flag, the variable, a preset's num_ctx or a models.toml context
        if asked is not None:
            # as the load caps it (engine/defaults.py)
            err.warn(f"{asked} {params.n_ctx:,} is past the {trained:,} tokens {ref.name} was trained on: the window "
                     f"is {trained:,} (--rope-scaling linear or yarn stretches it)")
    draft = decoding.draft
    draft_ref = resolve(draft, offline=load.offline, progress=make_progress()) if draft else None
    err.status(f"loading {ref.name} ({ref.quantization or 'unknown quantization'}) ...")
    engine = open_engine(ref, params, verbose=load.verbose, warn=err.warn, kv_tokens=_kv_tokens(plan, params.n_ctx))
    if decoding.lookup or draft:  # what plan.py's _speculative turned off is no flag of the user's
        for name in ("flash_attn", "repack"):
            given = name in load.load_given or (name == "flash_attn" and "no_flash_attn" in load.load_given)
            if not given and engine.origins.get(name) == "flag" and not getattr(engine.params, name):
                engine.origins[name] = "off for --draft/--lookup (a batched check would drift from plain decoding)"
    from localgen.cli.hints import record_note, tune_tip

    record_note(err.line, ref.name, ref.path, vars(engine.params), engine.origins)
    tune_tip(err.tty, err.line, ref.name, ref.path, engine.origins)
    drafter: Any = None
    try:
        if decoding.lookup:
            from localgen.engine.speculative import LookupDrafter

            drafter = LookupDrafter()
        elif draft_ref is not None:
            from localgen.engine.speculative import ModelDrafter

            err.status(f"loading the draft model {draft_ref.name} ...")
            drafter = ModelDrafter(engine, open_engine(draft_ref, for_draft(params), verbose=load.verbose,
                                                       warn=err.warn))
    except BaseException:
        engine.close()
        raise
    return LocalBackend(engine, drafter=drafter, draft_max=decoding.draft_max, warn=err.warn)


def _kv_tokens(plan: RunPlan, n_ctx: int) -> int | None:
    """KV cells the run holds at once, for the memory estimate, when it is not one window."""
    if plan.many is not None and plan.many.parallel > 1:
        return plan.many.parallel * n_ctx
    if plan.decoding.beams:
        from localgen.engine.beams import kv_cells

        return kv_cells(0, plan.decoding.beams, plan.send.sampling.alone.max_tokens, n_ctx) + n_ctx
    return None


def single_request(plan: RunPlan, backend: Backend, turns: list[Message] | None = None) -> GenerationRequest:
    """The one prompt as a request: earlier turns of a continued conversation, then documents and piped
    text, the question last."""
    send = plan.send
    text = "\n\n".join(plan.parts)
    shared = "\n\n".join(plan.parts[:-1]) + "\n\n" if len(plan.parts) > 1 else None
    sampling = send.sampling.params(backend.defaults, grammar=send.grammar)
    logprobs = plan.report.logprobs
    if plan.raw:
        return GenerationRequest(prompt=text, sampling=sampling, logprobs=logprobs, shared=shared,
                                 prompt_cache=send.prompt_cache, json_schema=send.json_schema)
    content: Any = text
    if plan.media:
        from localgen import media

        content = media.content(text, list(plan.media))
    messages = preset.head(backend, send.system, continued=bool(turns)) + list(turns or []) + [
        {"role": "user", "content": content}]
    return GenerationRequest(messages=tuple(messages), sampling=sampling, logprobs=logprobs, shared=shared,
                             prompt_cache=send.prompt_cache, json_schema=send.json_schema,
                             template_args=thinking_args(send.think))


def stream(report: ReportOptions, backend: Backend, request: GenerationRequest, err: ErrWriter,
           cid: str | None = None, extra: dict[str, Any] | None = None,
           on_partial: Callable[[Any, str, str], None] | None = None) -> tuple[Any, str]:
    """Stream one answer to stdout (or one JSON object at the end), its reasoning apart (to stderr with
    --show-thinking); returns the finished Generation and the answer without the reasoning. `on_partial` hears of
    an answer cut off, with what was said of it and why (the log keeps it, as chat's): a remote one with part of it
    arrived ("error", before its error is raised), and one that Ctrl-C stopped or whose reader went away
    (`| head -c 5`) ("cancelled", before the command ends, 130 or 0)."""
    from localgen.cli.output import AnswerWriter
    from localgen.errors import RemoteError
    from localgen.tools.stream import answer_stream, template_of

    gen = backend.generate(request, started=time.perf_counter())
    writer = AnswerWriter(err, json_out=report.json_out, show_thinking=report.show_thinking)
    answer = answer_stream(None, template_of(backend), request.template_args, split_reasoning=not request.raw)
    # a SIGTERM or SIGHUP stops the answer as Ctrl-C does, so it is logged as far as it came; the process then ends
    # by that signal, the terminal's echo put back first
    from localgen.native.lib import last_words

    # EchoOff: to the end of the "interrupted" line; llama.cpp aborting the process (an RPC server gone) ends the
    # answer's line and puts the echo back before its error line (which was glued to the answer)
    with term_as_interrupt(), EchoOff(sys.stdout) as terminal, last_words(terminal.restore), \
            last_words(writer.end):
        try:
            for chunk in gen:
                if not writer.show(answer.feed(chunk.text)):  # the reader went away (`| head -1`): stop quietly
                    gen.close()
                    _cut_off(gen, answer, on_partial)
                    raise typer.Exit(0)
            writer.show(answer.finish())
        except KeyboardInterrupt:
            terminal.drop_typed()
            gen.close()
            if ended_by_term():  # logged before anything is written: a closed terminal may fail the writes
                _cut_off(gen, answer, on_partial)
                with contextlib.suppress(OSError):
                    if writable(sys.stdout):  # a stalled reader would hold the exit up, the signals after ignored
                        writer.end()
                raise typer.Exit(128 + ended_by_term()) from None
            writer.end()
            err.interrupted()
            _cut_off(gen, answer, on_partial)
            raise typer.Exit(130) from None
        except RemoteError as e:
            writer.end()
            if report.json_out and e.partial:  # what arrived, marked as partial, then the one-line error
                import json

                TextWriter(sys.stdout).write(json.dumps({"text": gen.text, "partial": True, "error": e.message},
                                                        ensure_ascii=False) + "\n")
            if e.partial and on_partial is not None:
                on_partial(gen, gen.text, "error")
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

        fields = {"text": answer.content, "reasoning": answer.reasoning} if answer.reasoning else {}
        TextWriter(sys.stdout).write(answer_json(backend, gen, request.sampling, cid, fields | (extra or {})) + "\n")
    return gen, answer.content


def _cut_off(gen: Any, answer: Any, on_partial: Callable[[Any, str, str], None] | None) -> None:
    """An answer Ctrl-C stopped, or whose reader went away, told to `on_partial` as far as it came, its finish reason
    "cancelled" (a remote stream closed has none of its own), as chat logs one. A Ctrl-C from now on (the rest of a
    burst) cannot cut that short: the command is ending anyway."""
    if on_partial is None:
        return
    with ignoring_ctrl_c():
        with contextlib.suppress(Exception):  # what was held back (a tag's start) is the answer's too
            answer.finish()
        if answer.content or getattr(answer, "reasoning", ""):  # stopped before a word: nothing to log, as chat
            on_partial(gen, answer.content, str(gen.finish_reason or "cancelled"))  # takes such a message back


def run_beams(decoding: DecodingOptions, report: ReportOptions, backend: LocalBackend, request: GenerationRequest,
              err: ErrWriter) -> tuple[str, Any, str]:
    """Beam search; the best hypothesis (or all, with --json). Returns its text, stats and finish reason."""
    import json

    from localgen.types import Stats

    t0 = time.perf_counter()
    beams = decoding.beams
    assert beams is not None  # run_beams runs for --beams
    result = backend.beams(request, beams, decoding.length_penalty)
    best = result.beams[0]
    total = time.perf_counter() - t0
    st = Stats(prompt_tokens=result.prompt_tokens, cached_tokens=0, completion_tokens=len(best.tokens),
               load_s=backend.engine.load_s, ttft_s=total,
               prefill_tps=result.prompt_tokens / result.prefill_s if result.prefill_s else None,
               decode_tps=result.decoded_tokens / result.decode_s if result.decode_s else None, total_s=total,
               finish_reason=best.finish_reason)  # type: ignore[arg-type]
    out = TextWriter(sys.stdout)
    if report.json_out:
        info = backend.describe()
        doc = {"text": best.text, "finish_reason": best.finish_reason,
               "model": {"name": info["model"]["name"], "file": info["model"]["file"]},
               "beams": [{"text": h.text, "score": round(h.score, 5), "logprob": round(h.logprob, 5),
                          "tokens": len(h.tokens), "finish_reason": h.finish_reason} for h in result.beams],
               "length_penalty": decoding.length_penalty, "load": info["load"], "stats": st.to_dict()}
        out.write(json.dumps(doc, ensure_ascii=False) + "\n")
    else:
        out.write(best.text)
        out.end()
    if report.stats:  # after the answer, as a streamed one's: on a merged 2>&1 it came first
        err.stats(st)
    return best.text, st, best.finish_reason


def run_many(many: ManyPlan, plan: RunPlan, backend: Backend, err: ErrWriter) -> int:
    """--file / --each-line; returns the exit status."""
    from localgen.cli.run.many import BatchOptions, run_batch

    send, report = plan.send, plan.report
    base = send.sampling.params(backend.defaults, grammar=send.grammar)
    opts = BatchOptions(instruction=many.instruction, system=preset.system(backend, send.system), raw=plan.raw,
                        parallel=many.parallel, json_out=report.json_out, stats=report.stats, exact=many.exact,
                        logprobs=report.logprobs, json_schema=send.json_schema, resume_from=many.resume_from,
                        think=send.think, source_name=shown_input(many.file),
                        needs_prompts=many.file is not None)
    try:
        if many.file is not None:
            # a line that is not UTF-8 fails alone, with its number, as --each-line's do (many.parse); a byte order
            # mark at its start is no part of line 1 (utf-8-sig), as on stdin (main.utf8_stdin)
            with open(many.file, encoding="utf-8-sig", errors="surrogateescape") as source:
                return run_batch(backend, source, base, opts)
        return run_batch(backend, sys.stdin, base, opts)
    except KeyboardInterrupt:
        err.interrupted(at_line_start=True)  # the answers are whole lines
        return 130
