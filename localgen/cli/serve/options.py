"""serve's own options, in typed groups (frozen dataclasses whose fields are Typer options; with_knobs() gives
serve each field as an option and the group to the command): where it listens, which models stay loaded,
how a model's slots batch, and image URL fetches; ServeArgs, all of serve's parameters typed; and
ModelSettings, the table's settings serve took, checked once into what its models load and sample with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.cli.inputfile import input_path, model_file
from localgen.cli.options import CommandArgs, OptionGroup
from localgen.cli.options.knobs import Knobs
from localgen.errors import UsageError
from localgen.serve.stalls import DEFAULT_READ_TIMEOUT_S
from localgen.types import LoadParams

SERVE = "Server"
DEFAULT_MODEL = "smollm2:135m"  # loaded at start when -m names none (and no --endpoint serves remote models)
MAX_FETCHES = 8  # image URL fetches at once, per server
FETCH_WAIT_S = 2.0  # how long a fetch waits for one of them before its request gets 503


@dataclass(frozen=True)
class ListenOptions(OptionGroup):
    """Where the server listens, and who may use it."""

    host: Annotated[
        str, typer.Option("--host", envvar="LOCALGEN_HOST", rich_help_panel=SERVE,
                          help="Address to listen on. Anything but loopback is reachable by others: use an API key.")
    ] = "127.0.0.1"
    port: Annotated[int, typer.Option("--port", envvar="LOCALGEN_PORT", min=1, max=65535, rich_help_panel=SERVE,
                                      help="Port.")] = 11435
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="LOCALGEN_API_KEY", rich_help_panel=SERVE, show_default=False,
                                 help="Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every route but "
                                      "/health and the chat page's files.")
    ] = None
    api_key_file: Annotated[
        Path | None, typer.Option("--api-key-file", path_type=str, callback=input_path, rich_help_panel=SERVE,
                                  show_default=False, help="Read the API key from a file (64 KiB at most).")
    ] = None
    cors: Annotated[
        list[str] | None,
        typer.Option("--cors", rich_help_panel=SERVE, show_default=False,
                     help="Also let web pages at this origin use the server (repeatable; globs such as "
                          "https://*.example.com; * for any). Loopback pages are always allowed. Env: "
                          "LOCALGEN_ORIGINS (comma-separated).")
    ] = None
    max_body: Annotated[
        str, typer.Option("--max-body", rich_help_panel=SERVE,
                          help="Largest request body (e.g. 512k, 16M); larger ones get 413.")
    ] = "16M"
    read_timeout: Annotated[
        float, typer.Option("--read-timeout", min=1, max=3600, rich_help_panel=SERVE, metavar="SECONDS",
                            help="A client must send a request's headers, and each part of its body, within "
                                 "this time, and a whole body within it plus a second per 500 bytes: a stalled "
                                 "connection is closed (a stalled or trickled body gets 408).")
    ] = DEFAULT_READ_TIMEOUT_S
    webui: Annotated[
        bool, typer.Option("--webui/--no-webui", rich_help_panel=SERVE,
                           help="A chat page at / for browsers (with --api-key it asks for the key); "
                                "--no-webui: no page.")
    ] = True


def host_and_port(host: str, port: int, port_typed: bool, host_typed: bool = True) -> tuple[str, int]:
    """--host (or LOCALGEN_HOST where it was not typed: its errors name it) as Ollama's OLLAMA_HOST takes it too:
    `host:port`, `[v6]:port`, `[v6]` or `http://host:port`, whose port counts unless --port was typed; else the
    host as it is."""
    import re

    m = re.fullmatch(r"(?:https?://)?(\[[0-9A-Fa-f:.]+\]|[^:/\[\]\s]+)(?::([0-9]{1,5}))?/?", host.strip())
    url = host.strip().lower().startswith(("http://", "https://"))
    if m is None or (m[2] is None and not url and not m[1].startswith("[")):  # `[v6]` alone loses its brackets too
        return host, port
    if m[2] is not None and not 1 <= int(m[2]) <= 65535:
        source = "--host" if host_typed else "LOCALGEN_HOST"
        raise UsageError(f"{source} {host[:100]!r} names port {m[2]}, which is not 1 to 65535")
    named = m[1][1:-1] if m[1].startswith("[") else m[1]
    return named, port if port_typed or m[2] is None else int(m[2])


MAX_KEY_FILE = 64 << 10  # a key is some dozens of characters; a file past this is not one (/dev/zero, a log)


def key_file(path: Path, typed: str | None) -> str:
    """The key in --api-key-file, its ASCII whitespace around it stripped (serve's, ps's and launch's: the
    `tr -d '[:space:]'` of --print-env's lines takes the same away, so a no-break space or a U+001C stays in the key
    everywhere and is refused); a usage error when --api-key is typed too, or when the file cannot be read, is
    larger than 64 KiB, is not UTF-8 text, begins with a byte-order mark or is empty. A typed file wins over
    LOCALGEN_API_KEY."""
    if typed is not None:
        raise UsageError("--api-key and --api-key-file cannot be combined")
    from localgen.text import read_bounded

    where = f"the API key file {path}"
    try:
        key = read_bounded(path.expanduser(), MAX_KEY_FILE, where).decode("utf-8").strip(ASCII_SPACE)
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not UTF-8 text") from None
    except OSError as e:
        raise UsageError(f"{where} cannot be read: {e.strerror or e}") from None
    if key.startswith("\ufeff"):  # a shell's line would send its three bytes as the key's start
        raise UsageError(f"{where} begins with a byte-order mark (U+FEFF)", hint="save it as UTF-8 without a BOM")
    if not key:
        raise UsageError(f"{where} is empty")
    return key


ASCII_SPACE = " \t\n\r\f\v"  # what the C locale's [:space:] is, and what a key file's line ends and padding are


def check_host(host: str, source: str = "--host", client: bool = False) -> None:
    """An empty --host (serve's, or a client's: ps's, launch's) is a usage error: serve would take it for every
    interface, IPv4 and IPv6; so is one with spaces or control characters, which no host name has. `source` names
    where the value came from in the error (--host, or LOCALGEN_HOST where it was not typed); the hint is for a
    server's address to listen on, or for a `client`'s server to find."""
    hint = ("give the server's address or host name: 127.0.0.1 for a server on this machine" if client else
            "give an address: 127.0.0.1 for this machine only, 0.0.0.0 for every interface")
    if not host.strip():
        raise UsageError(f"{source} is empty", hint=hint)
    if not host.isprintable() or any(c.isspace() for c in host):  # no host name has them; bind() says TypeError
        raise UsageError(f"{source} {host[:100]!r} is not a host name or address: it has spaces or control characters",
                         hint=hint)


def check_host_name(host: str, source: str = "--host") -> None:
    """A client's --host (ps's, launch's), once host_and_port has taken its scheme and port away: an IP address or
    a host name (dot-separated labels), else a usage error naming `source`; `x/y` would otherwise become a URL's
    host and path."""
    import ipaddress
    import re

    try:
        ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
        return
    except ValueError:
        pass
    if re.fullmatch(r"[\w-]+(?:\.[\w-]+)*\.?", host) is None:
        raise UsageError(f"{source} {host[:100]!r} is not a host name or address",
                         hint="give a name or an address, with a port if you like: 127.0.0.1, localhost:11435, "
                              "[::1]:11435, http://gpu-box:11435")


def key_fault(key: str) -> str | None:
    """What in an API key no HTTP header carries as given (a space, a control character), said where it is; None
    for a key a header carries."""
    if not key.isprintable():
        return ("has a control character (a tab, a newline) in it" if key.isascii() else
                "has a character that is not printable ASCII (a no-break space, a control character) in it")
    if key.startswith(" ") or key.endswith(" "):
        return f"{'begins' if key.startswith(' ') else 'ends'} with a space"
    return "has a space inside" if " " in key else None


@dataclass(frozen=True)
class ServeToolOptions(OptionGroup):
    """The tools the server runs itself: GET /tools lists them, POST /tools/call runs one (the chat page's
    tools; serve/servertools.py); and the collections it searches (serve/vectorstores.py)."""

    functions: o.Functions = None
    mcp: o.Mcp = None
    tool_timeout: o.ToolTimeout = 30.0
    collections: Annotated[
        list[str] | None,
        typer.Option("--collection", rich_help_panel=SERVE, show_default=False, metavar="NAME",
                     help="Offer this embeddings collection (localgen embed --store) as an OpenAI vector store, "
                          "read-only: GET /v1/vector_stores, POST /v1/vector_stores/NAME/search (repeatable).")
    ] = None

    @property
    def any(self) -> bool:
        """Whether any tool was given."""
        return bool(self.functions or self.mcp)


@dataclass(frozen=True)
class ResidencyOptions(OptionGroup):
    """Which models stay loaded, and for how long (serve/residency.py)."""

    keep_alive: Annotated[
        str, typer.Option("--keep-alive", rich_help_panel=SERVE,
                          help="Unload a model after this long idle (e.g. 10m, 1h; -1 never); the next request "
                               "loads it again.")
    ] = "5m"
    max_queue: Annotated[
        int, typer.Option("--max-queue", min=0, rich_help_panel=SERVE,
                          help="Requests that may wait for a slot, per model; past it the answer is 503.")
    ] = 64
    max_models: Annotated[
        int | None, typer.Option("--max-models", min=1, max=64, rich_help_panel=SERVE, show_default=False,
                                 help="Models loaded at once (default: 3, or 3 per GPU); to load another, the least "
                                      "recently used idle one that -m did not name is unloaded.")
    ] = None
    max_memory: Annotated[
        str | None, typer.Option("--max-memory", rich_help_panel=SERVE, show_default=False, metavar="SIZE",
                                 help="Memory the loaded models may take together, each by its estimate (weights, "
                                      "KV cache, buffers), e.g. 12G (default: 90% of this machine's RAM, plus its "
                                      "GPUs' memory when offloading; on Apple Silicon when offloading, no more than "
                                      "Metal may use).")
    ] = None
    load_wait: Annotated[
        str, typer.Option("--load-wait", rich_help_panel=SERVE, metavar="DURATION",
                          help="How long a model's load may wait for room while the loaded models are busy (seconds, "
                               "or e.g. 90s, 2m; 1 s to 1 h): meanwhile the least recently used one takes no new "
                               "requests (they wait behind the swap), then unloads; past this the request gets 503.")
    ] = "2m"
    on_demand: Annotated[
        bool, typer.Option("--on-demand/--no-on-demand", rich_help_panel=SERVE,
                           help="Offer every model on this machine (localgen list) by name, loading one when a "
                                "request names it; --no-on-demand: only the -m models.")
    ] = True


@dataclass(frozen=True)
class SlotOptions(OptionGroup):
    """How a model's slots decode its requests together."""

    parallel: Annotated[
        int, typer.Option("--parallel", "-np", min=1, max=256, rich_help_panel=SERVE,
                          help="Slots per model: requests decoded together (continuous batching).")
    ] = 4
    batch_lines: Annotated[
        int, typer.Option("--batch-lines", min=1, max=256, rich_help_panel=SERVE, metavar="N",
                          help="Requests of the Batch API's batches (/v1/batches) run at once, all batches "
                               "together; a new one starts only while no request waits for a slot, so clients "
                               "wait at most for those in flight.")
    ] = 2
    exact: Annotated[
        bool | None, typer.Option("--exact/--no-exact", rich_help_panel=SERVE, show_default=False,
                                  help="Batching mode. Default: every request batched for throughput wherever "
                                       "exactness costs more than 10 % (a GPU; K-quant or repacked weights, "
                                       "flash attention on a CPU), else greedy answers identical to running "
                                       "alone. --exact: every answer identical to running alone, at that price; "
                                       "--no-exact: batch everything. The start-up line says which and why. A "
                                       "request may ask with \"exact\": true (Ollama: options.exact).")
    ] = None
    lookup: Annotated[
        bool, typer.Option("--lookup", rich_help_panel=SERVE,
                           help=o.LOOKUP_HELP)
    ] = False
    draft: Annotated[
        str | None,
        typer.Option("--draft", "--model-draft", "-md", callback=model_file, rich_help_panel=SERVE, show_default=False,
                     help=o.DRAFT_HELP),
    ] = None
    draft_max: Annotated[
        int, typer.Option("--draft-max", min=1, max=64, rich_help_panel=SERVE, metavar="N",
                          help=o.DRAFT_MAX_HELP)
    ] = 6
    share_prefix: Annotated[
        bool, typer.Option("--share-prefix/--no-share-prefix", rich_help_panel=SERVE,
                           help="In throughput batching, start a new prompt from the longest prefix any slot "
                                "holds (a system prompt, few-shot examples), sharing its KV cells instead of "
                                "evaluating it again.")
    ] = True
    cache_ram: Annotated[
        str, typer.Option("--cache-ram", rich_help_panel=SERVE,
                          help="Host memory per model for what a reused slot would discard: a conversation "
                               "coming back is copied in, not evaluated again. MiB (as llama-server's), or "
                               "512M, 4G; 0 off; -1 no limit; auto: 8G or a quarter of RAM if less.")
    ] = "auto"
    cache_disk: Annotated[
        str, typer.Option("--cache-disk", rich_help_panel=SERVE, metavar="SIZE",
                          help="Disk for the prompt cache across unloads and restarts: what the slots and "
                               "--cache-ram hold (prefixes of 64 tokens or more) is written under the cache "
                               "folder when a model unloads, when serve stops and while idle, and read back "
                               "when the model loads again. All models together, least recently used out "
                               "when this server writes; 512M, 8G, or a plain number of MiB (as "
                               "--cache-ram's); 0 off; auto: 8G or a quarter of the disk's free space if less.")
    ] = "auto"


