"""The Responses API's `mcp` tools as a request gives them (serve/responsemcp.py answers it): each tool's fields
checked (a 400 naming what is wrong, before any server is connected to), the mcp_approval_response items matched
to the calls that wait for them, and the servers a conversation has had listed already."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from localgen.serve.apierror import HTTPError
from localgen.serve.responseitems import replayed_answers
from localgen.serve.state import ServeState

MAX_SERVERS = 8  # mcp tools in one request (each a connection and a thread while the response lasts)
MAX_HEADERS, MAX_HEADER_CHARS = 32, 8192
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110's token
HEADER_VALUE = re.compile(r"[\x20-\x7e\t]*")  # no CR, LF, NUL or other controls; ASCII (httpx sends no other)
MAX_CHAIN = 100  # previous responses looked through for a server's mcp_list_tools already given
LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class McpTool:
    """A request's mcp tool, checked."""

    label: str
    url: str
    headers: dict[str, str]
    allowed: frozenset[str] | None  # None: all the server lists
    always: frozenset[str]  # require_approval's always.tool_names
    never: frozenset[str] | None  # its never.tool_names (None: "never", for every tool)

    def needs_approval(self, name: str) -> bool:
        """OpenAI's rule: a tool named under `always` needs approval, one under `never` (or every tool, with
        "never") runs at once, and any other needs approval (the default is "always")."""
        if name in self.always:
            return True
        return self.never is not None and name not in self.never

    @property
    def secrets(self) -> dict[str, str]:
        """What never leaves the request, each value by the name its redaction shows ("[NAME redacted]"): every
        header value, a "Bearer TOKEN"'s token, and the URL's `user:password@` (whole, its password, each decoded
        from %-escapes, and as the Basic credentials the HTTP client sends for it), whatever their length (the
        user's name alone is no secret: a short one would be taken out of every word that holds it)."""
        import base64
        from urllib.parse import unquote

        out = {f"{k} token": v for k, v in self.headers.items()}
        for k, v in self.headers.items():  # "Bearer TOKEN": the token alone too
            scheme, _, token = v.partition(" ")
            if token and scheme.isalpha():
                out[f"{k} bearer token"] = token
        userinfo = self.url.partition("://")[2].partition("/")[0].rpartition("@")[0]
        if userinfo:  # the URL's user:password, and the password alone
            user, _, password = userinfo.partition(":")
            basic = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
            out |= {"server_url password": userinfo, "server_url password part": password,
                    "server_url decoded password": unquote(userinfo),
                    "server_url decoded password part": unquote(password), "server_url credentials": basic}
        return {k: v for k, v in out.items() if v}

    def redact(self, text: str) -> str:
        """`text` with each of the secrets replaced by `[NAME redacted]`, in one pass (the longest first where one
        holds another, and a replacement's own letters never replaced)."""
        secrets = self.secrets
        if not secrets or not text:
            return text
        names: dict[str, str] = {}
        for name, value in sorted(secrets.items(), key=lambda kv: -len(kv[1])):
            names.setdefault(value, name)
        pattern = re.compile("|".join(re.escape(v) for v in names))
        return pattern.sub(lambda m: f"[{names[m.group()]} redacted]", text)

    def redacted(self, value: Any) -> Any:
        """A listed tool's fields (strings, lists and objects of them, keys too) with the secrets redacted."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self.redacted(v) for v in value]
        if isinstance(value, dict):
            return {self.redact(k) if isinstance(k, str) else k: self.redacted(v) for k, v in value.items()}
        return value


@dataclass(frozen=True)
class Approval:
    """An mcp_approval_response, matched to the request it answers."""

    ident: str
    label: str
    name: str
    arguments: str
    approve: bool


def checked(state: ServeState, body: dict[str, Any]) -> list[McpTool]:
    """The request's mcp tools, or a 400 naming what is wrong (first: the flag that allows them)."""
    raw = [t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "mcp"]
    if not state.allow_mcp_urls:
        raise HTTPError(400, "mcp tools connect this server to the MCP server a request names: start serve with "
                             "--allow-mcp-urls to allow them", param="tools")
    if len(raw) > MAX_SERVERS:
        raise HTTPError(400, f"{len(raw)} mcp tools; at most {MAX_SERVERS} in one request", param="tools")
    if any(isinstance(t, dict) and t.get("type") == "file_search" for t in body.get("tools") or []):
        raise HTTPError(400, "file_search and mcp tools are not served together here", param="tools")
    if body.get("truncation") == "auto":
        raise HTTPError(400, "truncation \"auto\" is not served with mcp tools", param="truncation")
    out: list[McpTool] = []
    for t in raw:
        tool = _tool(t)
        if any(o.label == tool.label for o in out):
            raise HTTPError(400, f"two mcp tools have the server_label {tool.label!r}", param="tools")
        out.append(tool)
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "mcp" and not any(
            t.label == choice.get("server_label") for t in out):  # before any server is connected to
        raise HTTPError(400, f"tool_choice names the mcp server {str(choice.get('server_label'))[:64]!r}, which no "
                             "mcp tool has", param="tool_choice")
    return out


