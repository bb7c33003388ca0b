"""serve's flag values read and checked, each a one-line usage error, before the port is tried or a model loads:
the API key, the caches' sizes, --max-body, --max-memory, the tools' and collections' needs, the address to
listen on. cli/serve/command.py starts the server with what they give (Checked)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localgen.cli import options as o
from localgen.cli.options.knobs import typed_by_user
from localgen.cli.output import plural
from localgen.cli.serve.options import ModelSettings, ResidencyOptions, ServeArgs, check_host, key_file, model_settings
from localgen.errors import LocalgenError, UsageError
from localgen.units import parse_bytes

if TYPE_CHECKING:
    import socket

    from localgen.serve.guard import Policy
    from localgen.serve.residency import Residency
    from localgen.serve.servelog import ServeLog


@dataclasses.dataclass(frozen=True)
class Checked:
    """serve's flags, each checked (a usage error otherwise) before the port is tried or a model loads."""

    key: str | None
    keep: float
    policy: Policy
    models: ModelSettings
    cache_ram: int
    cache_disk: int
    residency: Residency


def checked(f: ServeArgs, log: ServeLog) -> Checked:
    """Every flag of serve's checked, or the first usage error; the values serve starts with."""
    from localgen.serve.guard import Policy, origins_from
    from localgen.serve.jobs import parse_duration

    listen = f.listen
    check_host(listen.host, "--host" if typed_by_user(f.context, "host") else "LOCALGEN_HOST")
    o.refuse_empty(*(("--cors", origin) for origin in listen.cors or ()))
    if f.given("draft_max") and not (f.batching.lookup or f.batching.draft):
        raise UsageError("--draft-max sets how many tokens --lookup or --draft drafts: add --lookup or --draft")
    if f.batching.draft is not None and f.batching.lookup:
        raise UsageError("--draft and --lookup cannot be combined")
    if f.batching.draft is not None:
        o.refuse_empty(("--draft", f.batching.draft))
    named = list(dict.fromkeys(f.models or []))
    if f.upstream.endpoints and not named:  # nothing loads at start: what pairs with the first model has none
        paired = [flag for flag, on in (("--draft", f.batching.draft is not None), ("--mmproj", f.mmproj is not None),
                                         ("--chat-template-file", f.chat_template_file is not None)) if on]
        if paired:
            raise UsageError(f"{paired[0]} goes with a model loaded at start, and with --endpoint and no -m none is",
                             hint="name that model with -m")
    if f.mmproj and len(named) > 1:  # refused before any loads, not after the first model that it fits
        raise UsageError(f"--mmproj pairs a projector with one model, and -m names {len(named)}",
                         hint="serve the model it belongs to with it alone; a vision model from the catalogue "
                              "brings its own projector")
    key = _api_key(f)
    _check_tools(f, key)
    try:
        keep = parse_duration(f.residency.keep_alive)
    except LocalgenError as e:
        raise UsageError(f"--keep-alive: {e.message}") from None
    policy = Policy(api_key=key, origins=origins_from(listen.cors, os.environ.get("LOCALGEN_ORIGINS")),
                    check_host=_is_loopback(listen.host), names=_listen_name(listen.host),
                    max_body=_max_body(listen.max_body), read_timeout=listen.read_timeout)
    models = model_settings(f.knobs, f.batching.parallel)
    # a bad cache flag is a usage error whatever listens on the port
    cache_ram, cache_disk = _cache_ram(f.batching.cache_ram), _cache_disk(f.batching.cache_disk)
    residency = _residency(f.residency, models.offload, log)
    if len(named) > residency.max_models:  # -m pins each: refused before the first loads, not once it has
        given = "--max-models" if f.residency.max_models else "the default --max-models"
        raise UsageError(f"-m names {len(named)} models to keep loaded, and {given} holds "
                         f"{plural(residency.max_models, 'model')} at once",
                         hint=f"give --max-models {len(named)} or more, or name fewer models with -m")
    return Checked(key=key, keep=keep, policy=policy, models=models, cache_ram=cache_ram, cache_disk=cache_disk,
                    residency=residency)


