"""Tools from MCP servers, through the `mcp` SDK: a command line starts a server over stdio (with only the
SDK's safe subset of the environment, so secrets stay out of it, and what a config file gives it:
tools/mcpconfig.py), an http(s) URL reaches one over streamable HTTP (with a config file's headers).
The SDK is asynchronous; a server's session lives on its own event loop in a thread, and `run` and
`chat` call it with a timeout. A server's tool listing is read page by page (its nextCursor followed) up to
MAX_TOOLS tools in MAX_PAGES pages; a server a request names (serve's mcp tool) is read only within MAX_BODY and
MAX_TOOL_TEXT too; a stdio server's lines (one message each) are read at most MAX_LINE bytes each (_bounded_stdio: the
SDK's stdio_client with its reader replaced); and closing any server cuts a session that hangs after CLOSE_S, every
connection closed."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from typing import Any

from localgen.errors import ToolError
from localgen.tools.mcpconfig import McpTarget
from localgen.tools.spec import ToolSpec, check_name, check_schema

CONNECT_TIMEOUT_S = 30.0
CLOSE_S = 5.0  # how long closing waits for a session to end as it should, before it is cut
# what a server a request names (serve's mcp tool: `private` not None) may send, checked before it is parsed: a
# response body's or a server-sent event's bytes, a tool's description or input schema
MAX_BODY = 4 * 1024 * 1024
MAX_TOOL_TEXT = 65_536  # characters of a listed tool's description, and of its input schema written as JSON
MAX_TOOLS = 1000  # tools in one server's listing, all its pages together (any server's)
MAX_PAGES = 1000  # pages of a listing (its nextCursor followed until there is none)
MAX_CURSOR = 4096  # characters of a listing's cursor (sent back to the server for the next page)
MAX_LINE = 16 * 1024 * 1024  # bytes of one line a stdio server writes (one message): past it, the server is gone
BANNER_S = 5.0  # how long a stdio server whose first line is not JSON-RPC (a banner) has to send a message after it
STOP_NOW_S = 2.0  # how long a stdio server told to stop by stop_now (SIGTERM) has, before it is killed

_running: set[int] = set()  # the process groups of the stdio servers started and not yet stopped (stop_now's)


class _Unreadable(Exception):
    """The server sent a line that looked like a message and could not be read (its reason)."""


class McpServer:
    """One MCP server: its tools, and calls to them."""

    def __init__(self, target: McpTarget, timeout: float = CONNECT_TIMEOUT_S, private: bool | None = None) -> None:
        """`private`: None, a URL's host is reached by name (run's and chat's own servers); True or False (a
        server that connects where a request says: serve/responsemcp.py), every connection goes to the host's
        addresses resolved and checked as it is made (fetch.py's check, loopback and private ones only when
        True), so a DNS answer that changes after a check cannot lead inside."""
        self.target = target
        self.private = private
        self.label = target.label
        self.tools: tuple[ToolSpec, ...] = ()
        # each tool as the server listed it (name, description, input_schema, annotations: what a Responses
        # API's mcp_list_tools item shows)
        self.listed: tuple[dict[str, Any], ...] = ()
        self.left_out: list[str] = []  # warnings: its tools whose names a request's `tools` could not carry
        self.gone = False  # the connection was lost (the process died, the HTTP server went away): no more calls
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp {self.label}", daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        self._session: Any = None
        self._client: Any = None  # the HTTP client, when it is ours: closed after the session, whatever happened
        self._errlog: Any = None  # where a stdio server's stderr goes when ours is not a terminal
        self._refused: list[str] = []  # why a body the server sent was not read (past MAX_BODY): the error
        self._unparsed: list[str] = []  # why a line the server sent could not be read (not JSON-RPC): the error
        self._relaying: asyncio.Future[None] | None = None  # (a reference kept: the loop holds tasks weakly)
        self._broken_why = ""  # the line that set _broken, as its error
        self._broken: asyncio.Event | None = None  # set when a line that looked like a message could not be read
        self._heard = False  # whether the server has sent a message (a stdio server's line that is JSON-RPC)
        self._banner: str | None = None  # the first line a stdio server wrote that is not JSON-RPC, before any message
        _quiet_sdk()
        started = time.monotonic()
        try:
            if target.url is not None and private is not None:  # `timeout` is the whole start's: the probe's too
                _reachable_checked(target, private, started + timeout)
            elif target.url is not None:
                _reachable(target)
            left = max(0.1, started + timeout - time.monotonic())
            self.tools = self._wait(self._connect(), timeout, "starting", left)
        except BaseException:
            if private is None:
                self.close()
            else:  # a request's server: the thread that started it is free at once (closing may wait CLOSE_S)
                threading.Thread(target=self.close, name=f"mcp close {self.label}", daemon=True).start()
            raise

    def _wait(self, coro: Coroutine[Any, Any, Any], timeout: float, doing: str, left: float | None = None) -> Any:
        """`coro` run on the session's loop for at most `timeout` seconds (`left`, when less is left of it)."""
        import concurrent.futures

        self._refused.clear()  # (a reason from before: not this one's)
        self._unparsed.clear()
        future = asyncio.run_coroutine_threadsafe(self._unless_broken(coro), self._loop)
        try:
            return future.result(timeout if left is None else left)
        except concurrent.futures.TimeoutError:
            future.cancel()
            if self._refused:
                raise ToolError(f"{self._refused[0]} ({doing})") from None
            if self._unparsed:  # the answer may have been the line that could not be read
                raise ToolError(f"{self._unparsed[-1]} ({doing})") from None
            raise ToolError(f"the MCP server {self.label} did not answer within {timeout:g} s ({doing})") from None
        except _Unreadable as e:
            raise ToolError(f"{e} ({doing})") from None
        except ToolError:
            raise
        except Exception as e:  # the SDK's errors, a dead process, a refused connection: one line each
            if self._refused:  # a body past MAX_BODY (the SDK says "Failed to parse JSON response" or the like)
                raise ToolError(f"{self._refused[0]} ({doing})") from None
            if _lost(e) and doing != "starting":  # a server that never started never offered its tools
                self.gone = True
                raise ToolError(f"the MCP server {self.label} failed ({doing}): {_why(e)}{self._said()}",
                                hint="it has gone: its tools are no longer offered to the model") from None
            why = _why(e)
            if _lost(e):
                self.gone = True
                if doing == "starting" and self.target.url is None:  # it ended: `true`, `echo hi`, not a server
                    why = (f"it wrote {_quoted(self._banner)} on stdout, which is not JSON-RPC, and ended"
                           if self._banner else "it ended before it answered (an MCP server answers JSON-RPC on "
                                                "its stdin and stdout)")
            raise ToolError(f"the MCP server {self.label} failed ({doing}): {why}{self._said()}") from None

    async def _unless_broken(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """`coro`'s result; a ToolError as soon as the server sends a line that looks like a message (a JSON
        object) and cannot be read: the answer waited for may have been that line, and would never come."""
        if self._broken is None:
            self._broken = asyncio.Event()
        self._broken.clear()
        task = asyncio.ensure_future(coro)
        broken = asyncio.ensure_future(self._broken.wait())
        try:
            await asyncio.wait([task, broken], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled (a timeout): the call with it
            task.cancel()
            raise
        finally:
            broken.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise _Unreadable(self._broken_why)
        return task.result()

    async def _relay(self, source: Any, sink: Any, stdio: bool) -> None:
        """The server's messages passed on to the session; a stdio server's line the SDK could not read (an
        Exception in the stream) is kept as the reason a call fails, and a stdio server whose output ended (it
        died) is gone. A first line that is not JSON-RPC (a banner) followed by no message within BANNER_S fails
        the start then, quoting it (not at the start's timeout: a program that is no MCP server writes so)."""
        try:
            async with sink:
                async for item in source:
                    if isinstance(item, Exception) and stdio:  # (over HTTP: the SDK's own errors, not lines)
                        self._unparsed[:] = [_unreadable(self.label, item)]  # the last one only
                        if _looked_like_a_message(item) and self._broken is not None:
                            self._broken_why = self._unparsed[-1]  # (a caller's _wait may clear _unparsed)
                            self._broken.set()
                        elif not self._heard and self._banner is None:
                            self._banner = _line_of(item)
                            asyncio.get_running_loop().call_later(BANNER_S, self._silent_after_banner)
                    elif not isinstance(item, Exception):
                        self._heard = True
                    await sink.send(item)
        except Exception:  # the session closed its end: nothing more to pass on
            pass
        if stdio:
            self.gone = True

    def _silent_after_banner(self) -> None:
        """BANNER_S after a stdio server's first line that is not JSON-RPC: with no message since, the wait (its
        start's) ends, the line quoted."""
        if self._heard or self._broken is None or self._broken.is_set():
            return
        self._broken_why = (f"the MCP server {self.label} wrote {_quoted(self._banner or '')} on stdout, which is not "
                            f"JSON-RPC, and sent no message in the {BANNER_S:g} s after it")
        self._broken.set()

    def _said(self) -> str:
        """The last line the server wrote to stderr, when it went to our log (the reason a server that died
        gives: a missing module, a bad argument), as `; it said: ...`."""
        import os

        if self._errlog is None or not (hasattr(os, "pread") or self.gone):  # no pread (Windows): read only a
            return ""  # server gone, which no longer writes at the offset the read moves (it shares the file's)
        with contextlib.suppress(OSError, ValueError):
            tail = _tail(self._errlog.fileno(), 4096).decode("utf-8", "replace")
            lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
            if lines:
                said = lines[-1]
                if len(said) > 200:  # cut at a word, and said to be cut
                    said = said[:200].rsplit(" ", 1)[0].rstrip(" ,;:") + " …"
                return f"; it said: {said}"
        return ""

    async def _connect(self) -> tuple[ToolSpec, ...]:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.streamable_http import streamable_http_client

        target = self.target
        if target.url is not None:
            client, most = None, None
            if self.private is not None:
                client = await self._stack.enter_async_context(
                    _pinned_client(target.headers, self.private, self._refused, self.label))
                most = MAX_BODY
            elif target.headers:  # a remote server's key, from a config file
                from mcp.shared._httpx_utils import create_mcp_http_client

                client = await self._stack.enter_async_context(create_mcp_http_client(headers=target.headers))
            self._client = client
            transport = (streamable_http_client(target.url, http_client=client, max_sse_event_size=most) if most
                         else streamable_http_client(target.url, http_client=client))
        else:
            import sys
            import tempfile

            from mcp.client.stdio import get_default_environment

            # a server's own log lines: on a terminal; otherwise kept aside, for the reason a failure gives
            errlog = sys.stderr
            if not sys.stderr.isatty():
                errlog = self._errlog = self._stack.enter_context(tempfile.TemporaryFile("w+"))  # noqa: SIM115
            env = {**get_default_environment(), **target.env} if target.env else None
            # bytes that are not UTF-8 become U+FFFD: under "strict" one such byte ends the SDK's reader for good
            params = StdioServerParameters(command=target.argv[0], args=list(target.argv[1:]), env=env,
                                           cwd=target.cwd, encoding_error_handler="replace")
            from mcp.client import stdio as sdk

            if all(hasattr(sdk, part) for part in _SDK_PARTS):
                transport = _bounded_stdio(params, errlog, self.label, self._refused)
            else:  # an SDK whose stdio parts moved: its own reader (lines not bounded, as before)
                transport = sdk.stdio_client(params, errlog=errlog)
        import anyio

        source, write = await self._stack.enter_async_context(transport)
        sink, read = anyio.create_memory_object_stream[Any](0)
        self._relaying = asyncio.ensure_future(self._relay(source, sink, target.url is None))
        self._session = await self._stack.enter_async_context(ClientSession(read, write))
        await self._session.initialize()
        out, shown = [], []
        for t in await self._list_tools():
            schema = dict(t.input_schema or {"type": "object", "properties": {}})
            check_schema(schema, f"the MCP server {self.label}'s tool {t.name}")
            try:  # MCP allows 128 characters of any kind; a request's `tools` (OpenAI's), 64 of [A-Za-z0-9_.-]
                check_name(t.name, "name")
            except ToolError:  # left out, so that one bad name does not cost the server's other tools
                self.left_out.append(f"the MCP server {self.label}'s tool {_quoted(t.name)} is left out: a tool's "
                                     "name must be 1-64 ASCII letters, digits, _ . or -")
            else:
                out.append(ToolSpec(t.name, t.description or "", schema))
            notes = t.annotations.model_dump(exclude_none=True) if t.annotations is not None else None
            shown.append({"name": t.name, "description": t.description, "input_schema": schema,
                          "annotations": notes or None})
        self.listed = tuple(shown)
        return tuple(out)

    async def _list_tools(self) -> list[Any]:
        """Every page of the server's tools/list, its `nextCursor` followed until there is none (or an empty one): at
        most MAX_TOOLS tools in MAX_PAGES pages, a cursor at most MAX_CURSOR characters, and a cursor the server
        already sent is an error, not a loop. A server a request names has each page's tools checked as the page
        comes (MAX_TOOL_TEXT), and all its tools' text at most MAX_BODY characters, as one body of them was."""
        import hashlib
        import json

        from mcp.types import PaginatedRequestParams
        from pydantic import ValidationError

        tools: list[Any] = []
        cursor: str | None = None
        seen: set[bytes] = set()
        text = 0
        for _ in range(MAX_PAGES):
            try:
                page = await self._session.list_tools(
                    params=None if cursor is None else PaginatedRequestParams(cursor=cursor))
            except ValidationError as e:  # (pydantic's, in many lines): the field at fault, in one
                raise ToolError(f"the MCP server {self.label}'s tools/list answer is not MCP's: {_first_fault(e)}"
                                ) from None
            if len(tools) + len(page.tools) > MAX_TOOLS:
                raise ToolError(f"the MCP server {self.label} listed {len(tools) + len(page.tools):,} tools: at most "
                                f"{MAX_TOOLS:,} are read")
            for t in page.tools:
                if self.private is not None:
                    schema = t.input_schema or {}
                    _check_sizes(self.label, t.name, t.description or "", schema)
                    text += len(t.description or "") + len(json.dumps(schema)) + len(t.name)
                    if text > MAX_BODY:
                        raise ToolError(f"the MCP server {self.label}'s tool listing is over {MAX_BODY:,} characters "
                                        "of names, descriptions and schemas: at most that is read")
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools
            if len(cursor) > MAX_CURSOR:
                raise ToolError(f"the MCP server {self.label} sent a tools/list cursor of {len(cursor):,} characters: "
                                f"at most {MAX_CURSOR:,} are sent back")
            key = hashlib.sha256(cursor.encode("utf-8", "surrogatepass")).digest()
            if key in seen:
                raise ToolError(f"the MCP server {self.label} sent the same tools/list cursor twice: its listing "
                                "would never end")
            seen.add(key)
        raise ToolError(f"the MCP server {self.label} listed its tools in more than {MAX_PAGES:,} pages: at most "
                        f"{MAX_PAGES:,} are read")

    def call(self, name: str, args: dict[str, Any], timeout: float) -> str:
        """The tool's result as text (a ToolError when the server reports an error, dies, or times out)."""
        result = self._wait(self._session.call_tool(name, args), timeout, f"calling {name}")
        parts = []
        for block in result.content:
            text = getattr(block, "text", None)
            resource = getattr(block, "resource", None)  # an embedded resource: its text, or what it is
            if resource is not None and not isinstance(text, str):
                text = getattr(resource, "text", None)
                if not isinstance(text, str):
                    text = f"[resource {resource.uri} ({getattr(resource, 'mime_type', None) or 'no type'})]"
            parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')}]")
        text = "\n".join(parts)
        if not text and result.structured_content is not None:
            import json

            text = json.dumps(result.structured_content, ensure_ascii=False)
        if result.is_error:
            raise ToolError(f"{name} failed: {text or 'the MCP server reported an error'}")
        return text

    def close(self) -> None:
        """End the session and the server process, and close every connection to it (a server that hangs too)."""
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(CLOSE_S + 2)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            if not self._thread.is_alive():
                self._loop.close()

    async def _shutdown(self) -> None:
        """The session ended as it was opened (an HTTP server told so, a process stopped) within CLOSE_S; then
        whatever still runs on the loop (a request to a server that hangs, the session's own tasks) cancelled,
        and the HTTP client's connections closed."""
        with contextlib.suppress(BaseException):  # a timeout, the SDK's own errors on the way out
            await asyncio.wait_for(self._stack.aclose(), CLOSE_S)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 1)
        if self._client is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._client.aclose(), 1)


