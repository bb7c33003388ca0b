"""Talking to the Hugging Face Hub (or whatever HF_ENDPOINT names): repo listings through
huggingface_hub (auth, endpoint, error codes), and the URLs and headers for our own transfers."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from localgen.errors import LocalgenError, ModelNotFoundError
from localgen.models.hfcache import COMMIT, check_repo_id, safe_filename
from localgen.models.quant import RemoteFile
from localgen.proxies import connection_reason

RETRIES = 3
MAX_WAIT = 60  # seconds: the most one retry waits for a Retry-After (the Hub's API, and every file download)
_peers = threading.local()  # public_peers_only's flag, for the thread that set it


class HubUnreachableError(LocalgenError):
    """No answer from the Hub."""


@dataclass(frozen=True)
class RepoListing:
    """A repo at one commit: its files with sizes and SHA-256s."""

    repo: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]


def endpoint() -> str:
    """HF_ENDPOINT, read now (huggingface_hub reads it once, at import); empty or unset: the Hub itself. A value
    that is no http(s) URL is a usage error here, before any request (not a network error, nor a traceback)."""
    value = os.environ.get("HF_ENDPOINT", "").strip() or "https://huggingface.co"
    from localgen.hostnames import host_fault

    try:
        parts = urlsplit(value)
        # a port that is not a number raises; 0, or a host that cannot be looked up (`a..b`: a UnicodeError
        # traceback from the resolver), are no mirror either
        ok = parts.scheme in ("http", "https") and parts.port != 0 and not host_fault(parts.hostname or "")
    except ValueError:
        ok = False
    if not ok:
        from localgen.errors import UsageError

        raise UsageError(f"HF_ENDPOINT must be an http:// or https:// URL (the Hub or a mirror), not {shown(value)!r}",
                         hint="unset it for https://huggingface.co")
    if "@" in parts.netloc:  # urllib sends no user:password of a URL (it reads one as the host, or a bad port)
        from localgen.errors import UsageError

        raise UsageError(f"HF_ENDPOINT may not carry a user name or password ({shown(value)!r})",
                         hint="give a mirror's token in HF_TOKEN instead")
    return value.rstrip("/")


def file_url(repo: str, commit: str, filename: str) -> str:
    """The resolve URL of one file at one commit."""
    return f"{endpoint()}/{check_repo_id(repo)}/resolve/{commit}/{quote(safe_filename(filename))}"


def open_url(url: str, headers: dict[str, str], timeout: float,
             redirect: Callable[[str, str], None] | None = None) -> Any:
    """GET with urllib, following redirects, but never carrying Authorization to another host: every LFS
    or Xet file on the Hub is a redirect to a CDN, and with a mirror in HF_ENDPOINT the target can be anyone
    (huggingface_hub drops it the same way). `redirect(from, to)` is asked first about each redirect, and raises
    to refuse it (a model registry's: models/registry.py)."""
    import urllib.request

    class KeepTokenHome(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, hdrs: Any, newurl: str) -> Any:
            if redirect is not None:
                redirect(req.full_url, newurl)
            new = super().redirect_request(req, fp, code, msg, hdrs, newurl)
            if new is not None and not keeps_token(req.full_url, newurl):
                for name in list(new.headers):
                    if name.lower() == "authorization":
                        del new.headers[name]
                new.unredirected_hdrs.pop("Authorization", None)
            return new

    handlers: list[Any] = [KeepTokenHome]
    if getattr(_peers, "public", False):
        handlers += _public_peer_handlers()
    opener = urllib.request.build_opener(*handlers)
    return opener.open(urllib.request.Request(url, headers=headers), timeout=timeout)


class PrivatePeerError(OSError):
    """A connection that public_peers_only refused: its peer is at a loopback, private, link-local or metadata
    address."""


@contextlib.contextmanager
def public_peers_only() -> Iterator[None]:
    """Within it, in this thread, open_url's every connection (redirects and token realms too) is checked where it
    landed, its peer's address from the connected socket before TLS or a request's first byte, and refused
    (PrivatePeerError, within urllib's URLError) at a loopback, private, link-local or metadata address: serve's
    pull for a client, which a name that answers a public address to the check and 127.0.0.1 to the connection
    (DNS rebinding) would otherwise lead to this machine or its LAN. Through a proxy, the proxy is the peer:
    not checked."""
    before = getattr(_peers, "public", False)
    _peers.public = True
    try:
        yield
    finally:
        _peers.public = before


def _public_peer_handlers() -> list[Any]:
    """urllib's http and https handlers, their connections' peers checked (public_peers_only)."""
    import urllib.request

    from localgen.fetch import refusal

    def checked(http_class: Any) -> Any:
        class Checked(http_class):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                create: Any = self._create_connection  # type: ignore[has-type]

                def connect(*a: Any, **k: Any) -> Any:
                    sock = create(*a, **k)
                    if not self._tunnel_host:  # a proxy's tunnel: the proxy is the peer
                        why = refusal(str(sock.getpeername()[0]))
                        if why is not None:
                            sock.close()
                            raise PrivatePeerError(f"refused: {self.host} is at {why}")
                    return sock

                self._create_connection = connect

        return Checked

    class Http(urllib.request.HTTPHandler):
        def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
            return super().do_open(checked(http_class), req, **kwargs)

    class Https(urllib.request.HTTPSHandler):
        def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
            return super().do_open(checked(http_class), req, **kwargs)

    return [Http, Https]


def keeps_token(url: str, redirected_to: str) -> bool:
    """Whether a redirect may carry the Authorization header: only to the same origin (scheme, host and port, a
    scheme's default port as itself), or the same host upgraded from http on its default port to https on its
    (as httpx, huggingface_hub's HTTP client, and requests keep it); any other port of the same host may be another
    service."""
    before, after = _origin(url), _origin(redirected_to)
    upgrade = before == ("http", after[1], 80) and after[0] == "https" and after[2] == 443
    return before == after or upgrade


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), port if port is not None else {"http": 80, "https": 443}.get(scheme)


