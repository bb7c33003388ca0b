"""A JSON schema's `pattern` as GBNF, and repetition as GBNF's flat `x{m,n}` (native/grammar.py's converter calls
these in place of the bindings' own).

The bindings' converter writes `x{0,n}` as n nested optionals, `(x (x (...)?)?)?`: llama.cpp's parser refuses
that past 1,000 levels, and past about 17,000 it overflows the native stack and kills the process. llama.cpp's
own converter (common/json-schema-to-grammar.cpp) writes the flat `x{m,n}`, which the parser expands into a
chain of rules; so does this. The parser refuses a minimum past 2,000 (`x{2001}`), so a larger one is written
in pieces. Patterns take what pydantic and the MCP SDK write: the escapes \\d \\w \\s and their negations
\\D \\W \\S in their ASCII meanings (as llama.cpp's converter reads them), inside and outside classes,
`(?:...)`, lazy quantifiers (the same strings match), and escaped marks (`\\.`)."""

from __future__ import annotations

from collections.abc import Callable

from localgen.errors import GrammarError

MAX_DEPTH = 100  # groups inside groups in one pattern: llama.cpp's parser recurses on each
NATIVE_MIN = 2000  # the largest minimum llama.cpp's parser takes in one `x{m,n}`
_DOT = r"[^\x0A\x0D]"  # `.`: any character but a line break, as the converter's DOT
_CLASSES = {"d": "0-9", "w": "A-Za-z0-9_", "s": r" \t\n\r\x0C\x0B"}
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
            return _DOT, False
        if c == "\\":
            if self.i + 1 >= len(t):
                raise self.fail("ends in a lone backslash")
            e = t[self.i + 1]
            if e.lower() in _CLASSES:
                self.i += 2
                return f"[{'^' if e.isupper() else ''}{_CLASSES[e.lower()]}]", False
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
        ranges: list[str] = []
        others: list[str] = []  # \D \W \S inside: their own classes, joined as alternatives
        j = 0
        while j < len(body):
            c = body[j]
            if c == "\\" and j + 1 < len(body) and body[j + 1].lower() in _CLASSES:
                e = body[j + 1]
                if e.isupper():
                    others.append(f"[^{_CLASSES[e.lower()]}]")
                else:
                    ranges.append(_CLASSES[e])
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
                ranges.append(f"{_class_char(first)}-{_class_char(last)}")
            else:
                ranges.append(_class_char(first))
        if others and negated:
            raise self.fail("negates a class holding \\D, \\W or \\S")
        own = f"[{'^' if negated else ''}{''.join(ranges)}]" if ranges or negated else ""
        if not others or (not own and len(others) == 1):
            return own or others[0]
        return "(" + " | ".join([own, *others] if own else others) + ")"


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
    """A character as it goes inside a GBNF literal."""
    if c in '"\\':
        return "\\" + c
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02X}"
    return c


def _class_char(c: str) -> str:
    """A character as it goes inside a GBNF class."""
    if c in "\\]-^[\"" or ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02X}"
    return c


def _shown(pattern: str) -> str:
    return pattern if len(pattern) <= 60 else pattern[:57] + "..."
