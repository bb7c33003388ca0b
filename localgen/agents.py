"""The coding agents `localgen launch` starts, and what each one reads to talk to a localgen server: its
environment variables and its command-line flags (docs/agents.md)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

# The name of the provider Codex and OpenCode are given (Codex reserves openai, ollama and lmstudio).
PROVIDER = "localgen"
# The variable Codex reads the key from: not LOCALGEN_API_KEY, which `eval "$(localgen launch codex --print-env)"`
# would leave set for every later `localgen serve` in that shell (turning its auth on)
AGENT_KEY = "LOCALGEN_AGENT_KEY"


@dataclass(frozen=True)
class Endpoint:
    """A localgen server as an agent reaches it: its root URL (no /v1), its key, and the model to ask for."""

    url: str
    key: str
    model: str


@dataclass(frozen=True)
class Setup:
    """What an agent is started with: variables set, variables removed, and flags before the user's own."""

    env: dict[str, str]
    unset: tuple[str, ...]
    argv: list[str]


@dataclass(frozen=True)
class Agent:
    """A coding agent: its program, how to install it, and how to point it at a localgen server."""

    name: str
    title: str
    program: str
    install: str
    route: str  # the route it asks the server at: only chat completions reach a serve --endpoint model
    setup: Callable[[Endpoint], Setup]

    def path(self) -> str | None:
        """Where the program is on PATH, or None."""
        return shutil.which(self.program)


def _claude(e: Endpoint) -> Setup:
    # Bearer auth (ANTHROPIC_AUTH_TOKEN); a real ANTHROPIC_API_KEY left set would be sent as x-api-key too, and
    # Claude Code asks before it uses one. Every model it asks for (main, opus/sonnet/haiku, subagents): ours.
    models = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
              "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
    # a cloud turned on (Bedrock, Vertex, Foundry, ...) would send the code there rather than to ANTHROPIC_BASE_URL,
    # and a cloud's URL, resource or key is meant for it alone; the user's own Anthropic credentials are not sent to
    # the local server; the small fast model would be a cloud model's name, custom headers are meant for another
    # server
    env = {"ANTHROPIC_BASE_URL": e.url, **dict.fromkeys(models, e.model)}
    # Claude Code's settings files may set variables too (a settings.json's "env" with another
    # ANTHROPIC_BASE_URL, which would get the conversation and the key), and they override the process's:
    # --settings overrides them in turn. Each removed variable is emptied there (Claude Code reads "" as unset),
    # the token among them, and the key comes from apiKeyHelper, read from AGENT_KEY: no command line shows it
    settings = {"env": {**env, **dict.fromkeys((*CLAUDE_UNSET, "ANTHROPIC_AUTH_TOKEN"), "")},
                "apiKeyHelper": f"printenv {AGENT_KEY}"}
    return Setup(env={**env, "ANTHROPIC_AUTH_TOKEN": e.key, AGENT_KEY: e.key}, unset=CLAUDE_UNSET,
                 argv=["--settings", json.dumps(settings)])


# Claude Code's variables that launch removes (docs/agents.md lists them; Claude Code's own list:
# code.claude.com/docs/en/env-vars)
CLAUDE_UNSET = (
    "ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_MANTLE", "CLAUDE_CODE_USE_ANTHROPIC_AWS", "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY", "CLAUDE_CODE_PROVIDER_MANAGED_BY_HOST",
    "ANTHROPIC_BEDROCK_BASE_URL", "ANTHROPIC_BEDROCK_MANTLE_BASE_URL", "AWS_BEARER_TOKEN_BEDROCK",
    "ANTHROPIC_AWS_BASE_URL", "ANTHROPIC_AWS_API_KEY", "ANTHROPIC_AWS_WORKSPACE_ID",
    "ANTHROPIC_VERTEX_BASE_URL", "ANTHROPIC_VERTEX_PROJECT_ID",
    "ANTHROPIC_FOUNDRY_BASE_URL", "ANTHROPIC_FOUNDRY_RESOURCE", "ANTHROPIC_FOUNDRY_API_KEY",
    "ANTHROPIC_FOUNDRY_AUTH_TOKEN",
    "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_CUSTOM_HEADERS",
)


