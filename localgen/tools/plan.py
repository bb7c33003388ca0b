"""A request with tools, made ready for the model: which format its template speaks, what the template
receives, the grammar (lazy or from the first token) that keeps the calls valid, and the stream stage that
reads the answer back. Used the same way by `serve`, `run` and `chat`."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from localgen.errors import GrammarError, ToolError
from localgen.tools.formats import Constraint, Format, constraint, detect, generic_system_prompt
from localgen.tools.spec import ToolSpec

# These three live with the answer stream, which a plain answer (no tools) needs without this module.
from localgen.tools.stream import answer_stream as answer_stream
from localgen.tools.stream import template_of as template_of
from localgen.tools.stream import thinking_opened_by as thinking_opened_by
from localgen.types import GenerationRequest, Message


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools and tool_choice mean for this model. `fmt` None: calls are not looked for."""

    tools: tuple[ToolSpec, ...]
    fmt: Format | None
    choice: str  # auto | required | none | a tool's name
    parallel: bool
    constraint: Constraint | None

    @property
    def forced(self) -> bool:
        """The answer must be a call (required, or a named tool)."""
        return self.choice not in ("auto", "none")


def make_plan(template: str | None, tools: tuple[ToolSpec, ...], choice: Any = "auto",
              parallel: bool = True) -> ToolPlan:
    """Check tool_choice against the tools and build the grammar (a ToolError for what cannot work)."""
    name = check_choice(tools, choice)
    if not tools or name == "none":
        return ToolPlan(tools, None, "none" if tools else "auto", parallel, None)
    fmt = detect(template)
    allowed = tuple(t for t in tools if t.name == name) or tools
    forced = name != "auto"
    try:
        made = constraint(fmt, allowed, forced, parallel)
    except GrammarError as e:  # `part` counts the allowed tools: made to count all of them
        if e.part is None or e.part >= len(allowed):
            raise
        raise GrammarError(e.message, e.hint, part=tools.index(allowed[e.part])) from None
    return ToolPlan(tools, fmt, name, parallel, made)


def check_choice(tools: tuple[ToolSpec, ...], choice: Any = "auto") -> str:
    """tool_choice's word (auto, none, required) or the tool it names; a ToolError when that is no tool here."""
    name = _choice(choice)
    if name not in ("auto", "none", "required") and all(t.name != name for t in tools):
        raise ToolError(f"tool_choice names {name!r}, which is not among the tools")
    return name


def answer_plan(plan: ToolPlan) -> ToolPlan:
    """The plan of a round that must answer, not call: the generic format keeps its tools in the system
    prompt and its JSON, with a grammar that admits only {"response": ...}; other formats get none."""
    if plan.fmt is not None and plan.fmt.name == "generic":
        reply = constraint(plan.fmt, plan.tools, False, plan.parallel, calls_allowed=False)
        return ToolPlan(plan.tools, plan.fmt, "none", plan.parallel, reply)
    return ToolPlan(plan.tools, None, "none", plan.parallel, None)


def _choice(choice: Any) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str) and choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict) \
            and isinstance(choice["function"].get("name"), str):
        return str(choice["function"]["name"])
    raise ToolError('tool_choice must be "auto", "none", "required" or {"type": "function", '
                    '"function": {"name": ...}}')


def with_tools(plan: ToolPlan, request: GenerationRequest) -> GenerationRequest:
    """The request as the model gets it: tools for the template (or, for a template that knows none, in
    the system prompt), and the grammar."""
    if plan.fmt is None:
        return dataclasses.replace(request, messages=plain_history(request.messages)) if plan.tools else request
    sampling = request.sampling
    if plan.constraint is not None:
        if sampling.grammar:
            raise ToolError("a grammar or response_format cannot be combined with tools")
        sampling = dataclasses.replace(sampling, grammar=plan.constraint.grammar,
                                       grammar_triggers=plan.constraint.triggers)
    if plan.fmt.name == "generic":
        return dataclasses.replace(request, messages=_generic_messages(plan, request.messages), sampling=sampling)
    return dataclasses.replace(request, tools=tuple(t.to_openai() for t in plan.tools), sampling=sampling)


def _generic_messages(plan: ToolPlan, messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """Tools described in the system prompt; earlier calls and results written as the JSON the format uses,
    in roles every template takes."""
    rules = generic_system_prompt(plan.tools, plan.forced, plan.parallel)
    out = list(plain_history(messages))
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{rules}"}
    else:
        out.insert(0, {"role": "system", "content": rules})
    return tuple(out)


def plain_history(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """Assistant calls as JSON text, tool results as user messages: for templates without tool roles."""
    names: dict[str, str] = {}
    out: list[Message] = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _args(c["function"].get("arguments"))}
                     for c in m["tool_calls"]]
            names.update({c.get("id", ""): c["function"]["name"] for c in m["tool_calls"]})
            doc = {"tool_calls": calls} if len(calls) > 1 else {"tool_call": calls[0]}
            out.append({"role": "assistant", "content": json.dumps(doc, ensure_ascii=False)})
        elif m["role"] == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id", ""), "tool")
            out.append({"role": "user", "content": json.dumps({"tool_response": {"name": name,
                                                                                 "content": m["content"]}},
                                                              ensure_ascii=False)})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return tuple(out)


def _args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw
