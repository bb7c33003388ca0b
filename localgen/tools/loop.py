"""The tool loop of `run` and `chat`: generate; if the answer calls tools, check each call against its
schema, ask (unless allowed), run it with a timeout, give the result back in a `tool` message, and generate
again, until the model answers without a call or the step bound is reached. The tools come from Python
files and MCP servers (a Toolbox). Any failure is a ToolError, and the caller keeps none of the turn."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen.errors import ContextOverflowError, GrammarError, ToolError
from localgen.text import mended
from localgen.tools.plan import ToolPlan, answer_plan, answer_stream, make_plan, with_tools
from localgen.tools.spec import ToolCall, ToolSpec, check_call
from localgen.types import GenerationRequest, Message, Stats, turn_stats

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
MAX_RESULT_CHARS = 2 << 20  # a tool's result, in characters: some 500,000 tokens, more than a context window holds
STOP_POLL_S = 0.1  # how often a call's wait looks whether the user stopped the answer (Ctrl-C)

Runner = Callable[[dict[str, Any], float, Callable[[], bool]], str]  # (args, timeout, stopped) -> the result


class CallStopped(Exception):
    """A call the user stopped (Ctrl-C while it ran): abandoned, its result never read, its round dropped."""


@dataclass(frozen=True)
class ToolResult:
    """What a call returned (or that the user declined it)."""

    call: ToolCall
    text: str
    declined: bool = False


class Toolbox:
    """The tools of one run or chat, from Python files and MCP servers, callable by name."""

    def __init__(self, warn: Callable[[str], None] = lambda text: None) -> None:
        self.warn = warn  # where a warning goes as the tools close (an MCP server whose close failed)
        self._specs: tuple[ToolSpec, ...] = ()
        self._runners: dict[str, Runner] = {}
        self._servers: list[Any] = []
        self._of: dict[str, Any] = {}  # an MCP tool's server, by the tool's name
        self._source: dict[str, str] = {}  # where each tool comes from: "mcp: LABEL" or "functions: FILE"
        self._secrets: dict[str, str] = {}  # what MCP config files give their servers (env, headers), redacted too
        self.running: set[threading.Thread] = set()  # Python tools' calls still running (one past its timeout too)
        self.left_out: list[str] = []  # warnings: the MCP tools not offered (a name a request could not carry)

    @property
    def had_tools(self) -> bool:
        """Whether the tools' sources offered any at all (an MCP server may list none)."""
        return bool(self._specs)

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """The tools the model may call: all of them but those of an MCP server that stopped."""
        return tuple(s for s in self._specs if not getattr(self._of.get(s.name), "gone", False))

    @classmethod
    def open(cls, functions: Sequence[Path | str], servers: list[str],
             warn: Callable[[str], None] = lambda text: None) -> Toolbox:
        """Load the files and start the servers (closing what started if any fails); `warn` says what goes wrong
        as they close."""
        from localgen.tools import functions as fn_source

        box = cls(warn)
        try:
            for path in map(Path, functions):
                for spec, fn in fn_source.load(path):
                    box._add(spec, _python_runner(spec.name, fn, box.running), f"functions: {path.name}")
            from localgen.tools.mcpconfig import targets

            for target in targets(servers):
                from localgen.tools.mcp import McpServer

                box._secrets.update({**target.env, **target.headers})
                for key, value in target.headers.items():  # "Bearer TOKEN": the token alone is a secret too
                    scheme, _, token = value.partition(" ")
                    if token and scheme.isalpha():
                        box._secrets[f"{key} token"] = token
                server = McpServer(target)
                box._servers.append(server)
                box.left_out += server.left_out
                for spec in server.tools:
                    runner = _mcp_runner(server, spec.name)
                    if spec.name in box._runners and target.named:  # two servers of a config file: as Claude
                        # Desktop does, both kept, this one's under its server's name (server_tool)
                        spec = dataclasses.replace(spec, name=_qualified(server.label, spec.name, box._runners))
                    box._add(spec, runner, f"mcp: {server.label}")
                    box._of[spec.name] = server
        except BaseException:
            box.close()
            raise
        return box

    def _add(self, spec: ToolSpec, runner: Runner, source: str) -> None:
        if spec.name in self._runners:
            raise ToolError(f"two tools are named {spec.name!r} ({self._source[spec.name]}; {source})")
        self._specs += (spec,)
        self._runners[spec.name] = runner
        self._source[spec.name] = source

    def source(self, name: str) -> str | None:
        """Where a tool comes from ("mcp: LABEL", "functions: FILE"); None for a name that was never a tool."""
        return self._source.get(name)

    def call(self, call: ToolCall, timeout: float, stopped: Callable[[], bool] = lambda: False) -> str:
        """Run a checked call; its result with secrets from the environment taken out (a ToolError's message
        too: a failure may quote a key). CallStopped once `stopped()` (the call is abandoned, as one past its
        timeout is)."""
        try:
            check_call(call, self.specs)
            text = mended(self._runners[call.name](call.args, timeout, stopped))
        except ToolError as e:  # (a path not UTF-8 in its words too)
            e.message = redact(mended(e.message), self._secrets)
            raise
        if len(text) > MAX_RESULT_CHARS:  # said here, by name, before the template and tokenizer spend on it
            raise ToolError(f"{call.name} returned {len(text):,} characters, more than the model can read "
                            f"(at most {MAX_RESULT_CHARS:,})")
        return redact(text, self._secrets)

    def close(self) -> None:
        """Stop the MCP servers, all at once: each may wait seconds for its process to end (one stuck in a call
        too), and ten of them one after the other held an exit for twenty. Each close is bounded (tools/mcp.py);
        an interrupt here (a second Ctrl-C) stops the wait, the rest closing on their daemon threads. A close that
        fails (an SDK error at shutdown) is one warning naming its server, never its thread's traceback."""
        servers, self._servers = list(self._servers), []
        if not servers:
            return
        from localgen.tools.mcp import _why

        failed: list[str] = []

        def close(server: Any) -> None:
            try:
                server.close()
            except Exception as e:  # said in one line, not as threading.excepthook's traceback on stderr
                failed.append(f"the MCP server {server.label} did not close cleanly: {_why(e)}")

        closing = [threading.Thread(target=close, args=(server,), name=f"mcp close {server.label}", daemon=True)
                   for server in servers]
        for thread in closing:
            thread.start()
        for thread in closing:
            thread.join()
        for text in failed:
            self.warn(text)