# the SDK's own stdio parts _bounded_stdio runs (mcp.client.stdio's, private: pyproject.toml pins mcp's minor version)
_SDK_PARTS = ("_get_executable_command", "_create_platform_compatible_process", "_parse_line", "_drain_stdout",
              "_WRITER_FLUSH_TIMEOUT", "_stop_server_process", "_aclose_all", "get_default_environment")


@contextlib.asynccontextmanager
async def _bounded_stdio(params: Any, errlog: Any, label: str, refused: list[str]) -> Any:
    """The SDK's stdio_client, its server's stdout read as bytes split at each newline as they come (the SDK joins
    and splits its whole buffer again at every 64 KB: a 50 MB line took 76 s), each line at most MAX_LINE bytes:
    past it, why is added to `refused` and the server's output ends here (it is gone), before the line is held."""
    import anyio
    import anyio.lowlevel
    from mcp.client import stdio as sdk
    from mcp.shared.message import SessionMessage

    command = await sdk._get_executable_command(params.command)
    process = await sdk._create_platform_compatible_process(
        command=command, args=params.args, env=sdk.get_default_environment() | (params.env or {}), errlog=errlog,
        cwd=params.cwd)
    _running.add(process.pid)  # its group's id (a session of its own: the SDK starts it so)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def stdout_reader() -> None:
        assert process.stdout
        buffer, start = bytearray(), 0
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream,
                                 ConnectionError):
            try:
                async with read_writer:  # (closed before the drain: the session sees the output end at once)
                    while True:
                        buffer += await process.stdout.receive()
                        over = False
                        while (end := buffer.find(b"\n", start)) >= 0:
                            if end > MAX_LINE:  # whole in one read, but past the bound all the same
                                over = True
                                break
                            line = buffer[:end].decode(params.encoding, params.encoding_error_handler)
                            del buffer[:end + 1]
                            start = 0
                            await read_writer.send(sdk._parse_line(line))
                        start = len(buffer)
                        if over or len(buffer) > MAX_LINE:
                            refused.append(f"the MCP server {label} sent a line over {MAX_LINE // 1024 // 1024} MiB "
                                           "(one message): at most that is read, and the server is no longer used")
                            return
            finally:  # what the server still writes is read and dropped, so that it never blocks on a full pipe
                await sdk._drain_stdout(process)

    async def stdin_writer() -> None:
        assert process.stdin
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode(params.encoding, params.encoding_error_handler))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the connection end, not a request that hangs
        finally:
            writer_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):  # as the SDK's: every wait bounded, the process never left
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(sdk._WRITER_FLUSH_TIMEOUT):
                    await writer_done.wait()
                await sdk._stop_server_process(process)
                _running.discard(process.pid)
                await sdk._aclose_all(read_stream, write_stream, read_writer, write_reader)
                await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()


