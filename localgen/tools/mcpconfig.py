"""What an `--mcp` value names: one MCP server (a command line, or an http(s) URL), or a JSON file of servers in
the shape Claude Desktop, Cursor, VS Code and llama-server's --mcp-servers-config write (`{"mcpServers": {NAME:
{"command", "args", "env", "cwd"} or {"url", "headers"}}}`; VS Code's `"servers"` key too). A server from a file
is labelled by its name there and gets the environment the file gives it (on top of the SDK's safe subset),
and an HTTP server the headers."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen.errors import UsageError
from localgen.regular import Unreadable, not_a_file, read_regular
from localgen.text import config_text

MAX_CONFIG_BYTES = 1 << 20  # an MCP config file: a few KB in practice
EXAMPLE_URL = "http://127.0.0.1:8000/mcp"


@dataclass(frozen=True)
class McpTarget:
    """One MCP server to start or reach: `argv` over stdio, or `url` over streamable HTTP."""

    label: str
    argv: tuple[str, ...] = ()
    url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    named: bool = False  # from a config file, labelled by its name there


def targets(values: list[str]) -> list[McpTarget]:
    """The servers that --mcp's values name, in order (a UsageError for a value or a file that is wrong)."""
    out: list[McpTarget] = []
    for value in values:
        if value.lower().endswith(".json") and not value.startswith(("http://", "https://")) and (
                " " not in value.strip() or Path(value).expanduser().is_file()):  # Application Support/...
            out += from_file(Path(value).expanduser())
        else:
            out.append(one(value))
    return out


def one(value: str) -> McpTarget:
    """A server given on the command line: a URL, or a command line (labelled by itself, cut to 60 characters; a
    URL's password and query left out)."""
    if value.startswith(("http://", "https://")):
        from localgen.hostnames import checked_url
        from localgen.redact import url_shown

        checked_url(value, "--mcp", EXAMPLE_URL)
        return McpTarget(_label(url_shown(value)), url=value)
    try:
        argv = tuple(windows_split(value) if sys.platform == "win32" else shlex.split(value))
    except ValueError as e:  # a quote left open: the command line itself is wrong
        raise UsageError(f"--mcp {value!r} is not a command line: {e}") from None
    if not argv:
        raise UsageError("--mcp needs a command line, a URL, or a JSON file of servers")
    return McpTarget(_label(value), argv=argv)


def _label(text: str) -> str:
    """A command line or URL as a server's label: cut to 60 characters."""
    return text if len(text) <= 60 else text[:57] + "..."


def windows_split(line: str) -> list[str]:
    """`line` cut into words as a Windows program's C runtime cuts its command line (the rules of the runtime since
    Visual C++ 2008 and the UCRT, which Python and most programs use): a backslash is itself (C:\\tools\\srv.exe),
    except in a run before a double quote, where each two are one and an odd one makes the quote a character;
    double quotes group words, and "" inside them is one quote with the group still open (CommandLineToArgvW
    and the older runtimes close the group there instead). ValueError for a quote left open, as shlex gives."""
    words: list[str] = []
    word: list[str] = []
    quoted = started = False
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            j = i
            while j < len(line) and line[j] == "\\":
                j += 1
            n, i = j - i, j
            quote_follows = line[i:i + 1] == '"'
            word.append("\\" * (n // 2 if quote_follows else n))
            if quote_follows and n % 2:
                word.append('"')
                i += 1
            started = True
            continue
        if c == '"':
            if quoted and line[i + 1:i + 2] == '"':
                word.append('"')
                i += 1
            else:
                quoted = not quoted
            started = True
        elif c in " \t" and not quoted:
            if started:
                words.append("".join(word))
                word, started = [], False
        else:
            word.append(c)
            started = True
        i += 1
    if quoted:
        raise ValueError("No closing quotation")
    if started:
        words.append("".join(word))
    return words


def from_file(path: Path) -> list[McpTarget]:
    """The servers of a JSON config file, those marked `"disabled": true` left out."""
    where = f"--mcp {path}"
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise UsageError(f"{where}: {size:,} bytes is too big for a file of MCP servers")
        raw = read_regular(path, MAX_CONFIG_BYTES, whole=True, what="a file of MCP servers")
        doc = json.loads(config_text(raw, where, "JSON"))  # UTF-16: Utf16File, naming `where`
    except Unreadable as e:  # a FIFO (whose read would wait for a writer), a folder, a device: never opened
        kind = not_a_file(path)
        raise UsageError(f"{where}: it {kind}, not a file of MCP servers" if kind and not kind.startswith("is not")
                         else f"{where}: {e}") from None
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file") from None
    except OSError as e:
        raise UsageError(f"{where}: cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{where}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    servers = doc.get("mcpServers", doc.get("servers")) if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        raise UsageError(f'{where}: expected {{"mcpServers": {{NAME: {{"command": ..., "args": [...]}} or '
                         '{"url": ...}}}, as Claude Desktop and Cursor write it')
    out = []
    for name, entry in servers.items():
        if not isinstance(entry, dict):
            raise UsageError(f"{where}: the server {name!r} must be an object")
        if not isinstance(entry.get("disabled", False), bool):  # "yes" started the server, as if enabled
            raise UsageError(f"{where}: the server {name!r}: its disabled must be true or false")
        if entry.get("disabled") is True:
            continue
        out.append(_entry(where, str(name), entry))
    if not out:
        raise UsageError(f"{where}: names no server (or only disabled ones)")
    return out


def _entry(where: str, name: str, entry: dict[str, Any]) -> McpTarget:
    url, command = entry.get("url", entry.get("serverUrl")), entry.get("command")
    kind = entry.get("type", entry.get("transport"))
    if kind in ("sse",):
        raise UsageError(f"{where}: the server {name!r} speaks the old SSE transport; localgen speaks stdio and "
                         "streamable HTTP")
    if url is not None and command is not None:
        raise UsageError(f'{where}: the server {name!r} has both "command" and "url": give one')
    if url is None and command is None:
        raise UsageError(f'{where}: the server {name!r} needs either "command" (with "args") or "url"')
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise UsageError(f"{where}: the server {name!r} has a url that is not http(s)")
        from localgen.hostnames import checked_url

        checked_url(url, f"{where}: the server {name!r}", EXAMPLE_URL)
        return McpTarget(name, url=url, headers=_strings(where, name, entry, "headers"), named=True)
    args = entry.get("args", [])
    if not isinstance(command, str):
        raise UsageError(f"{where}: the server {name!r}: its command must be a string")
    if not command.strip():
        raise UsageError(f"{where}: the server {name!r} has an empty command")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):  # [1]: not started with "1"
        raise UsageError(f"{where}: the server {name!r}: its args must be a list of strings")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise UsageError(f"{where}: the server {name!r}: its cwd must be a string")
    return McpTarget(name, argv=(command, *(str(a) for a in args)), env=_strings(where, name, entry, "env"),
                     cwd=cwd, named=True)


def _strings(where: str, name: str, entry: dict[str, Any], key: str) -> dict[str, str]:
    value = entry.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise UsageError(f"{where}: the server {name!r}: its {key} must map names to strings")
    return dict(value)
