"""Options shared by run, chat, bench and serve: each defined once, its range and help taken from the
one settings table (settings.KNOBS), with llama.cpp's spellings as aliases. A command's body hands its
parameters on typed, as its CommandArgs (ModelArgs: what run and chat share), whose `knobs` give
the engine's types through the one validation."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from localgen.cli.inputfile import input_file, input_path
from localgen.cli.options.knobs import Knobs, given_by_user, typed_by_user
from localgen.loadsettings import GPU, LOAD_KNOBS, SWITCH, TEXT, LoadKnob
from localgen.settings import BIAS, BOOL, FLOAT, INT, KNOBS, TEXTS, Knob
from localgen.types import LoadParams, SamplingParams

_D = SamplingParams()
_L = LoadParams()
MODEL_PANEL = "Model and loading"
SAMPLING_PANEL = "Sampling"
OUTPUT_PANEL = "Output"
GPU_PANEL = "GPU, memory and long context"


def _option(k: Knob | LoadKnob, **kw: Any) -> Any:
    """A typer.Option from a table entry: its flags, help, range, panel, env var and metavar."""
    limits: dict[str, Any] = {}
    if k.kind in (INT, FLOAT):
        limits = {"min": k.lo, "max": k.hi}
    if isinstance(k, LoadKnob):
        kw.update(rich_help_panel=GPU_PANEL if k.panel == GPU else MODEL_PANEL, envvar=k.envvar, metavar=k.metavar)
        flags = k.flags
    else:
        kw.update(rich_help_panel=SAMPLING_PANEL)
        flags = k.cli
        if k.kind in (INT, FLOAT) and k.default is not None:  # a catalogue entry's or preset's value comes first
            kw["show_default"] = f"the model's, else {k.default}"
    if k.default is None or (isinstance(k, Knob) and k.kind in (TEXTS, BIAS)):
        kw["show_default"] = False
    return typer.Option(*flags, help=k.help, **limits, **kw)  # type: ignore[misc]


def _python_type(k: Knob | LoadKnob) -> Any:
    """The parameter's type as Typer reads it."""
    if k.kind in (TEXTS, BIAS):
        return list[str] | None
    base: Any = {INT: int, FLOAT: float, BOOL: bool, TEXT: str, SWITCH: bool}[k.kind]
    return base | None if k.default is None else base


def _cli_default(k: Knob | LoadKnob) -> Any:
    return None if isinstance(k, Knob) and k.kind in (TEXTS, BIAS) else k.default


def _entry(name: str) -> Knob | LoadKnob:
    return KNOBS[name] if name in KNOBS else LOAD_KNOBS[name]


def option(name: str, **kw: Any) -> Any:
    """The typer.Option of a setting (a sampling knob's or a load setting's name), for a command that takes it
    alone: `ctx: Annotated[int, o.option("ctx")] = 2048`."""
    return _option(_entry(name), **kw)


def annotation(name: str) -> Any:
    """The Annotated type of a setting's CLI parameter, as the commands that take every setting get it."""
    k = _entry(name)
    return Annotated[_python_type(k), _option(k)]



Model = Annotated[
    str | None,
    typer.Option(
        "--model", "-m", envvar="LOCALGEN_MODEL", rich_help_panel=MODEL_PANEL, show_default=False,
        help="Model name (e.g. smollm2:135m, the default), owner/repo[:QUANT], path to a .gguf file, or a model "
             "Ollama or LM Studio downloaded: ollama:NAME, lmstudio:PUBLISHER/REPO.",
    ),
]
Ctx = Annotated[int, option("ctx")]
Threads = Annotated[int | None, option("threads")]
ThreadsBatch = Annotated[int | None, option("threads_batch")]
GpuLayers = Annotated[int | None, option("gpu_layers")]
Batch = Annotated[int, option("batch_size")]
UBatch = Annotated[int | None, option("ubatch_size")]
Repack = Annotated[bool | None, option("repack")]
Rpc = Annotated[str | None, option("rpc")]
REMOTE_PANEL = "Remote endpoints"
# --lookup and --draft-max mean the same in run and serve (tests/test_flag_meanings.py)
LOOKUP_HELP = ("Draft from n-grams already in the context (prompt lookup): fast for summaries, code edits, extraction. "
               "With many prompts (run --file, serve) the drafts are checked in the batch, only as many as pay for "
               "their rows (measured at load), and every request is batched as with --no-exact.")
