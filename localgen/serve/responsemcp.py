"""The Responses API's `mcp` tool (OpenAI's remote MCP): the server connects to each tool's `server_url` over
streamable HTTP (tools/mcp.py's McpServer, only with `serve --allow-mcp-urls`, and to loopback or private
addresses only with --allow-private-urls, checked as image URLs are: fetch.py), lists its tools (an
`mcp_list_tools` item), offers the allowed ones to the model beside the request's function tools, and answers
in rounds, as run's tool loop does: a call that needs no approval runs (an `mcp_call` item with its output or
error) and the model goes on; one that does ends the response with an `mcp_approval_request`, which the client
answers with an `mcp_approval_response` input item in its next request. A tool's header values never leave
the request: the echoed tool and every output have them redacted."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localgen.errors import LocalgenError, ToolError
from localgen.serve import mcprequest
from localgen.serve.apierror import HTTPError
from localgen.serve.http10 import STREAM_HEADERS
from localgen.serve.mcprequest import Approval, McpTool
from localgen.serve.pipeline import Made, generation, parts
from localgen.serve.responseitems import DECLINED, Encoder, new_id, without_userinfo
from localgen.serve.running import run_whole
from localgen.serve.servelog import TRACE
from localgen.serve.state import ServeState
from localgen.serve.tooling import apply_plan, stream_for, tool_plan
from localgen.tools.spec import ToolCall

if TYPE_CHECKING:
    from localgen.serve.servertools import ToolThreads

MAX_ROUNDS = 8  # rounds of calls in one response, as run's --tool-steps: the round after them must answer


def wanted(body: dict[str, Any]) -> bool:
    """Whether a request has an mcp tool, or answers an approval request (it then needs its mcp tool too)."""
    tools, items = body.get("tools"), body.get("input")
    return (isinstance(tools, list) and any(isinstance(t, dict) and t.get("type") == "mcp" for t in tools)) or (
        isinstance(items, list) and any(isinstance(i, dict) and i.get("type") == "mcp_approval_response"
                                        for i in items))


@dataclass
class Remote:
    """One mcp tool's server for the response: connected (its tools listed), or why not."""

    tool: McpTool
    server: Any = None  # a tools/mcp.py McpServer
    error: str | None = None
    offered: dict[str, str] = field(default_factory=dict)  # the name the model calls → the server's tool name


async def respond(state: ServeState, http: Request, api: Any, body: dict[str, Any]) -> Response:
    """A request with mcp tools: its servers connected, its rounds run, answered whole or streamed."""
    tools = mcprequest.checked(state, body)
    worker = state.worker(body.get("model"))
    ask = await api.parse(body)
    approvals = await mcprequest.approvals(api, body, tools, ask.messages)
    listed = await mcprequest.listed(api, body)
    request, said = await generation(state, worker, ask)
    encoder: Encoder = api.encoder(body, ask, Made(worker.name, request, said))
    run = _Rounds(state, worker, http, ask, encoder, tools, approvals, listed, request)
    if not ask.stream:
        async for _ in run.events():
            pass
        assert run.finished is not None
        return JSONResponse(await encoder.ended(run.finished))
    return StreamingResponse(run.stream(), media_type=encoder.media_type, headers=STREAM_HEADERS)


