"""Where remote work goes: `--endpoint URL` (env LOCALGEN_ENDPOINT, repeatable for fan-out) with
`--api-key-env NAME`, or a named endpoint from the user's endpoints.toml (`-m NAME/MODEL`).

A key is read only from the variable the user named (never OPENAI_API_KEY by default) and is sent only to
the URL it belongs to: the HTTP client follows no redirects."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from localgen.errors import UsageError
from localgen.hostnames import checked_url
from localgen.text import Utf16File, config_text


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server: base URL (ending where /chat/completions is appended), its key."""

    url: str
    key: str | None = None
    name: str | None = None  # from endpoints.toml
    models: tuple[str, ...] = ()
    key_env: str | None = None  # the variable the key came from, for messages (never the key)

    @property
    def host(self) -> str:
        """host:port, for messages."""
        return urlsplit(self.url).netloc

    @property
    def label(self) -> str:
        """The name, else host:port."""
        return self.name or self.host


MAX_FILE = 2**20  # endpoints.toml past this is refused before it is parsed
KEYS = ("url", "api_key_env", "models")  # an entry's


def endpoints_file() -> Path:
    """The user's named endpoints."""
    from localgen import paths

    return paths.endpoints_file()


def base_url(url: str, flag: str = "--endpoint", key_by: str = "--api-key-env NAME") -> str:
    """A user's URL as the API base: `http://host:8080` and `http://host:8080/` mean `.../v1`; a URL with
    a path (`https://api.example.com/openai/v1`) is taken as it is. `flag` names where the URL came from, `key_by`
    where its key is named instead (endpoints.toml's entries: their `api_key_env`)."""
    from localgen.redact import url_shown

    text = url.strip()
    parts = checked_url(text, flag, "http://host:8000/v1")
    shown = url_shown(text)  # a password or a ?api_key= stays out of the message
    if "@" in parts.netloc:  # it would end up in errors, --json and the bench history
        urls = " URLs" if flag.startswith("-") or flag.isupper() else ""  # an entry's `url` is one
        raise UsageError(f"{flag}{urls} may not carry credentials ({shown})",
                         hint=f"put the key in an environment variable and name it with {key_by}")
    if parts.query or parts.fragment:
        raise UsageError(f"{flag} takes a base URL without ?query or #fragment: {shown!r}",
                         hint=f"a key goes in an environment variable named with {key_by}")
    path = parts.path.rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{path or '/v1'}"


def read_key(env_name: str | None) -> str | None:
    """The key from the variable named by --api-key-env; a named variable that is unset or empty is an error."""
    if not env_name:
        return None
    value = os.environ.get(env_name, "").strip()
    if not value:
        raise UsageError(f"--api-key-env {env_name}: the variable {env_name} is not set")
    return value


def declared(head: str, warn: Callable[[str], None]) -> dict[str, Any] | None:
    """The entry `head` of endpoints.toml as written (None where the file has no such entry), e.g.

        [gpu-box]
        url = "http://10.0.0.5:8000/v1"
        api_key_env = "GPU_BOX_KEY"   # optional
        models = ["qwen2.5:32b"]      # optional: the ids -m may name (the first is the default)

    Only that entry matters: another entry's mistakes, or its unset key, do not stop a run. A file that
    cannot be read is an error only where it appears to declare `head`; otherwise it is `warn`ed about and
    the name is taken as a model to load here."""
    path = endpoints_file()
    if not head or not path.is_file():
        return None
    try:
        if path.stat().st_size > MAX_FILE:  # checked before it is read: every run with -m NAME reads it
            raise UsageError(f"{path} is over {MAX_FILE // 2**20} MiB: endpoints.toml holds a few named endpoints",
                             hint="keep only the entries you use")
        data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")  # a byte order mark an editor wrote: not TOML's
    except OSError as e:
        warn(f"{path} cannot be read ({e}): its endpoints are not used")
        return None
    try:
        doc = tomllib.loads(config_text(data, path, "TOML"))
    except Utf16File as e:  # Notepad's "Unicode": TOML is UTF-8, and read as that the file names no entry
        if _declares(e.text, head):
            raise
        warn(f"{e.message} (save it as UTF-8): its endpoints are not used")
        return None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:  # TOML is UTF-8: other bytes are not valid TOML
        why = _where(e, data)
        if _declares(data.decode("utf-8", "replace"), head):
            raise UsageError(f"{path}: {why}") from None
        warn(f"{path} is not valid TOML ({why}): its endpoints are not used")
        return None
    if head not in doc:
        return None
    table = doc[head]
    if not isinstance(table, dict) or not isinstance(table.get("url"), str):
        raise UsageError(f"{path}: [{head}] needs url = \"http://...\"")
    for key in (str(k) for k in table if k not in KEYS):
        import difflib

        close = difflib.get_close_matches(key.lower(), KEYS, n=1, cutoff=0.6)
        guess = f"did you mean {close[0]}?" if close else f"an entry's keys are {', '.join(KEYS)}"
        warn(f"{path}: [{head}] has an unknown key {key[:40]!r}, which is ignored ({guess})")
    return table