# --draft means the same in run and serve (serve drafts for its first -m model, in the batch as --lookup's drafts)
DRAFT_HELP = ("A small model with the same vocabulary proposes tokens; the model checks several at once "
              "(llama.cpp's -md/--model-draft and its --draft-max). serve drafts for its first -m model, in the "
              "batch as with --lookup, only where the draft model's work pays (measured at load), and turns "
              "drafting off if the draft model fails.")
DRAFT_MAX_HELP = "Most tokens drafted per step."
Endpoint = Annotated[
    list[str] | None,
    typer.Option("--endpoint", envvar="LOCALGEN_ENDPOINT", rich_help_panel=REMOTE_PANEL, show_default=False,
                 metavar="URL",
                 help="An OpenAI-compatible server (vLLM, llama-server, Ollama, localgen serve, ...) to send the work "
                      "to instead of loading a model here; -m names its model. Repeat (or separate URLs with commas) "
                      "to spread run --file lines."),
]
ApiKeyEnv = Annotated[
    str | None,
    typer.Option("--api-key-env", rich_help_panel=REMOTE_PANEL, show_default=False, metavar="NAME",
                 help="The environment variable holding the endpoint's API key (none is read unless named)."),
]
Verbose = Annotated[
    bool, typer.Option("--verbose", rich_help_panel=OUTPUT_PANEL, help="Show llama.cpp's log lines on stderr.")
]

LOG_PANEL = "Log"
NoLog = Annotated[
    bool, typer.Option("--no-log", rich_help_panel=LOG_PANEL,
                       help="Keep this out of the log of prompts and answers (`localgen logs`).")
]

PromptCache = Annotated[
    bool,
    typer.Option("--prompt-cache/--no-prompt-cache", rich_help_panel=MODEL_PANEL,
                 help="Keep the KV state of a long shared prefix (documents, piped text, the system prompt, the "
                      "tools' schemas) on disk and load it next time instead of recomputing it."),
]
System = Annotated[
    str | None,
    typer.Option("--system", "--system-prompt", "-sys", rich_help_panel=SAMPLING_PANEL, show_default=False,
                 help="System prompt."),
]
GrammarFile = Annotated[
    str | None,
    typer.Option("--grammar", "--grammar-file", rich_help_panel=SAMPLING_PANEL, show_default=False,
                 help="Constrain output to a GBNF grammar: the path of a file, or the grammar itself "
                      "(root ::= \"yes\" | \"no\")."),
]
JsonSchema = Annotated[
    str | None,
    typer.Option("--json-schema", "-j", rich_help_panel=SAMPLING_PANEL, show_default=False,
                 help="Constrain output to JSON matching this JSON schema (inline, or the path of a file)."),
]
JsonSchemaFile = Annotated[
    Path | None,
    typer.Option("--json-schema-file", "-jf", path_type=str, callback=input_path,
                 rich_help_panel=SAMPLING_PANEL, show_default=False, help="A file holding the JSON schema."),
]
Think = Annotated[
    bool | None,
    typer.Option("--think/--no-think", rich_help_panel="Reasoning", show_default=False,
                 help="Turn a reasoning model's thinking on or off through its chat template's switch "
                      "(enable_thinking, as Qwen3's); default: the template's own default."),
]
Logprobs = Annotated[
    int | None,
    typer.Option("--logprobs", min=0, max=20, rich_help_panel=OUTPUT_PANEL, show_default=False,
                 help="With --json (and JSONL output): each token's log-probability and its N likeliest "
                      "alternatives."),
]

