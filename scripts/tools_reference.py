#!/usr/bin/env python3
"""llama-server's tool calls (`--jinja`) against localgen serve's, for the same requests, model, template and
greedy settings.

Starts llama-server (built from the same vendored llama.cpp: ../shared/tools/build-llama-bench --server)
and `localgen serve` on SmolLM2 135M with Qwen2.5's chat template (tests/data/templates: SmolLM2's own
template renders no tools), sends each request of CASES to both through the `openai` client, and prints
the parsed tool calls (names and arguments) side by side, and whether the prompts the two render are the
same text. With --write it saves llama-server's prompts and calls to tests/data/llama_server_tools.json,
which tests/test_tools_serve.py compares localgen against without building llama.cpp.

Greedy text at a near-tie can flip with the batch a prompt was evaluated in (a prefix reused from an
earlier request's cache, or not). So each side answers every request twice: llama-server with and without
`cache_prompt`, localgen in both orders. A case whose calls differ between two runs of the same side is
reported as unstable and left out of the fixture; the others must match.

usage: scripts/tools_reference.py --llama-server PATH/llama-server [--write]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "data" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
FIXTURE = ROOT / "tests" / "data" / "llama_server_tools.json"
MODEL = "smollm2:135m"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                         "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                                                        "required": ["zone"]}}}
INTEGER = {"type": "integer"}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                        "parameters": {"type": "object", "properties": {"a": INTEGER, "b": INTEGER},
                                                       "required": ["a", "b"]}}}


def _call(i: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


ASK_PARIS = {"role": "user", "content": "Use a <tool_call> to get the weather in Paris."}
ROUND_TRIP = [ASK_PARIS,
              {"role": "assistant", "content": "", "tool_calls": [_call(1, "get_weather", {"city": "Paris"})]},
              {"role": "tool", "tool_call_id": "call_1", "content": "It is 21 C and sunny in Paris."}]
THEN = [*ROUND_TRIP, {"role": "assistant", "content": "It is 21 C and sunny in Paris."}]
# SmolLM2 135M calls a tool when asked for a <tool_call> in so many words; what it answers otherwise is text,
# and then both sides must find no call in it.
CASES: dict[str, dict[str, Any]] = {
    "parallel calls": {"messages": [ASK_PARIS], "tools": [WEATHER, TIME, ADD]},
    "system prompt, one tool": {"messages": [{"role": "system", "content": "You call tools with <tool_call>."},
                                             ASK_PARIS], "tools": [WEATHER]},
    "tool result back (role tool)": {"messages": ROUND_TRIP, "tools": [WEATHER, TIME, ADD]},
    "call after a round trip": {"messages": [*THEN, {"role": "user", "content":
                                                     "Use a <tool_call> to get the weather in Rome."}],
                                "tools": [WEATHER, TIME, ADD]},
    "another tool after a round trip": {"messages": [*THEN, {"role": "user", "content":
                                                             "Use a <tool_call> to add 2 and 3."}],
                                        "tools": [WEATHER, TIME, ADD]},
    "no call (text)": {"messages": [{"role": "user", "content": "Use a <tool_call> to get the weather in Lima."}],
                       "tools": [WEATHER, TIME, ADD]},
}
SETTINGS = {"temperature": 0, "max_tokens": 96}


def calls_of(message: Any) -> list[dict[str, Any]]:
    """The parsed calls of an answer: names and decoded arguments (ids and whitespace are not compared)."""
    return [{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
            for c in (message.tool_calls or [])]


def ask(base_url: str, case: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="none")
    r = client.chat.completions.create(model=MODEL, **case, **SETTINGS, extra_body=extra or {})
    choice = r.choices[0]
    return {"calls": calls_of(choice.message), "finish_reason": choice.finish_reason,
            "content": choice.message.content or ""}


def render(case: dict[str, Any]) -> str:
    """The prompt localgen renders for a request with tools, as its backend does (a call's arguments as an
    object). Qwen2.5's template names neither the BOS nor the EOS token, so none are given."""
    from localgen.engine.local import template_messages
    from localgen.engine.template import ChatTemplate

    return ChatTemplate(TEMPLATE.read_text(), "", "").render(template_messages(case["messages"]), tools=case["tools"])


