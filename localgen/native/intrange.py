"""Integer ranges as GBNF: a JSON schema's `"type": "integer"` with `minimum`, `maximum`, `exclusiveMinimum` or
`exclusiveMaximum` as a rule that accepts exactly the integers in range (the bindings' Python converter leaves
them out: a TODO in llama_cpp/llama_grammar.py; native/grammar.py's converter calls this).

int_range is a port of `build_min_max_int` from llama.cpp's common/json-schema-to-grammar.cpp (MIT License,
Copyright (c) 2023-2024 The ggml authors), with three changes, each found by checking numbers against the
grammar (tests/test_intrange.py):
- a one-sided minimum whose tail has a leading zero (100, 205) required too few digits after the first one
  (the C++ recursion reads the tail as a number, so "10" passed minimum 100): the tail is matched as digits;
- a negative maximum alone let a zero follow the minus sign ("-05", "-00": not JSON, and -0 is above -5);
- a one-sided bound of 16 digits or more widens the digit cap past it (llama.cpp wrote `[0-9]{16,15}`).
Bounds as llama.cpp's json-schema.cpp reads them: a fractional bound is rounded inwards, exclusive ones are
folded in (the tighter wins where a schema gives both, and draft 4's boolean exclusiveMinimum is read), and
bounds past int64 are no bound (a limit beyond them) or nothing at all (a limit on the wrong side)."""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from localgen.errors import GrammarError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DECIMALS = 16  # the digits an unbounded side may have, as in llama.cpp (and the bindings' integral-part)
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_OWN_RULE = ("$ref", "oneOf", "anyOf", "const", "enum")  # the converter reads these before the type


def integer_rule(schema: Any) -> str | None:
    """The GBNF body for a bounded integer schema (its trailing `space` included, as the converter's own
    primitives have it); None for any other schema; a GrammarError for a range that holds no integer."""
    if not isinstance(schema, dict) or schema.get("type") != "integer" or any(k in schema for k in _OWN_RULE):
        return None
    if not any(_number(schema.get(k)) for k in _BOUNDS):
        return None
    lo, hi = integer_bounds(schema)
    if lo is None and hi is None:
        return None
    return f"({int_range(lo, hi)}) space"


def integer_bounds(schema: dict[str, Any]) -> tuple[int | None, int | None]:
    """The inclusive (minimum, maximum) an integer schema allows, None for no bound; a GrammarError when no
    integer fits."""
    lows: list[int | None] = []
    highs: list[int | None] = []
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    ex_min, ex_max = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if _number(minimum):
        lows.append(_low(minimum, exclusive=ex_min is True))
    if _number(ex_min):
        lows.append(_low(ex_min, exclusive=True))
    if _number(maximum):
        highs.append(_high(maximum, exclusive=ex_max is True))
    if _number(ex_max):
        highs.append(_high(ex_max, exclusive=True))
    lo = max((v for v in lows if v is not None), default=None)
    hi = min((v for v in highs if v is not None), default=None)
    if (lo is not None and lo > INT64_MAX) or (hi is not None and hi < INT64_MIN) or \
            (lo is not None and hi is not None and lo > hi):
        given = ", ".join(f"{k} {_shown(schema[k])}" for k in _BOUNDS if _number(schema.get(k)))
        raise GrammarError(f"the JSON schema has an integer with {given}: no integer is in that range")
    return lo, hi


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _shown(value: float) -> str:
    return str(int(value)) if isinstance(value, int) or (value.is_integer() and abs(value) < 1e16) else str(value)


def _low(value: float, *, exclusive: bool) -> int | None:
    """The least integer a minimum admits; None below int64 (no bound), INT64_MAX + 1 above it (none)."""
    if value < INT64_MIN:
        return None
    if value > INT64_MAX:
        return INT64_MAX + 1
    return math.floor(value) + 1 if exclusive else math.ceil(value)


def _high(value: float, *, exclusive: bool) -> int | None:
    """The greatest integer a maximum admits; None above int64 (no bound), INT64_MIN - 1 below it (none)."""
    if value > INT64_MAX:
        return None
    if value < INT64_MIN:
        return INT64_MIN - 1
    return math.ceil(value) - 1 if exclusive else math.floor(value)


def int_range(lo: int | None, hi: int | None) -> str:
    """GBNF (without the trailing space) for the integers from lo to hi, both included; None is no bound."""
    if lo is None and hi is None:
        raise ValueError("at least one of lo or hi must be set")
    out: list[str] = []
    widest = max(len(str(abs(v))) for v in (lo, hi) if v is not None)
    _build(lo, hi, out, max(DECIMALS, widest + 1))
    return "".join(out)