def _where(e: ValueError, data: bytes) -> str:
    """What is wrong with the file and where (line and column), also where tomllib says only "at end of document"
    or the fault is a byte that is not UTF-8."""
    newline = b"\n"
    if isinstance(e, UnicodeDecodeError):
        before = data[:e.start]
        line, column = before.count(newline) + 1, e.start - before.rfind(newline)
        return f"not UTF-8 text: byte 0x{data[e.start]:02x} (at line {line}, column {column})"
    text, end = str(e), "(at end of document)"
    if text.endswith(end):
        line, column = data.count(newline) + 1, len(data.decode("utf-8")) - data.decode("utf-8").rfind("\n")
        text = f"{text[:-len(end)]}(at end of document, line {line}, column {column})"
    return text


def _declares(text: str, head: str) -> bool:
    """Whether unparsable TOML appears to declare the entry `head` ([head], [head.x] or head = {...})."""
    name = f"[\"']?{re.escape(head)}(?![\\w-])[\"']?"
    return re.search(rf"^\s*(\[\s*{name}|{name}\s*=)", text, re.MULTILINE) is not None


def entry(head: str, warn: Callable[[str], None]) -> Endpoint | None:
    """The endpoint endpoints.toml names `head`, checked and with its key read (only this entry's key)."""
    table = declared(head, warn)
    if table is None:
        return None
    path = endpoints_file()
    models = table.get("models", [])
    key_env = table.get("api_key_env")
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise UsageError(f"{path}: [{head}] models must be a list of strings")
    if key_env is not None and not isinstance(key_env, str):
        raise UsageError(f"{path}: [{head}] api_key_env must be a variable name")
    try:
        url = base_url(table["url"], "url", 'api_key_env = "NAME" in its entry')
    except UsageError as e:
        raise UsageError(f"{path}: [{head}] {e.message}", hint=e.hint) from None
    key = None
    if key_env:
        key = os.environ.get(key_env, "").strip() or None
        if key is None:
            raise UsageError(f"{path}: [{head}] api_key_env = \"{key_env}\", and the variable {key_env} is not set",
                             hint=f"export {key_env}=<the key> for -m {head}")
    return Endpoint(url, key, head, tuple(models), key_env if key else None)


def _source() -> str:
    """Where the URLs came from, for messages: --endpoint, or LOCALGEN_ENDPOINT when no --endpoint was typed."""
    import sys

    typed = any(a == "--endpoint" or a.startswith("--endpoint=") for a in sys.argv[1:])
    return "--endpoint" if typed or not os.environ.get("LOCALGEN_ENDPOINT", "").strip() else "LOCALGEN_ENDPOINT"


def url_list(given: list[str]) -> list[str]:
    """--endpoint's URLs: each flag (or LOCALGEN_ENDPOINT, split at blanks) may hold several, comma-separated, as
    --rpc's servers are (an empty item is none); none at all is a usage error."""
    urls = [u.strip() for item in given for u in item.split(",") if u.strip()]
    if not urls:
        raise UsageError(f"--endpoint needs an http:// or https:// URL, not {' '.join(given)!r}")
    return urls


def choose(urls: list[str] | None, key_env: str | None, model: str | None,
           warn: Callable[[str], None]) -> tuple[list[Endpoint], str | None]:
    """The endpoints and the model id for this command, or ([], model) to run in-process.

    `--endpoint URL` (one or more) wins; otherwise `-m NAME/MODEL` (or `-m NAME`) where NAME is an entry of
    endpoints.toml (the only entry read; `warn` hears of a file that cannot be)."""
    if urls:
        key = read_key(key_env)
        flag = _source()
        return [Endpoint(u, key, key_env=key_env if key else None)
                for u in dict.fromkeys(base_url(u, flag) for u in url_list(urls))], model
    if key_env:
        raise UsageError("--api-key-env goes with --endpoint (named endpoints set api_key_env in endpoints.toml)")
    if not model or model.endswith(".gguf"):
        return [], model
    head, _, rest = model.partition("/")
    ep = entry(head, warn)
    if ep is None:
        return [], model
    # None: the server's only or default model, as for --endpoint without -m
    chosen = rest or (ep.models[0] if ep.models else None)
    if ep.models and chosen not in ep.models:
        raise UsageError(f"{head} serves {', '.join(ep.models)}, not {chosen!r}")
    return [ep], chosen
