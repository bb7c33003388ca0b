"""Tools as OpenAI describes them ({"type": "function", "function": {name, description, parameters}}), the
calls a model makes to them, and the checks on both: a schema must be valid JSON Schema, a call must name a
tool and carry arguments its schema accepts."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from localgen.errors import ToolError

NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


@dataclass(frozen=True)
class ToolSpec:
    """One function a model may call: its name, what it does, and a JSON Schema for its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's tool object, as chat templates receive it in `tools`."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: an id for the result to point back to, a tool name, JSON arguments."""

    name: str
    arguments: str  # a JSON object, as OpenAI carries it
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    @property
    def args(self) -> dict[str, Any]:
        """The arguments decoded (an empty object when they are not a JSON object)."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's tool_calls entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def check_schema(schema: Any, where: str, field: str = "parameters") -> None:
    """A ToolError unless `schema` is a valid JSON Schema for an object of arguments (`field`: the API's name
    for it: OpenAI's parameters, Anthropic's input_schema)."""
    import jsonschema

    if not isinstance(schema, dict):
        raise ToolError(f"{where}: {field} must be a JSON Schema object")
    if schema.get("type", "object") != "object":
        raise ToolError(f"{where}: {field} must describe an object (type: object)")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as e:
        path = "/".join(str(p) for p in e.path)
        raise ToolError(f"{where}: not a valid JSON Schema{f' at {path}' if path else ''}: {e.message}") from None


def check_name(name: Any, field: str) -> str:
    """A tool's name, or a ToolError naming the request's `field` that holds it."""
    if not isinstance(name, str) or not name or len(name) > 64 or not set(name) <= NAME_CHARS:
        raise ToolError(f"{field} must be 1-64 ASCII letters, digits, _ . or -")
    return name


def parse_tools(raw: Any) -> tuple[ToolSpec, ...]:
    """OpenAI's `tools` list (function tools), checked; a ToolError names the first bad entry."""
    if not isinstance(raw, list):
        raise ToolError("`tools` must be a list of tool objects")
    out: list[ToolSpec] = []
    for i, item in enumerate(raw):
        fn = item.get("function") if isinstance(item, dict) else None
        if not isinstance(item, dict) or item.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ToolError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        name = check_name(fn.get("name"), f"tools[{i}].function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        check_schema(params, f"tools[{i}] ({name})")
        desc = fn.get("description", "")
        if not isinstance(desc, str):
            raise ToolError(f"tools[{i}].function.description must be a string")
        out.append(ToolSpec(name, desc, params))
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ToolError("two tools have the same name")
    return tuple(out)


def check_call(call: ToolCall, tools: tuple[ToolSpec, ...]) -> ToolSpec:
    """The tool a call names, once its arguments pass that tool's schema; else a ToolError."""
    import jsonschema

    tool = next((t for t in tools if t.name == call.name), None)
    if tool is None:
        raise ToolError(f"the model called {call.name!r}, which is not a tool here "
                        f"(tools: {', '.join(t.name for t in tools) or 'none'})")
    try:
        args = json.loads(call.arguments)
    except ValueError:
        raise ToolError(f"the model's arguments for {call.name} are not JSON: {call.arguments[:200]}") from None
    try:
        jsonschema.validate(args, tool.parameters)
    except jsonschema.ValidationError as e:
        raise ToolError(f"the model's arguments for {call.name} fail its schema: {e.message}") from None
    return tool