@dataclass(frozen=True)
class FetchOptions(OptionGroup):
    """URLs in requests (images, MCP servers): whether the server fetches or connects to them, from where, how
    long."""

    allow_image_urls: Annotated[
        bool, typer.Option("--allow-image-urls", rich_help_panel=SERVE,
                           help="Fetch http(s) image URLs in requests (off: only data: URIs and base64, so clients "
                                "cannot make the server fetch URLs). Loopback, private, link-local and cloud "
                                "metadata addresses are refused, after redirects and DNS too.")
    ] = False
    allow_mcp_urls: Annotated[
        bool, typer.Option("--allow-mcp-urls", rich_help_panel=SERVE,
                           help="Serve the Responses API's mcp tool: connect to the MCP server_url a request names "
                                "(off: such a request is a 400). Loopback, private, link-local and cloud metadata "
                                "addresses are refused.")
    ] = False
    allow_private_urls: Annotated[
        bool, typer.Option("--allow-private-urls", rich_help_panel=SERVE,
                           help="Also fetch from and connect to loopback, private and link-local addresses: "
                                "with --allow-image-urls or --allow-mcp-urls a LAN's own image or MCP server, and "
                                "/api/pull's ollama:HOST/... registry on this machine or the LAN; any client can then "
                                "reach them.")
    ] = False
    fetch_timeout: Annotated[
        float, typer.Option("--fetch-timeout", min=0.1, max=600, rich_help_panel=SERVE,
                            help="Seconds an image URL's fetch may take, connect and body together; "
                                 f"{MAX_FETCHES} run at once, and one that waits over {FETCH_WAIT_S:g} s gets 503.")
    ] = 10.0