def stop_now() -> None:
    """Every stdio server still running stopped before a SIGTERM or SIGHUP ends this process (cli/signals.py): its
    process group told to stop (SIGTERM), and killed after STOP_NOW_S. The signal leaves no time for a session's
    own close, and a server busy in a call may never see its input end, so it would run on, its parent gone."""
    import os
    import signal

    if not hasattr(os, "killpg"):  # Windows: the SDK's job object ends the server with this process
        return
    groups = set(_running)
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_NOW_S
    while groups and time.monotonic() < deadline:
        time.sleep(0.02)
        groups = {g for g in groups if _group_alive(g)}
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    _running.clear()


def _group_alive(pgid: int) -> bool:
    """Whether a process group has a process left (one that ended is reaped by the loop's child watcher)."""
    import os

    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (EPERM: one it may not signal, still there)
        return True
    return True


def _tail(fd: int, size: int) -> bytes:
    """The last `size` bytes of the file open at `fd`, its offset (the server's too: it writes there) as it was."""
    import os

    start = max(0, os.fstat(fd).st_size - size)
    if hasattr(os, "pread"):
        return os.pread(fd, size, start)
    at = os.lseek(fd, 0, os.SEEK_CUR)  # no pread (Windows; only once the server is gone): the offset put back
    try:
        os.lseek(fd, start, os.SEEK_SET)
        return os.read(fd, size)
    finally:
        os.lseek(fd, at, os.SEEK_SET)


