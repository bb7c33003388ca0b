"""Which requests take the environment's proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY): every one but
those to this machine. A proxy cannot carry a request to 127.0.0.1 or localhost (it would reach its own), so
these go direct, as Go's http.ProxyFromEnvironment sends them (Ollama's clients); httpx and curl would send
them to the proxy, and `localgen ps` behind a company proxy would find no server. The environment's
certificates (SSL_CERT_FILE, SSL_CERT_DIR) hold for every request, this machine's too."""

from __future__ import annotations

import functools
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


@functools.cache
def tls() -> Any:
    """The TLS settings every client of this process shares: httpx's default (certifi's roots, or the
    environment's SSL_CERT_FILE or SSL_CERT_DIR), made once. Each client, and each transport of a client, made its
    own, loading every root certificate again: four for a client with this machine's mounts (docs/benchmarks.md,
    "HTTP clients")."""
    import httpx

    return httpx.create_ssl_context()


def direct_mounts(make: Callable[[], Any]) -> dict[str, Any]:
    """httpx mounts that send a client's requests to this machine direct, whatever proxy the environment names
    for the rest: a transport made by `make` for each of its names (a mount wins over the environment's proxy
    mounts, being more specific)."""
    return {f"all://{host}": make() for host in THIS_MACHINE}


def client(**settings: Any) -> Any:
    """An httpx.Client (with `settings`) that takes the environment's proxy for other machines only."""
    import httpx

    return httpx.Client(verify=tls(), mounts=direct_mounts(lambda: httpx.HTTPTransport(verify=tls())), **settings)


def get(url: str, **settings: Any) -> Any:
    """httpx.get, as `client` sends it, within its `timeout` in all (request)."""
    return request("GET", url, **settings)


def request(method: str, url: str, **settings: Any) -> Any:
    """httpx.request, as `client` sends it: the response, read whole, within its `timeout` in all (httpx's bounds
    each read: a server that sends a byte a second, an event stream's keep-alive comments, a header line now and
    then, held it for ever); past that, httpx.ReadTimeout. The request runs on a thread of its own, given up on
    (left to end with the process) once the time is out."""
    import threading
    import time

    import httpx

    timeout = settings.pop("timeout", 5.0)
    deadline = time.monotonic() + timeout
    outcome: list[Any] = []

    def fetch() -> None:
        try:
            with client(timeout=timeout, follow_redirects=settings.pop("follow_redirects", False)) as c, \
                    c.stream(method, url, **settings) as r:
                body = bytearray()
                for chunk in r.iter_bytes():  # decoded (gzip): the headers' Content-Encoding is not kept below
                    body += chunk
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout(f"no whole answer within {timeout:g} s", request=r.request)
                headers = [(k, v) for k, v in r.headers.multi_items() if k.lower() != "content-encoding"]
                outcome.append(httpx.Response(r.status_code, headers=headers, content=bytes(body), request=r.request))
        except BaseException as e:  # raised again on the caller's thread
            outcome.append(e)

    worker = threading.Thread(target=fetch, name=f"localgen-{method.lower()}", daemon=True)
    worker.start()
    worker.join(timeout + 1)  # the second: httpx's own timeouts (a connect timeout) end it first, said as they are
    if not outcome:
        raise httpx.ReadTimeout(f"no whole answer within {timeout:g} s")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def connection_reason(e: BaseException) -> str:
    """Why a connection failed, in words ("connection refused", "name or service not known", "timed out"):
    the system's reason inside the HTTP client's message (`[Errno 111] Connection refused`), never the
    exception's class."""
    import re

    text = str(e).strip()
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]\n]+)", text)
    if found:
        return found.group(1).strip().rstrip(".").lower()
    if "timeout" in type(e).__name__.lower() or "timed out" in text.lower():
        return "timed out"
    line = text.splitlines()[0].strip() if text else ""
    return line[:200] if line and " " in line else "the connection failed"
