"""`localgen ps`: the models a running `localgen serve` has loaded, asked over its Ollama route /api/ps; and how
a client command (ps, stop) finds that server and asks it: its address, its key, and the one-line errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from localgen import proxies
from localgen.cli.inputfile import input_path
from localgen.cli.output import aligned
from localgen.errors import LocalgenError, UsageError

# the options by which ps and stop find a server, as serve's: its address, and its key
HostOption = Annotated[str, typer.Option("--host", envvar="LOCALGEN_HOST", help="The server's address.")]
PortOption = Annotated[
    int, typer.Option("--port", envvar="LOCALGEN_PORT", min=1, max=65535, help="The server's port.")]
ApiKeyOption = Annotated[
    str | None, typer.Option("--api-key", envvar="LOCALGEN_API_KEY", show_default=False,
                             help="The server's API key, if it has one (as serve's --api-key).")]
ApiKeyFileOption = Annotated[
    Path | None, typer.Option("--api-key-file", path_type=str, callback=input_path, show_default=False,
                              help="Read the server's API key from a file (as serve's --api-key-file).")]


class NoAnswer(LocalgenError):
    """A server that gave no whole answer in time."""


@dataclass(frozen=True)
class Server:
    """A running `localgen serve` as a client command asks it: its URL, the key it is sent (if any) and where
    the host and the key came from, for the errors that name them."""

    url: str
    host: str
    host_from: str  # --host, or LOCALGEN_HOST where it was not typed
    key: str | None
    key_from: str  # the option the key came from, as a refusal names it

    def ask(self, path: str, body: dict[str, Any] | None = None, timeout: float = 10) -> Any:
        """The server's answer to GET `path` (POST `body` as JSON, where given), whole within `timeout` seconds
        (proxies.request: a server that trickled bytes held a POST for ever); no server there, none answering in
        time (NoAnswer), and a refused or missing key are each one LocalgenError."""
        import httpx

        # the key's UTF-8 bytes, as serve compares them (httpx would encode a str header as ASCII only)
        auth = {b"Authorization": f"Bearer {self.key}".encode()} if self.key else {}
        try:
            r = proxies.request("GET" if body is None else "POST", f"{self.url}{path}", headers=auth,
                                timeout=timeout, **({} if body is None else {"json": body}))
        except httpx.InvalidURL as e:
            raise UsageError(f"{self.host_from} {self.host[:100]!r} is not a host name or address: "
                             f"{str(e)[:100]}") from None
        except httpx.ReadTimeout:  # something listens there, and gives no whole answer in time
            raise NoAnswer(f"the server at {self.url} did not answer {path} within {timeout:g} s",
                                hint="is it localgen serve? give the --host and --port of one") from None
        except httpx.HTTPError:
            raise LocalgenError(f"no localgen serve is running at {self.url}", hint="start one with localgen serve, "
                                "or give --host and --port") from None
        if r.status_code == 401:
            raise LocalgenError(f"the server at {self.url} needs an API key: give --api-key KEY or set "
                                "LOCALGEN_API_KEY, or give --api-key-file FILE" if not self.key else
                                f"the server at {self.url} refused the API key given ({self.key_from})")
        return r


def server_of(ctx: typer.Context, host: str, port: int, api_key: str | None, api_key_file: Path | None) -> Server:
    """The server that --host, --port, --api-key and --api-key-file (or LOCALGEN_HOST, LOCALGEN_PORT and
    LOCALGEN_API_KEY) name; a usage error for an address or a key no request can carry."""
    from localgen.childserver import url_of
    from localgen.cli.options.knobs import typed_by_user
    from localgen.cli.serve.options import check_host, check_host_name, host_and_port, key_fault, key_file

    host, port = host_and_port(host, port, typed_by_user(ctx, "port"),
                            typed_by_user(ctx, "host"))
    source = "--host" if typed_by_user(ctx, "host") else "LOCALGEN_HOST"
    check_host(host, source, client=True)
    check_host_name(host, source)
    if api_key_file is not None:
        api_key = key_file(api_key_file, api_key if typed_by_user(ctx, "api_key") else None)
    fault = key_fault(api_key) if api_key else None
    if fault:
        raise UsageError(f"{'the API key file' if api_key_file else '--api-key (or LOCALGEN_API_KEY)'} {fault}: "
                         "no HTTP header carries it as given")
    return Server(url_of(host, port), host, source, api_key or None,
                  "--api-key-file" if api_key_file else "--api-key or LOCALGEN_API_KEY")


def ps(
    ctx: typer.Context,
    host: HostOption = "127.0.0.1",
    port: PortOption = 11435,
    api_key: ApiKeyOption = None,
    api_key_file: ApiKeyFileOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="The server's answer as JSON.")] = False,
) -> None:
    """The models a running server has loaded: size, where (CPU or GPU), context, and when each unloads."""
    import datetime

    from localgen.units import format_bytes

    server = server_of(ctx, host, port, api_key, api_key_file)
    url = server.url
    models = loaded(server)
    if json_out:
        print(json.dumps(models))
        return
    if not models:
        print(f"no model is loaded at {url}")
        return
    now = datetime.datetime.now(datetime.UTC)
    rows = [["NAME", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]]
    for m in models:
        vram, size = m.get("size_vram", 0), m.get("size", 0)
        where = "-" if m.get("loading") else "100% CPU" if not vram else \
            f"{min(100, round(100 * vram / max(size, 1)))}% GPU"
        until = datetime.datetime.fromisoformat(m["expires_at"].replace("Z", "+00:00"))
        left = (until - now).total_seconds()
        swap = m.get("yielding_to") or []  # a swap: it unloads once its running requests end
        rows.append([m["name"], format_bytes(size), where, f"{m.get('context_length', 0):,}",
                     "loading" if m.get("loading") else "unloading" if m.get("unloading") else
                     f"unloading for {', '.join(swap)}" if swap else until_text(left)])
    print("\n".join(aligned(rows)))


def until_text(left: float) -> str:
    """When a model unloads, `left` seconds from now, as Ollama's ps says it: "forever" past a year, else in
    seconds under a minute and a half (a model 20 s from unloading read "0 minutes from now"), minutes under
    two hours, then hours."""
    if left > 365 * 86400:
        return "forever"
    n, unit = ((round(left), "second") if left < 90 else (round(left / 60), "minute") if left < 7200
               else (round(left / 3600), "hour"))
    n = max(0, n)
    return f"{n} {unit}{'' if n == 1 else 's'} from now"


def loaded(server: Any) -> list[Any]:
    """The server's /api/ps models; a LocalgenError in one line where it answers anything else (an error, or
    another kind of server's web page: its JSON read was a traceback)."""
    r = server.ask("/api/ps")
    try:
        body = r.json()
    except ValueError:
        body = None
    models = body.get("models", []) if isinstance(body, dict) else None
    if r.status_code != 200 or not isinstance(models, list):
        raise LocalgenError(f"{server.url}/api/ps answered {r.status_code}: {said(r)}")
    return models


def said(r: Any) -> str:
    """What an error answer says, in one line: its `error` (Ollama's shape, or OpenAI's error.message), else its
    text's first line, short; a web page (another kind of server's) is said to be one, its HTML not quoted."""
    from localgen.remote.errortext import error_text

    if r.text.lstrip()[:20].lower().startswith(("<!doctype html", "<html")):
        return "a web page, not localgen serve's answer"
    return error_text(r.text)[:200]
