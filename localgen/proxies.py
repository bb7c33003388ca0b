"""Which requests take the environment's proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY): every one but
those to this machine. A proxy cannot carry a request to 127.0.0.1 or localhost (it would reach its own), so
these go direct, as Go's http.ProxyFromEnvironment sends them (Ollama's clients); httpx and curl would send
them to the proxy, and `localgen ps` behind a company proxy would find no server."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

# httpx's URL patterns for this machine's names and loopback addresses (127.0.0.1 alone of 127/8: what localgen
# listens on and says)
THIS_MACHINE = ("localhost", "127.0.0.1", "[::1]")


def this_machine(url: str) -> bool:
    """Whether `url`'s host is this machine's loopback: localhost, 127.0.0.0/8 or ::1."""
    import ipaddress

    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def trust_env(url: str) -> bool:
    """httpx's trust_env for a request to `url`: the environment's proxy and certificates, but not for this
    machine."""
    return not this_machine(url)


def direct_mounts(transport: type[Any], **settings: Any) -> dict[str, Any]:
    """httpx mounts that send a client's requests to this machine direct, whatever proxy the environment names
    for the rest: one transport (made with `settings`) for each of its names."""
    return {f"all://{host}": transport(**settings) for host in THIS_MACHINE}