def _tool(t: dict[str, Any]) -> McpTool:
    from urllib.parse import urlsplit

    label = t.get("server_label")
    if not isinstance(label, str) or not LABEL.fullmatch(label):
        raise HTTPError(400, "an mcp tool's server_label must be 1 to 64 ASCII letters, digits, '_' or '-'",
                        param="tools")
    if t.get("connector_id") is not None:
        raise HTTPError(400, f"mcp tool {label}: connectors are not served here; give its server_url", param="tools")
    url = t.get("server_url")
    parsed = urlsplit(url) if isinstance(url, str) else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise HTTPError(400, f"mcp tool {label}: server_url must be an http(s) URL", param="tools")
    try:
        port = parsed.port  # (a port past 65535, or not a number, raises)
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise HTTPError(400, f"mcp tool {label}: server_url's port must be a number from 1 to 65535", param="tools")
    headers = t.get("headers") or {}
    if not isinstance(headers, dict) or len(headers) > MAX_HEADERS or any(
            not isinstance(k, str) or not isinstance(v, str) or len(k) + len(v) > MAX_HEADER_CHARS
            for k, v in headers.items()):
        raise HTTPError(400, f"mcp tool {label}: headers must be an object of at most {MAX_HEADERS} strings, each "
                             f"at most {MAX_HEADER_CHARS:,} characters", param="tools")
    headers = dict(headers)
    for k, v in headers.items():  # what HTTP can carry: a token for a name, visible ASCII and blanks for a value
        if not HEADER_NAME.fullmatch(k) or not HEADER_VALUE.fullmatch(v):
            raise HTTPError(400, f"mcp tool {label}: headers: {k[:40]!r} is not a header HTTP can send (a name of "
                                 "letters, digits and !#$%&'*+-.^_`|~; a value of printable ASCII, no line breaks)",
                            param="tools")
    authorization = t.get("authorization")
    if authorization is not None:
        if not isinstance(authorization, str) or len(authorization) > MAX_HEADER_CHARS or not HEADER_VALUE.fullmatch(
                authorization):
            raise HTTPError(400, f"mcp tool {label}: authorization must be a string of printable ASCII",
                            param="tools")
        headers["Authorization"] = f"Bearer {authorization}"
    description = t.get("server_description")
    if description is not None and not (isinstance(description, str) and len(description) <= MAX_HEADER_CHARS):
        raise HTTPError(400, f"mcp tool {label}: server_description must be a string of at most "
                             f"{MAX_HEADER_CHARS:,} characters", param="tools")
    allowed = _names(t.get("allowed_tools"), label, "allowed_tools")
    approval = t.get("require_approval")
    always: frozenset[str] = frozenset()
    never: frozenset[str] | None = frozenset()
    if approval == "never":
        never = None
    elif isinstance(approval, dict) and set(approval) <= {"always", "never"}:
        always = _names(approval.get("always"), label, "require_approval.always") or frozenset()
        never = _names(approval.get("never"), label, "require_approval.never") or frozenset()
    elif approval not in (None, "always"):
        raise HTTPError(400, f"mcp tool {label}: require_approval must be \"always\", \"never\" or an object of "
                             "always and never, each with tool_names", param="tools")
    return McpTool(label, str(url), headers, allowed, always, never)


