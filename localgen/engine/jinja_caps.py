"""What a chat template may build (engine/jinja_sandbox.py enforces it): the caps on the strings, lists and
dicts it makes, on widths, integers and batches, and the arithmetic that checks them before anything is built: an
upper bound of the text str() or json.dumps makes of a value, and of a format's result."""

from __future__ import annotations

import collections
import functools
import itertools
import operator
from typing import Any

MAX_OUTPUT = 4 << 20  # characters; a prompt this long would not fit any context anyway
MAX_SEQUENCE = 1 << 20  # result size of `*` on strings and lists
# size of any string or list a template builds (`~`, `+`, `%`, format, join, replace, a filter's or a call's
# result, a literal), measured as the text str() would make of it: a message's content is concatenated whole,
# so the bound is the output's. Every C-level step a template can take (str() of a list, a comparison, a sort,
# json.dumps) is linear in the sizes it is given, so with them bounded no single one runs for long.
MAX_BUILT = MAX_OUTPUT
FLOAT_REPR = 24  # characters of a float's repr or JSON at most: -1.7976931348623157e+308
FLOAT_FORMATTED = 330  # of one formatted ('%f' of 1e308 writes every digit)
MAX_WIDTH = 100_000  # widths, paddings and precisions in formats and string methods
MAX_INT_BITS = 1 << 16  # results of ** and * on integers
MAX_BATCH = 10_000  # the batch and slice filters' counts (each may fill that many places)


def check_built(size: int, what: str = "string") -> None:
    """Refuse a string or list of `size` before it is built."""
    if size > MAX_BUILT:
        from jinja2.exceptions import SecurityError

        raise SecurityError(f"{what} too long ({size:,} > {MAX_BUILT:,})")


class Measure:
    """Upper bounds of the text str() (repr, for what is inside a container) or json.dumps makes of a value,
    counting a value held twice twice (a list of a million references to one list is a million lists), walked
    once per object, and given up once past the limit."""

    def __init__(self, json_style: bool = False, ensure_ascii: bool = False, per_item: int = 2,
                 indent: int = 0, floats: int = FLOAT_REPR) -> None:
        self.json_style = json_style
        self.floats = floats  # a float's characters: its repr's (or JSON's), or a format's ('%f' of 1e308: 330)
        self.ensure_ascii = ensure_ascii
        self.per_item = per_item  # separators between items, between a key and its value
        self.indent = indent  # json's indent: each item on its own line, indented by its depth
        self.seen: dict[tuple[int, int], int] = {}

    def text(self, value: Any) -> int:
        """Of str(value)."""
        if isinstance(value, str):
            return len(value)
        return self.of(value)

    def of(self, value: Any, depth: int = 0) -> int:
        """Of repr(value) or the JSON of value."""
        if isinstance(value, str):
            return self._string(value)
        if isinstance(value, bool) or value is None:
            return 5
        if isinstance(value, int):
            return value.bit_length() // 3 + 2
        if isinstance(value, float):
            return self.floats
        key = (id(value), depth if self.indent else 0)
        if key in self.seen:
            return self.seen[key]
        items = _items(value)
        if items is None:
            return 200  # an object's repr: <Macro 'm'>, <generator object ...>, an undefined
        self.seen[key] = 16  # a container holding itself: repr writes [...]
        line = 1 + self.indent * (depth + 1) if self.indent else 0
        flat = self._flat(items, line) if isinstance(items, (list, tuple, set, frozenset)) else None
        if flat is not None:
            self.seen[key] = flat
            return flat
        listed = items if isinstance(items, (list, tuple)) else list(items)
        # the brackets (and a name: <Namespace {...}>, dict_items([...])), the closing line, the separators
        total = (2 if isinstance(value, (list, tuple, dict)) else 16) + line + len(listed) * (self.per_item + line)
        # each object measured once, times the places that hold it (counted in C: a million places is quick)
        times = collections.Counter(map(id, listed))
        for at, item in dict(zip(map(id, listed), listed, strict=True)).items():
            total += self.of(item, depth + 1) * times[at]
            if total > MAX_BUILT:
                break
        self.seen[key] = total
        return total

    def _flat(self, items: Any, line: int) -> int | None:
        """A list of strings or of numbers measured in C, without a Python call an item (a template's loop
        of `+` measures its list each time)."""
        import json.encoder

        kinds = set(map(type, items))
        extra = len(items) * (self.per_item + line) + 18
        if kinds <= {str}:
            if self.json_style:
                encode = json.encoder.encode_basestring_ascii if self.ensure_ascii else \
                    json.encoder.encode_basestring
                return sum(map(len, map(encode, items))) + extra
            if all(map(str.isprintable, items)):
                escaped = sum(map(operator.methodcaller("count", "\\"), items)) + sum(
                    map(operator.methodcaller("count", "'"), items))
                return int(sum(map(len, items))) + int(escaped) + 2 * len(items) + extra
            return int(sum(map(len, map(repr, items)))) + extra
        if kinds <= {int, bool}:
            return sum(map(int.bit_length, items)) // 3 + 5 * len(items) + extra
        if kinds <= {float}:
            return self.floats * len(items) + extra
        return None

    def _string(self, s: str) -> int:
        import json.encoder

        if self.json_style:
            encode = json.encoder.encode_basestring_ascii if self.ensure_ascii else json.encoder.encode_basestring
            return len(encode(s))
        if s.isprintable():  # repr escapes only backslashes and quotes
            return len(s) + s.count("\\") + s.count("'") + 2
        return len(repr(s))