@dataclass(frozen=True)
class UpstreamOptions(OptionGroup):
    """Other OpenAI-compatible servers whose models serve offers beside its own (serve/upstream.py)."""

    endpoints: Annotated[
        list[str] | None,
        typer.Option("--endpoint", rich_help_panel=o.REMOTE_PANEL, show_default=False, metavar="URL|NAME",
                     help="Also serve the models of this OpenAI-compatible server (vLLM, llama-server, Ollama, LM "
                          "Studio, another localgen serve): a URL, or an entry of endpoints.toml. Its models "
                          "(the entry's models, else its /v1/models, asked at start) are listed beside this "
                          "server's as ENDPOINT/ID (and by the bare ID where no other model has it), and their "
                          "requests at /v1/chat/completions, /v1/completions and /v1/embeddings are sent on to it "
                          "(repeatable).")
    ] = None
    api_key_env: o.ApiKeyEnv = None
    endpoint_timeout: Annotated[
        float, typer.Option("--endpoint-timeout", min=0.1, max=86400, rich_help_panel=o.REMOTE_PANEL, metavar="SECONDS",
                            help="The longest an --endpoint server may send nothing, its wait for a whole answer "
                                 "included: past it, a request that had no answer yet gets 504, and a stream ends "
                                 "with a 504 error event.")
    ] = 600.0