def _check_tools(f: ServeArgs, key: str | None) -> None:
    """--tool-timeout needs tools; tools on an address others reach need a key (POST /tools/call runs them), and
    so do collections (their texts are their owner's)."""
    if f.given("tool_timeout") and not (f.tools.any or f.fetching.allow_mcp_urls):
        raise UsageError("--tool-timeout sets how long a tool of --functions or --mcp (or a request's mcp tool, "
                         "with --allow-mcp-urls) may take: give one")
    if f.tools.collections and not key and not _is_loopback(f.listen.host):
        raise UsageError(f"--collection on {f.listen.host} with no API key would let anyone who can reach this port "
                         "read the collection", hint="add --api-key (or --api-key-file), or listen on 127.0.0.1")
    for name in f.tools.collections or []:
        _refuse_unoffered(f, name, _collection(name))
    if f.tools.any and not key and not _is_loopback(f.listen.host):
        raise UsageError(f"--functions and --mcp on {f.listen.host} with no API key would let anyone who can reach "
                         "this port run the tools", hint="add --api-key (or --api-key-file), or listen on 127.0.0.1")
    if f.fetching.allow_mcp_urls and not key and not _is_loopback(f.listen.host):
        raise UsageError(f"--allow-mcp-urls on {f.listen.host} with no API key would let anyone who can reach this "
                         "port make the server call MCP servers of their choosing",
                         hint="add --api-key (or --api-key-file), or listen on 127.0.0.1")
    widened = [*(f.listen.cors or ()), *(o for o in os.environ.get("LOCALGEN_ORIGINS", "").split(",") if o.strip())]
    if f.tools.any and not key and widened:
        raise UsageError(f"--functions and --mcp with more web origins allowed ({', '.join(widened)[:100]}) and no API "
                         "key would let those pages run the tools", hint="add --api-key (or --api-key-file)")


def _collection(name: str) -> Any:
    """A --collection by name (a usage error naming those there are), with entries to search (as run --rag's)."""
    from localgen.embeddings import store as collections
    from localgen.text import checked

    checked(name, "--collection")
    if not collections.path().exists():
        raise UsageError(f"--collection {name!r}: there are no collections yet",
                         hint="make one with localgen embed --store NAME")
    try:
        coll = collections.get(name)
    except LocalgenError as e:
        raise UsageError(f"--collection: {e.message}") from None
    if collections.described(name).entries == 0:
        raise UsageError(f"--collection {name!r} is empty: there is nothing to search",
                         hint=f"store texts in it with `localgen embed --file FILE --store {name}`")
    return coll


def _refuse_unoffered(f: ServeArgs, name: str, coll: Any) -> None:
    """Before any model loads: a usage error for a --collection whose model is plainly not one this server will
    offer (no -m names it, and on demand it is not a model on disk by that name). A -m not on disk yet (fetched
    at start) leaves the answer to the check after the load (check_collections)."""
    from localgen.models.installed import installed
    from localgen.models.resolve import resolve

    names = f.at_start
    if coll.model in names or coll.model_spec in names:
        return
    for n in names:
        try:
            if resolve(n, offline=True, pull_missing=False, assemble=False).name == coll.model:
                return
        except LocalgenError:
            return
    if f.residency.on_demand and _a_file(coll):  # on demand, serve offers models by name, never a file's path
        raise _unoffered(name, coll)
    if f.residency.on_demand and (coll.model.lower().startswith("ollama:") or coll.model.lower().endswith(":latest")
                                  or coll.model in (i["name"] for i in installed())):
        return
    if f.residency.on_demand:  # on demand, serve offers whatever resolves on this machine (serve/ondemand.py)
        try:
            resolve(coll.model, offline=True, pull_missing=False, assemble=False)
            return
        except LocalgenError:
            pass
    raise _unoffered(name, coll)