def _lost(e: BaseException) -> bool:
    """Whether an error means the connection is gone for good (the SDK's "Connection closed", a closed
    stream, a refused connection), not one call's failure."""
    import anyio

    if isinstance(e, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, ConnectionError)):
        return True
    from mcp.types import CONNECTION_CLOSED

    error = getattr(e, "error", None)  # the SDK's own "Connection closed" (a server may answer -32000 itself)
    closed = getattr(error, "code", None) == CONNECTION_CLOSED and getattr(error, "message", "") == "Connection closed"
    return closed or any(type(c).__name__ == "ConnectError" for c in (e.__cause__, e.__context__) if c is not None)


def _unreadable(label: str, e: Exception) -> str:
    """The error for a line the server sent that the SDK could not read (pydantic's reason, its first line)."""
    errors = getattr(e, "errors", None)
    why = str(e)
    with contextlib.suppress(Exception):
        why = errors()[0]["msg"] if errors is not None else why
    why = why.strip().splitlines()[0][:200] if why.strip() else type(e).__name__
    return f"the MCP server {label} sent a line that is not JSON-RPC: {why}"


def _input_of(e: Exception) -> Any:
    """The line (pydantic's input: text, or the object it parsed to) that the SDK could not read, else None."""
    errors = getattr(e, "errors", None)
    with contextlib.suppress(Exception):
        line = errors()[0]["input"] if errors is not None else None
        return line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    return None