@dataclass(frozen=True, kw_only=True)
class ServeArgs(CommandArgs):
    """`localgen serve`'s parameters (serve/command.py): its own, its groups and the table's settings."""

    models: list[str] | None
    offline: bool
    chat_template_file: Path | None
    mmproj: Path | None
    drain_timeout: float
    quiet: bool
    verbose: bool
    log_format: str
    listen: ListenOptions
    residency: ResidencyOptions
    batching: SlotOptions
    fetching: FetchOptions
    tools: ServeToolOptions
    upstream: UpstreamOptions
    knobs: Knobs

    @property
    def at_start(self) -> list[str]:
        """The models loaded at start: the -m models, else the default one; none with --endpoint and no -m (its
        remote models, and every model here on demand, are served without a load nobody asked for)."""
        return list(dict.fromkeys(self.models or ([] if self.upstream.endpoints else [DEFAULT_MODEL])))


@dataclass(frozen=True)
class ModelSettings:
    """What every served model loads with and the sampling its requests start from: the table's settings as
    serve took them, checked once at the entry (models_settings), so that nothing after it looks a setting up
    by name."""

    load: LoadParams  # the load settings, the flags over the defaults (a tuning record for this many streams)
    load_given: frozenset[str]  # the load settings the user gave (flags, env vars): each wins over a preset's
    sampling: dict[str, Any]  # the sampling flags given, checked: the defaults that requests override

    @property
    def ctx_given(self) -> bool:  # --ctx given: it wins over a preset's num_ctx
        return "ctx" in self.load_given

    @property
    def offload(self) -> bool:  # the layers may go to a GPU (-ngl not 0)
        return self.load.n_gpu_layers != 0

    def given(self, name: str) -> bool:
        """Whether the user gave this load setting (by the table's name; for a preset's layer)."""
        return name in self.load_given


def model_settings(knobs: Knobs, parallel: int) -> ModelSettings:
    """The settings serve took, checked (a bad sampling flag or -ot buffer is a usage error before anything
    loads)."""
    from localgen.loadsettings import LOAD_KNOBS
    from localgen.settings import KNOBS

    params = knobs.sampling()
    sampling = {k: getattr(params, k) for k in knobs.values if k in KNOBS and knobs.given(k)}
    return ModelSettings(load=knobs.load(streams=parallel),
                         load_given=frozenset(n for n in LOAD_KNOBS if knobs.given(n)), sampling=sampling)
