"""What run and chat share, checked once: the model's options, the tools, the answer's format and the remote
endpoints become a typed plan (what to load, what to send) through the same rules for both commands, before
anything downloads or loads. Each command adds its own flags to the shared rules (CommandRules) and keeps
its own checks for the flags only it has."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localgen.cli.options import ModelArgs, RemoteOptions, ToolOptions, refuse_empty
from localgen.cli.options.knobs import SamplingFlags
from localgen.errors import UsageError
from localgen.loadsettings import LOAD_KNOBS
from localgen.text import checked
from localgen.types import LoadParams

if TYPE_CHECKING:
    from localgen.remote.endpoints import Endpoint

# refused by run and chat alike: the loop's settings given without a tool
TOOL_FLAGS_WITHOUT_TOOLS = "--tool-choice, --tool-steps and --tool-timeout go with tools: add --functions or --mcp"
FORMATS_TOGETHER = "--grammar, --json-schema and --json-schema-file cannot be combined"


@dataclass(frozen=True)
class LoadPlan:
    """What to load: the model (or the endpoints that serve it), with what, and how."""

    model: str | None  # -m (a remote model's id with endpoints); None: the default, or the endpoint's only one
    model_given: bool  # -m was given (else a continued or loaded conversation brings its own model)
    offline: bool
    template_file: Path | None  # --chat-template-file
    mmproj: Path | None
    verbose: bool
    params: LoadParams  # the load settings, the flags over the defaults
    ctx_given: bool  # --ctx given: it wins over a preset's num_ctx, and is the window a remote server is assumed
    load_given: frozenset[str] = frozenset()  # the load settings given (flags, env vars): each wins over a preset's
    endpoints: tuple[Endpoint, ...] = ()  # remote endpoints; empty: the model loads here
    # -m typed: it replaces a resumed or loaded conversation's own model, which LOCALGEN_MODEL, a default, does not
    model_typed: bool = False
    ctx_typed: bool = False  # --ctx typed (ctx_given without it: LOCALGEN_CTX's)

    @property
    def remote(self) -> bool:
        return bool(self.endpoints)

    @property
    def assumed_ctx(self) -> int | None:
        """--ctx as the window of a remote server that reports none."""
        return self.params.n_ctx if self.ctx_given else None


@dataclass(frozen=True)
class SendPlan:
    """What goes to the model with every prompt: the system prompt, thinking, the answer's format, the sampling
    flags, the prompt cache and the tools."""

    system: str | None  # --system, checked
    think: bool | None  # --think/--no-think: the template's switch; None: its default
    grammar: str | None  # the GBNF an answer follows (a model loaded here)
    json_schema: str | None  # the JSON schema an answer follows, for a remote server (which takes it itself)
    sampling: SamplingFlags
    prompt_cache: bool  # keep the KV state of a long shared prefix on disk (a model loaded here)
    tools: ToolOptions | None  # the tools the model may call; None: none
    rag: RagPlan | None = None  # --rag: the collection each question's excerpts come from


RAG_NEEDS = "--rag needs (it puts the excerpts into a chat message)"  # said of a model without a chat template


@dataclass(frozen=True)
class RagPlan:
    """--rag COLLECTION --rag-top K: the collection is known and has entries (checked before anything loads)."""

    collection: str
    top: int


@dataclass(frozen=True)
class CommandRules:
    """What a command adds to the shared rules: its own flags given (`flag`, given) that tools cannot go with,
    and that a remote endpoint cannot honour; and, where it cannot ask before a tool call runs, who it is."""

    with_tools: Sequence[tuple[str, bool]] = ()
    remote_only: Sequence[tuple[str, bool]] = ()
    cannot_ask: str | None = None  # e.g. "run": the model's calls need --yes
    ask_hint: str | None = None


@dataclass(frozen=True)
class ModelPlan:
    """The shared part of a run's or a chat's plan."""

    load: LoadPlan
    send: SendPlan


def check(args: ModelArgs, rules: CommandRules) -> ModelPlan:
    """The rules run and chat share, in one place: the answer's format (one of --grammar, -j, -jf), --system's
    text, the flags a remote endpoint cannot honour, the tools and their flags; then the sampling and load
    settings typed and the grammar made. Every error is a usage error, before anything loads."""
    out = args.output
    formats = [x for x in (out.grammar, out.json_schema, out.json_schema_file) if x]
    if len(formats) > 1:
        raise UsageError(FORMATS_TOGETHER)
    if args.system is not None:
        checked(args.system, "--system")
    refuse_empty(("-m", args.model), ("--api-key-env", args.remote.api_key_env),  # not "none given"
                 *(("--mcp", server) for server in args.tools.mcp or ()), ("--tool-choice", args.tools.tool_choice),
                 ("-j/--json-schema", out.json_schema),  # `-j ''` answered in free text, as if left out
                 ("--lora", args.knobs.get("lora")), ("--lora-scaled", args.knobs.get("lora_scaled")))
    endpoints, model = endpoints_for(args.remote, args.model)
    keep_states = False
    if endpoints:
        _check_remote(args, rules)
    else:  # a model loaded here keeps prompt and conversation states within LOCALGEN_PROMPT_CACHE_MB (0: the
        # cache is off, as with --no-prompt-cache)
        from localgen.engine.promptcache import cap_bytes

        keep_states = cap_bytes() > 0
    tools = args.tools
    if tools.any:
        dropped = [flag for flag, on in (*rules.with_tools, ("a grammar or JSON schema", bool(formats)),
                                         ("a remote endpoint", bool(endpoints))) if on]
        if dropped:
            raise UsageError(f"tools (--functions, --mcp) cannot be combined with {', '.join(dropped)}")
        if not tools.yes and rules.cannot_ask:
            if args.given("model"):
                _tools_need_a_template(model, args.chat_template_file)
            raise UsageError(f"the model may call tools, and {rules.cannot_ask} cannot ask first: add --yes to let the "
                             "calls run", hint=rules.ask_hint)
    elif args.given("tool_choice") or args.given("tool_steps") or args.given("tool_timeout"):
        raise UsageError(TOOL_FLAGS_WITHOUT_TOOLS)
    rag = _check_rag(args)
    sampling = args.knobs.sampling_flags()
    from localgen.cli.options.files import output_grammar

    grammar, schema = output_grammar(out)
    load = LoadPlan(model=model, model_given=args.given("model"), model_typed=args.typed("model"), offline=args.offline,
                    template_file=args.chat_template_file, mmproj=args.mmproj, verbose=args.verbose,
                    params=args.knobs.load(), ctx_given=args.given("ctx"), ctx_typed=args.typed("ctx"),
                    load_given=frozenset(n for n in LOAD_KNOBS if args.knobs.given(n)), endpoints=tuple(endpoints))
    send = SendPlan(system=args.system, think=args.think, grammar=None if endpoints else grammar,
                    json_schema=schema if endpoints else None, sampling=sampling,
                    prompt_cache=args.prompt_cache and keep_states, tools=tools if tools.any else None, rag=rag)
    return ModelPlan(load, send)


def _check_rag(args: ModelArgs) -> RagPlan | None:
    """--rag's collection must exist and hold entries (read from the store, nothing loads); --rag-top goes with it."""
    rag = args.rag
    refuse_empty(("--rag", rag.rag))
    if rag.rag is None:
        if args.given("rag_top"):
            raise UsageError("--rag-top goes with --rag COLLECTION")
        return None
    from localgen.embeddings import store

    store.get(checked(rag.rag, "--rag"))  # an unknown name: an error naming the collections there are
    if store.described(rag.rag).entries == 0:
        raise UsageError(f"the collection {rag.rag!r} is empty: there is nothing to answer from",
                         hint=f"store texts in it with `localgen embed --file FILE --store {rag.rag}`")
    return RagPlan(rag.rag, rag.rag_top)


