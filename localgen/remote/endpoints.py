"""Where remote work goes: `--endpoint URL` (env LOCALGEN_ENDPOINT, repeatable for fan-out) with
`--api-key-env NAME`, or a named endpoint from the user's endpoints.toml (`-m NAME/MODEL`).

A key is read only from the variable the user named (never OPENAI_API_KEY by default) and is sent only to
the URL it belongs to: the HTTP client follows no redirects."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from localgen.errors import UsageError


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server: base URL (ending where /chat/completions is appended), its key."""

    url: str
    key: str | None = None
    name: str | None = None  # from endpoints.toml
    models: tuple[str, ...] = ()

    @property
    def host(self) -> str:
        """host:port, for messages."""
        return urlsplit(self.url).netloc

    @property
    def label(self) -> str:
        """The name, else host:port."""
        return self.name or self.host


def endpoints_file() -> Path:
    """The user's named endpoints."""
    from localgen import paths

    return paths.endpoints_file()


def base_url(url: str) -> str:
    """A user's URL as the API base: `http://host:8080` and `http://host:8080/` mean `.../v1`; a URL with
    a path (`https://api.example.com/openai/v1`) is taken as it is."""
    text = url.strip()
    parts = urlsplit(text)
    shown = redacted(text)
    if "@" in parts.netloc:  # it would end up in errors, --json and the bench history
        raise UsageError(f"--endpoint URLs may not carry credentials ({shown})",
                         hint="put the key in an environment variable and name it with --api-key-env NAME")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--endpoint needs an http:// or https:// URL, not {shown!r}")
    if parts.query or parts.fragment:
        raise UsageError(f"--endpoint takes a base URL without ?query or #fragment: {shown!r}")
    path = parts.path.rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{path or '/v1'}"


def redacted(url: str) -> str:
    """The URL with any user:password@ replaced by ***@, for messages."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()


def read_key(env_name: str | None) -> str | None:
    """The key from the variable the user named; a named variable that is unset or empty is an error."""
    if not env_name:
        return None
    value = os.environ.get(env_name, "").strip()
    if not value:
        raise UsageError(f"--api-key-env {env_name}: the variable {env_name} is not set")
    return value


def named() -> dict[str, Endpoint]:
    """endpoints.toml: a table per endpoint, e.g.

        [gpu-box]
        url = "http://10.0.0.5:8000/v1"
        api_key_env = "GPU_BOX_KEY"   # optional
        models = ["qwen2.5:32b"]      # optional: the ids -m may name (the first is the default)
    """
    path = endpoints_file()
    if not path.is_file():
        return {}
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"{path}: {e}") from None
    out = {}
    for name, table in doc.items():
        if not isinstance(table, dict) or not isinstance(table.get("url"), str):
            raise UsageError(f"{path}: [{name}] needs url = \"http://...\"")
        models = table.get("models", [])
        key_env = table.get("api_key_env")
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise UsageError(f"{path}: [{name}] models must be a list of strings")
        if key_env is not None and not isinstance(key_env, str):
            raise UsageError(f"{path}: [{name}] api_key_env must be a variable name")
        try:
            url = base_url(table["url"])
        except UsageError as e:
            raise UsageError(f"{path}: [{name}] {e.message}", hint=e.hint) from None
        out[name] = Endpoint(url, read_key(key_env), name, tuple(models))
    return out


def choose(urls: list[str] | None, key_env: str | None, model: str | None) -> tuple[list[Endpoint], str | None]:
    """The endpoints and the model id for this command, or ([], model) to run in-process.

    `--endpoint URL` (one or more) wins; otherwise `-m NAME/MODEL` (or `-m NAME`) where NAME is in
    endpoints.toml."""
    if urls:
        key = read_key(key_env)
        return [Endpoint(base_url(u), key) for u in dict.fromkeys(urls)], model
    if key_env:
        raise UsageError("--api-key-env goes with --endpoint (named endpoints set api_key_env in endpoints.toml)")
    if not model or model.endswith(".gguf"):
        return [], model
    head, _, rest = model.partition("/")
    table = named() if head else {}
    if head not in table:
        return [], model
    ep = table[head]
    chosen = rest or (ep.models[0] if ep.models else "")
    if not chosen:
        raise UsageError(f"name the model: -m {head}/MODEL (or list models = [...] in {endpoints_file()})")
    if ep.models and chosen not in ep.models:
        raise UsageError(f"{head} serves {', '.join(ep.models)}, not {chosen!r}")
    return [ep], chosen