ChatTemplateFile = Annotated[
    Path | None,
    typer.Option("--chat-template-file", path_type=str, callback=input_path, rich_help_panel=MODEL_PANEL,
                 show_default=False,
                 help="A Jinja chat template to use instead of the model's own (e.g. one that renders tools)."),
]
MmProj = Annotated[
    Path | None,
    typer.Option("--mmproj", path_type=str, callback=input_path, rich_help_panel=MODEL_PANEL, show_default=False,
                 help="A multimodal projector (mmproj GGUF) for the model: lets it read images or audio."),
]
TOOLS_PANEL = "Tools"
Functions = Annotated[
    list[str] | None,  # (as given: a Path would make `--functions ""` the folder ".")
    typer.Option("--functions", callback=input_file, rich_help_panel=TOOLS_PANEL,
                 show_default=False,
                 help="A Python file whose public functions the model may call; type hints and docstrings make "
                      "each tool's schema (repeatable)."),
]
Mcp = Annotated[
    list[str] | None,
    typer.Option("--mcp", rich_help_panel=TOOLS_PANEL, show_default=False,
                 help="An MCP server whose tools the model may call: a command line (\"uvx some-server\", over "
                      "stdio), an http(s) URL (streamable HTTP), or a JSON file of servers as Claude Desktop "
                      "and Cursor write it (mcpServers). Repeatable."),
]
ToolChoice = Annotated[
    str, typer.Option("--tool-choice", rich_help_panel=TOOLS_PANEL,
                      help="auto (the model decides), required (its first answer must call a tool), none, or a "
                           "tool's name (its first answer calls that tool).")
]
ToolSteps = Annotated[
    int, typer.Option("--tool-steps", min=1, max=100, rich_help_panel=TOOLS_PANEL,
                      help="At most this many rounds of tool calls for one prompt.")
]
Yes = Annotated[
    bool, typer.Option("--yes", "-y", rich_help_panel=TOOLS_PANEL,
                       help="Run the model's tool calls without asking first.")
]
ToolTimeout = Annotated[
    float, typer.Option("--tool-timeout", min=0.1, max=86400, rich_help_panel=TOOLS_PANEL,
                        help="Seconds one tool call may take before it fails, at most 86400 (a day; in serve, also "
                             "each call of a Responses request's mcp tool, with --allow-mcp-urls).")
]


class OptionGroup:
    """Options a command takes together, as a frozen dataclass whose fields are Typer options: with_knobs()
    gives the command each field as an option, and the command the group, typed."""



@dataclass(frozen=True)
class ToolOptions(OptionGroup):
    """The tools a run or chat may call, and how."""

    functions: Functions = None
    mcp: Mcp = None
    tool_choice: ToolChoice = "auto"
    tool_steps: ToolSteps = 8
    yes: Yes = False
    tool_timeout: ToolTimeout = 30.0

    @property
    def any(self) -> bool:
        """Whether any tool was given."""
        return bool(self.functions or self.mcp)


@dataclass(frozen=True)
class OutputFormat(OptionGroup):
    """What the answer must be: a GBNF grammar, or JSON matching a schema."""

    grammar: GrammarFile = None
    json_schema: JsonSchema = None
    json_schema_file: JsonSchemaFile = None

    @property
    def any(self) -> bool:
        """Whether a grammar or schema was given."""
        return bool(self.grammar or self.json_schema or self.json_schema_file)


@dataclass(frozen=True)
class RemoteOptions(OptionGroup):
    """Endpoints to send the work to instead of loading a model here."""

    endpoint: Endpoint = None
    api_key_env: ApiKeyEnv = None


RAG_PANEL = "Answer from your documents"


@dataclass(frozen=True)
class RagOptions(OptionGroup):
    """A collection to answer from (docs/rag.md): the excerpts nearest each question go into its message."""

    rag: Annotated[
        str | None,
        typer.Option("--rag", metavar="COLLECTION", rich_help_panel=RAG_PANEL, show_default=False,
                     help="Answer from this collection (made with `embed --store`): the excerpts nearest each "
                          "question (--rag-top of them) go before it in the message, each named by its id for the "
                          "model to cite; stdout stays the answer alone."),
    ] = None
    rag_top: Annotated[
        int, typer.Option("--rag-top", min=1, rich_help_panel=RAG_PANEL,
                          help="With --rag: how many excerpts each question gets (the lowest-scoring are left out "
                               "where they do not fit the context window).")
    ] = 4