def main() -> int:
    import harness  # here: tests import this module as scripts.tools_reference, without scripts/ on sys.path

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--llama-server", required=True, type=harness.executable)
    ap.add_argument("--write", action="store_true", help="save llama-server's prompts and calls under tests/data/")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import httpx

    from localgen.models.resolve import resolve

    path = str(resolve(MODEL).path)
    lp, op = harness.free_port(), harness.free_port()
    theirs_cmd = [a.llama_server, "-m", path, "--jinja", "--chat-template-file", str(TEMPLATE), "--port", str(lp),
                  "-c", "2048", "-np", "1", "-t", "2"]
    ours_cmd = [sys.executable, "-m", "localgen", "serve", "-m", MODEL, "--port", str(op), "--chat-template-file",
                str(TEMPLATE), "-np", "2", "--ctx", "2048"]
    with (harness.server(theirs_cmd, f"http://127.0.0.1:{lp}/health", name="llama-server"),
          harness.server(ours_cmd, f"http://127.0.0.1:{op}/health", cwd=ROOT, name="localgen serve")):
        theirs, cached, prompts = {}, {}, {}
        for name, case in CASES.items():
            theirs[name] = ask(f"http://127.0.0.1:{lp}/v1", case, {"cache_prompt": False})
            cached[name] = ask(f"http://127.0.0.1:{lp}/v1", case)
            prompts[name] = httpx.post(f"http://127.0.0.1:{lp}/apply-template", json=case, timeout=60).json()["prompt"]
        first = {name: ask(f"http://127.0.0.1:{op}/v1", case) for name, case in CASES.items()}
        second = {name: ask(f"http://127.0.0.1:{op}/v1", case) for name, case in reversed(CASES.items())}
    same, stable = 0, []
    for name, case in CASES.items():
        prompt_same = render(case) == prompts[name]
        steady = first[name]["calls"] == second[name]["calls"] and theirs[name]["calls"] == cached[name]["calls"]
        match = first[name]["calls"] == theirs[name]["calls"]
        if steady:
            stable.append(name)
            same += match
        print(f"{name}: {'match' if match else 'DIFFER'}{'' if steady else ' (unstable: left out)'}; "
              f"prompt {'the same' if prompt_same else 'DIFFERS'}")
        print(f"  llama-server: {json.dumps(theirs[name]['calls'])} {theirs[name]['finish_reason']}"
              + ("" if cached[name]["calls"] == theirs[name]["calls"] else
                 f"; from its prompt cache: {json.dumps(cached[name]['calls'])}"))
        print(f"  localgen:     {json.dumps(first[name]['calls'])} {first[name]['finish_reason']}"
              + ("" if first[name]["calls"] == second[name]["calls"] else
                 f"; in the other order: {json.dumps(second[name]['calls'])}"))
    print(f"{same}/{len(stable)} stable cases: the same tool calls ({len(CASES) - len(stable)} unstable)")
    if a.write:
        doc = {"model": MODEL, "template": TEMPLATE.name, "settings": SETTINGS,
               "llama_server": "built from llama-cpp-python's vendored llama.cpp by build-llama-bench --server",
               "cases": [{"name": name, "request": case, "prompt": prompts[name], "tool_calls": theirs[name]["calls"],
                          "finish_reason": theirs[name]["finish_reason"]}
                         for name, case in CASES.items() if name in stable]}
        FIXTURE.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {FIXTURE.relative_to(ROOT)}")
    return 0 if same == len(stable) else 1


if __name__ == "__main__":
    raise SystemExit(main())
