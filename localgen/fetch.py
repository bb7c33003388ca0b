"""Fetching the bytes at an http(s) URL for a prompt's media: bounded in time (one deadline for connect and
body), in size, in redirects and in concurrency, stoppable from another thread, and, for a server, unable
to reach inside: each hop's name is resolved once, every address checked, and the connection made to the
checked address (the Host header and TLS's server name keep the name), so neither a redirect nor a DNS answer
that changes between check and connect leads to loopback, private, link-local or cloud metadata addresses.
Errors say in general terms why a fetch failed, never what answered."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from localgen.errors import LocalgenError

if TYPE_CHECKING:
    import httpcore
    import httpx

T = TypeVar("T")
IP = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_BYTES = 64 * 2**20  # as media.MAX_BYTES: one attachment
POLL_S = 0.2  # how often a blocked read looks at its deadline and its cancel flag
REDIRECTS = (301, 302, 303, 307, 308)

# the metadata services of clouds (AWS, GCP, Azure, OpenStack: 169.254.169.254; AWS over IPv6; Alibaba;
# Oracle): all are non-global already, named here so that a refusal says what they are
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192"))


class FetchError(LocalgenError):
    """A URL that could not be fetched; the message is safe to send a client (no body, nothing an address
    answered)."""


class FetchBusy(FetchError):
    """Too many fetches in flight, or the server is shutting down: try again later (HTTP 503)."""


def refusal(address: str | IP) -> str | None:
    """Why a server must not fetch from an address ("a loopback address", ...), or None for a public one.
    IPv4 inside IPv6 (mapped, 6to4, NAT64, Teredo) is judged by the IPv4 address it carries."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0] if isinstance(address, str) else address)
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is None and ip in ipaddress.ip_network("64:ff9b::/96"):
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if inner is not None and (refusal(inner) or ip.ipv4_mapped):
            return refusal(inner)
    if ip in METADATA:
        return "a cloud metadata address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_unspecified or ip.is_reserved:
        return "a reserved address"
    if ip.is_private or not ip.is_global:
        return "a private address"
    return None


def resolve(host: str, port: int) -> list[str]:
    """The addresses a name has now, in the resolver's order (one lookup: what is checked is what is used)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise FetchError("the host name does not resolve") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def addresses(host: str, port: int, private: bool) -> list[str]:
    """`host` resolved once and, unless `private`, every address checked: the IPs to connect to, or a
    FetchError (one private address among public ones refuses the name: that is how rebinding hides)."""
    found = resolve(host, port)
    if not found:
        raise FetchError("the host name does not resolve")
    if not private:
        for ip in found:
            why = refusal(ip)
            if why:
                raise FetchError(f"refused: {why}")
    return found


class _Clock:
    """One fetch's deadline and its cancel flag, consulted by every blocking step."""

    def __init__(self, timeout: float, cancel: threading.Event | None) -> None:
        self.timeout = timeout
        self.until = time.monotonic() + timeout
        self.cancel = cancel or threading.Event()

    def left(self, cap: float | None = None) -> float:
        """Seconds left (at most `cap`); a FetchError once cancelled or past the deadline."""
        if self.cancel.is_set():
            raise FetchError("cancelled")
        left = self.until - time.monotonic()
        if left <= 0:
            raise FetchError(f"timed out after {self.timeout:g} s")
        return left if cap is None else min(left, cap)


def _backend(clock: _Clock, private: bool) -> httpcore.NetworkBackend:
    """httpcore's sockets, except that a name is resolved once and checked, the connection goes to a checked
    address, and every read and write keeps to the fetch's deadline and cancel flag."""
    import httpcore

    class Stream(httpcore.NetworkStream):
        def __init__(self, inner: httpcore.NetworkStream) -> None:
            self.inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            until = None if timeout is None else time.monotonic() + timeout
            while True:  # short waits, so that cancel and the deadline are seen within POLL_S
                wait = clock.left(POLL_S)
                if until is not None:
                    wait = max(0.001, min(wait, until - time.monotonic()))  # 0 would mean non-blocking
                try:
                    return self.inner.read(max_bytes, wait)
                except httpcore.ReadTimeout:
                    if until is not None and time.monotonic() >= until:
                        raise

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self.inner.write(buffer, clock.left(timeout))

        def close(self) -> None:
            self.inner.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                      timeout: float | None = None) -> httpcore.NetworkStream:
            return Stream(self.inner.start_tls(ssl_context, server_hostname, clock.left(timeout)))

        def get_extra_info(self, info: str) -> Any:
            return self.inner.get_extra_info(info)

    class Backend(httpcore.SyncBackend):
        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
            failed: Exception = FetchError("could not connect")
            for ip in addresses(host, port, private):
                try:
                    return Stream(super().connect_tcp(ip, port, clock.left(timeout), local_address, socket_options))
                except httpcore.ConnectTimeout:
                    clock.left()  # past the deadline: say so
                    failed = FetchError("could not connect")
                except httpcore.ConnectError:
                    failed = FetchError("could not connect")
            raise failed

    return Backend()


