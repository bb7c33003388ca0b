"""Which requests take the environment's proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY): every one but
those to this machine. A proxy cannot carry a request to 127.0.0.1 or localhost (it would reach its own), so
these go direct, as Go's http.ProxyFromEnvironment sends them (Ollama's clients); httpx and curl would send
them to the proxy, and `localgen ps` behind a company proxy would find no server. The environment's
certificates (SSL_CERT_FILE, SSL_CERT_DIR) hold for every request, this machine's too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

# httpx's URL patterns for this machine's names and loopback address (127.0.0.1 alone of 127/8: what localgen
# listens on and says)
THIS_MACHINE = ("localhost", "127.0.0.1", "[::1]")


def this_machine(url: str) -> bool:
    """Whether `url`'s host is one of THIS_MACHINE's."""
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    return host in {name.strip("[]") for name in THIS_MACHINE}


def direct_mounts(make: Callable[[], Any]) -> dict[str, Any]:
    """httpx mounts that send a client's requests to this machine direct, whatever proxy the environment names
    for the rest: a transport made by `make` for each of its names (a mount wins over the environment's proxy
    mounts, being more specific)."""
    return {f"all://{host}": make() for host in THIS_MACHINE}


def client(**settings: Any) -> Any:
    """An httpx.Client (with `settings`) that takes the environment's proxy for other machines only."""
    import httpx

    return httpx.Client(mounts=direct_mounts(httpx.HTTPTransport), **settings)


def get(url: str, **settings: Any) -> Any:
    """httpx.get, as `client` sends it: the response, read whole, within its `timeout` in all (httpx's bounds each
    read: a server that sends a byte a second, an event stream's keep-alive comments, held it for ever); past
    that, httpx.ReadTimeout."""
    import time

    import httpx

    timeout = settings.pop("timeout", 5.0)
    deadline = time.monotonic() + timeout
    with client(timeout=timeout, follow_redirects=settings.pop("follow_redirects", False)) as c, \
            c.stream("GET", url, **settings) as r:
        body = bytearray()
        for chunk in r.iter_bytes():  # decoded (gzip): the headers' Content-Encoding is not kept for it below
            body += chunk
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout(f"no whole answer within {timeout:g} s", request=r.request)
        headers = [(k, v) for k, v in r.headers.multi_items() if k.lower() != "content-encoding"]
        return httpx.Response(r.status_code, headers=headers, content=bytes(body), request=r.request)
