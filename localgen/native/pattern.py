"""A JSON schema's `pattern` as GBNF, and repetition as GBNF's flat `x{m,n}` (native/grammar.py's converter calls
these in place of the bindings' own).

The bindings' converter writes `x{0,n}` as n nested optionals, `(x (x (...)?)?)?`: llama.cpp's parser refuses
that past 1,000 levels, and past about 17,000 it overflows the native stack and kills the process. llama.cpp's
own converter (common/json-schema-to-grammar.cpp) writes the flat `x{m,n}`, which the parser expands into a
chain of rules; so does this. The parser refuses a minimum past 2,000 (`x{2001}`), so a larger one is written
in pieces. Patterns take what pydantic and the MCP SDK write: the escapes \\d \\w \\s and their negations
\\D \\W \\S in their ASCII meanings (as llama.cpp's converter reads them), inside and outside classes,
`(?:...)`, lazy quantifiers (the same strings match), and escaped marks (`\\.`). What a pattern matches is
written as JSON's text holds it: a quote, a backslash and the control characters as their escapes, never raw."""

from __future__ import annotations

from collections.abc import Callable

from localgen.errors import GrammarError

MAX_DEPTH = 100  # groups inside groups in one pattern: llama.cpp's parser recurses on each
NATIVE_MIN = 2000  # the largest minimum llama.cpp's parser takes in one `x{m,n}`
# character sets as (negated, [(first, last) code points]); each is written as what a JSON string holds for them
# (a quote, a backslash and the control characters escaped: JSON's text never holds them raw)
Ranges = list[tuple[int, int]]
_DOT: tuple[bool, Ranges] = (True, [(0x0A, 0x0A), (0x0D, 0x0D)])  # `.`: any character but a line break
_CLASSES: dict[str, Ranges] = {"d": [(0x30, 0x39)], "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
                               "s": [(0x09, 0x0D), (0x20, 0x20)]}
_ESCAPED: Ranges = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]  # what JSON's text holds only escaped
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}


def repetition(item: str, lo: int, hi: int | None, sep: str = "") -> str:
    """GBNF for `lo` to `hi` (None: no limit) of `item`, `sep` between two, as llama.cpp's build_repetition
    writes it: flat `x{m,n}`, never nested optionals."""
    if hi == 0:
        return ""
    if lo == 0 and hi == 1:
        return f"{item}?"
    if sep:
        rest = repetition(f"({sep} {item})", max(lo - 1, 0), None if hi is None else hi - 1)
        return f"({item} {rest})?" if lo == 0 else f"{item} {rest}".rstrip()
    if hi is None and lo <= 1:
        return f"{item}{'+' if lo else '*'}"
    parts = []
    while lo > NATIVE_MIN:  # the parser refuses a larger minimum: the rest in pieces of at most NATIVE_MIN
        parts.append(f"{item}{{{NATIVE_MIN}}}")
        lo, hi = lo - NATIVE_MIN, None if hi is None else hi - NATIVE_MIN
    parts.append(f"{item}{{{lo}}}" if lo == hi else f"{item}{{{lo},{'' if hi is None else hi}}}")
    return " ".join(parts)


def pattern_repeats(pattern: str) -> list[tuple[str, int]]:
    """Each `{m,n}` count in a regular expression, as ("{m,n}", the larger of m and n): escapes and classes
    skipped, without translating it (a schema's bounds are checked before any work)."""
    out: list[tuple[str, int]] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
        elif c == "[":
            i = _class_end(pattern, i)
        elif c == "{" and (got := _quantifier(pattern, i)) is not None:
            lo, hi, end = got
            out.append((pattern[i:end], max(lo, hi or 0)))
            i = end
        else:
            i += 1
    return out


def pattern_rule(pattern: str, name: str, add_rule: Callable[[str, str], str]) -> str:
    """The GBNF body for a JSON string matching `pattern` (anchored with ^ and $, as the converter needs),
    quotes and trailing `space` included; `add_rule(name, body)` adds a helper rule and returns its name. A
    GrammarError for what it cannot take (lookaround, backreferences, \\b)."""
    if not (pattern.startswith("^") and pattern.endswith("$")) or len(pattern) < 2:
        raise GrammarError(f"the JSON schema's pattern /{_shown(pattern)}/ must start with ^ and end with $ to become "
                           "a grammar")
    return '"\\"" ' + _Pattern(pattern[1:-1], pattern, name, add_rule).whole() + ' "\\"" space'