def _client(clock: _Clock, private: bool, proxies: bool) -> httpx.Client:
    import urllib.request

    import httpx

    import localgen
    from localgen.proxies import tls

    headers = {"User-Agent": f"localgen/{localgen.__version__}", "Accept-Encoding": "identity"}
    if proxies and private and urllib.request.getproxies():
        # the environment's proxy (HTTP_PROXY, ...), as any tool uses it (but for this machine: proxies.py):
        # nothing is checked, and the deadline is kept between reads
        from localgen._compat import httpx_transport
        from localgen.proxies import direct_mounts

        return httpx.Client(trust_env=True, follow_redirects=False, timeout=httpx.Timeout(clock.timeout),
                            headers=headers,
                            mounts=direct_mounts(lambda: httpx_transport(tls(), _backend(clock, private))))
    from localgen._compat import httpx_transport

    transport = httpx_transport(tls(), _backend(clock, private))  # httpx takes no network backend itself
    return httpx.Client(transport=transport, trust_env=False, follow_redirects=False,
                        timeout=httpx.Timeout(clock.timeout), headers=headers)


@dataclass(frozen=True)
class Fetcher:
    """How URLs are fetched: whether private addresses may be reached (a CLI user's own LAN: yes; a server's
    clients: no), the deadline for each fetch, connect plus body, the size and redirect limits, and whether
    the environment's proxy is used (the CLI's, with private addresses allowed; a server's never)."""

    private: bool = False
    timeout: float = 10.0
    max_bytes: int = MAX_BYTES
    max_redirects: int = 5
    proxies: bool = False

    def get(self, url: str, cancel: threading.Event | None = None) -> bytes:
        """The body at `url` (status 200), following redirects, each hop checked; a FetchError saying why not."""
        import httpx

        clock = _Clock(self.timeout, cancel)
        with _client(clock, self.private, self.proxies) as client:
            for _ in range(self.max_redirects + 1):
                target = _checked_url(url)
                try:
                    with client.stream("GET", target) as r:
                        if r.status_code in REDIRECTS and "location" in r.headers:
                            url = str(r.url.join(r.headers["location"]))
                            continue
                        if r.status_code != 200:
                            raise FetchError(f"HTTP {r.status_code}")
                        return self._body(r, clock)
                except httpx.TimeoutException:
                    clock.left()  # past the total deadline: "timed out after N s"
                    raise FetchError(f"timed out after {self.timeout:g} s") from None
                except httpx.HTTPError:  # what went wrong stays here: a client learns only that it failed
                    clock.left()
                    raise FetchError("the connection failed") from None
        raise FetchError(f"more than {self.max_redirects} redirects")

    def _body(self, r: httpx.Response, clock: _Clock) -> bytes:
        length = r.headers.get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > self.max_bytes:
            raise FetchError(f"larger than {self.max_bytes // 2**20} MiB")
        buf = bytearray()
        for piece in r.iter_bytes():
            buf += piece
            if len(buf) > self.max_bytes:
                raise FetchError(f"larger than {self.max_bytes // 2**20} MiB")
            clock.left()
        return bytes(buf)


def _checked_url(url: str) -> httpx.URL:
    import httpx

    try:
        target = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        raise FetchError("not a valid URL") from None
    if target.scheme not in ("http", "https") or not target.host:
        raise FetchError("only http and https URLs are fetched")
    return target


class FetchPool:
    """Daemon threads that run fetches, `size` at once: a fetch waits for a thread at most `wait` seconds
    (then FetchBusy); one whose caller is cancelled is told to stop (it stops reading within POLL_S); close()
    stops them all and waits for none. The caller waits no longer than the fetcher's deadline (a name
    lookup, which nothing interrupts, may hold its thread longer)."""

    def __init__(self, fetcher: Fetcher | None = None, size: int = 8, wait: float = 2.0) -> None:
        self.fetcher = fetcher or Fetcher()
        self.size = size
        self.wait = wait
        self._jobs: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._running: set[threading.Event] = set()
        self._lock = threading.Lock()
        self.closed = False

    def _submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if len(self._threads) < self.size:  # threads start as they are first needed
                t = threading.Thread(target=self._work, name=f"localgen-fetch-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
        self._jobs.put((future, fn))
        return future

    def _work(self) -> None:
        while True:
            future, fn = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # handed to the caller, which re-raises it
                future.set_exception(e)

    async def run(self, fn: Callable[[threading.Event], T]) -> T:
        """fn(cancel) on a pool thread; `cancel` is set when the caller is cancelled or the pool closes."""
        if self.closed:
            raise FetchBusy("the server is shutting down")
        cancel = threading.Event()
        with self._lock:
            self._running.add(cancel)
        future = self._submit(lambda: fn(cancel))
        waiting = asyncio.wrap_future(future)
        try:
            done, _ = await asyncio.wait({waiting}, timeout=self.wait)
            if not done and future.cancel():
                raise FetchBusy(f"{self.size} URL fetches are in flight; try again shortly")
            done, _ = await asyncio.wait({waiting}, timeout=self.fetcher.timeout + 1)
            if not done:
                raise FetchError(f"timed out after {self.fetcher.timeout:g} s")
            return waiting.result()
        except Exception:
            if self.closed:  # stopped by close(), whatever the fetch raised on the way out
                raise FetchBusy("the server is shutting down") from None
            raise
        finally:
            cancel.set()
            with self._lock:
                self._running.discard(cancel)

    def close(self) -> None:
        """Stop every fetch now (each stops reading within POLL_S); later ones are refused."""
        self.closed = True
        with self._lock:
            for cancel in self._running:
                cancel.set()


@functools.cache
def default_pool() -> FetchPool:
    """The pool for fetches made outside a server's own (a server's refuses private addresses all the same)."""
    return FetchPool()