def _a_file(coll: Any) -> bool:
    """Whether a collection was made with a model file named by its path (`embed -m ./bert.gguf`), not by a name."""
    from localgen.models import names
    from localgen.models.resolve import spec_of

    try:
        return isinstance(spec_of(coll.model_spec or coll.model), names.PathSpec)
    except LocalgenError:
        return False


def _unoffered(name: str, coll: Any) -> UsageError:
    spec = coll.model_spec or coll.model
    if _a_file(coll) and not os.path.isabs(os.path.expanduser(spec)):  # kept as typed by an older localgen
        hint = f"serve it too: -m {spec} from the folder the collection was stored from, or -m the model's full path"
    else:
        hint = f"serve it too: -m {spec}"
    return UsageError(f"--collection {name!r} was made with {coll.model}, which this server does not offer",
                      hint=hint)


def check_collections(state: Any) -> None:
    """Each --collection's model is one this server offers (its queries are embedded on that model), the very
    file it was made with (its fingerprint: another file of that name would rank by unrelated vectors)."""
    from localgen.serve.apierror import HTTPError
    from localgen.serve.vectorstores import made_with_another, other_model

    for name in state.collections:
        coll = _collection(name)
        try:
            worker = state.worker(coll.model)
        except HTTPError:
            raise _unoffered(name, coll) from None
        if other_model(worker, coll):
            raise UsageError(f"--collection {name!r} {made_with_another(coll, worker)}",
                             hint=f"serve the file it was made with, or store it again with this one: localgen "
                                  f"embed -m {worker.ref.path} --store NEWNAME")


def _listen_name(host: str) -> tuple[str, ...]:
    """The name serve listens on, where it is a name (not an address): a Host header naming it means this
    machine (serve --host vm, vm resolving to loopback: http://vm:PORT answers)."""
    import ipaddress

    try:
        ipaddress.ip_address(host.strip("[]"))
        return ()
    except ValueError:
        return (host.strip().lower().removesuffix("."),) if host.strip() else ()


def _is_loopback(host: str) -> bool:
    from localgen.cli.main import is_loopback

    return is_loopback(host)


def _residency(options: ResidencyOptions, offload_given: bool, log: Any = None) -> Residency:
    """How many models, and how much memory, may be loaded at once (serve/residency.py); `offload_given`:
    -ngl is not 0."""
    from localgen import hardware
    from localgen.serve.residency import Residency, default_budget

    gpus = [g for g in hardware.gpus() if not g.unified]
    offload = offload_given and bool(hardware.gpus())
    max_memory = options.max_memory
    if max_memory is not None:
        try:
            budget = parse_bytes(max_memory)
        except (LocalgenError, ValueError):
            raise UsageError(f"--max-memory takes a size such as 12G or 800M, not {max_memory!r}") from None
        if budget < 1 << 20:
            raise UsageError(f"--max-memory {max_memory!r} leaves no room for any model: give a size such as 12G "
                             "or 800M")
        if budget > 1 << 50:
            raise UsageError(f"--max-memory {max_memory!r} is over 1 PiB, more memory than a machine has: give a size "
                             "such as 12G")
    else:
        budget = default_budget(offload)
    from localgen.serve.servelog import STDERR_LOG

    return Residency(budget=budget, max_models=options.max_models or 3 * max(1, len(gpus) if offload else 1),
                     wait_s=_load_wait(options.load_wait), log=log or STDERR_LOG)


LOAD_WAIT_S = (1.0, 3600.0)  # --load-wait's range


def _load_wait(text: str) -> float:
    """--load-wait's seconds, from seconds or a duration as --keep-alive takes it (90s, 2m)."""
    from localgen.serve.jobs import parse_duration

    try:
        seconds = parse_duration(text)
    except LocalgenError:
        raise UsageError(f"--load-wait: bad duration {text[:40]!r}: use seconds, or e.g. 90s, 2m") from None
    if not LOAD_WAIT_S[0] <= seconds <= LOAD_WAIT_S[1]:
        raise UsageError(f"--load-wait must be within 1 s to 1 h, not {text[:40]}")
    return seconds


