"""`localgen run`'s flags become its RunPlan: every usage error (run's own flags that cannot go together, then
the rules run shares with chat, options/plan.py), the conversation a --continue goes on with, the prompt, images and
audio read and the grammar made, all before any download or load. Nothing after this sees RunArgs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from localgen.cli.inputfile import file_source, shown_input
from localgen.cli.log.conversation import Thread
from localgen.cli.options import plan as shared
from localgen.cli.options import refuse_empty
from localgen.cli.options.plan import LoadPlan, SendPlan
from localgen.cli.run import prompt
from localgen.cli.run.options import DecodingOptions, ReportOptions, RunArgs
from localgen.errors import UsageError

REMOTE_PARALLEL = 4  # run --file --endpoint without --parallel: requests in flight on each endpoint (serve's default)


@dataclasses.dataclass(frozen=True)
class ManyPlan:
    """--file / --each-line: where the prompts come from and how they run."""

    file: Path | None  # None: each line of stdin
    instruction: str | None  # -p: after each line
    parallel: int
    exact: bool | None  # --exact / --no-exact; None: the batching mode's default
    resume_from: Path | None


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Everything `run` will do, decided before anything heavy happens: what to load, what to send (one prompt
    or many), and how to output."""

    load: LoadPlan
    send: SendPlan
    raw: bool  # the prompt as a plain completion, without the chat template
    decoding: DecodingOptions  # speculative decoding and beams
    report: ReportOptions  # what is printed besides the answer
    no_log: bool
    thread: Thread | None = None  # one prompt: the conversation it belongs to (None: many prompts)
    parts: tuple[str, ...] = ()  # one prompt: documents and stdin first, the question last
    media: tuple[Any, ...] = ()  # images and audio (--image, -a), read and checked before the load
    many: ManyPlan | None = None  # --file / --each-line
    warnings: tuple[str, ...] = ()  # said as the model loads

    @property
    def speculative(self) -> bool:
        return bool(self.decoding.draft or self.decoding.lookup)


def check(f: RunArgs) -> RunPlan:
    """Usage errors, all of them before any download or model load; then the plan."""
    from localgen.cli.log import conversation

    refuse_empty(("--cid", f.log.cid), ("--draft", f.decoding.draft))  # `--draft ''` ran without drafting
    if f.log.cid is not None:
        from localgen.text import checked

        checked(f.log.cid, "--cid")
    if f.log.continue_ and f.log.cid is not None:  # the latest conversation, or that one: not both (--cid won)
        raise UsageError("--continue and --cid each name the conversation to go on with: give one")
    many = f.many.file is not None or f.many.each_line
    if (f.log.continue_ or f.log.cid) and (many or f.raw):
        raise UsageError(f"{'--continue' if f.log.continue_ else '--cid'} continues a chat: it cannot be combined "
                         f"with {'--file/--each-line' if many else '--raw'}")
    thread = None if many else conversation.thread_for(f.log)
    own_model = False
    if thread is not None:  # the conversation's model and system prompt, where the flags do not say otherwise
        if thread.model_spec and not f.typed("model"):  # LOCALGEN_MODEL, a default, does not replace it
            f = dataclasses.replace(f, model=thread.model_spec)
            own_model = True
        if thread.system and not f.given("system"):
            f = dataclasses.replace(f, system=thread.system)
    _check_combinations(f, many)
    _not_a_model(f)
    d = f.decoding
    model = shared.check(f, shared.CommandRules(
        with_tools=(("--file/--each-line", many), ("--raw", f.raw), ("--beams", bool(d.beams)),
                    ("--rag", bool(f.rag.rag))),
        remote_only=[(flag, f.given(name) and bool(value)) for name, flag, value in (
            ("draft", "--draft", d.draft), ("lookup", "--lookup", d.lookup), ("beams", "--beams", d.beams),
            ("verbose_prompt", "--verbose-prompt", f.report.verbose_prompt),
            ("exact", "--exact/--no-exact", f.many.exact is not None))],
        cannot_ask="run", ask_hint="or use `localgen chat`, which asks before each call"))
    if own_model:  # the conversation's, not the user's: gone, it is model_gone's error
        model = dataclasses.replace(model, load=dataclasses.replace(model.load, model_given=False))
    if f.many.resume_from is not None and (f.many.file is None or not f.report.json_out):
        raise UsageError("--resume-from goes with --file and --json (it reads the line numbers of JSONL output)")
    if f.many.resume_from is not None:  # before the model loads: a FIFO or a file of something else is one line
        from localgen.cli.run.many import check_resume

        check_resume(f.many.resume_from)
    if f.many.file is not None:
        from localgen.cli.run.many import no_prompts

        why = no_prompts(f.many.file)
        if why:
            raise UsageError(f"{file_source(f.many.file)} has no prompts: {why}", hint="one prompt a line")
    media = prompt.attachments(f.media, [
        ("--file/--each-line", many), ("--raw", f.raw), ("--beams", bool(d.beams)),
        ("--draft/--lookup", bool(d.draft or d.lookup)), ("--endpoint", bool(f.remote.endpoint)),
        ("--prompt-cache", f.given("prompt_cache") and f.prompt_cache)], f.in_order("image", "video", "attach"))
    stdin_taken = any(a == "-" for a in f.media.attach or ())
    parts = () if many else tuple(prompt.prompt_parts(f.prompt if f.prompt is not None else f.prompt_arg,
                                                         f.document, no_stdin=f.no_stdin or stdin_taken,
                                                         rag=f.rag.rag is not None, media=bool(media)))
    # many prompts promise no identity with plain decoding (they are batched), so nothing is pinned for them
    load, warnings = _speculative(model.load, f) if (d.draft or d.lookup) and not many else (model.load, ())
    return RunPlan(load=load, send=model.send, raw=f.raw, decoding=d, report=f.report, no_log=f.log.no_log,
                   thread=thread, parts=parts, media=media, warnings=warnings,
                   many=ManyPlan(f.many.file, f.prompt, f.many.parallel if f.given("parallel") or not model.load.remote
                                 else REMOTE_PARALLEL, f.many.exact, f.many.resume_from) if many else None)


def _not_a_model(f: RunArgs) -> None:
    """`localgen run MODEL`, typed as `ollama run MODEL` is, with no -m: the model's name would be the prompt."""
    from localgen.cli.usage import names_a_model

    word = f.prompt_arg
    meant = names_a_model(word) if word is not None and not f.typed("model") else []
    if word is not None and meant:
        import shlex

        first = shlex.quote(meant[0])
        raise UsageError(f"{word} names a model, not a prompt: the model is named with -m",
                         hint=f"localgen run -m {first} \"PROMPT\"" + "".join(f" or -m {shlex.quote(m)}"
                                                                               for m in meant[1:]) +
                         f"; localgen chat -m {first} to talk turn by turn; -p {shlex.quote(word)} sends the word "
                         "as the prompt")


def _check_combinations(f: RunArgs, many: bool) -> None:
    """run's own flags that cannot go together (the rules it shares with chat are options/plan.py's)."""
    d, report = f.decoding, f.report
    if f.prompt_arg is not None and f.prompt is not None:
        raise UsageError("give the prompt once: as an argument or with -p, not both")
    if f.many.file is not None and f.many.each_line:
        raise UsageError("--file and --each-line cannot be combined")
    if f.no_stdin and f.many.file is not None and shown_input(f.many.file) == "stdin":  # --file -: as --each-line
        raise UsageError("--file - reads its prompts from stdin: it cannot be combined with --no-stdin")
    if f.many.each_line and f.no_stdin:  # the prompts are stdin's lines: there would be none
        raise UsageError("--each-line reads its prompts from stdin: it cannot be combined with --no-stdin",
                         hint="give the prompts with --file FILE instead")
    if not many and (f.many.parallel > 1 or f.many.exact is not None):
        raise UsageError(f"{'--parallel' if f.many.parallel > 1 else '--exact/--no-exact'} applies to many prompts: "
                         "add --file FILE or --each-line")
    if many:
        dropped = [flag for flag, on in (("-f/--document", bool(f.document)), ("--draft", bool(d.draft)),
                                         ("--beams", bool(d.beams)),
                                         ("--prompt-cache", f.given("prompt_cache") and f.prompt_cache),
                                         ("--verbose-prompt", report.verbose_prompt)) if on]
        if dropped:
            raise UsageError(f"{', '.join(dropped)} cannot be used with --file/--each-line (many prompts)")
        if f.prompt_arg is not None:
            raise UsageError("with --file/--each-line, give the instruction with -p, not as an argument")
    if f.rag.rag is not None:  # the excerpts go into one chat message, and --json carries their sources
        dropped = [flag for flag, on in (("--file/--each-line", many), ("--raw", f.raw),
                                         ("--beams", bool(d.beams))) if on]
        if dropped:
            raise UsageError(f"--rag cannot be combined with {', '.join(dropped)}",
                             hint="--rag puts the excerpts into the chat message of one question")
    if f.raw and f.system:
        raise UsageError("--system needs the chat template; it cannot be combined with --raw")
    if d.draft and d.lookup:
        raise UsageError("--draft and --lookup cannot be combined")
    if f.given("draft_max") and not (d.draft or d.lookup):  # as serve refuses it: never silently without effect
        raise UsageError("--draft-max sets how many tokens --lookup or --draft drafts: add --lookup or --draft")
    if f.given("length_penalty") and not d.beams:
        raise UsageError("--length-penalty scores beam search's hypotheses: add --beams N")
    if d.beams and (d.draft or d.lookup or f.output.any):
        raise UsageError("--beams cannot be combined with --draft, --lookup, a grammar or a JSON schema")
    if f.knobs.sampling_flags().alone.reasoning_budget >= 0 and (d.draft or d.lookup or d.beams):
        raise UsageError("--reasoning-budget cannot be combined with --draft, --lookup or --beams")
    if report.logprobs is not None and not report.json_out:
        raise UsageError("--logprobs adds to the JSON output: add --json")
    if report.logprobs is not None and d.beams:
        raise UsageError("--logprobs cannot be combined with --beams (--json lists each beam's log-probability)")


def _speculative(load: LoadPlan, f: RunArgs) -> tuple[LoadPlan, tuple[str, ...]]:
    """The load for speculative decoding. llama.cpp's flash-attention kernel and its repacked CPU weights compute
    a batch of tokens with a different rounding than one token; checking drafts in a batch would then drift
    from plain decoding. Without them the two agree exactly (at temperature 0): they are off unless given."""
    params = load.params
    fa_given, repack_given = f.given("flash_attn") or bool(f.knobs.get("no_flash_attn")), f.given("repack")
    warnings = [f"with --{name}, speculative output can differ slightly from plain decoding" for name, on in (
        ("flash-attn", f.given("flash_attn") and params.flash_attn is not False),
        ("repack", repack_given and bool(params.repack))) if on]
    quantized_v = params.cache_type_v not in ("f16", "f32", "bf16")
    if not fa_given and quantized_v:  # a quantized V cache needs flash attention: it stays on, said
        warnings.append(f"a quantized V cache ({params.cache_type_v}) keeps flash attention on, so speculative output "
                        "can differ slightly from plain decoding")
    elif not fa_given:
        params = dataclasses.replace(params, flash_attn=False)
    if not repack_given:
        params = dataclasses.replace(params, repack=False)
    return dataclasses.replace(load, params=params), tuple(warnings)
