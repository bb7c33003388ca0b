"""How each model family writes a tool call, found from its chat template: where a call begins (the
trigger), how to read calls back out of the answer, and a grammar that makes every call valid JSON for its
tool's schema. The grammar is lazy (llama.cpp waits for the trigger, then constrains the rest) unless the
request forces a call (tool_choice required or a named function), when it constrains from the first token.

Families: Hermes/Qwen `<tool_call>{json}</tool_call>`; Llama 3.x `{"name": ..., "parameters": ...}` (after
`<|python_tag|>` or bare); Mistral `[TOOL_CALLS][{...}]` and `[TOOL_CALLS]name[ARGS]{...}`; FunctionGemma
`<start_function_call>call:name{k:<escape>v<escape>}<end_function_call>`; and, for templates that know no
tools, a generic JSON answer ({"tool_call": ...} or {"response": ...}) described in the system prompt, as
llama-server's generic format does."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any

from localgen.tools.spec import ToolCall, ToolSpec


@dataclass(frozen=True)
class Format:
    """One family's tool-call format. `triggers`: literal strings where a call begins in the answer;
    `whole`: the whole answer is one JSON document (generic); `start_only`: a call may only open the answer
    (Llama 3.x JSON, which has no marker of its own)."""

    name: str
    triggers: tuple[str, ...] = ()
    whole: bool = False
    start_only: bool = False
    closes: str | None = None  # the text that ends one call (a call is complete before the answer ends)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The calls in `text` (the answer from the trigger on), and any text that is not a call."""
        return _PARSERS[self.name](text)

    def complete_calls(self, text: str, start: int = 0) -> tuple[list[ToolCall], int]:
        """The calls complete in an answer still being written, for a format whose answer is one document
        (generic: the items of `tool_calls` closed so far; none for the others), read from `start` (0, or
        the position this returned last time, for the text grown since), and where to read on from."""
        if not self.whole:
            return [], start
        items, end = _items(text, _GENERIC_LIST, start)
        return [c for c in (_item_call(v) for v in items) if c is not None], end

    def open_block_calls(self, block: str) -> list[ToolCall]:
        """The calls complete so far in a block not yet closed (hermes: the comma-separated objects of one
        `<tool_call>`, as a parallel grammar allows them; none for the other formats)."""
        if self.name != "hermes":
            return []
        items, _ = _items(block, _HERMES_OPEN)
        return [c for c in (_item_call(v) for v in items) if c is not None]


FORMATS = {
    "hermes": Format("hermes", ("<tool_call>",), closes="</tool_call>"),
    "llama3": Format("llama3", ("<|python_tag|>", '{"name"', '{"type"'), start_only=True),
    "mistral": Format("mistral", ("[TOOL_CALLS]",)),
    "functiongemma": Format("functiongemma", ("<start_function_call>",), closes="<end_function_call>"),
    "generic": Format("generic", whole=True),
}


def detect(template: str | None) -> Format:
    """The format a chat template's source implies (generic when it renders no tools of its own)."""
    src = template or ""
    if "tools" not in src:
        return FORMATS["generic"]
    if "<tool_call>" in src:
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in src:
        return FORMATS["mistral"]
    if "<start_function_call>" in src:
        return FORMATS["functiongemma"]
    if "<|python_tag|>" in src or "ipython" in src:
        return FORMATS["llama3"]
    return FORMATS["generic"]


def generic_system_prompt(tools: tuple[ToolSpec, ...], forced: bool, parallel: bool) -> str:
    """The instructions a template without tools support gets in its system prompt (llama-server's generic
    format says the same in its own words)."""
    listing = json.dumps([t.to_openai()["function"] for t in tools], ensure_ascii=False, indent=2)
    call = ('{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}' if parallel
            else '{"tool_call": {"name": ..., "arguments": {...}}}')
    answer = call if forced else f'either {call} to call a tool, or {{"response": "..."}} to answer the user'
    return (f"You can call these tools:\n{listing}\n\nRespond in JSON: {answer}. "
            "A tool's result comes back in a message with role tool.")