def _codex(e: Endpoint) -> Setup:
    # `-c key=value` overrides ~/.codex/config.toml, the value read as TOML (a JSON string or boolean is TOML's);
    # the key is read from the variable env_key names, so no command line shows it
    p = f"model_providers.{PROVIDER}"
    pairs = [("model_provider", PROVIDER), (f"{p}.name", PROVIDER), (f"{p}.base_url", f"{e.url}/v1"),
             (f"{p}.env_key", AGENT_KEY), (f"{p}.wire_api", "responses"), ("model", e.model),
             # no hosted web search (the server has none to run) and no sub-agents (their tools come as a
             # namespace, which the server leaves out): the model is offered only the tools it can call
             ("web_search", "disabled"), ("features.multi_agent", False)]
    argv = [w for k, v in pairs for w in ("-c", f"{k}={json.dumps(v)}")]
    return Setup(env={AGENT_KEY: e.key}, unset=(), argv=argv)


# What a key that the shell puts into OpenCode's JSON as it is (--print-env) must not have.
OPENCODE_KEY_CHARS = '"\\'


def _opencode(e: Endpoint) -> Setup:
    # OPENCODE_CONFIG_CONTENT is merged over every config file OpenCode reads; its OpenAI-compatible provider
    # speaks chat completions under baseURL. The small model (titles, summaries) is ours too, and no other provider
    # is enabled: a config file's small_model or an agent's model would otherwise send the code to a cloud
    config = {"provider": {PROVIDER: {"npm": "@ai-sdk/openai-compatible", "name": PROVIDER,
                                      "options": {"baseURL": f"{e.url}/v1", "apiKey": e.key},
                                      "models": {e.model: {"name": e.model}}}},
              "model": f"{PROVIDER}/{e.model}", "small_model": f"{PROVIDER}/{e.model}",
              "enabled_providers": [PROVIDER]}
    return Setup(env={"OPENCODE_CONFIG_CONTENT": json.dumps(config)}, unset=(), argv=[])


AGENTS: dict[str, Agent] = {a.name: a for a in (
    Agent("claude", "Claude Code, on Anthropic's Messages API", "claude",
          "npm install -g @anthropic-ai/claude-code", "/v1/messages", _claude),
    Agent("codex", "Codex, on OpenAI's Responses API", "codex", "npm install -g @openai/codex", "/v1/responses",
          _codex),
    Agent("opencode", "OpenCode, on OpenAI's chat completions", "opencode", "npm install -g opencode-ai",
          "/v1/chat/completions", _opencode),
)}


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def set_up(agent: Agent, endpoint: Endpoint, environ: Mapping[str, str]) -> Setup:
    """The agent's setup for this environment: where a proxy variable is set and the server is on this machine
    (proxies.py: no proxy reaches it), its host is added to NO_PROXY and no_proxy, each holding the names of both
    (a client reads one or the other), so that the agent's requests reach the server direct, as launch's own do."""
    from localgen.proxies import this_machine

    setup = agent.setup(endpoint)
    if not any(environ.get(name) for name in PROXY_VARIABLES) or not this_machine(endpoint.url):
        return setup
    host = urlsplit(endpoint.url).hostname or ""
    listed = [h.strip() for name in ("NO_PROXY", "no_proxy") for h in environ.get(name, "").split(",") if h.strip()]
    names = list(dict.fromkeys([*listed, host]))
    return Setup(env={**setup.env, **dict.fromkeys(("NO_PROXY", "no_proxy"), ",".join(names))}, unset=setup.unset,
                 argv=setup.argv)


def shell_lines(agent: Agent, endpoint: Endpoint, key_expr: str, extra: list[str] | None = None,
                environ: Mapping[str, str] | None = None) -> list[str]:
    """The POSIX shell lines that set the agent up (for `environ`, set_up) and start it by hand, with `extra` (the
    user's arguments) after its flags: `key_expr` (a shell expression such as "$(cat key.txt)") stands wherever
    the key goes, so the lines never show the key itself."""
    import shlex

    marker = "__LOCALGEN_KEY__"  # text JSON keeps as it is (a NUL would become \u0000)
    setup = set_up(agent, Endpoint(endpoint.url, marker, endpoint.model), environ or {})
    lines = [f"unset {' '.join(setup.unset)}"] if setup.unset else []
    for name, value in setup.env.items():
        quoted = '"' + "".join("\\" + c if c in '"\\$`' else c for c in value) + '"'
        lines.append(f"export {name}={quoted.replace(marker, key_expr)}")
    lines.append(shlex.join([agent.program, *setup.argv, *(extra or [])]))
    return lines