def _line_of(e: Exception) -> str:
    """The line a stdio server wrote that the SDK could not read, or the error's own words."""
    line = _input_of(e)
    if isinstance(line, str):
        return line.strip()
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _looked_like_a_message(e: Exception) -> bool:
    """Whether the line an error is about was a JSON-RPC message the SDK could not read (an object naming
    "jsonrpc" or an "id"), not a log line (plain text, or a structured logger's JSON object, which the SDK passes
    over as servers expect)."""
    line = _input_of(e)
    if isinstance(line, str):
        return line.lstrip()[:1] == "{" and '"jsonrpc"' in line[:4096]
    return isinstance(line, dict) and ("jsonrpc" in line or "id" in line)


def _check_sizes(label: str, name: str, description: str, schema: dict[str, Any]) -> None:
    """A listed tool's description and input schema at most MAX_TOOL_TEXT characters each, else a ToolError."""
    import json

    for what, size in (("description", len(description)), ("input schema", len(json.dumps(schema)))):
        if size > MAX_TOOL_TEXT:
            raise ToolError(f"the MCP server {label}'s tool {name[:64]} has a {what} of {size:,} characters: at "
                            f"most {MAX_TOOL_TEXT:,} are read")


def _quiet_sdk() -> None:
    """Keep the SDK's own log records (a traceback for each line a server writes to stdout that is not JSON-RPC,
    "Session termination failed" when an HTTP server is gone) off stderr: what went wrong is the one error line
    a failed start or call gives."""
    import logging

    sdk = logging.getLogger("mcp")
    if not any(isinstance(h, logging.NullHandler) for h in sdk.handlers):
        sdk.addHandler(logging.NullHandler())
    sdk.propagate = False