# ---- grammars ---------------------------------------------------------------------------------------------

# llama.cpp's own converter (common/json-schema-to-grammar.cpp, which llama-server uses) lets JSON break
# lines and indent; the bindings' Python port allows one space. Calls follow llama-server's whitespace, so
# that a model writes the same call under both.
SPACE_RULE = r'space ::= | " " | "\n"{1,2} [ \t]{0,20}'


def _fix_space(gbnf: str) -> str:
    """The rules with llama-server's whitespace (their `char` is llama.cpp's already: engine/grammar.py)."""
    return re.sub(r"^space\s*::=.*$", lambda m: SPACE_RULE, gbnf, count=1, flags=re.MULTILINE)


def _literal(text: str) -> str:
    """A GBNF literal for a JSON string (JSON's escapes are GBNF's)."""
    return json.dumps(json.dumps(text))


def _call_rules(tools: tuple[ToolSpec, ...], args_key: str = "arguments") -> str:
    """GBNF for one call to any of `tools` (`tool-json`: {"name": ..., "<args_key>": {...}}), and `string`.
    Each tool's arguments are converted once, under its own rule names (`targs<i>-...`), with the rules
    they share written once: a grammar for N tools grows as N, and builds in time linear in N."""
    from localgen.engine.grammar import schema_rules

    rules, names = schema_rules([*(t.parameters for t in tools), {"type": "string"}], "targs")
    each = "\n".join(
        f'tool-{i} ::= "{{" space "\\"name\\"" space ":" space {_literal(t.name)} space "," space '
        f'{_literal(args_key)} space ":" space {names[i]} space "}}"' for i, t in enumerate(tools))
    return (f'tool-json ::= {" | ".join(f"tool-{i}" for i in range(len(tools)))}\n{each}\n'
            f'{_fix_space(rules)}')


def _hermes(tools: tuple[ToolSpec, ...], parallel: bool) -> str:
    """Hermes/Qwen calls as llama-server's grammar writes them: `<tool_call>`, a newline, then the call
    objects (several, comma-separated, when parallel), whitespace allowed between every two tokens."""
    more = ' (space "," space tool-json)*' if parallel else ""
    return (f'root ::= tool-call space{" (tool-call space)*" if parallel else ""}\n'
            f'tool-call ::= "<tool_call>\\n" space tool-json{more} space "</tool_call>"\n'
            f'{_call_rules(tools)}')


@dataclass(frozen=True)
class Constraint:
    """A grammar and, when lazy, the regex patterns that start it."""

    grammar: str
    triggers: tuple[str, ...] = ()


def constraint(fmt: Format, tools: tuple[ToolSpec, ...], forced: bool, parallel: bool,
               content_allowed: bool = True, calls_allowed: bool = True) -> Constraint | None:
    """The grammar that keeps calls to `tools` valid in `fmt` (None where the format has no JSON body to
    constrain: FunctionGemma's calls are checked after parsing instead). `calls_allowed` False: the generic
    format's answer must be a reply (the loop's last round, after a repeated call)."""
    if fmt.name == "hermes":
        # Lazy from "<tool_call>" and a newline, as llama-server: a model that names the tag in a sentence
        # ("use the <tool_call> function") is not forced into a call.
        return Constraint(_hermes(tools, parallel), () if forced else (re.escape("<tool_call>\n"),))
    if fmt.name == "llama3":
        g = 'root ::= tool-json space' + (' (";" " "? tool-json space)*' if parallel else '') + '\n'
        return Constraint(g + _call_rules(tools, "parameters"), () if forced else (r'^\s*(\{\s*")',))
    if fmt.name == "mistral":
        more = ' ("," space tool-json space)*' if parallel else ""
        return Constraint(f'root ::= "[TOOL_CALLS]" "[" space tool-json space{more} "]" space\n' + _call_rules(tools),
                          () if forced else (re.escape("[TOOL_CALLS]"),))
    if fmt.name == "generic":
        calls = ('"{" space "\\"tool_calls\\"" space ":" space "[" space tool-json space '
                 '("," space tool-json space)* "]" space "}" space' if parallel else
                 '"{" space "\\"tool_call\\"" space ":" space tool-json space "}" space')
        reply = '"{" space "\\"response\\"" space ":" space string "}" space'
        if not calls_allowed:
            root = "reply"
        elif forced or not content_allowed:
            root = "calls"
        else:
            root = "calls | reply"
        return Constraint(f"root ::= {root}\ncalls ::= {calls}\nreply ::= {reply}\n{_call_rules(tools)}")
    return None


