"""serve's --endpoint: the OpenAI-compatible servers it names (URLs, or entries of endpoints.toml), each with
its models discovered before any load (serve/remotes.py, serve/upstream.py's Upstreams), and the start's lines
that name them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localgen.errors import UsageError

if TYPE_CHECKING:
    from localgen.cli.serve.options import ServeArgs
    from localgen.serve.servelog import ServeLog
    from localgen.serve.upstream import Upstreams


def upstreams(f: ServeArgs, log: ServeLog) -> Upstreams | None:
    """The servers --endpoint names (URLs, or entries of endpoints.toml), each with its models (None without
    --endpoint)."""
    given = f.upstream
    if not given.endpoints:
        if given.api_key_env:
            raise UsageError("--api-key-env goes with --endpoint: it names the variable holding an endpoint's key",
                             hint="serve's own key is --api-key or --api-key-file")
        if f.given("endpoint_timeout"):
            raise UsageError("--endpoint-timeout goes with --endpoint: it bounds an endpoint's silence")
        return None
    from localgen.remote.endpoints import Endpoint, base_url, endpoints_file, entry, read_key, url_list
    from localgen.serve.remotes import discover
    from localgen.serve.upstream import Upstreams

    items = url_list(given.endpoints)
    urls = [item for item in items if "://" in item]
    if given.api_key_env and not urls:
        raise UsageError("--api-key-env is for --endpoint URLs: a named endpoint's key is its api_key_env in "
                         f"{endpoints_file()}")
    key = read_key(given.api_key_env) if urls else None
    found: dict[str, Endpoint] = {}
    for item in items:
        if "://" in item:
            ep = Endpoint(base_url(item), key)
        else:
            named = entry(item, log.warning)
            if named is None:
                raise UsageError(f"--endpoint {item[:100]!r} is neither an http:// or https:// URL nor an entry of "
                                 f"{endpoints_file()}")
            ep = named
        found.setdefault(ep.url, ep)
    return Upstreams([discover(ep) for ep in found.values()], parallel=f.batching.parallel,
                     queue=f.residency.max_queue, timeout=given.endpoint_timeout)


def upstream_lines(upstreams: Any, shadowed: list[str], log: Any) -> None:
    """The start's lines on the remote models: each endpoint's, by the names a client uses, and the bare names
    left to this server's own models."""
    for remote in upstreams.remotes:
        log.line(f"  remote models (--endpoint {remote.label}, {remote.endpoint.url}): "
                 f"{', '.join(upstreams.names_of(remote))}")
    if shadowed:
        log.line(f"  served here, so reached upstream only as ENDPOINT/NAME: {', '.join(shadowed)}")