def _reachable(target: McpTarget) -> None:
    """An MCP URL whose server does not listen is one clear line (the SDK says only "CancelledError"), naming the
    server by its key in a config file, and its URL; behind a proxy the proxy decides, so there is nothing to try
    first."""
    import socket
    import urllib.request
    from urllib.parse import urlsplit

    url = target.url or ""
    u = urlsplit(url)
    if not u.hostname or (u.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(u.hostname)):
        return
    try:
        socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=5).close()
    except OSError as e:
        from localgen.redact import url_shown

        name = f"{target.label} ({url_shown(url)})" if target.named else url_shown(url)
        raise ToolError(f"cannot reach the MCP server {name}: {e.strerror or e}") from None


def _reachable_checked(target: McpTarget, private: bool, deadline: float) -> None:
    """_reachable for a URL a request gave: its host resolved and checked (a refused address is one line
    naming why), and the probe made to a checked address, each try at most 5 s and none past `deadline`."""
    import socket
    from urllib.parse import urlsplit

    from localgen.fetch import FetchError, addresses

    u = urlsplit(target.url or "")
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        found = addresses(u.hostname or "", port, private)
    except FetchError as e:
        raise ToolError(f"cannot connect to the MCP server {target.label}: {e.message}") from None
    failed: OSError | None = None
    for ip in found:
        try:
            socket.create_connection((ip, port), timeout=min(5.0, max(0.1, deadline - time.monotonic()))).close()
            return
        except OSError as e:
            failed = e
        if time.monotonic() >= deadline:
            break
    assert failed is not None
    raise ToolError(f"cannot reach the MCP server {target.url}: {failed.strerror or failed}") from None