class _Pattern:
    """One pattern's recursive-descent translation (alternation → sequence → quantified atom)."""

    def __init__(self, text: str, shown: str, name: str, add_rule: Callable[[str, str], str]) -> None:
        self.text, self.shown, self.name, self.add_rule = text, shown, name, add_rule
        self.i = 0
        self.subs: dict[str, str] = {}

    def fail(self, why: str) -> GrammarError:
        return GrammarError(f"the JSON schema's pattern /{_shown(self.shown)}/ {why}: it cannot become a grammar")

    def whole(self) -> str:
        out = self.alternation(0)
        if self.i < len(self.text):  # a `)` with no `(`
            raise self.fail("has unbalanced parentheses")
        return f"({out})" if "|" in self.text else out  # `^a|b$` is a or b between the quotes

    def alternation(self, depth: int) -> str:
        if depth > MAX_DEPTH:
            raise self.fail(f"nests groups more than {MAX_DEPTH} deep")
        seqs = [self.sequence(depth)]
        while self.i < len(self.text) and self.text[self.i] == "|":
            self.i += 1
            seqs.append(self.sequence(depth))
        return " | ".join(seqs)

    def sequence(self, depth: int) -> str:
        items: list[tuple[str, bool]] = []  # (GBNF, whether it is one literal character, unquoted)
        t = self.text
        while self.i < len(t) and t[self.i] not in "|)":
            atom = self.atom(depth)
            got = _quantifier(t, self.i) if self.i < len(t) and t[self.i] == "{" else None
            if self.i < len(t) and t[self.i] in "*+?":
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[t[self.i]]
                self.i += 1
            elif got is not None:
                lo, hi, end = got
                if hi is not None and lo > hi:
                    raise self.fail(f"has {t[self.i:end]}, whose minimum is above its maximum")
                self.i = end
            else:
                items.append(atom)
                continue
            if self.i < len(t) and t[self.i] in "?+":  # lazy or possessive: the same strings match
                self.i += 1
            items.append((repetition(self.unit(atom), lo, hi), False))
        out: list[str] = []
        run = ""
        for text, literal in items:  # neighbouring characters as one literal
            if literal:
                run += text
                continue
            if run:
                out.append(f'"{run}"')
                run = ""
            out.append(text)
        if run:
            out.append(f'"{run}"')
        return " ".join(out) or '""'

    def unit(self, atom: tuple[str, bool]) -> str:
        """An atom as one symbol to repeat: a character as a literal, a group as a rule of its own (the parser
        counts the rules inside a repeated group against its bound; a rule's name is one)."""
        text, literal = atom
        if literal:
            return f'"{text}"'
        if not text.startswith("("):
            return text
        if text not in self.subs:
            self.subs[text] = self.add_rule(f"{self.name}-{len(self.subs) + 1}", text[1:-1].strip())
        return self.subs[text]

    def atom(self, depth: int) -> tuple[str, bool]:
        t = self.text
        c = t[self.i]
        if c == "(":
            self.i += 1
            if t.startswith("?:", self.i):
                self.i += 2
            elif self.i < len(t) and t[self.i] == "?":
                raise self.fail("uses a group of the form (?...) other than (?:...), such as a lookahead")
            inner = self.alternation(depth + 1)
            if self.i >= len(t) or t[self.i] != ")":
                raise self.fail("has unbalanced parentheses")
            self.i += 1
            return f"({inner})", False
        if c == "[":
            end = _class_end(t, self.i)
            if end > len(t):
                raise self.fail("has an unclosed [")
            body = t[self.i + 1:end - 1]
            self.i = end
            return self.char_class(body), False
        if c == ".":
            self.i += 1
            return self.chars(*_DOT), False
        if c == "\\":
            if self.i + 1 >= len(t):
                raise self.fail("ends in a lone backslash")
            e = t[self.i + 1]
            if e.lower() in _CLASSES:
                self.i += 2
                return self.chars(e.isupper(), _CLASSES[e.lower()]), False
            ch, self.i = self.escaped(t, self.i)
            return _literal(ch), True
        if c in "*+?":
            raise self.fail(f"has a {c} with nothing before it")
        if c in "^$":
            raise self.fail(f"has {c} inside it (only at its ends)")
        self.i += 1
        return _literal(c), True

    def escaped(self, t: str, i: int) -> tuple[str, int]:
        """The character an escape at t[i] (a backslash) stands for, and where t goes on."""
        e = t[i + 1]
        if e in _CHAR_ESCAPES and not (e == "0" and i + 2 < len(t) and t[i + 2].isdigit()):
            return _CHAR_ESCAPES[e], i + 2
        if e in "xu":
            size = 2 if e == "x" else 4
            digits = t[i + 2:i + 2 + size]
            if len(digits) == size and all(d in "0123456789abcdefABCDEF" for d in digits):
                return chr(int(digits, 16)), i + 2 + size
            raise self.fail(f"has a \\{e} escape without its {size} hex digits")
        if e.isalnum():  # \b, \B, \1, \p{...}: boundaries, backreferences, Unicode classes
            raise self.fail(f"uses \\{e}, which a grammar cannot hold")
        return e, i + 2

    def char_class(self, body: str) -> str:
        negated = body.startswith("^")
        body = body[1:] if negated else body
        members: list[tuple[bool, Ranges]] = []  # each as (negated, ranges): \D \W \S are complements
        j = 0
        while j < len(body):
            c = body[j]
            if c == "\\" and j + 1 < len(body) and body[j + 1].lower() in _CLASSES:
                e = body[j + 1]
                members.append((e.isupper(), _CLASSES[e.lower()]))
                j += 2
                continue
            if c == "\\":
                if j + 1 >= len(body):
                    raise self.fail("ends a class in a lone backslash")
                first, j = self.escaped(body, j)
            else:
                first, j = c, j + 1
            if j + 1 < len(body) and body[j] == "-" and \
                    not (body[j + 1] == "\\" and j + 2 < len(body) and body[j + 2].lower() in _CLASSES):
                if body[j + 1] == "\\":
                    last, j = self.escaped(body, j + 1)
                else:
                    last, j = body[j + 1], j + 2
                if ord(last) < ord(first):
                    raise self.fail(f"has the class range {first}-{last}, which runs backwards")
                members.append((False, [(ord(first), ord(last))]))
            else:
                members.append((False, [(ord(first), ord(first))]))
        # the union of the members: positive ones P, complements of Q1, Q2...: not (Q1 and Q2 ...) minus P
        plus = _union([r for neg, ranges in members if not neg for r in ranges])
        minus = [ranges for neg, ranges in members if neg]
        if minus:
            left = minus[0]
            for ranges in minus[1:]:
                left = _intersect(left, ranges)
            union: tuple[bool, Ranges] = (True, _subtract(left, plus))
        else:
            union = (False, plus)
        return self.chars(union[0] != negated, union[1])

    def chars(self, negated: bool, ranges: Ranges) -> str:
        """GBNF for one character of a set (`negated`: all but `ranges`), as JSON's text holds it: the plain ones
        as a class, and a quote, a backslash or a control character in the set as its escape (raw, it would end
        the string early or make it invalid JSON)."""
        ranges = _union(ranges)
        if negated:
            own = f"[^{_written(_union(ranges + _ESCAPED))}]"
            escaped = _subtract(_ESCAPED, ranges)
        else:
            plain = _subtract(ranges, _ESCAPED)
            own = f"[{_written(plain)}]" if plain else ""
            escaped = _intersect(ranges, _ESCAPED)
        alts = [own] if own else []
        for first, last in escaped:
            alts += [f'"{_json_text(chr(c))}"' for c in range(first, last + 1)]
        if not alts:
            raise self.fail("has a class no character is in")
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _union(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return _union([(max(f1, f2), min(l1, l2)) for f1, l1 in a for f2, l2 in b if max(f1, f2) <= min(l1, l2)])


def _subtract(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    for first, last in _union(a):
        for f2, l2 in _union(b):
            if l2 < first or f2 > last:
                continue
            if f2 > first:
                out.append((first, f2 - 1))
            first = l2 + 1
            if first > last:
                break
        if first <= last:
            out.append((first, last))
    return out


def _written(ranges: Ranges) -> str:
    return "".join(_class_char(chr(f)) if f == last else f"{_class_char(chr(f))}-{_class_char(chr(last))}"
                   for f, last in ranges)


def _json_text(c: str) -> str:
    """A character as JSON's text writes it inside a string (a quote, a backslash, a control character escaped),
    as it goes inside a GBNF literal."""
    import json

    return "".join(f"\\{ch}" if ch in '"\\' else ch for ch in json.dumps(c, ensure_ascii=False)[1:-1])


def _class_end(pattern: str, i: int) -> int:
    """Where the class opening at pattern[i] ends (past its `]`); past the end when it is not closed. A `]`
    first (after any ^) is a member, as in Python's re and JavaScript's /u-less regexes."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _quantifier(pattern: str, i: int) -> tuple[int, int | None, int] | None:
    """A `{m}`, `{m,}` or `{m,n}` at pattern[i]: (m, n or None, where the text goes on); None where the `{` is a
    plain character, as regular expressions read it."""
    end = pattern.find("}", i)
    if end < 0:
        return None
    lo, comma, hi = pattern[i + 1:end].partition(",")
    lo, hi = lo.strip(), hi.strip()
    if not lo.isdigit() or not (hi.isdigit() or hi == "") or not lo.isascii() or not hi.isascii():
        return None
    if not comma:
        return int(lo), int(lo), end + 1
    return int(lo), int(hi) if hi else None, end + 1


def _literal(c: str) -> str:
    """A character as JSON's text holds it, inside a GBNF literal."""
    if ord(c) == 0x7F:
        return "\\x7F"
    return _json_text(c)


def _class_char(c: str) -> str:
    """A character as it goes inside a GBNF class."""
    if c in "\\]-^[\"" or ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02X}"
    return c


def _shown(pattern: str) -> str:
    return pattern if len(pattern) <= 60 else pattern[:57] + "..."