def endpoints_for(remote: RemoteOptions, model: str | None) -> tuple[list[Endpoint], str | None]:
    """The endpoints a command sends to (none: the model loads here), and the model's name or id."""
    from localgen.paths import endpoints_file

    if not (remote.endpoint or remote.api_key_env) and (not model or not endpoints_file().is_file()):
        return [], model  # nothing can be remote: the remote code stays unloaded
    from localgen.cli.output import ErrWriter
    from localgen.remote.endpoints import choose

    return choose(remote.endpoint, remote.api_key_env, model, warn=ErrWriter().warn)


def _check_remote(args: ModelArgs, rules: CommandRules) -> None:
    """Flags a remote server cannot honour are usage errors, never dropped: the load settings, --offline,
    --verbose, a chat template or projector file (the server renders and reads with its own), the command's own, a
    GBNF grammar and --prompt-cache, each where the user gave it."""
    shared = [(flag, args.given(name) and value) for name, flag, value in (
        ("offline", "--offline", args.offline), ("verbose", "--verbose", args.verbose),
        ("chat_template_file", "--chat-template-file", args.chat_template_file is not None),
        ("mmproj", "--mmproj", args.mmproj is not None))]
    tail = [(flag, args.given(name) and value) for name, flag, value in (
        ("grammar", "--grammar (GBNF; --json-schema works)", bool(args.output.grammar)),
        ("prompt_cache", "--prompt-cache", args.prompt_cache))]
    bad = args.knobs.remote_conflicts() + [flag for flag, on in (*shared, *rules.remote_only, *tail) if on]
    if bad:
        raise UsageError(f"{', '.join(bad)} cannot be used with a remote endpoint (the server loads and runs the "
                         "model)")


def _tools_need_a_template(model: str | None, template_file: Path | None) -> None:
    """Before asking for --yes: a model here without a chat template cannot be offered tools at all, the error run
    and chat give once it loads (said after the --yes one, it sent the user to add a flag that could not help)."""
    if template_file is not None:
        return
    from localgen.errors import LocalgenError, no_chat_template
    from localgen.models.resolve import resolve

    try:
        ref = resolve(model, offline=True, pull_missing=False)  # nothing loaded or downloaded: the header's template
    except LocalgenError:
        return  # not here yet, or no model: said where it loads
    if not ref.summary.chat_template:
        raise no_chat_template(ref.name, "tools need",
                               hint="drop --functions/--mcp, or give it a template with --chat-template-file")