def _items(value: Any) -> Any:
    """What str() of a container writes, flattened (a dict's keys and values), or None for another object."""
    from collections.abc import ItemsView, KeysView, ValuesView

    from jinja2.utils import Namespace

    if isinstance(value, (list, tuple, set, frozenset, KeysView, ValuesView)):
        return value
    if isinstance(value, (dict, ItemsView)):
        return _flat(value.items() if isinstance(value, dict) else value)
    if isinstance(value, Namespace):
        return _flat(object.__getattribute__(value, "_Namespace__attrs").items())
    return None


def _flat(pairs: Any) -> Any:
    return itertools.chain.from_iterable(pairs)


def kind_of(value: Any) -> str:
    """What a refusal calls a value: a string, a list, a dict."""
    return "string" if isinstance(value, str) else "list" if isinstance(value, (list, tuple)) else \
        "dict" if isinstance(value, dict) else "value"


def check_text(value: Any) -> Any:
    """Refuse a value whose text (str() of it) would be past MAX_BUILT, before it is made; returns it."""
    check_built(Measure().text(value), kind_of(value))
    return value


def check_value(value: Any) -> Any:
    """A value a template built (a filter's, a call's result, a literal): refused past MAX_BUILT."""
    if isinstance(value, str):
        check_built(len(value))
    elif _items(value) is not None:
        check_built(Measure().of(value), kind_of(value))
    return value


def check_join(sep: str, items: Any) -> list[Any]:
    """`sep.join(items)` or `items|join(sep)`: the items listed and their total refused past MAX_BUILT."""
    listed = list(items)
    check_built(_texts(listed) + len(sep) * len(listed))
    return listed


def _texts(listed: list[Any]) -> int:
    """A bound of the length of str() of each of `listed`, together."""
    if set(map(type, listed)) <= {str}:
        return sum(map(len, listed))
    measure = Measure()
    return sum(measure.text(x) for x in listed)


def percent_bound(fmt: str, args: Any) -> int:
    """An upper bound of `fmt % args`'s length, its widths and precisions refused past MAX_WIDTH."""
    widths = _check_percent_format(fmt, args)
    measure = Measure(floats=FLOAT_FORMATTED)
    if isinstance(args, tuple):  # each placeholder takes its own argument
        filled = sum(measure.of(a) for a in args)
    else:  # one argument, or a mapping whose keys a placeholder may name again and again
        values = list(args.values()) if isinstance(args, dict) else [args]
        filled = fmt.count("%") * max((measure.of(v) for v in values), default=0)
    return len(fmt) + filled + widths


def _check_percent_format(fmt: str, args: Any) -> int:
    """`fmt % args`: refuse widths or precisions past MAX_WIDTH (they allocate that many characters); their
    sum."""
    import re

    from jinja2.exceptions import SecurityError

    values = args if isinstance(args, tuple) else (args,)
    total = 0
    for m in re.finditer(r"%[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?", fmt):
        for g in m.groups():
            if g is None:
                continue
            n = max((abs(v) for v in values if isinstance(v, int)), default=0) if g == "*" else int(g)
            if n > MAX_WIDTH:
                raise SecurityError("format width too large")
            total += n
    return total


def check_brace_format(fmt: str) -> int:
    """`fmt.format(...)`: the same for the format specs of {} fields."""
    import re
    import string

    from jinja2.exceptions import SecurityError

    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return 0  # str.format raises the same error itself
    total = 0
    for _literal, _name, spec, _conv in fields:
        for d in re.findall(r"\d+", spec or ""):
            if int(d) > MAX_WIDTH:
                raise SecurityError("format width too large")
            total += int(d)
    return total


def capped(name: str, fn: Any) -> Any:
    """A string filter whose numeric arguments may not exceed MAX_WIDTH."""
    def wrapper(value: Any, *args: Any, **kwargs: Any) -> Any:
        from jinja2.exceptions import SecurityError

        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_WIDTH:
                raise SecurityError(f"{name} width too large")
        return fn(value, *args, **kwargs)

    return functools.update_wrapper(wrapper, fn)