# ---- parsers ----------------------------------------------------------------------------------------------

def _call(name: Any, args: Any) -> ToolCall | None:
    if not isinstance(name, str) or not name:
        return None
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


def _objects(text: str) -> list[tuple[int, int, Any]]:
    """Every top-level JSON value in `text` with its span (text between them is skipped)."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while i < len(text):
        j = min((k for k in (text.find("{", i), text.find("[", i)) if k >= 0), default=-1)
        if j < 0:
            break
        try:
            value, end = dec.raw_decode(text, j)
        except ValueError:
            i = j + 1
            continue
        out.append((j, end, value))
        i = end
    return out


_GENERIC_LIST = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[\s*')
_MISTRAL_LIST = re.compile(r'\s*\[\s*')
_SEPARATOR = re.compile(r"\s*,?\s*")  # before an item: a comma after the one before it
_HERMES_OPEN = re.compile(r"\s*<tool_call>\s*")


def _items(text: str, head: re.Pattern[str], start: int = 0) -> tuple[list[Any], int]:
    """The complete items of a JSON array that `head` opens at the start of `text`, also when the text is
    cut off (an answer that reached max_tokens in the middle of its calls), from `start` (0: the array's
    head; else where the last call left off); and where the next item begins."""
    pos = start
    if not pos:
        m = head.match(text)
        if not m:
            return [], 0
        pos = m.end()
    dec, out = json.JSONDecoder(), list[Any]()
    while True:
        sep = _SEPARATOR.match(text, pos)
        try:
            value, end = dec.raw_decode(text, sep.end() if sep else pos)
        except ValueError:  # not written yet (or the array's end)
            return out, pos
        out.append(value)
        pos = end


def _item_call(item: Any) -> ToolCall | None:
    return _call(item.get("name"), item.get("arguments")) if isinstance(item, dict) else None


def _parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    calls: list[ToolCall] = []
    rest, pos = [], 0
    for m in re.finditer(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.DOTALL):
        rest.append(text[pos:m.start()])
        pos = m.end()
        found = [_call(v.get("name"), v.get("arguments", v.get("parameters"))) if isinstance(v, dict) else None
                 for _, _, v in _objects(m.group(1))]  # one object, or several comma-separated (parallel)
        if not found or None in found:
            if calls and not m.group(0).rstrip().endswith("</tool_call>"):
                continue  # a call cut off by max_tokens after whole ones: not text for the user
            rest.append(m.group(0))
        else:
            calls.extend(c for c in found if c is not None)
    rest.append(text[pos:])
    return "".join(rest).strip(), calls


def _parse_llama3(text: str) -> tuple[str, list[ToolCall]]:
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):]
    calls, rest, pos = [], [], 0
    for start, end, value in _objects(body):
        call = _call(value.get("name"), value.get("parameters", value.get("arguments"))) \
            if isinstance(value, dict) else None
        if call is None:
            continue
        rest.append(body[pos:start])
        calls.append(call)
        pos = end
    if not calls:
        return text, []
    tail = body[pos:]
    if tail.strip(" ;\n").startswith("{"):  # a call cut off by max_tokens after whole ones
        tail = ""
    rest.append(tail)
    leftover = "".join(rest).replace(";", " ").strip()
    return leftover, calls


def _parse_mistral(text: str) -> tuple[str, list[ToolCall]]:
    head, _, body = text.partition("[TOOL_CALLS]")
    calls: list[ToolCall] = []
    named = re.match(r"\s*([\w.-]+)\[ARGS\]", body)
    if named:  # the newer form: one or more `name[ARGS]{...}`, each after its own [TOOL_CALLS]
        for m in re.finditer(r"([\w.-]+)\[ARGS\]", body):
            after = body[m.end():]
            objs = _objects(after)
            if objs and not after[:objs[0][0]].strip():
                call = _call(m.group(1), objs[0][2])
                if call:
                    calls.append(call)
        return head.strip(), calls
    for item in _items(body, _MISTRAL_LIST)[0]:  # the array, or as much of it as was written
        call = _item_call(item)
        if call:
            calls.append(call)
    return (head.strip(), calls) if calls else (text, [])


def _gemma_value(raw: str) -> Any:
    raw = raw.strip()
    if raw.startswith("<escape>") and raw.endswith("<escape>"):
        return raw[len("<escape>"):-len("<escape>")]
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _parse_functiongemma(text: str) -> tuple[str, list[ToolCall]]:
    calls, rest, pos = [], [], 0
    for m in re.finditer(r"<start_function_call>\s*call:([\w.-]+)\{(.*?)\}\s*(?:<end_function_call>|$)", text,
                         re.DOTALL):
        rest.append(text[pos:m.start()])
        pos = m.end()
        args = {}
        for km in re.finditer(r"([\w.-]+):(<escape>.*?<escape>|[^,]*)(?:,|$)", m.group(2), re.DOTALL):
            args[km.group(1)] = _gemma_value(km.group(2))
        call = _call(m.group(1), args)
        if call:
            calls.append(call)
    rest.append(text[pos:])
    return "".join(rest).strip(), calls


_ENVELOPE = re.compile(r'\s*\{\s*"(response|tool_calls?)"\s*:\s*')


def _parse_generic(text: str) -> tuple[str, list[ToolCall]]:
    cut = FORMATS["generic"].complete_calls(text)[0]
    try:
        json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError:  # cut off by max_tokens: the calls it completed, if any
        if cut:
            return "", cut
        envelope = _ENVELOPE.match(text)
        if envelope:  # the answer's text as far as it came; a call it cut is left out (no JSON for the user)
            if envelope.group(1) == "tool_call":  # one call, whole where only the envelope's `}` was cut
                call = None
                with contextlib.suppress(ValueError):
                    call = _item_call(json.JSONDecoder().raw_decode(text, envelope.end())[0])
                return "", [call] if call else []
            return (_cut_string(text[envelope.end():]) if envelope.group(1) == "response" else ""), []
        bare = re.sub(r"\s+", "", text)
        if bare and any(key.startswith(bare) for key in ('{"response":', '{"tool_calls":')):
            return "", []  # cut inside its first key
    objs = _objects(text)
    if not objs or not isinstance(objs[0][2], dict):
        return text, []
    doc = objs[0][2]
    if "response" in doc and isinstance(doc["response"], str):
        return doc["response"], []
    many = doc.get("tool_calls")
    items: list[Any] = many if isinstance(many, list) else [doc.get("tool_call")]
    calls = [c for c in (_call(i.get("name"), i.get("arguments")) if isinstance(i, dict) else None
                         for i in items) if c]
    return ("", calls) if calls else (text, [])


def _cut_string(rest: str) -> str:
    """The text of a JSON string that `rest` opens, whole or cut short anywhere (inside an escape too)."""
    if not rest.startswith('"'):
        return ""
    with contextlib.suppress(ValueError):
        whole = json.JSONDecoder().raw_decode(rest)[0]  # (closed, and the document cut after it)
        return whole if isinstance(whole, str) else ""
    for end in range(len(rest), max(0, len(rest) - 6), -1):  # `\u00e` and `\` are an escape cut short
        with contextlib.suppress(ValueError):
            text = str(json.loads(rest[:end] + '"'))
            return text[:-1] if text and "\ud800" <= text[-1] <= "\udbff" else text  # (a pair cut in two)
    return ""


_PARSERS = {"hermes": _parse_hermes, "llama3": _parse_llama3, "mistral": _parse_mistral,
            "functiongemma": _parse_functiongemma, "generic": _parse_generic}
