"""Chat templates from GGUF files, rendered as untrusted code: an immutable Jinja sandbox, size caps on
string and list arithmetic, a cap on the output, and a time limit enforced inside the render."""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import sys
import time
from types import FrameType
from typing import Any

from localgen.errors import TemplateError
from localgen.types import final_text

TIME_LIMIT_S = 2.0
MAX_OUTPUT = 4 << 20  # characters; a prompt this long would not fit any context anyway
MAX_SEQUENCE = 1 << 20  # result size of `*` on strings and lists
# size of any string or list a template builds (`~`, `+`, `%`, format, join, replace): a message's content is
# concatenated whole, so the bound is the output's; a template doubling a string stops at it, not at 1 GB
MAX_BUILT = MAX_OUTPUT
# Put after the text of a message to be continued, to find where the template wrote it: no template writes it
# itself, and it has nothing a template would strip, escape or split on.
_MARK = "LOCALGENCONTINUESHERE7c1f"


MAX_WIDTH = 100_000  # widths, paddings and precisions in formats and string methods
MAX_INT_BITS = 1 << 16  # results of ** and * on integers


class _Timeout(Exception):
    pass


def _check_built(size: int, what: str = "string") -> None:
    """Refuse a string or list of `size` before it is built."""
    if size > MAX_BUILT:
        from jinja2.exceptions import SecurityError

        raise SecurityError(f"{what} too long ({size:,} > {MAX_BUILT:,})")


def _bounded_concat(seq: Any) -> str:
    """`a ~ b ~ ...` (jinja's str_join), refused before a result past MAX_BUILT is built."""
    parts = [str(x) for x in seq]
    _check_built(sum(map(len, parts)))
    return "".join(parts)


def _placeholders_bound(fmt: str, args: Any, marker: str) -> int:
    """An upper bound of `fmt % args` or `fmt.format(*args)`'s length: each placeholder (at most one per
    `marker` in fmt) filled by the longest argument (widths are capped apart)."""
    values = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, (tuple, list)) \
        else [args]
    longest = max((len(v) if isinstance(v, str) else 64 for v in values), default=0)
    return len(fmt) + fmt.count(marker) * longest


def _check_join(sep: str, items: Any) -> list[Any]:
    """`sep.join(items)` or `items|join(sep)`: the items listed and their total refused past MAX_BUILT."""
    listed = list(items)
    _check_built(sum(len(x) if isinstance(x, str) else 64 for x in listed) + len(sep) * len(listed))
    return listed


def _check_percent_format(fmt: str, args: Any) -> None:
    """`fmt % args`: refuse widths or precisions past MAX_WIDTH (they allocate that many characters)."""
    import re

    from jinja2.exceptions import SecurityError

    values = args if isinstance(args, tuple) else (args,)
    for m in re.finditer(r"%[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?", fmt):
        for g in m.groups():
            if g is None:
                continue
            n = max((abs(v) for v in values if isinstance(v, int)), default=0) if g == "*" else int(g)
            if n > MAX_WIDTH:
                raise SecurityError("format width too large")


def _check_brace_format(fmt: str) -> None:
    """`fmt.format(...)`: the same for the format specs of {} fields."""
    import re
    import string

    from jinja2.exceptions import SecurityError

    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format raises the same error itself
    for _literal, _name, spec, _conv in fields:
        if spec and any(int(d) > MAX_WIDTH for d in re.findall(r"\d+", spec)):
            raise SecurityError("format width too large")


def _capped(name: str, fn: Any) -> Any:
    """A string filter whose numeric arguments may not exceed MAX_WIDTH."""
    def wrapper(value: Any, *args: Any, **kwargs: Any) -> Any:
        from jinja2.exceptions import SecurityError

        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_WIDTH:
                raise SecurityError(f"{name} width too large")
        return fn(value, *args, **kwargs)

    return wrapper


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """Hugging Face's tojson: plain json.dumps (no HTML escaping), non-ASCII kept."""
    if isinstance(indent, int) and indent > MAX_WIDTH:
        from jinja2.exceptions import SecurityError

        raise SecurityError("tojson indent too large")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _generation_tag() -> Any:
    """HF's `{% generation %}...{% endgeneration %}` (marks assistant text for training masks): renders its
    body, as transformers and llama-cpp-python do."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}  # noqa: RUF012 (jinja's API)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    return GenerationTag


def _sandbox_class() -> Any:
    """The immutable sandbox with caps on what a template's operators and string methods may allocate."""
    import jinja2.sandbox
    from jinja2.exceptions import SecurityError

    class Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%", "+"})
        code_generator_class = _bounded_code_generator()
        bounded_concat = staticmethod(_bounded_concat)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "%":
                if isinstance(left, str):
                    _check_percent_format(left, right)
                    _check_built(_placeholders_bound(left, right, "%"))
                return left % right
            if operator == "+":
                if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                    _check_built(len(left) + len(right), "string" if isinstance(left, str) else "list")
                return left + right
            ints = isinstance(left, int) and isinstance(right, int)
            if operator == "**":
                if isinstance(right, (int, float)) and abs(right) > 64:
                    raise SecurityError("exponent too large")
                if ints and right > 0 and abs(left) > 1 and left.bit_length() * right > MAX_INT_BITS:
                    raise SecurityError("power too large")
                return left**right
            if ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise SecurityError("product too large")
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_SEQUENCE:
                    raise SecurityError("sequence repetition too large")
            return left * right

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)  # str.format and format_map, at attribute access
            if wrapped is None:
                return None
            fmt = value.__self__
            _check_brace_format(fmt)

            def bounded(*args: Any, **kwargs: Any) -> Any:
                _check_built(_placeholders_bound(fmt, [*args, *kwargs.values()], "{"))
                return wrapped(*args, **kwargs)

            return bounded

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, str) and getattr(__obj, "__name__", "") in ("center", "ljust", "rjust", "zfill",
                                                                             "expandtabs"):
                _capped(__obj.__name__, lambda v, *a, **k: None)(owner, *args, **kwargs)
            name = getattr(__obj, "__name__", "")
            if isinstance(owner, str) and name == "join" and args:
                args = (_check_join(owner, args[0]), *args[1:])
            elif isinstance(owner, str) and name == "replace" and len(args) >= 2 and all(
                    isinstance(a, str) for a in args[:2]):
                count = owner.count(args[0]) if args[0] else len(owner) + 1
                if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                    count = min(count, args[2])
                _check_built(len(owner) + count * max(0, len(args[1]) - len(args[0])))
            return super().call(__context, __obj, *args, **kwargs)

    return Sandbox


