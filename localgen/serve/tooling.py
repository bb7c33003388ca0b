"""Tools and reasoning in both APIs: a request's `tools` and `tool_choice` become a ToolPlan (the grammar
built off the event loop, bounded as response_format's is), and the answer goes through the one stream stage
(tools/stream.py) before either API shapes it."""

from __future__ import annotations

import asyncio
from typing import Any

from localgen.errors import GrammarError, LocalgenError
from localgen.serve.apierror import HTTPError
from localgen.serve.schema import bounded_schema, check_grammar_size
from localgen.serve.served import Served
from localgen.tools.plan import ToolPlan, answer_stream, make_plan, with_tools
from localgen.tools.stream import AnswerStream
from localgen.types import GenerationRequest

# Tools in one request. Each costs about 300 characters of grammar (under MAX_GRAMMAR_CHARS), a few dozen
# tokens of prompt, and a branch the grammar follows at each token; even 1,000 build quickly, so the build
# is bounded (docs/benchmarks.md, Tools).
MAX_TOOLS = 256


async def tool_plan(worker: Served, tools: Any, choice: Any, parallel: Any) -> ToolPlan | None:
    """The request's tools for this model (None without tools), or a 400 that says what is wrong."""
    from localgen.tools.spec import parse_tools

    if tools in (None, []):
        if choice not in (None, "auto", "none"):
            raise HTTPError(400, "tool_choice needs tools", param="tool_choice")
        return None
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise HTTPError(400, "parallel_tool_calls must be true or false", param="parallel_tool_calls")
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        raise HTTPError(400, f"`tools` holds {len(tools):,} tools; at most {MAX_TOOLS:,} in one request",
                        param="tools")
    bounded_schema(tools, "tools", "the tools' schemas")
    try:
        specs = parse_tools(tools)
        plan = await asyncio.to_thread(make_plan, worker.ref.summary.chat_template, specs, choice, parallel)
    except RecursionError:
        raise HTTPError(400, "a tool schema nests or refers to itself too deeply", param="tools") from None
    except GrammarError as e:  # a tool's schema that cannot become a grammar: the tool named
        at = e.part if e.part is not None and isinstance(tools, list) and e.part < len(tools) else None
        raise HTTPError(400, e.message, param="tools" if at is None else f"tools[{at}].function.parameters") from None
    except LocalgenError as e:
        raise HTTPError(400, e.message, param="tool_choice" if "tool_choice" in e.message else "tools") from None
    if plan.constraint is not None:
        check_grammar_size(plan.constraint.grammar, "tools", "the tools' schemas")
    return plan


def checked_tool(tool: dict[str, Any], i: int, schema_field: str, required: bool = False) -> None:
    """A tool of an API without OpenAI's function wrapper (Anthropic's, the Responses API's): its name and
    schema checked, or a 400 in the request's own field names (tool_plan checks the rest)."""
    from localgen.tools.spec import check_name, check_schema

    bounded_schema(tool, "tools", "the tools' schemas", at=i)
    try:
        name = check_name(tool.get("name"), f"tools[{i}].name")
        if required or tool.get(schema_field) is not None:
            check_schema(tool.get(schema_field), f"tools[{i}] ({name})", schema_field)
    except RecursionError:
        raise HTTPError(400, "a tool schema nests or refers to itself too deeply", param="tools") from None
    except LocalgenError as e:
        raise HTTPError(400, e.message, param=f"tools[{i}]") from None


def apply_plan(plan: ToolPlan | None, request: GenerationRequest) -> GenerationRequest:
    """The request with its tools in the template (or system prompt) and the grammar."""
    if plan is None:
        return request
    try:
        return with_tools(plan, request)
    except LocalgenError as e:
        raise HTTPError(400, e.message, param="tools") from None


def stream_for(worker: Served, plan: ToolPlan | None, request: GenerationRequest,
               split_reasoning: bool = True) -> AnswerStream:
    """The stage that reads this request's answer."""
    return answer_stream(plan, worker.ref.summary.chat_template, request.template_args, split_reasoning,
                         request.prefill)
