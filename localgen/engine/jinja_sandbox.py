"""The Jinja environment chat templates run in (engine/template.py): immutable and sandboxed, with a size cap on
every string, list or dict a template builds, checked before it is built (so that no single C-level step,
which the render's time limit cannot stop, runs long), bounded widths, integers and batches, a linear `sum`,
and amplifying filters and methods bounded or refused. This module hooks the caps into Jinja (its filters,
operators, calls, string methods and compiled code); the caps and their arithmetic are engine/jinja_caps.py."""

from __future__ import annotations

import functools
import itertools
import json
from typing import Any

from localgen.engine.jinja_caps import (
    FLOAT_FORMATTED,
    MAX_BATCH,
    MAX_INT_BITS,
    MAX_SEQUENCE,
    MAX_WIDTH,
    Measure,
    capped,
    check_brace_format,
    check_built,
    check_join,
    check_text,
    check_value,
    kind_of,
    percent_bound,
)


def _bounded_concat(seq: Any) -> str:
    """`a ~ b ~ ...` (jinja's str_join), refused before a result past MAX_BUILT is built."""
    measure = Measure()
    check_built(sum(measure.text(x) for x in seq))
    return "".join(str(x) for x in seq)


class _TextBuffer(list[str]):
    """Where Jinja collects the text of a block (a macro, a `{% set %}` block, a loop's): refused once past
    MAX_BUILT, as it grows."""

    size = 0

    def append(self, piece: str) -> None:
        self.size += len(piece)
        check_built(self.size)
        super().append(piece)

    def extend(self, pieces: Any) -> None:
        for piece in pieces:
            self.append(piece)


def _bounded_join(pieces: Any) -> str:
    """The text of a block (a macro's, a `{% set %}` block's, a filter block's), refused past MAX_BUILT."""
    listed = list(pieces)
    check_built(sum(len(x) for x in listed))
    return "".join(listed)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """Hugging Face's tojson: plain json.dumps (no HTML escaping), non-ASCII kept; refused before a text past
    MAX_BUILT."""
    if isinstance(indent, int) and indent > MAX_WIDTH:
        from jinja2.exceptions import SecurityError

        raise SecurityError("tojson indent too large")
    width = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    seps = separators if isinstance(separators, (tuple, list)) and len(separators) == 2 else (", ", ": ")
    per_item = sum(len(s) if isinstance(s, str) else 2 for s in seps)
    if indent is None:  # every value a template holds was bounded as it was built (its repr, each place that holds an
        # object counted), and its JSON with no indent is at most a few times that (12 characters for an astral
        # character under ensure_ascii): made first, then checked, as a Python walk of it under the time limit's
        # tracer cost ten times json.dumps (a request's tools, rendered for each request)
        out = json.dumps(value, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)
        check_built(len(out))
        return out
    check_built(Measure(True, bool(ensure_ascii), per_item, width).of(value))  # an indent grows with the depth
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    """Jinja's sum filter, without Python's sum: that adds lists in one C loop, in time quadratic in their
    number (a million one-item lists froze the process). Numbers are added by Python's sum; anything else one
    at a time, each result refused past MAX_BUILT."""
    from jinja2.filters import make_attrgetter

    items = list(iterable)
    if attribute is not None:
        get = make_attrgetter(environment, attribute)
        items = [get(x) for x in items]
    kinds = {type(start), *map(type, items)}
    if kinds <= {int, float, bool}:
        return sum(items, start)
    if kinds in ({list}, {tuple}):
        measure = Measure()
        check_built(measure.of(start) + measure.of(items), "list")
        joined = list(itertools.chain(start, *items))
        return joined if isinstance(start, list) else tuple(joined)
    total = start
    for x in items:  # a step at a time: the time limit can stop it
        if isinstance(total, (str, list, tuple)) and isinstance(x, (str, list, tuple)):
            measure = Measure()
            check_built(measure.of(total) + measure.of(x), kind_of(total))
        total = total + x
    return total