def _bounded_code_generator() -> Any:
    """Jinja's code generator with `~` compiled to the environment's bounded_concat (the sandbox cannot
    intercept it: it is not a binary operator there)."""
    from jinja2.compiler import CodeGenerator

    class Bounded(CodeGenerator):
        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    return Bounded


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    """One sandboxed environment for every template (its filters are pure; Jinja renders concurrently)."""
    env = _sandbox_class()(trim_blocks=True, lstrip_blocks=True,
                           extensions=["jinja2.ext.loopcontrols", _generation_tag()])
    env.policies["json.dumps_kwargs"] = {"ensure_ascii": False}
    env.filters["tojson"] = _tojson
    for name in ("center", "indent", "wordwrap", "truncate"):
        env.filters[name] = _capped(name, env.filters[name])
    join = env.filters["join"]

    def join_filter(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> Any:
        if attribute is None:
            value = _check_join(str(d), value)
        return join(eval_ctx, value, d, attribute)

    env.filters["join"] = functools.update_wrapper(join_filter, join)
    percent = env.filters["format"]

    def format_filter(value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, str):
            _check_percent_format(value, args)
        return percent(value, *args, **kwargs)

    env.filters["format"] = format_filter
    return env


@functools.lru_cache(maxsize=16)
def _compiled(source: str) -> Any:
    """A template's source compiled once per process: the engine's template and the answer stage's look at
    the same model's (tools/stream.py thinking_opened_by), and serve's models keep theirs."""
    return _environment().from_string(source)


class ChatTemplate:
    """A compiled GGUF chat template. Construction compiles it; render() runs it under the limits."""

    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:

        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _compiled(source)
        except Exception as e:  # compiling untrusted source: a syntax error, or anything else it provokes
            raise TemplateError(
                f"the model's chat template is broken: {_one_line(e)}",
                hint="use --raw to send the prompt as plain text",
            ) from None

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               continue_final: bool = False, **extra: Any) -> str:
        """Render a conversation to prompt text, or raise TemplateError. `continue_final`: a final assistant
        message's text is left open for the model to go on from (see `continued`)."""
        text = final_text(messages) if continue_final else None
        if text is None:
            return self._render(messages, add_generation_prompt, extra)
        if not text:  # an empty final message: the answer starts where it would have
            return self._render(messages[:-1], True, extra)
        return self.continued(messages, text, extra)

    def continued(self, messages: list[dict[str, Any]], text: str, extra: dict[str, Any]) -> str:
        """The conversation up to its final assistant message's text, without the end of turn the template
        writes after it (Hugging Face's continue_final_message): rendered with a mark after the text, and cut
        there, so that what the template writes around an answer (Qwen3's closed thinking block, a channel)
        stays. A template that drops or rewrites the mark: the rest of the conversation with the generation
        prompt, and the text after it (llama-server's way)."""
        last = {**messages[-1], "content": text + _MARK}
        with contextlib.suppress(TemplateError):
            rendered = self._render([*messages[:-1], last], False, extra)
            at = rendered.rfind(_MARK)
            if at >= 0:
                return rendered[:at]
        return self._render(messages[:-1], True, extra) + text

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, extra: dict[str, Any]) -> str:
        import jinja2

        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        def strftime_now(fmt: str) -> str:
            return datetime.datetime.now().strftime(fmt)

        context = {
            "messages": messages,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_generation_prompt": add_generation_prompt,
            "raise_exception": raise_exception,
            "strftime_now": strftime_now,
            **extra,
        }
        deadline = time.monotonic() + TIME_LIMIT_S

        def tracer(frame: FrameType, event: str, arg: Any) -> Any:
            if time.monotonic() > deadline:
                raise _Timeout
            return tracer

        out: list[str] = []
        size = 0
        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            for piece in self._template.generate(context):
                size += len(piece)
                if size > MAX_OUTPUT:
                    raise TemplateError("the model's chat template produced an absurdly long prompt")
                out.append(piece)
        except _Timeout:
            raise TemplateError(
                f"the model's chat template did not finish within {TIME_LIMIT_S:g} s",
                hint="the template may be hostile; use --raw to send the prompt as plain text",
            ) from None
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"the model's chat template tried something unsafe: {_one_line(e)}") from None
        except RecursionError:
            raise TemplateError("the model's chat template recursed without end") from None
        except MemoryError:
            raise TemplateError("the model's chat template tried to allocate too much memory") from None
        except Exception as e:  # the template is untrusted code: whatever it raises is its fault
            raise TemplateError(
                f"the model's chat template failed: {_one_line(e)}",
                hint="use --raw to send the prompt as plain text",
            ) from None
        finally:
            sys.settrace(previous)
        return "".join(out)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
