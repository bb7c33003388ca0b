"""The tools serve runs itself (`serve --mcp`, `--functions`): `GET /tools` lists them as OpenAI tool objects,
ready for a request's `tools`; `POST /tools/call` runs one and answers its result. A call that fails (the tool
raised or timed out, its arguments miss its schema, its MCP server died) is still a result, marked `is_error`,
for the model to read, as run's and chat's loops give it; an unknown tool is a 404. The chat page calls these;
so may any client behind the same key and origin gate."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen.errors import ToolError
from localgen.serve.apierror import HTTPError
from localgen.serve.jsonbody import read_json

MAX_CALLS = 8  # tool calls running at once, in threads of their own; more wait
STOPPING = "the server is shutting down"

T = TypeVar("T")


class ToolThreads:
    """The tool calls serve runs (POST /tools/call, a Responses request's mcp tools), each in a daemon thread of
    its own, at most MAX_CALLS at once (the loop's default pool parses, plans and stores for every route). At
    shutdown `end_all` ends every call still waiting as a 503; its thread is abandoned, and never holds up the
    process's exit (a pool's threads are joined at exit: a tool sleeping 40 s held the exit that long)."""

    def __init__(self) -> None:
        self._waiting: dict[asyncio.Future[Any], str] = {}
        self._slots: asyncio.Semaphore | None = None
        self._stopped = False

    async def run(self, name: str, fn: Callable[..., T], *args: Any,
                  refused: Callable[[], HTTPError | None] | None = None) -> T:
        """fn(*args) in a thread of its own, its result; a 503 HTTPError once the server stops. `refused`: asked
        again once a slot is free (while the call waited, the calls before it may have been left past their
        timeout), its error raised instead of the call."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        if self._stopped:
            raise HTTPError(503, f"{STOPPING}: the tool call {name} was not run", "server_error")
        self._waiting[done] = name
        try:
            if self._slots is None:
                self._slots = asyncio.Semaphore(MAX_CALLS)
            slots = self._slots
            if await _acquired(slots, done) and done.done():  # ended while it waited for a slot
                slots.release()
            if done.done():
                return done.result()  # type: ignore[no-any-return]  # (raises the 503)
            refusal = refused() if refused is not None else None
            if refusal is not None:
                slots.release()
                raise refusal

            def settle(result: Any, error: BaseException | None) -> None:
                slots.release()
                if not done.done():
                    if error is not None:
                        done.set_exception(error)
                    else:
                        done.set_result(result)

            def target() -> None:
                result, error = None, None
                try:
                    result = fn(*args)
                except BaseException as e:  # (a ToolError, the call's own answer): handed to the request
                    error = e
                with contextlib.suppress(RuntimeError):  # the loop has closed: the server is gone
                    loop.call_soon_threadsafe(settle, result, error)

            threading.Thread(target=target, name=f"tool call {name}", daemon=True).start()
            return await done  # type: ignore[no-any-return]
        finally:
            self._waiting.pop(done, None)

    def end_all(self) -> list[str]:
        """Every call still waiting ends now as a 503 (the server is stopping): the names of those abandoned."""
        self._stopped = True
        ended = []
        for done, name in list(self._waiting.items()):
            if not done.done():
                done.set_exception(HTTPError(503, f"{STOPPING}: the tool call {name} was abandoned",
                                             "server_error"))
                ended.append(name)
        return ended


async def _acquired(slots: asyncio.Semaphore, done: asyncio.Future[Any]) -> bool:
    """Wait for a slot, or for `done` (ended at shutdown) if it comes first: whether a slot was taken."""
    task = asyncio.ensure_future(slots.acquire())
    try:
        await asyncio.wait([task, done], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the request went away: a slot its acquire took meanwhile goes back
        await _stop(task)
        if not task.cancelled():
            slots.release()
        raise
    await _stop(task)
    return not task.cancelled()


async def _stop(task: asyncio.Future[Any]) -> None:
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def routes(toolbox: Any, timeout: float, threads: ToolThreads | None = None) -> list[Route]:
    """`GET /tools` and `POST /tools/call` over a Toolbox (tools/loop.py), or over none: an empty list, and
    every call a 404. Calls run in threads of their own (ToolThreads), more than MAX_CALLS waiting for a slot;
    while MAX_CALLS Python tools' calls are still running past their timeout (a thread cannot be stopped), a
    call is a 503."""
    threads = threads or ToolThreads()

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

        def past_timeout() -> HTTPError | None:
            """The 503 while MAX_CALLS calls run on past their timeout (calls within it hold slots: one past the 8th
            waits for a slot, and is asked again then, as those before it may have run past theirs meanwhile)."""
            from localgen.tools.functions import abandoned

            stuck = abandoned(toolbox.running)
            return HTTPError(503, f"{stuck} tool calls are still running past --tool-timeout: try again later",
                             "server_error") if stuck >= MAX_CALLS else None

        if (refusal := past_timeout()) is not None:
            raise refusal
        if all(spec.name != name for spec in toolbox.specs):  # a tool of an MCP server that has gone
            server = (toolbox.source(name) or "").removeprefix("mcp: ")
            return JSONResponse({"object": "tool.result", "name": name, "is_error": True, "content":
                                 f"the MCP server {server} has gone: its tools are no longer offered"})
        try:
            text, failed = await threads.run(name, toolbox.call, tool_call, timeout, refused=past_timeout), False
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