def _bounded_filters(env: Any) -> None:
    """Every filter's result is refused past MAX_BUILT; those that could make one far larger than what they
    are given (a replacement, a format, a join, an indent, a fill) are checked before they run."""
    filters = env.filters
    filters["tojson"] = _tojson
    filters["sum"] = functools.update_wrapper(_sum, filters["sum"])
    for name in ("center", "truncate"):
        filters[name] = capped(name, filters[name])

    def ahead(name: str, check: Any) -> None:
        original = filters[name]
        passes = getattr(original, "jinja_pass_arg", None) is not None  # the environment or a context first

        def checked(*args: Any, **kwargs: Any) -> Any:
            check(*args[1:] if passes else args, **kwargs)
            return original(*args, **kwargs)

        filters[name] = functools.update_wrapper(checked, original)

    join = filters["join"]

    def join_filter(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> Any:
        from jinja2.filters import make_attrgetter

        if attribute is not None:
            value = map(make_attrgetter(eval_ctx.environment, attribute), value)
        return join(eval_ctx, check_join(str(d), value), d)  # listed: a generator is read once

    filters["join"] = functools.update_wrapper(join_filter, join)
    for name, check in (("replace", _before_replace), ("format", _before_format), ("indent", _before_indent),
                        ("wordwrap", _before_wordwrap), ("batch", _before_fill("batch")),
                        ("slice", _before_fill("slice"))):
        ahead(name, check)
    for name in ("string", "pprint", "upper", "lower", "title", "capitalize", "trim", "striptags", "urlize",
                 "urlencode", "wordcount", "reverse", "list", "unique", "sort", "dictsort", "xmlattr"):
        ahead(name, _before_text)
    for name in ("e", "escape", "forceescape"):
        ahead(name, _before_escape)
    for name, original in list(filters.items()):
        filters[name] = _results_checked(original)


# The checks _bounded_filters runs before a filter, given its arguments: a SecurityError where its result would
# pass MAX_BUILT (or a width MAX_WIDTH, a count MAX_BATCH)

def _before_replace(s: Any, old: Any, new: Any, count: Any = None) -> None:
    text, old, new = str(check_text(s)), str(old), str(new)
    n = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    check_built(len(text) + n * max(0, len(new) - len(old)))


def _before_format(value: Any, *args: Any, **kwargs: Any) -> None:
    if args and kwargs:
        return  # the filter refuses both itself
    check_built(percent_bound(str(check_text(value)), kwargs or args))


def _before_indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> None:
    from jinja2.exceptions import SecurityError

    text = str(check_text(s))
    pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    if pad > MAX_WIDTH:
        raise SecurityError("indent width too large")
    check_built(len(text) + (text.count("\n") + 1) * pad)


def _before_wordwrap(s: Any, width: int = 79, break_long_words: bool = True, wrapstring: Any = None,
                     break_on_hyphens: bool = True) -> None:
    from jinja2.exceptions import SecurityError

    text = str(check_text(s))
    if isinstance(width, int) and width > MAX_WIDTH:
        raise SecurityError("wordwrap width too large")
    wrap = len(wrapstring) if isinstance(wrapstring, str) else 2  # each line is at least a character
    check_built(len(text) + (len(text) + 1) * wrap)


def _before_fill(name: str) -> Any:
    def check(value: Any, count: Any, fill_with: Any = None) -> None:
        from jinja2.exceptions import SecurityError

        if isinstance(count, int) and count > MAX_BATCH:
            raise SecurityError(f"{name} count too large ({count:,} > {MAX_BATCH:,})")
    return check


def _before_text(value: Any, *args: Any, **kwargs: Any) -> None:
    check_text(value)


def _before_escape(value: Any, *args: Any, **kwargs: Any) -> None:
    text = str(check_text(value))  # &, <, >, ' and " become at most 5 characters
    check_built(len(text) + 4 * sum(text.count(c) for c in "&<>'\""))


def _results_checked(fn: Any) -> Any:
    def checked(*args: Any, **kwargs: Any) -> Any:
        return check_value(fn(*args, **kwargs))

    return functools.update_wrapper(checked, fn)


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
    """The immutable sandbox with caps on what a template's operators, literals, calls and string methods may
    allocate."""
    import jinja2.sandbox
    from jinja2.exceptions import SecurityError
    from jinja2.runtime import BlockReference

    class Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%", "+"})
        code_generator_class = _bounded_code_generator()
        bounded_concat = staticmethod(_bounded_concat)
        concat = staticmethod(_bounded_join)  # the compiled code's `concat`, for the text of a block
        text_buffer = _TextBuffer
        checked = staticmethod(check_value)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            return _bounded_binop(operator, left, right)

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            # bytes have a method for every str one, unchecked; translate maps a character to any string
            if isinstance(obj, (bytes, bytearray)) or (isinstance(obj, str) and attr in (
                    "encode", "translate", "maketrans")):
                return False
            return bool(super().is_safe_attribute(obj, attr, value))

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)  # str.format and format_map, at attribute access
            if wrapped is None:
                return None
            fmt = value.__self__
            widths = check_brace_format(fmt)

            def bounded(*args: Any, **kwargs: Any) -> Any:
                values = [*args, *kwargs.values()]
                if len(args) == 1 and not kwargs and isinstance(args[0], dict):  # format_map
                    values = list(args[0].values())
                measure = Measure(floats=FLOAT_FORMATTED)
                # each field (at most one per `{`) filled by the longest argument, or a part of one
                longest = max((measure.of(v) for v in values), default=0)
                check_built(len(fmt) + fmt.count("{") * longest + widths)
                return wrapped(*args, **kwargs)

            return bounded

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, str):
                args = _str_method_args(owner, getattr(__obj, "__name__", ""), args, kwargs)
            if isinstance(__obj, BlockReference):  # self.name(), super(): a block's text, joined by Jinja
                if not __self.is_safe_callable(__obj):
                    raise SecurityError(f"{__obj!r} is not safely callable")
                return _bounded_join(__obj._stack[__obj._depth](__obj._context))
            return check_value(super().call(__context, __obj, *args, **kwargs))

    return Sandbox