Offline = Annotated[
    bool,
    typer.Option("--offline", envvar="LOCALGEN_OFFLINE", rich_help_panel=MODEL_PANEL,
                 help="Use only models already on disk; never touch the network (also HF_HUB_OFFLINE=1)."),
]

DEFAULTS = _D
LOAD_DEFAULTS = _L
LOAD_ALL = tuple(LOAD_KNOBS)


def with_knobs(sampling: bool = True, load: tuple[str, ...] = LOAD_ALL,
               ) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the table's settings as options: every sampling knob (when `sampling`) and the load
    settings named in `load`, each built from its entry (settings.py, loadsettings.py). The command declares a
    parameter `knobs: Knobs` and receives them there, typed, with which the user set; Typer sees the options. The
    command takes a typer.Context too (which says what the user set)."""
    names = [*(KNOBS if sampling else ()), *load]

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        sig = inspect.signature(fn, eval_str=True)
        groups = {p.name: p.annotation for p in sig.parameters.values()
                  if isinstance(p.annotation, type) and issubclass(p.annotation, OptionGroup)}
        own = [p for p in sig.parameters.values() if p.name != "knobs" and p.name not in groups]
        context = next(p.name for p in own if p.annotation is typer.Context)
        fields = {g: _group_params(cls) for g, cls in groups.items()}
        added = [p for ps in fields.values() for p in ps]
        added += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=annotation(n),
                                    default=_cli_default(_entry(n))) for n in names]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind == p.POSITIONAL_OR_KEYWORD else p
                  for p in own]

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> None:
            values = {n: kwargs.pop(n) for n in names}
            for g, cls in groups.items():
                kwargs[g] = cls(**{p.name: kwargs.pop(p.name) for p in fields[g]})
            ctx = kwargs[context]
            fn(*args, **kwargs, knobs=Knobs.of(ctx, values))

        command.__signature__ = sig.replace(parameters=[*params, *added])  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in [*params, *added]} | {"return": None}
        return command

    return wrap


def _group_params(cls: type[OptionGroup]) -> list[inspect.Parameter]:
    """A group's fields as keyword parameters, with their Typer options."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name], default=f.default)
            for f in dataclasses.fields(cls)]  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class CommandArgs:
    """A command's parameters, typed: each command has its subclass (RunArgs, ChatArgs, ServeArgs, EmbedArgs,
    ...), with exactly the parameters of its Typer signature as fields (its option groups as typed fields, its
    settings as `knobs`), which its body builds with keyword arguments. The Typer context says which
    parameters the user set."""

    context: typer.Context = field(repr=False, compare=False)

    def given(self, name: str) -> bool:
        """Whether the user set this parameter (command line, env var), as opposed to its default."""
        return given_by_user(self.context, name)

    def typed(self, name: str) -> bool:
        """Whether the user typed this parameter on the command line (not an env var, which is a default)."""
        return typed_by_user(self.context, name)

    def in_order(self, *names: str) -> list[str]:
        """Of these parameters, the names of those given on the command line, once per time each was given, in
        the order given (OrderedCommand)."""
        from localgen.cli.optionorder import given_in_order

        return given_in_order(self.context, names)


@dataclass(frozen=True, kw_only=True)
class ModelArgs(CommandArgs):
    """What run and chat both take: the model (its template and projector), the system prompt, thinking, the
    prompt cache, the tools, the answer's format, remote endpoints and the table's settings (options/plan.py checks
    them, by the same rules for both)."""

    model: str | None
    offline: bool
    chat_template_file: Path | None
    mmproj: Path | None
    verbose: bool
    system: str | None
    think: bool | None
    prompt_cache: bool
    tools: ToolOptions
    output: OutputFormat
    remote: RemoteOptions
    rag: RagOptions
    knobs: Knobs


def refuse_empty(*given: tuple[str, str | None]) -> None:
    """Each (flag, value) given as '' or blanks is a usage error: an empty name or text is a mistake (an empty
    variable in a script), never the same as leaving the flag out."""
    from localgen.errors import UsageError

    for flag, value in given:
        if value is not None and not value.strip():
            raise UsageError(f"{flag} is empty: give a value, or leave it out")
