"""A request's JSON schema (response_format, text.format, output_config.format, Ollama's format) or tools as a
grammar, built off the event loop and bounded by engine/grammar.py's bounds (run's -j and --grammar share them):
the converter expands repetition counts (minLength: 100000 gave 500 KB of grammar), and the worker parses the
grammar between decoding steps. Here they are checked first, to name the request's field in a 400."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from localgen.engine.grammar import MAX_GRAMMAR_CHARS, MAX_REPEAT, MAX_SCHEMA_CHARS, big_repeat
from localgen.errors import LocalgenError
from localgen.serve.apierror import HTTPError

__all__ = ["MAX_GRAMMAR_CHARS", "MAX_REPEAT", "MAX_SCHEMA_CHARS", "bounded_schema", "check_grammar_size",
           "schema_grammar"]


async def schema_grammar(schema: Any, param: str = "response_format") -> str:
    """A JSON schema (an object, or "json" for any JSON object) as a grammar; a 400 naming `param` for a schema
    that cannot be one."""
    from localgen.engine.grammar import grammar_from_json_schema

    if schema not in ("json", None, True) and not isinstance(schema, dict):
        raise HTTPError(400, "the schema must be a JSON object", param=param)
    text = bounded_schema({"type": "object"} if schema in ("json", None, True) else schema, param,
                          "the JSON schema")
    try:
        grammar = await asyncio.to_thread(grammar_from_json_schema, text)
    except RecursionError:
        raise HTTPError(400, "the JSON schema nests or refers to itself too deeply", param=param) from None
    except LocalgenError as e:
        raise HTTPError(400, e.message, param=param) from None
    check_grammar_size(grammar, param, "the JSON schema")
    return grammar


def bounded_schema(schema: Any, param: str, what: str, at: int | None = None) -> str:
    """A schema (or tools, or tool `at` of them) as JSON text, or a 400 when it is too long or repeats too much for
    a grammar: the tool named."""
    tools = isinstance(schema, list) or at is not None
    # tools: their schemas alone (their descriptions, Claude Code's 70,000 characters, make no grammar)
    text = json.dumps([_tool_schema(t) for t in (schema if isinstance(schema, list) else [schema])] if tools
                      else schema)
    if len(text) > MAX_SCHEMA_CHARS:
        raise HTTPError(400, f"{what} is {len(text):,} characters; at most {MAX_SCHEMA_CHARS:,}", param=param)
    for i, part in enumerate(schema if isinstance(schema, list) else [schema]):
        big = big_repeat(part)
        if big:
            name = _tool_name(part) if tools else None
            where = f"the JSON of tools[{i if at is None else at}] ({name})" if name else what
            raise HTTPError(400, f"{where}'s {big[0]} is {big[1]:,}; at most {MAX_REPEAT:,} here", param=param)
    return text


def _tool_schema(tool: Any) -> Any:
    """A tool's schema as any API gives it (OpenAI's `function.parameters`, Anthropic's `input_schema`, the
    Responses API's `parameters`)."""
    if not isinstance(tool, dict):
        return tool
    fn = tool.get("function")
    if isinstance(fn, dict):
        return fn.get("parameters")
    return tool.get("input_schema", tool.get("parameters"))


def _tool_name(tool: Any) -> str | None:
    """A tool's name as any API gives it (Anthropic's and the Responses API's `name`, OpenAI's `function.name`)."""
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function")
    name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
    return name[:64] if isinstance(name, str) else None


def check_grammar_size(grammar: str, param: str, what: str) -> None:
    """A 400 for a grammar too large for the worker to parse between decoding steps."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise HTTPError(400, f"{what} makes a grammar of {len(grammar):,} characters; at most "
                             f"{MAX_GRAMMAR_CHARS:,}", param=param)