def _bounded_binop(operator: str, left: Any, right: Any) -> Any:
    """A template's `%`, `+`, `**` or `*`, refused (SecurityError) where its result would pass the caps."""
    from jinja2.exceptions import SecurityError

    if operator == "%":
        if isinstance(left, str):
            check_built(percent_bound(left, right))
        return left % right
    if operator == "+":
        if type(left) is str and type(right) is str:  # (the common case, measured without a Measure)
            check_built(len(left) + len(right), "string")
            return left + right
        if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            measure = Measure()
            check_built(measure.text(left) + measure.text(right), kind_of(left))
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
        if isinstance(n, int) and not isinstance(n, bool) and hasattr(seq, "__len__") and n > 0:
            if len(seq) * n > MAX_SEQUENCE:
                raise SecurityError("sequence repetition too large")
            check_built(Measure().text(seq) * n, kind_of(seq))
    return left * right


def _str_method_args(owner: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A string method's arguments, checked before it runs where it could build past the caps (a padding, tabs
    expanded, a join, a replacement); a join's iterable is listed (a generator is read once)."""
    if name in ("center", "ljust", "rjust", "zfill", "expandtabs"):
        capped(name, lambda v, *a, **k: None)(owner, *args, **kwargs)
        if name == "expandtabs":
            size = args[0] if args else kwargs.get("tabsize", 8)
            check_built(len(owner) + owner.count("\t") * (size if isinstance(size, int) else 8))
    if name == "join" and args:
        return (check_join(owner, args[0]), *args[1:])
    if name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        count = owner.count(args[0]) if args[0] else len(owner) + 1
        if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
            count = min(count, args[2])
        check_built(len(owner) + count * max(0, len(args[1]) - len(args[0])))
    return args


def _bounded_code_generator() -> Any:
    """Jinja's code generator with `~` compiled to the environment's bounded_concat (the sandbox cannot
    intercept it: it is not a binary operator there), and list, tuple and dict literals checked (a list of
    one list a hundred times, doubled in a loop, is small in memory and huge as text)."""
    from jinja2.compiler import CodeGenerator

    class Bounded(CodeGenerator):
        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

        def buffer(self, frame: Any) -> None:
            frame.buffer = self.temporary_identifier()
            self.writeline(f"{frame.buffer} = environment.text_buffer()")

        def visit_List(self, node: Any, frame: Any) -> None:
            self.write("environment.checked(")
            super().visit_List(node, frame)
            self.write(")")

        def visit_Dict(self, node: Any, frame: Any) -> None:
            self.write("environment.checked(")
            super().visit_Dict(node, frame)
            self.write(")")

        def visit_Tuple(self, node: Any, frame: Any) -> None:
            if node.ctx != "load":  # a target: {% for a, b in ... %}, {% set a, b = ... %}
                super().visit_Tuple(node, frame)
                return
            self.write("environment.checked(")
            super().visit_Tuple(node, frame)
            self.write(")")

    return Bounded


@functools.lru_cache(maxsize=1)
def environment() -> Any:
    """One sandboxed environment for every template (its filters are pure; Jinja renders concurrently)."""
    env = _sandbox_class()(trim_blocks=True, lstrip_blocks=True, finalize=check_text,
                           extensions=["jinja2.ext.loopcontrols", _generation_tag()])
    env.policies["json.dumps_kwargs"] = {"ensure_ascii": False}
    _bounded_filters(env)
    lipsum = env.globals["lipsum"]

    def bounded_lipsum(*args: Any, **kwargs: Any) -> str:
        from jinja2.exceptions import SecurityError

        if any(isinstance(v, int) and v > 1000 for v in (*args, *kwargs.values())):
            raise SecurityError("lipsum too long")
        return str(lipsum(*args, **kwargs))

    env.globals["lipsum"] = bounded_lipsum
    return env