def _python_runner(name: str, fn: Callable[..., Any],
                   running: set[threading.Thread]) -> Runner:
    import asyncio
    import inspect

    from localgen.tools.functions import abandon, call_args, positional, printing_to_stderr, tools_running

    def run(args: dict[str, Any], timeout: float, stopped: Callable[[], bool]) -> str:
        box: dict[str, Any] = {}
        first, args = positional(fn, call_args(fn, args))

        def target() -> None:
            try:
                try:
                    value = fn(*first, **args)
                    if inspect.iscoroutine(value):  # an async def: its body runs here, on a loop of this thread
                        value = asyncio.run(value)
                    box["value"] = value
                except BaseException as e:  # the tool's own failure, reported as one line
                    box["error"] = e
            except BaseException:  # the stop of a call past its timeout, come as it ended: nobody waits for it
                pass
            finally:
                running.discard(threading.current_thread())

        with tools_running():  # what the tool prints: shown on stderr, never in the answer
            worker = threading.Thread(target=printing_to_stderr(target), name=f"tool {name}", daemon=True)
            running.add(worker)
            worker.start()
            try:
                late = not _waited(worker, timeout, stopped)
            finally:  # past its timeout, stopped by the user, or a second Ctrl-C raised in the wait: stopped as
                if worker.is_alive():  # soon as it runs Python code again, and muted (never on stdout)
                    abandon(worker)
        if late and stopped():
            raise CallStopped(name)
        if late:
            raise ToolError(f"{name} did not finish within {timeout:g} s (--tool-timeout)")
        if "error" in box:
            e = box["error"]
            raise ToolError(f"{name} failed: {type(e).__name__}: {e}")
        return _as_text(name, box.get("value"))

    return run


def _as_text(name: str, value: Any) -> str:
    """A function's result as the model reads it: a string as it is, JSON's own types as JSON (a NaN or an
    infinity as null, as JavaScript's JSON.stringify and pydantic write them: `NaN` is no JSON), anything else
    (a set, an object, a cycle) as its str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple, int, float, bool)) or value is None:
        try:
            return json.dumps(_finite(value, set()), ensure_ascii=False, default=str, allow_nan=False)
        except (TypeError, ValueError, RecursionError):  # a cycle, keys that are not strings
            pass
    try:
        return str(value)
    except Exception as e:  # the value's own __str__ failed: one line, not a traceback
        raise ToolError(f"{name} returned a {type(value).__name__} that cannot be shown as text: "
                        f"{type(e).__name__}: {e}") from None


def _finite(value: Any, within: set[int]) -> Any:
    """`value` with each float that is NaN or infinite, in it at any depth (dicts, lists, tuples), as None; a
    ValueError for a cycle (`within`: the containers around this one)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if not isinstance(value, (dict, list, tuple)):
        return value
    if id(value) in within:
        raise ValueError("a cycle")
    within.add(id(value))
    try:
        if isinstance(value, dict):
            return {k: _finite(v, within) for k, v in value.items()}
        return [_finite(v, within) for v in value]
    finally:
        within.discard(id(value))