class _Rounds:
    """One response's rounds: connect, list, run what was approved, then generate and run calls until the model
    answers, a call waits for approval, the model calls a function tool (the client runs it), or MAX_ROUNDS."""

    def __init__(self, state: ServeState, worker: Any, http: Request, ask: Any, encoder: Encoder,
                 tools: list[McpTool], approvals: list[Approval], listed: set[str], request: Any) -> None:
        self.state, self.worker, self.http, self.ask, self.encoder = state, worker, http, ask, encoder
        self.tools, self.approvals, self.listed, self.request = tools, approvals, listed, request
        self.remotes: list[Remote] = []
        self.finished: Any = None  # the Completion the response reports: the last round's, its tokens summed
        # every server connected, as each connects: closed at the end even where the response ended (an error, a
        # client gone) while others were still connecting; one that connects after that is closed at once
        self._opened: list[Any] = []
        self._closed = False
        self._lock = threading.Lock()

    async def stream(self) -> AsyncIterator[bytes]:
        """The stream: the response opened, the rounds' events, and its end (an error after the start: failed)."""
        for chunk in self.encoder.opening(None):  # type: ignore[arg-type]  # the opening reads no event
            yield chunk
        try:
            async for chunk in self.events():
                yield chunk
        except HTTPError as e:
            trace = TRACE.get()
            if trace is not None:  # the stream said 200 at its start: its access line says how it ended
                trace.fail(e)
            for chunk in self.encoder.failed(e):
                yield chunk
            return
        assert self.finished is not None
        for chunk in await self.encoder.done(self.finished, None):  # type: ignore[arg-type]  # done reads no job
            yield chunk

    async def events(self) -> AsyncIterator[bytes]:
        """The rounds' events; the servers closed at the end, however it ends."""
        try:
            self.remotes = list(await asyncio.gather(*(self._connect(t) for t in self.tools)))
            for remote in self.remotes:
                if remote.tool.label not in self.listed or remote.error is not None:
                    shown = list(remote.server.listed) if remote.server is not None else []
                    shown = [remote.tool.redacted(s) for s in shown
                             if remote.tool.allowed is None or s["name"] in remote.tool.allowed]
                    for chunk in self.encoder.listed(remote.tool.label, shown, remote.error):
                        yield chunk
            async for chunk in self._rounds():
                yield chunk
        finally:  # closed in a thread of their own: a server stuck in a call (past --tool-timeout) takes seconds
            # to give up its session, and the answer need not wait for that
            threading.Thread(target=self._close, name="mcp close", daemon=True).start()

    async def _rounds(self) -> AsyncIterator[bytes]:
        from localgen.tools.plan import answer_plan

        enc, ask = self.encoder, self.ask
        offered = self._offer()
        extra: list[dict[str, Any]] = []  # the messages of the rounds, after the conversation
        made: set[tuple[str, str]] = set()  # the calls answered in this response: one made again means "answer now"
        async for chunk in self._approved(extra, made):
            yield chunk
        functions = list(ask.tools or [])
        choice = self._choice(offered)
        answering = False
        done: list[Any] = []  # each round's Completion
        budget = self.request.sampling.max_tokens
        for step in range(MAX_ROUNDS + 1):
            specs = [*functions, *({"type": "function", "function": f} for f, _ in offered.values())]
            plan = await tool_plan(self.worker, specs or None, choice if specs else None, ask.parallel_tool_calls)
            if plan is not None and (answering or step == MAX_ROUNDS):
                plan = answer_plan(plan)
            # a round after the first goes on after messages of its own (a message of its own: a new turn)
            req = apply_plan(plan, dataclasses.replace(self.request, messages=(*self.request.messages, *extra),
                                                       continue_final=self.request.continue_final and not extra))
            if budget > 0:  # max_output_tokens is the whole response's: this round gets what the others left
                left = budget - sum(c.completion_tokens for c in done)
                if left <= 0:  # none left: the response ends incomplete, as the last round cut short would
                    done[-1] = dataclasses.replace(done[-1], finish_reason="length")
                    extra.append({"role": "assistant", "content": ""})
                    break
                req = dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, max_tokens=left))
            enc.content, enc.calls = "", []
            answer = stream_for(self.worker, plan, req, ask.split_reasoning)
            if ask.stream:  # the round's text as the model writes it; the calls to mcp tools held for below
                final = None
                async for pieces, ended in self._streamed(req, answer):
                    final = ended or final
                    for chunk in enc.said([p for p in pieces if not (isinstance(p, ToolCall) and p.name in offered)]):
                        yield chunk
                assert final is not None
            else:
                watch = stream_for(self.worker, plan, req, ask.split_reasoning) if plan is not None else None
                _, final = await run_whole(self.worker, req, self.http, ask.keep_alive, watch)
                answer.feed(final.text)
                answer.finish(final.finish_reason)
                for chunk in enc.said([p for p in parts(answer)
                                       if not (isinstance(p, ToolCall) and p.name in offered)]):
                    yield chunk
            done.append(final)
            mine = [c for c in answer.calls if c.name in offered]
            theirs = [c for c in answer.calls if c.name not in offered]
            new = [c for c in mine if (c.name, c.arguments) not in made]
            if not new and not theirs:
                if mine and step < MAX_ROUNDS:  # only calls it made before (whose results it has): now answer
                    answering = True
                    for chunk in enc.close("completed"):  # what it said before them is a message of its own
                        yield chunk
                    if answer.content:
                        extra.append({"role": "assistant", "content": answer.content})
                    continue
                said: dict[str, Any] = {"role": "assistant", "content": answer.content}
                extra.append(said)
                break
            made.update((c.name, c.arguments) for c in new)
            settled: list[dict[str, Any]] = []
            results: list[dict[str, Any]] = []
            async for chunk in self._run_calls(new, offered, settled, results):
                yield chunk
            extra += [{"role": "assistant", "content": answer.content,
                       "tool_calls": [*settled, *(c.to_openai() for c in theirs)]}, *results]
            if len(results) < len(settled) or theirs:  # the client answers next: an approval, or its own function's
                break  # result
            choice = "auto"  # the request's choice held for the first round; the model may now answer
        enc.tail = extra
        last = done[-1]
        self.finished = dataclasses.replace(
            last, prompt_tokens=sum(c.prompt_tokens for c in done), cached_tokens=sum(c.cached_tokens for c in done),
            completion_tokens=sum(c.completion_tokens for c in done))

    async def _run_calls(self, new: list[ToolCall], offered: dict[str, tuple[dict[str, Any], Remote]],
                         settled: list[dict[str, Any]], results: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        """The model's new calls to mcp tools: one that needs approval an mcp_approval_request item (the call's id
        the request's), any other run (its mcp_call item, its result a tool message in `results`); each call in
        `settled`, as the assistant's message holds it."""
        for call in new:
            remote = offered[call.name][1]
            name = remote.offered[call.name]
            if remote.tool.needs_approval(name):
                call = dataclasses.replace(call, id=new_id("mcpr"))
                for chunk in self.encoder.approval(call.id, remote.tool.label, name, call.arguments):
                    yield chunk
            else:
                output, error, text = await self._call(remote, name, call.arguments)
                for chunk in self.encoder.mcp_call(remote.tool.label, name, call.arguments, output, error):
                    yield chunk
                results.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text})
            settled.append(call.to_openai())

    async def _streamed(self, req: Any, answer: Any) -> AsyncIterator[tuple[list[Any], Any]]:
        """One round streamed: the answer stage's pieces as the model's text comes (the job ended once the model
        repeats a call it made), each with None, then the last pieces with the round's Completion."""
        from localgen.serve.apierror import http_error
        from localgen.serve.jobs import Failed, Text
        from localgen.serve.running import events, run_job, watch_repeats

        job, first = await run_job(self.worker, req, self.http, self.ask.keep_alive)
        async for event in events(job, first):
            if isinstance(event, Text):
                yield watch_repeats(job, answer, event.text), None
            elif isinstance(event, Failed):
                raise http_error(event)
            else:
                yield list(answer.finish(event.completion.finish_reason)), event.completion

    async def _approved(self, extra: list[dict[str, Any]], made: set[tuple[str, str]]) -> AsyncIterator[bytes]:
        """The calls this request's approvals answer: each approved one run (its mcp_call item), each result (or
        DECLINED) a tool message in `extra`, each call counted as `made`."""
        for a in self.approvals:
            remote = next(r for r in self.remotes if r.tool.label == a.label)
            name = next((k for k, v in remote.offered.items() if v == a.name), a.name)
            if a.approve:
                output, error, text = await self._call(remote, a.name, a.arguments)
                for chunk in self.encoder.mcp_call(a.label, a.name, a.arguments, output, error, approval=a.ident):
                    yield chunk
            else:
                text = DECLINED
            extra.append({"role": "tool", "tool_call_id": a.ident, "name": name, "content": text})
            made.add((name, a.arguments))

    def _offer(self) -> dict[str, tuple[dict[str, Any], Remote]]:
        """The MCP tools the model may call, by the name it calls them: the server's own, or label_name where
        two servers (or a function tool) share one."""
        from localgen.tools.loop import _qualified

        taken = {f["function"]["name"] for f in self.ask.tools or []}
        counts: dict[str, int] = {}
        for r in self.remotes:
            for spec in r.server.tools if r.server is not None else ():
                counts[spec.name] = counts.get(spec.name, 0) + 1
        out: dict[str, tuple[dict[str, Any], Remote]] = {}
        for r in self.remotes:
            for spec in r.server.tools if r.server is not None else ():
                if r.tool.allowed is not None and spec.name not in r.tool.allowed:
                    continue
                name = spec.name
                if counts[name] > 1 or name in taken:
                    name = _qualified(r.tool.label, spec.name)
                r.offered[name] = spec.name  # (what the model reads has the secrets redacted, as the listing has)
                out[name] = ({"name": name, "description": r.tool.redact(spec.description),
                              "parameters": r.tool.redacted(spec.parameters)}, r)
        return out

    def _choice(self, offered: dict[str, tuple[dict[str, Any], Remote]]) -> Any:
        """The request's tool_choice in the names offered (an mcp tool's choice made a function's)."""
        choice = self.ask.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "mcp":
            label, name = choice.get("server_label"), choice.get("name")  # (a label no tool has: checked)
            mine = [k for k, (_, r) in offered.items() if r.tool.label == label and name in (None, r.offered[k])]
            if not mine:
                return "auto"  # the server listed no such tool (or could not list): nothing to force
            return {"type": "function", "function": {"name": mine[0]}} if name is not None else "required"
        if not offered and not self.ask.tools and choice == "required":
            return None  # no server could list its tools: the model answers
        return choice

    async def _connect(self, tool: McpTool) -> Remote:
        return await self._threads().run(f"mcp {tool.label} (connecting)", self._open, tool)

    def _open(self, tool: McpTool) -> Remote:
        """The tool's server connected and listed (in a thread), or the reason it is not, its secrets left out."""
        from localgen.tools.mcp import McpServer
        from localgen.tools.mcpconfig import McpTarget

        try:  # each connection made to the host's addresses as they are checked then (no DNS rebinding)
            server = McpServer(McpTarget(tool.label, url=tool.url, headers=tool.headers), self.state.tool_timeout,
                               private=self.state.allow_private_urls)
        except (ToolError, LocalgenError) as e:
            hint = " (serve --allow-private-urls allows it)" if "refused: " in e.message else ""
            return Remote(tool, error=_shown(e.message, tool) + hint)
        except Exception as e:  # anything else the client library raises: the item's error
            where = without_userinfo(tool.url)
            return Remote(tool, error=f"cannot reach the MCP server {where}: {type(e).__name__}")
        with self._lock:
            late = self._closed
            if not late:
                self._opened.append(server)
        if late:  # the response ended while this one connected
            server.close()
        return Remote(tool, server=server)

    async def _call(self, remote: Remote, name: str, arguments: str) -> tuple[str | None, dict[str, Any] | None, str]:
        """A call run in a thread: its output or its error (in OpenAI's shape), and the text the model reads."""
        return await self._threads().run(name, self._run, remote, name, arguments)

    def _threads(self) -> ToolThreads:
        """Threads of their own for connecting and calling (each may wait up to --tool-timeout), as
        servertools' calls have, and ended as theirs are at shutdown."""
        if self.state.tool_threads is None:
            from localgen.serve.servertools import ToolThreads

            self.state.tool_threads = ToolThreads()
        threads: ToolThreads = self.state.tool_threads
        return threads

    def _run(self, remote: Remote, name: str, arguments: str) -> tuple[str | None, dict[str, Any] | None, str]:
        from localgen.tools.loop import MAX_RESULT_CHARS, redact
        from localgen.tools.spec import check_call

        call = ToolCall(name, arguments)
        try:
            if remote.server is None or remote.server.gone:
                raise ToolError(f"the MCP server {remote.tool.label} is not connected")
            try:
                check_call(call, remote.server.tools)
            except ToolError as e:  # the model's arguments miss the tool's schema: JSON-RPC's invalid params
                message = _shown(e.message, remote.tool)
                return None, {"type": "mcp_protocol_error", "code": -32602, "message": message}, message
            text = remote.server.call(name, call.args, self.state.tool_timeout)
            if len(text) > MAX_RESULT_CHARS:
                raise ToolError(f"{name} returned {len(text):,} characters, more than the model can read "
                                f"(at most {MAX_RESULT_CHARS:,})")
        except ToolError as e:
            message = _shown(e.message, remote.tool)
            if message.startswith(f"{name} failed: "):  # the tool said it failed (is_error): its own words
                said = message.removeprefix(f"{name} failed: ")
                return None, {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": said}]}, message
            return None, {"type": "mcp_protocol_error", "code": -32603, "message": message}, message
        text = redact(remote.tool.redact(text))  # (and this process's secrets, as run's tool loop takes them out)
        return text, None, text

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            opened, self._opened = self._opened, []
        for server in opened:
            server.close()


def _shown(message: str, tool: McpTool) -> str:
    """An error's text as the response and the log may show it: any URL's `user:password@` (as the tool's URL is
    written, or as the HTTP library rewrote it) as `[redacted]@`, and the tool's secrets (and this process's)
    redacted."""
    from localgen.tools.loop import redact

    said = re.sub(r"//[^/@\s]*@", "//[redacted]@", message.replace(tool.url, without_userinfo(tool.url)))
    return redact(tool.redact(said))
