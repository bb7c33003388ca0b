"""`localgen run`'s flags become its RunPlan: every usage error (flags that cannot go together, or not with a
remote endpoint), the prompt, images and audio read, the grammar made, all before any download or load."""

from __future__ import annotations

import dataclasses
from typing import Any

from localgen.cli import flagfiles, runinput
from localgen.cli import options as o
from localgen.cli.runoptions import RunArgs
from localgen.errors import UsageError
from localgen.text import checked


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Everything `run` will do, decided before anything heavy happens."""

    many: bool
    parts: tuple[str, ...]  # single prompt: documents and stdin first, the question last
    grammar: str | None
    speculative: bool
    flash_attn_given: bool
    repack_given: bool
    flash_attn_on: bool  # the user asked for it (with speculation: a warning)
    repack_on: bool
    schema: str | None = None  # the JSON schema behind `grammar` (a remote server takes the schema itself)
    endpoints: tuple[Any, ...] = ()  # remote endpoints; empty: load the model here
    model: str | None = None  # the model name (a remote model id with endpoints)
    media: tuple[Any, ...] = ()  # images and audio (--image, -a), read and checked before the load


def check(f: RunArgs) -> RunPlan:
    """Usage errors, all of them before any download or model load."""
    many = f.many.file is not None or f.many.each_line
    schemas = _check_combinations(f, many)
    if f.tools.any:
        dropped = [flag for flag, on in (("--file/--each-line", many), ("--raw", f.raw),
                                         ("--beams", bool(f.decoding.beams)),
                                         ("a grammar or JSON schema", bool(schemas)),
                                         ("--endpoint", bool(f.remote.endpoint))) if on]
        if dropped:
            raise UsageError(f"tools (--functions, --mcp) cannot be combined with {', '.join(dropped)}")
        if not f.tools.yes:
            raise UsageError("the model may call tools, and run cannot ask first: add --yes to let the calls run",
                             hint="or use `localgen chat`, which asks before each call")
    elif f.given("tool_choice") or f.given("tool_steps") or f.given("tool_timeout"):
        raise UsageError(o.TOOL_FLAGS_WITHOUT_TOOLS)
    if f.many.resume_from is not None and (f.many.file is None or not f.report.json_out):
        raise UsageError("--resume-from goes with --file and --json (it reads the line numbers of JSONL output)")
    attached = runinput.attachments(f, many)
    endpoints, model = _endpoints(f)
    if endpoints:
        _check_remote(f)
    parts = () if many else tuple(runinput.prompt_parts(f, stdin_taken=any(a == "-" for a in f.media.attach or ())))
    grammar, schema = flagfiles.output_grammar(f.output)
    k = f.knobs
    return RunPlan(many=many, parts=parts, grammar=grammar, speculative=bool(f.decoding.draft or f.decoding.lookup),
                   flash_attn_given=k.given("flash_attn") or k.get("no_flash_attn"), repack_given=k.given("repack"),
                   flash_attn_on=(k.given("flash_attn") and k.flash_attn() is not False),
                   repack_on=k.given("repack") and bool(k.get("repack")), schema=schema, endpoints=tuple(endpoints),
                   model=model, media=attached)


def _check_combinations(f: RunArgs, many: bool) -> list[object]:
    """The flags that cannot go together (check() goes on with tools, endpoints and inputs); returns the
    grammar and schema flags given."""
    d, report = f.decoding, f.report
    if f.prompt_arg is not None and f.prompt is not None:
        raise UsageError("give the prompt once: as an argument or with -p, not both")
    if f.many.file is not None and f.many.each_line:
        raise UsageError("--file and --each-line cannot be combined")
    if not many and (f.many.parallel > 1 or f.many.exact is not None):
        raise UsageError(f"{'--parallel' if f.many.parallel > 1 else '--exact/--no-exact'} applies to many prompts: "
                         "add --file FILE or --each-line")
    if many:
        dropped = [flag for flag, on in (("-f/--document", bool(f.document)), ("--draft", bool(d.draft)),
                                         ("--lookup", d.lookup), ("--beams", bool(d.beams)),
                                         ("--prompt-cache", f.given("prompt_cache") and f.prompt_cache),
                                         ("--verbose-prompt", report.verbose_prompt)) if on]
        if dropped:
            raise UsageError(f"{', '.join(dropped)} cannot be used with --file/--each-line (many prompts)")
        if f.prompt_arg is not None:
            raise UsageError("with --file/--each-line, give the instruction with -p, not as an argument")
    schemas: list[object] = [x for x in (f.output.grammar, f.output.json_schema, f.output.json_schema_file) if x]
    if len(schemas) > 1:
        raise UsageError("--grammar, --json-schema and --json-schema-file cannot be combined")
    if f.raw and f.system:
        raise UsageError("--system needs the chat template; it cannot be combined with --raw")
    if f.system:
        checked(f.system, "--system")
    if d.draft and d.lookup:
        raise UsageError("--draft and --lookup cannot be combined")
    if d.beams and (d.draft or d.lookup or schemas):
        raise UsageError("--beams cannot be combined with --draft, --lookup, a grammar or a JSON schema")
    if f.knobs.get("reasoning_budget", -1) >= 0 and (d.draft or d.lookup or d.beams):
        raise UsageError("--reasoning-budget cannot be combined with --draft, --lookup or --beams")
    if report.logprobs is not None and not report.json_out:
        raise UsageError("--logprobs adds to the JSON output: add --json")
    if report.logprobs is not None and d.beams:
        raise UsageError("--logprobs cannot be combined with --beams (--json lists each beam's log-probability)")
    return schemas


def _endpoints(f: RunArgs) -> tuple[list[Any], str | None]:
    from localgen.paths import endpoints_file

    if not (f.remote.endpoint or f.remote.api_key_env) and (not f.model or not endpoints_file().is_file()):
        return [], f.model  # nothing can be remote: the remote code stays unloaded
    from localgen.remote.endpoints import choose

    return choose(f.remote.endpoint, f.remote.api_key_env, f.model)


def _check_remote(f: RunArgs) -> None:
    """Flags a remote server cannot honour are usage errors, never dropped."""
    d = f.decoding
    extra: dict[str, tuple[str, object]] = {
        "draft": ("--draft", d.draft), "lookup": ("--lookup", d.lookup), "beams": ("--beams", d.beams),
        "grammar": ("--grammar (GBNF; --json-schema works)", f.output.grammar),
        "verbose_prompt": ("--verbose-prompt", f.report.verbose_prompt), "exact": ("--exact/--no-exact", f.many.exact)}
    if f.given("prompt_cache") and f.prompt_cache:
        extra["prompt_cache"] = ("--prompt-cache", f.prompt_cache)
    bad = o.remote_conflicts(f, extra)
    if f.given("exact") and "--exact/--no-exact" not in bad:
        bad.append("--exact/--no-exact")
    if bad:
        raise UsageError(f"{', '.join(bad)} cannot be used with a remote endpoint (the server loads and runs the "
                         "model)")