def _mcp_runner(server: Any, name: str) -> Runner:
    """A call to the server's tool `name` (offered to the model as its own name, or as server_tool), waited for on
    a thread of its own, so that the user's stop abandons it at once (the server's answer, when it comes, is
    dropped; the call ends at its timeout anyway)."""

    def run(args: dict[str, Any], timeout: float, stopped: Callable[[], bool]) -> str:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = str(server.call(name, args, timeout))
            except BaseException as e:  # (a ToolError, said by the caller)
                box["error"] = e

        waiter = threading.Thread(target=target, name=f"mcp call {name}", daemon=True)
        waiter.start()
        if not _waited(waiter, timeout + 5, stopped):  # (the call's own timeout ends it first)
            if stopped():
                raise CallStopped(name)
            raise ToolError(f"the MCP server {server.label} did not answer within {timeout:g} s (calling {name})")
        if "error" in box:
            raise box["error"]
        return str(box["value"])

    return run


def _waited(thread: threading.Thread, timeout: float, stopped: Callable[[], bool]) -> bool:
    """Wait for a call's thread for at most `timeout` seconds, in short slices so that the user's stop is seen
    at once: True when it ended."""
    import time

    deadline = time.monotonic() + timeout
    while thread.is_alive() and not stopped():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        thread.join(min(STOP_POLL_S, left))
    return not thread.is_alive()


def _qualified(label: str, name: str, taken: Any = ()) -> str:
    """A tool's name with its server's in front (server_tool, as llama-server names them), in the characters a
    tool's name may hold, at most 64 of them; where that name is `taken` already (another tool's, or labels that
    differ only past the cut), a counter after it: server_tool_2, _3, ..."""
    from localgen.tools.spec import NAME_CHARS

    both = "".join(c if c in NAME_CHARS else "_" for c in f"{label}_{name}")
    free, n = both[:64], 1
    while free in taken:
        n += 1
        free = f"{both[:64 - len(str(n)) - 1]}_{n}"
    return free


def redact(text: str, more: dict[str, str] | None = None) -> str:
    """The text with the values of secret-looking environment variables (keys, tokens, passwords) replaced:
    this process's, and `more` (what an MCP config file gives its servers: their env and headers)."""
    for key, value in [*os.environ.items(), *(more or {}).items()]:
        if len(value) >= 8 and SECRET_NAME.search(key) and value in text:
            text = text.replace(value, f"[{key} redacted]")
    return text


@dataclass
class Turn:
    """What one prompt produced: the answer, its reasoning, each call with its result, the messages to add
    to the conversation, and the generations (for stats)."""

    text: str = ""
    reasoning: str = ""
    results: list[ToolResult] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    generations: list[Any] = field(default_factory=list)

    def step_stats(self) -> list[Stats]:
        """Each round's stats, in order (a round closed before it began has none)."""
        return [s for s in (getattr(g, "stats", None) for g in self.generations) if s is not None]

    def stats(self) -> Stats | None:
        """The turn's stats over all its rounds (types.turn_stats); None before any generation ended."""
        steps = self.step_stats()
        return turn_stats(steps) if steps else None