def _names(raw: Any, label: str, what: str) -> frozenset[str] | None:
    """allowed_tools or an approval filter: a list of names, or {"tool_names": [...]} (None: not given)."""
    if raw is None:
        return None
    if isinstance(raw, dict):
        if set(raw) - {"tool_names"}:
            raise HTTPError(400, f"mcp tool {label}: {what} filters only by tool_names here (read_only is not "
                                 "served)", param="tools")
        raw = raw.get("tool_names") or []
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw) or len(raw) > 256:
        raise HTTPError(400, f"mcp tool {label}: {what} must list tool names", param="tools")
    return frozenset(raw)


async def approvals(api: Any, body: dict[str, Any], tools: list[McpTool],
                     messages: list[dict[str, Any]]) -> list[Approval]:
    """The request's mcp_approval_response items, each matched to its mcp_approval_request (in the input, or
    in the previous response's output) and to a call still waiting in the conversation; else a 400."""
    raw = body.get("input")
    items = [i for i in raw if isinstance(i, dict)] if isinstance(raw, list) else []
    fresh = raw[replayed_answers(raw):] if isinstance(raw, list) else []  # earlier turns' answers: answered then
    answers = [i for i in fresh if isinstance(i, dict) and i.get("type") == "mcp_approval_response"]
    if not answers:
        return []
    asked = {i.get("id"): i for i in items if i.get("type") == "mcp_approval_request"}
    previous = body.get("previous_response_id")
    if isinstance(previous, str):
        found = await asyncio.to_thread(api.store.load, previous)
        for item in (found.response.get("output") or []) if found is not None else []:
            if item.get("type") == "mcp_approval_request":
                asked.setdefault(item.get("id"), item)
    waiting = {c["id"] for m in messages for c in m.get("tool_calls") or ()} - {
        m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    out: list[Approval] = []
    for answer in answers:
        ident = answer["approval_request_id"]
        request = asked.get(ident)
        if request is None or ident not in waiting:
            raise HTTPError(400, f"approval_request_id {ident[:100]!r} answers no mcp_approval_request that waits "
                                 "(in this input or the previous response)", param="input")
        if any(a.ident == ident for a in out):  # answered twice in one request: the call would run twice
            raise HTTPError(400, f"approval_request_id {ident[:100]!r} is answered twice in this input",
                            param="input")
        label = request.get("server_label")
        tool = next((t for t in tools if t.label == label), None)
        if tool is None:
            raise HTTPError(400, f"the approved call is to the mcp tool {str(label)[:64]!r}: give that tool again in "
                                 "this request's tools", param="tools")
        if tool.allowed is not None and request.get("name") not in tool.allowed:  # an approval request the
            # client wrote itself may name any tool: only those allowed_tools gives run
            raise HTTPError(400, f"the approved call is to {str(request.get('name'))[:64]!r}, which the mcp tool "
                                 f"{tool.label}'s allowed_tools does not list", param="input")
        out.append(Approval(ident, str(label), str(request.get("name")), str(request.get("arguments") or "{}"),
                            answer["approve"]))
    return out


async def listed(api: Any, body: dict[str, Any]) -> set[str]:
    """The servers whose mcp_list_tools the conversation already holds (in the input, or in a response it
    continues): not listed again, as OpenAI does not."""
    items: list[Any] = body["input"] if isinstance(body.get("input"), list) else []
    labels = {str(i.get("server_label")) for i in items
              if isinstance(i, dict) and i.get("type") == "mcp_list_tools" and not i.get("error")}
    previous = body.get("previous_response_id")
    for _ in range(MAX_CHAIN):
        if not isinstance(previous, str):
            break
        found = await asyncio.to_thread(api.store.load, previous)
        if found is None:
            break
        labels |= {str(i.get("server_label")) for i in found.response.get("output") or []
                   if i.get("type") == "mcp_list_tools" and not i.get("error")}
        previous = found.response.get("previous_response_id")
    return labels
