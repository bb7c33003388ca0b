"""The tools serve runs itself (`serve --mcp`, `--functions`): `GET /tools` lists them as OpenAI tool objects,
ready for a request's `tools`; `POST /tools/call` runs one and answers its result. A call that fails (the tool
raised or timed out, its arguments miss its schema, its MCP server died) is still a result, marked `is_error`,
for the model to read, as run's and chat's loops give it; an unknown tool is a 404. The chat page calls these;
so may any client behind the same key and origin gate."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen.errors import ToolError
from localgen.serve.apierror import HTTPError
from localgen.serve.jsonbody import read_json

MAX_CALLS = 8  # tool calls running at once, in threads of their own; more wait


def routes(toolbox: Any, timeout: float) -> list[Route]:
    """`GET /tools` and `POST /tools/call` over a Toolbox (tools/loop.py), or over none: an empty list, and
    every call a 404. Calls run in a pool of their own (the loop's default pool parses, plans and stores for
    every route); while MAX_CALLS Python tools are still running, some past their timeout (a thread cannot be
    stopped), a call is a 503."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(MAX_CALLS, thread_name_prefix="tool call")

    async def listing(request: Request) -> Response:
        data = [] if toolbox is None else [{**spec.to_openai(), "source": toolbox.source(spec.name)}
                                           for spec in toolbox.specs]
        return JSONResponse({"object": "list", "data": data, "timeout": timeout})

    async def call(request: Request) -> Response:
        from localgen.tools.spec import ToolCall

        body = await read_json(request)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "`name` must be the name of a tool (GET /tools lists them)", param="name")
        if toolbox is None or toolbox.source(name) is None:
            offered = ", ".join(s.name for s in toolbox.specs) if toolbox is not None else ""
            raise HTTPError(404, f"no tool is named {name[:100]!r} here "
                                 f"({'tools: ' + offered if offered else 'serve was started with no tools'})",
                            param="name")
        tool_call = ToolCall(name, _arguments(body.get("arguments")))
        stuck = len(toolbox.running)
        if stuck >= MAX_CALLS:
            raise HTTPError(503, f"{stuck} tool calls are still running, some past --tool-timeout: try again later",
                            "server_error")
        try:
            text, failed = await asyncio.get_running_loop().run_in_executor(pool, toolbox.call, tool_call,
                                                                            timeout), False
        except ToolError as e:
            text, failed = e.message, True
        return JSONResponse({"object": "tool.result", "name": name, "content": text, "is_error": failed})

    return [Route("/tools", listing, methods=["GET"]), Route("/tools/call", call, methods=["POST"])]


def _arguments(raw: Any) -> str:
    """The call's arguments as the JSON text a model writes: an object as it is, a string as the model wrote it
    (checked against the tool's schema by the call, so a model's mistake is the model's to read); else a 400."""
    if raw is None:
        return "{}"
    if isinstance(raw, dict):
        return json.dumps(raw, ensure_ascii=False)
    if isinstance(raw, str):
        return raw
    raise HTTPError(400, "`arguments` must be a JSON object, or a string holding one", param="arguments")