def _build(min_value: int | None, max_value: int | None, out: list[str], decimals_left: int = DECIMALS,
           top_level: bool = True) -> None:
    """build_min_max_int: None stands for the C++ code's INT64_MIN / INT64_MAX (no bound)."""
    if min_value is not None and max_value is not None:
        if min_value < 0 and max_value < 0:
            out.append('"-" (')
            _build(-max_value, -min_value, out, decimals_left, top_level=True)
            out.append(")")
            return
        if min_value < 0:
            out.append('"-" (')
            _build(0, -min_value, out, decimals_left, top_level=True)
            out.append(") | ")
            min_value = 0
        min_s, max_s = str(min_value), str(max_value)
        for digits in range(len(min_s), len(max_s)):
            _uniform_range(out, min_s, "9" * digits)
            min_s = "1" + "0" * digits
            out.append(" | ")
        _uniform_range(out, min_s, max_s)
        return

    less_decimals = max(decimals_left - 1, 1)

    if min_value is not None:
        if min_value < 0:
            out.append('"-" (')
            _build(None, -min_value, out, decimals_left, top_level=False)
            out.append(") | [0] | [1-9] ")
            _more_digits(out, 0, decimals_left - 1)
        elif min_value == 0:
            if top_level:
                out.append("[0] | [1-9] ")
                _more_digits(out, 0, less_decimals)
            else:
                _more_digits(out, 1, decimals_left)
        elif min_value <= 9:
            c = str(min_value)
            range_start = "1" if top_level else "0"
            if c > range_start:
                _digit_range(out, range_start, chr(ord(c) - 1))
                out.append(" ")
                _more_digits(out, 1, less_decimals)
                out.append(" | ")
            _digit_range(out, c, "9")
            out.append(" ")
            _more_digits(out, 0, less_decimals)
        else:
            min_s = str(min_value)
            length, c, tail = len(min_s), min_s[0], min_s[1:]
            if c > "1":
                _digit_range(out, "1" if top_level else "0", chr(ord(c) - 1))
                out.append(" ")
                _more_digits(out, length, less_decimals)
                out.append(" | ")
            _digit_range(out, c, c)
            out.append(" (")
            if len(tail) > 1 and tail[0] == "0":
                # localgen: llama.cpp recurses on int(tail), losing its zeros (100 let "10" through): the tail is
                # its own length of digits at least tail, or any longer run
                _uniform_range(out, tail, "9" * len(tail))
                if len(tail) < less_decimals:
                    out.append(" | ")
                    _more_digits(out, len(tail) + 1, less_decimals)
            else:
                _build(int(tail), None, out, less_decimals, top_level=False)
            out.append(")")
            if c < "9":
                out.append(" | ")
                _digit_range(out, chr(ord(c) + 1), "9")
                out.append(" ")
                _more_digits(out, length - 1, less_decimals)
        return

    assert max_value is not None
    if max_value >= 0:
        if top_level:
            out.append('"-" [1-9] ')
            _more_digits(out, 0, less_decimals)
            out.append(" | ")
        _build(0, max_value, out, decimals_left, top_level=True)
    else:
        out.append('"-" (')
        # localgen: top level (llama.cpp passes false), so no zero follows the minus sign
        _build(-max_value, None, out, decimals_left, top_level=True)
        out.append(")")


# build_min_max_int's lambdas, each writing its part of the rule to `out`
def _digit_range(out: list[str], lo: str, hi: str) -> None:
    """A digit from lo to hi (one character class)."""
    out.append(f"[{lo}]" if lo == hi else f"[{lo}-{hi}]")


def _more_digits(out: list[str], min_digits: int, max_digits: int) -> None:
    """From min_digits to max_digits more digits, any of them."""
    out.append("[0-9]")
    if min_digits == max_digits == 1:
        return
    out.append("{" + str(min_digits) + ("" if max_digits == min_digits else f",{max_digits}") + "}")


def _uniform_range(out: list[str], start: str, end: str) -> None:
    """The digit strings of start's length from start to end, both included."""
    i = 0
    while i < len(start) and i < len(end) and start[i] == end[i]:
        i += 1
    if i > 0:
        out.append(f'"{start[:i]}"')
    if i < len(start) and i < len(end):
        if i > 0:
            out.append(" ")
        sub_len = len(start) - i - 1
        if sub_len > 0:
            from_sub, to_sub = start[i + 1:], end[i + 1:]
            sub_zeros, sub_nines = "0" * sub_len, "9" * sub_len
            to_reached = False
            out.append("(")
            if from_sub == sub_zeros:
                _digit_range(out, start[i], chr(ord(end[i]) - 1))
                out.append(" ")
                _more_digits(out, sub_len, sub_len)
            else:
                out.append(f"[{start[i]}] (")
                _uniform_range(out, from_sub, sub_nines)
                out.append(")")
                if start[i] < chr(ord(end[i]) - 1):
                    out.append(" | ")
                    if to_sub == sub_nines:
                        _digit_range(out, chr(ord(start[i]) + 1), end[i])
                        to_reached = True
                    else:
                        _digit_range(out, chr(ord(start[i]) + 1), chr(ord(end[i]) - 1))
                    out.append(" ")
                    _more_digits(out, sub_len, sub_len)
            if not to_reached:
                out.append(" | ")
                _digit_range(out, end[i], end[i])
                out.append(" ")
                _uniform_range(out, sub_zeros, to_sub)
            out.append(")")
        else:
            out.append(f"[{start[i]}-{end[i]}]")