def shown(url: str) -> str:
    """A URL as messages show it: without the user and password that HF_ENDPOINT may carry (http://user:pw@host)."""
    import re

    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@", r"\1", url)  # any URL, even one urlsplit refuses


def auth_headers() -> dict[str, str]:
    """Authorization (HF_TOKEN or the saved login) and user agent, as huggingface_hub builds them."""
    endpoint()  # a bad HF_ENDPOINT breaks huggingface_hub's import: said first, as a usage error
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    return dict(build_hf_headers(library_name="localgen"))


def list_repo(repo: str, revision: str = "main", note: Callable[[str], None] | None = None) -> RepoListing:
    """The repo's files at a revision, with the SHA-256 the Hub publishes for each LFS file. `note`: told of each
    wait a 429 or 503's Retry-After asks for."""
    hub_url = endpoint()  # before huggingface_hub's import, which a bad HF_ENDPOINT breaks
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hf_errors

    check_repo_id(repo)
    api = HfApi(endpoint=hub_url, library_name="localgen")
    for attempt in range(RETRIES):
        try:
            info = api.model_info(repo, revision=revision, files_metadata=True, timeout=30)
            break
        except hf_errors.GatedRepoError:
            raise LocalgenError(
                f"{repo} is gated: accept its terms on the Hub, then set HF_TOKEN (or `hf auth login`)"
            ) from None
        except hf_errors.RevisionNotFoundError:
            raise ModelNotFoundError(f"{repo} has no revision {revision!r}") from None
        except hf_errors.RepositoryNotFoundError:
            raise ModelNotFoundError(
                f"no repo {repo} on the Hub (or it is private)",
                hint="check the name; for a private repo set HF_TOKEN",
            ) from None
        except hf_errors.HfHubHTTPError as e:
            status = getattr(getattr(e, "response", None), "status_code", None)
            if status in (401, 403):
                raise LocalgenError(
                    f"the Hub refused access to {repo} ({status}): it is gated or private",
                    hint="accept its terms on the Hub, then set HF_TOKEN (or `hf auth login`)",
                ) from None
            if attempt + 1 == RETRIES or (status is not None and status < 500 and status != 429):
                raise LocalgenError(f"the Hub answered {status or 'an error'} for {repo}",
                                    hint=RATE_HINT if status == 429 else None) from None
            asked = retry_after(e.response.headers.get("Retry-After")) if status in (429, 503) else None
            if asked is not None:  # the Hub over a user's rate (429) or busy (503) says when to come back
                wait = min(asked, MAX_WAIT)
                if note is not None:
                    note(waiting("the Hub", asked, wait, status))
                time.sleep(wait)
                continue
        except hf_errors.OfflineModeIsEnabled:
            raise HubUnreachableError("HF_HUB_OFFLINE is set; only cached models can be used") from None
        except (OSError, *_transport_errors()) as e:  # type: ignore[misc]
            if attempt + 1 == RETRIES:
                raise HubUnreachableError(
                    f"cannot reach the Hub at {shown(hub_url)}: {connection_reason(e)}",
                    hint="`localgen list` shows the models already here, which --offline uses without the Hub",
                ) from None
        time.sleep(0.5 * 2**attempt)
    commit = info.sha or ""
    if not COMMIT.match(commit):
        raise LocalgenError(f"the Hub gave no valid commit for {repo}")
    files = []
    for s in info.siblings or []:
        name = safe_filename(s.rfilename)
        sha = s.lfs.sha256 if s.lfs else None
        size = s.lfs.size if s.lfs else (s.size or 0)
        files.append(RemoteFile(name=name, size=int(size), sha256=sha))
    return RepoListing(repo=repo, revision=revision, commit=commit, files=tuple(files))