def _pinned_client(headers: dict[str, str] | None, private: bool, refused: list[str] | None = None,
                   label: str = "") -> Any:
    """The SDK's HTTP client (its timeouts, `headers` on every request) whose connections each go to an address
    of the host resolved and checked then (fetch.py's check): never to a name resolved again after the check.
    TLS's server name and the Host header keep the name. No proxy from the environment. A response body (a
    server-sent event, in a stream of them) past MAX_BODY bytes is not read on: an error, its reason added to
    `refused`; bodies come unencoded (a compressed one could grow past any size once decoded)."""
    from collections.abc import Iterable

    import anyio.to_thread
    import httpcore2
    import httpx2
    from httpcore2._backends.auto import AutoBackend
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    from localgen.fetch import FetchError, addresses

    class Backend(AutoBackend):
        async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                              local_address: str | None = None,
                              socket_options: Iterable[Any] | None = None) -> Any:
            try:
                found = await anyio.to_thread.run_sync(addresses, host, port, private)
            except FetchError as e:
                raise httpcore2.ConnectError(e.message) from None
            failed: Exception = httpcore2.ConnectError("could not connect")
            for ip in found:
                try:
                    return await super().connect_tcp(ip, port, timeout, local_address, socket_options)
                except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as e:
                    failed = e
            raise failed

    said = refused if refused is not None else []

    def too_big(why: str) -> httpx2.StreamError:
        said.append(f"the MCP server {label} sent {why}: at most {MAX_BODY:,} bytes are read")
        return httpx2.StreamError(said[-1])

    Capped = _capped_stream(too_big)

    class Transport(httpx2.AsyncHTTPTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            response = await super().handle_async_request(request)
            size = response.headers.get("content-length", "")
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            events = response.headers.get("content-type", "").lower().startswith("text/event-stream")
            error = None
            if size.isascii() and size.isdigit() and int(size) > MAX_BODY:
                error = too_big(f"a body of {int(size):,} bytes")
            elif encoding not in ("", "identity"):
                error = too_big(f"a body encoded as {encoding[:32]}, not asked for (it could decode past any size)")
            return httpx2.Response(response.status_code, headers=response.headers,
                                   stream=Capped(response.stream, events, error), extensions=response.extensions)

    transport = Transport(trust_env=False)
    # httpx2 takes no network backend itself: its pool is made again with ours (as _compat.httpx_transport does)
    transport._pool = httpcore2.AsyncConnectionPool(ssl_context=httpx2.create_ssl_context(), network_backend=Backend())
    return httpx2.AsyncClient(transport=transport, headers={**(headers or {}), "Accept-Encoding": "identity"},
                              trust_env=False,
                              timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT))



def _capped_stream(too_big: Any) -> Any:
    """The class of a response's bytes counted as they come (_pinned_client's): a body's, or each server-sent
    event's; past MAX_BODY, `too_big`'s error."""
    import httpx2

    class Capped(httpx2.AsyncByteStream):
        """A response's bytes, counted as they come: a body's, or each server-sent event's."""

        def __init__(self, inner: Any, events: bool, error: httpx2.StreamError | None) -> None:
            self.inner, self.events, self.error = inner, events, error

        async def __aiter__(self) -> Any:
            if self.error is not None:  # refused by its headers: nothing of it read (raised here, as the SDK
                raise self.error  # expects of a body it cannot read)
            seen, tail = 0, b""
            async for part in self.inner:
                if self.events:  # bytes since the last blank line (an event's end), the separator looked for
                    buf = tail + part  # across the chunks' edges
                    end = max(buf.rfind(b"\n\n"), buf.rfind(b"\r\r"), buf.rfind(b"\r\n\r\n"))
                    seen = len(buf) - end if end >= 0 else seen + len(part)
                    tail = buf[-3:]
                else:
                    seen += len(part)
                if seen > MAX_BODY:
                    raise too_big("a server-sent event over 4 MB" if self.events else "a body over 4 MB")
                yield part

        async def aclose(self) -> None:
            await self.inner.aclose()

    return Capped


def _why(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup) and e.exceptions:
        return _why(e.exceptions[0])
    text = " ".join(line.strip() for line in str(e).strip().splitlines() if line.strip())  # joined, as tools.md says
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _quoted(name: str) -> str:
    """A name a server sent, quoted on one line and cut to 80 characters."""
    return repr(name[:80] + ("..." if len(name) > 80 else ""))


def _first_fault(e: Any) -> str:
    """A pydantic ValidationError's first fault in one line: where (`tools.0.name`) and what."""
    faults = e.errors()
    if not faults:
        return "it does not validate"
    where = ".".join(str(p) for p in faults[0].get("loc", ())) or "the answer"
    more = f" (and {len(faults) - 1:,} more)" if len(faults) > 1 else ""
    return f"{where}: {str(faults[0].get('msg', 'invalid'))[:200]}{more}"