def run_turn(backend: Any, request: GenerationRequest, plan: ToolPlan | None, toolbox: Toolbox | None,
             approve: Callable[[ToolCall], bool], show: Callable[[Any], None], steps: int, timeout: float,
             template: str | None, split_reasoning: bool = True, first: ToolPlan | None = None,
             turn: Turn | None = None, stopped: Callable[[], bool] = lambda: False) -> Turn:
    """Generate for `request` (its messages end with the user's), running tools until a plain answer. `show`
    sees every Piece, ToolCall and ToolResult as it happens. `first`: the plan of the first round, when it
    differs (a call forced by --tool-choice). A repeated call ends its round and runs once; a round that
    only repeats calls of earlier rounds (whose results the model has) is dropped, and the next round must
    answer (a small model asks for the same result again and again otherwise). Into `turn` go
    only settled messages: a round's calls with all their results, and an answer, also one cut short (an
    error, an interrupt, or `stopped()`: its calls are then not run)."""
    turn = Turn() if turn is None else turn
    rounds = plan
    made: set[tuple[str, str]] = set()  # the calls of earlier rounds
    answering = False
    for step in range(steps + 1):
        plan = first if step == 0 and first is not None else rounds
        if answering and plan is not None:
            plan = answer_plan(plan)
        messages = (*request.messages, *turn.messages)
        req = dataclasses.replace(request, messages=messages)
        if plan is not None:
            req = with_tools(plan, req)
        stream = answer_stream(plan, template, req.template_args, split_reasoning)
        try:
            gen = backend.generate(req)
        except ContextOverflowError as e:
            if not turn.results:
                raise
            raise _too_long(turn.results, e) from None
        turn.generations.append(gen)
        try:
            _stream_round(gen, stream, show, made)
        except BaseException:
            stream.finish()
            if stream.content or stream.reasoning:  # what was said is kept by a caller that keeps partial answers
                _answer(turn, stream)
            raise
        turn.reasoning += stream.reasoning
        if not stream.calls or stopped():
            _answer(turn, stream)
            return turn
        if toolbox is None:
            raise ToolError("the model called a tool, but none were given")
        calls = [c for c in stream.calls if (c.name, c.arguments) not in made]  # the stream gives each once
        if not calls:
            answering = True
            continue
        if step == steps:  # `steps` rounds of calls ran: this generation had to answer, and its calls never run
            break
        made.update((c.name, c.arguments) for c in calls)
        settled: list[Message] = [{**_said(stream), "tool_calls": [c.to_openai() for c in calls]}]
        done: list[ToolResult] = []
        for call in calls:
            check_call(call, toolbox.specs)
            if approve(call):
                try:
                    result = ToolResult(call, toolbox.call(call, timeout, stopped))
                except CallStopped:  # the user stopped the answer while it ran: this round is dropped
                    return turn
            else:
                result = ToolResult(call, "The user declined to run this tool call.", declined=True)
            show(result)
            done.append(result)
            settled.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result.text})
        turn.results += done
        turn.messages += settled
        if stopped():
            return turn
    raise ToolError(f"the model was still calling tools after {steps} rounds", hint="raise --tool-steps")


def _too_long(results: list[ToolResult], e: ContextOverflowError) -> ToolError:
    """A prompt past the window once the calls' results were added: the results named, as a tool's failure (the
    chat takes the question back and goes on), not as a prompt the user could shorten."""
    names = ", ".join(dict.fromkeys(r.call.name for r in results))
    size = sum(len(r.text) for r in results)
    return ToolError(f"the result of {names} ({size:,} characters) is too long for the context window: "
                     f"{e.message}", hint="ask for less of it, or restart with a larger --ctx")


def _stream_round(gen: Any, stream: Any, show: Callable[[Any], None], made: set[tuple[str, str]]) -> None:
    """Show one round's events as they come. A call the round (or an earlier one: `made`) already made,
    made again, stops the generation there (a small model repeats its call until the tokens run out) and is
    not shown."""

    def events() -> Any:
        for chunk in gen:
            yield from stream.feed(chunk.text)
            if stream.repeats:
                gen.cancel()
        yield from stream.finish()

    for event in events():
        if isinstance(event, ToolCall) and (event.name, event.arguments) in made:
            gen.cancel()
            continue
        show(event)


def _said(stream: Any) -> Message:
    """The assistant message of a round: its content, and its reasoning apart (templates that show earlier
    reasoning read `reasoning_content`)."""
    message: Message = {"role": "assistant", "content": stream.content}
    if stream.reasoning:
        message["reasoning_content"] = stream.reasoning
    return message


def _answer(turn: Turn, stream: Any) -> None:
    turn.text = stream.content
    turn.messages.append(_said(stream))


def plan_for(template: str | None, toolbox: Toolbox | None, choice: str = "auto") -> ToolPlan | None:
    """The plan for a run or chat with these tools (None without tools). `choice`: --tool-choice's word:
    auto, required, none, or a tool's name."""
    if toolbox is None or not toolbox.specs:
        return None
    from localgen.engine.grammar import check_grammar_size, grammar_limit

    specs = toolbox.specs
    try:
        plan = make_plan(template, specs, named_choice(choice), True)
        if plan.constraint is not None:  # the calls' frame around the schemas' rules, bounded as serve's tools are
            check_grammar_size(plan.constraint.grammar, "the tools' grammar", grammar_limit(len(specs) + 1))
        return plan
    except GrammarError as e:  # a tool's schema that cannot become a grammar: the tool and where it is from named
        if e.part is None or e.part >= len(specs):
            raise
        name = specs[e.part].name
        source = toolbox.source(name) or ""
        who = f"the MCP server {source[5:]}'s tool {name}" if source.startswith("mcp: ") else \
            f"the tool {name} ({source.removeprefix('functions: ')})" if source else f"the tool {name}"
        raise GrammarError(f"{who}: {e.message}", e.hint) from None


def named_choice(choice: str) -> Any:
    """--tool-choice's word as a request's tool_choice."""
    return choice if choice in ("auto", "required", "none") else {"type": "function", "function": {"name": choice}}