RATE_HINT = "the Hub limits requests per user: try again in a few minutes (with HF_TOKEN set the limit is higher)"


def retry_after(value: str | None, cap: float | None = None) -> float | None:
    """Retry-After in seconds (RFC 9110: delay-seconds, or an HTTP-date, read as the seconds from now to it), at
    most `cap` where one is given: a server asking for longer gets a retry at that point all the same; None for
    a value that is neither (a negative number, garbage)."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():  # "²" is a digit int() refuses
        # digits enough to overflow a float (or past int()'s 4,300) are as absurd as 2**40 s
        seconds = float(min(int(text), 1 << 40)) if len(text) <= 15 else float(1 << 40)
    else:
        import email.utils
        from datetime import UTC, datetime

        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # an HTTP-date is GMT
            when = when.replace(tzinfo=UTC)
        seconds = max((when - datetime.now(UTC)).total_seconds(), 0.0)
    return seconds if cap is None else min(seconds, float(cap))


def waiting(who: str, asked: float, wait: float, status: int | None) -> str:
    """The line a retry that waits for a Retry-After says: what the server asked, and what is waited."""
    then = "trying again after that" if wait >= asked else f"trying again in {wait:.0f} s"
    return f"{who} asked to wait {asked:.0f} s (HTTP {status}); {then}"


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's connection errors (huggingface_hub has moved from requests to httpx to httpx2)."""
    import importlib

    found: list[type[BaseException]] = []
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "ConnectionError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def fetch_summary(repo: str, commit: str, filename: str, size: int, split: bool,
                  note: Callable[[str], None] | None = None) -> tuple[Any, Any]:
    """Summarize a remote GGUF from the start of the file (a few MB, fetched with Range requests): its
    GGUFSummary and its WeightLayout (models/footprint.py, from the tensor table). `note`: told of each wait a
    429 or 503's Retry-After asks for."""
    import tempfile

    from localgen.errors import ModelFormatError
    from localgen.models.footprint import layout
    from localgen.models.gguf_meta import summarize

    url = file_url(repo, commit, filename)
    want = 4 << 20
    while True:
        data = _header_bytes(url, repo, filename, min(want, size), note)
        with tempfile.NamedTemporaryFile(suffix=".gguf") as tmp:
            tmp.write(data)
            tmp.flush()
            try:
                summary = summarize(tmp.name, file_size=size, check_data=not split)
                return summary, layout(tmp.name)
            except ModelFormatError as e:
                if "ends in the middle of its header" not in e.message or want >= min(size, 64 << 20):
                    # named as the repo's file, never the temporary one its start was read into; nothing was
                    # downloaded, so "download it again" cannot help
                    shown = f"{repo}/{filename}"
                    raise ModelFormatError(e.message.replace(tmp.name, shown),
                                           hint="the repo's file is damaged or not a model llama.cpp can "
                                                "load; nothing was downloaded") from None
        want *= 4


def _header_bytes(url: str, repo: str, filename: str, n: int, note: Callable[[str], None] | None) -> bytes:
    """The first `n` bytes of a repo's file, as list_repo asks the API: a 429, or a 5xx, tried RETRIES times
    (waiting what a Retry-After asks, at most MAX_WAIT), as is a connection that fails."""
    import urllib.error

    attempt = 0
    while True:
        attempt += 1
        last = attempt == RETRIES
        try:
            with open_url(url, {**auth_headers(), "Range": f"bytes=0-{n - 1}"}, 30) as resp:
                return bytes(resp.read(n))
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                raise LocalgenError(
                    f"{repo} is gated or private: the Hub refused its files ({e.code})",
                    hint="accept its terms on the Hub, then set HF_TOKEN (or `hf auth login`)",
                ) from None
            if last or (e.code < 500 and e.code != 429):
                raise LocalgenError(f"the Hub answered {e.code} for the header of {filename}",
                                    hint=RATE_HINT if e.code == 429 else None) from None
            asked = retry_after(e.headers.get("Retry-After")) if e.code in (429, 503) else None
            if asked is not None:
                wait = min(asked, MAX_WAIT)
                if note is not None:
                    note(waiting("the Hub", asked, wait, e.code))
                time.sleep(wait)
                continue
        except (urllib.error.URLError, OSError) as e:
            if last:
                raise HubUnreachableError(f"cannot read the header of {filename}: {connection_reason(e)}") from None
        time.sleep(0.5 * 2 ** (attempt - 1))