def _cache_ram(text: str) -> int:
    """--cache-ram in bytes (-1 no limit, 0 off): a plain number is MiB, as llama-server's."""
    from localgen import hardware

    value = text.strip().lower()
    if value == "auto":
        return min(8 << 30, (hardware.total_ram_bytes() or 32 << 30) // 4)
    if value == "-1":
        return -1
    try:
        size = _mib_or_size(value)
    except ValueError:
        raise UsageError(f"--cache-ram: {text!r} is not a size: use MiB (as llama-server), 512M, 4G, 0 (off), "
                         "-1 (no limit) or auto") from None
    if size > 1 << 50:  # (/health's and /metrics' readers take 64-bit numbers)
        raise UsageError(f"--cache-ram: {text!r} is over 1 PiB, more memory than a machine has: give a size such as "
                         "8G, or -1 for no limit")
    return size


def _cache_disk(text: str) -> int:
    """--cache-disk in bytes (0 off); auto: 8 GiB, or a quarter of the cache disk's free space if less."""
    import shutil

    from localgen import paths

    value = text.strip().lower()
    if value == "auto":
        folder = paths.cache_dir()
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            free = 32 << 30
        return min(8 << 30, free // 4)
    try:
        size = _mib_or_size(value)
    except ValueError:
        raise UsageError(f"--cache-disk: {text!r} is not a size: use 512M, 8G, 0 (off) or auto") from None
    if size > 1 << 60:
        raise UsageError(f"--cache-disk: {text!r} is over 1 EiB, more than a disk holds: give a size such as 64G")
    return size


def _mib_or_size(value: str) -> int:
    """--cache-ram's and --cache-disk's sizes in bytes: a plain number is MiB, as llama-server's (1.5 too, not
    1 byte), else a size with its unit (512M, 4G); ValueError otherwise."""
    import re

    from localgen.units import parse_bytes

    if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", value):
        return int(float(value) * (1 << 20))
    return parse_bytes(value)


def _max_body(text: str) -> int:
    from localgen.units import parse_bytes

    try:
        n = parse_bytes(text)
    except ValueError as e:
        raise UsageError(f"--max-body: {e}") from None
    if n < 1024:
        raise UsageError(f"--max-body: {text!r} is under 1k; no request would fit")
    return n


def _api_key(f: ServeArgs) -> str | None:
    """The key every request must carry: --api-key-file's, else --api-key's (or LOCALGEN_API_KEY's). A typed
    --api-key-file wins over the variable, as every flag does; both flags typed is an error."""
    from localgen.cli.options.knobs import typed_by_user

    listen = f.listen
    if listen.api_key_file:
        key = key_file(Path(listen.api_key_file),
                       listen.api_key if listen.api_key and typed_by_user(f.context, "api_key") else None)
        return _checked_key(key, f"the API key file {listen.api_key_file}")
    if listen.api_key is None:
        if os.environ.get("LOCALGEN_API_KEY") == "":  # Click reads it as unset: an open API the user did not ask for
            raise UsageError("LOCALGEN_API_KEY is blank: no client could send it", hint="give a key, or unset it")
        return None
    where = "--api-key" if typed_by_user(f.context, "api_key") else "LOCALGEN_API_KEY"
    if not listen.api_key.strip():
        raise UsageError(f"{where} is blank: no client could send it", hint="give a key, or none")
    return _checked_key(listen.api_key, where)


MAX_KEY = 4096  # an API key's characters: the Authorization header must fit the 64 KiB of a request's line and
# headers the server reads (serve/connection.py's MAX_HEAD), beside the client's other headers


def _checked_key(key: str, where: str) -> str:
    """A key a client can send in `Authorization: Bearer KEY`: one line of ASCII, no spaces or control
    characters (browsers, httpx and the OpenAI libraries send headers in ASCII alone)."""
    other = next((c for c in key if not c.isascii()), None)
    if other is not None:
        raise UsageError(f"{where}: the key has a character outside ASCII (U+{ord(other):04X}); browsers and the "
                         "OpenAI and Anthropic libraries cannot send it in a header, so their requests could not "
                         "match", hint="make one of letters, digits and - _ . ~ (secrets.token_urlsafe)")
    if any(c.isspace() or not c.isprintable() for c in key):
        raise UsageError(f"{where}: the key has spaces, line breaks or control characters inside; a client "
                         "sends it on one header line, so no request could match",
                         hint="one key, on one line")
    if len(key) > MAX_KEY:  # past what a request's headers may hold beside the others
        raise UsageError(f"{where}: the key is {len(key):,} characters; at most {MAX_KEY:,} fit a request's headers")
    return key


def probe_socket(family: int) -> socket.socket:
    """A socket to bind as the server will listen: on Windows exclusively (a bind with SO_REUSEADDR there takes a
    port another program listens on, so a busy port would pass), elsewhere with SO_REUSEADDR (as servers listen:
    a port still in TIME_WAIT is free)."""
    import socket
    import sys

    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        if sys.platform == "win32":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
        else:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    except BaseException:
        s.close()
        raise
    return s


def check_port(host: str, port: int) -> None:
    """A port in use, or an address this machine cannot listen on, is a one-line error now, not a log line from
    the server later; the hint fits the cause. A --host that names no address of this machine (a name whose lookup
    fails, for now or for good, or an address elsewhere) is a usage error, exit 2; a busy port is exit 1."""
    import errno
    import ipaddress
    import socket

    from localgen.hostnames import host_fault, lookup_fault, temporary_lookup

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address in brackets, as URLs write it
    mine = "127.0.0.1 for this machine only, 0.0.0.0 for every interface"

    def unresolved(e: OSError) -> UsageError:
        return UsageError(f"cannot listen on {where}: {lookup_fault(host, e)}",
                          hint=f"try again, or give an address of this machine: {mine}" if temporary_lookup(e) else
                          f"--host takes an address or a host name of this machine: {mine}")

    try:  # an address as written (127.0.0.1, fe80::1%eth0): nothing to look up, no name service asked
        literal = ipaddress.ip_address(host)
        address = host.partition("%")[0]  # (an IPv4 link-local address, 169.254.x.y, needs no interface)
        unscoped = literal.version == 6 and literal.is_link_local and not getattr(literal, "scope_id", None)
    except ValueError:  # a name (or 1.2.3): looked up here as well as inside bind, which says only "no such host"
        try:
            found = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4]
        except socket.gaierror as e:
            raise unresolved(e) from None
        except UnicodeError:  # a name IDNA cannot write (an empty label, one over 63 characters)
            raise UsageError(f"cannot listen on {where}: {host!r} has {host_fault(host) or 'no valid host name'}",
                             hint=f"--host takes an address or a host name of this machine: {mine}") from None
        address = str(found[0])
        unscoped = len(found) == 4 and not found[-1] and ipaddress.ip_address(address).is_link_local
    with probe_socket(family) as s:
        try:
            s.bind((host, port))
        except socket.gaierror as e:  # its lookup failed this time
            raise unresolved(e) from None
        except OSError as e:
            if e.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):  # EINVAL: link-local IPv6 with no interface (scope 0)
                shown = host if address == host.partition("%")[0] else f"{host} ({address})"
                raise UsageError(f"cannot listen on {where}: {shown} is not an address of this machine" +
                                 (" (a link-local address needs its interface too: fe80::1%eth0)" if unscoped else ""),
                                 hint=f"give one of this machine's: {mine}, or an interface's own address") from None
            hint = ("ports below 1024 need privileges: pick a --port above 1023" if e.errno == errno.EACCES else
                    "pick another --port, or stop what is using it")
            raise LocalgenError(f"cannot listen on {where}: {e.strerror or e}", hint=hint) from None
