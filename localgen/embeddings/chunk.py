"""Documents cut into chunks for a collection (`embed --store NAME --docs PATH...`), measured in the embedding
model's own tokens (`count`: a text's tokens as the model embeds it, special tokens included). A chunk holds at
most `limit` tokens. A text is cut at paragraph boundaries (blank lines) where a paragraph fits, a paragraph
too long for a chunk at its line ends, a line at its sentence ends, a sentence between words, and only a word
longer than a chunk inside itself; the pieces are then packed greedily, each chunk ending at the best boundary
(a paragraph's end before a line's, a line's before a sentence's, ...) that keeps at least half of what would
fit. Each chunk after the first starts with the end of the one before (`overlap` tokens at most, from the
start of a sentence or a line where one is in reach, else of a word). The chunks cover every character of the
text that is not whitespace, in order, and repeat only the overlap; a chunk has no whitespace at its ends.
Plain Python: the caller passes the tokenizer."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

Count = Callable[[str], int]

# the boundary a piece ends at, best first
END, PARAGRAPH, LINE, SENTENCE, WORD, CHAR = 5, 4, 3, 2, 1, 0
_CUTS = {
    PARAGRAPH: re.compile(r"\n[ \t]*\n\s*"),  # a blank line (and the whitespace after it)
    LINE: re.compile(r"\n\s*"),
    SENTENCE: re.compile(r"[.!?…][\"'”’)\]]*\s+|[。！？][\"'”’)\]」』]*\s*"),
    WORD: re.compile(r"\s+"),
}
MAX_TOKEN_CHARS = 32  # a chunk is searched for within limit × this many characters (tokenizing no more)
MIN_LIMIT = 8  # tokens a chunk may hold, at least: room for the special tokens and some text


@dataclass(frozen=True)
class Chunk:
    """A chunk: text[start:end] of the document."""

    start: int
    end: int
    text: str


def chunks(text: str, limit: int, overlap: int, count: Count) -> list[Chunk]:
    """The chunks of `text` (none when it is empty or blank), each at most `limit` tokens by `count`, each
    after the first starting with at most `overlap` tokens of the one before (`count` less the special tokens
    it adds to any text: count(""))."""
    if limit < MIN_LIMIT:
        raise ValueError(f"a chunk holds at least {MIN_LIMIT} tokens, not {limit}")
    if not 0 <= overlap < limit:
        raise ValueError(f"the overlap must be at least 0 and less than the chunk's {limit} tokens, not {overlap}")
    if not text.strip():
        return []
    return _Chunker(text, limit, overlap, count).run()


class _Chunker:
    def __init__(self, text: str, limit: int, overlap: int, count: Count) -> None:
        self.text, self.limit, self.overlap, self.count = text, limit, overlap, count
        self.base = count("")  # the special tokens every text gets (BOS, CLS and SEP, ...)
        self.atoms: list[tuple[int, int, int]] = []  # (start, end, the boundary at its end): each fits a chunk
        self.sizes: list[int] = []  # each atom's tokens, less the special ones: what it adds to a chunk, about

    def tokens(self, s: int, e: int) -> int:
        """text[s:e]'s tokens, its ends' whitespace left out; past limit × MAX_TOKEN_CHARS characters, a number
        past the limit without tokenizing (a long text is cut smaller; the cost of a count stays bounded)."""
        if e - s > self.limit * MAX_TOKEN_CHARS:
            return self.limit + 1
        return self.count(self.text[s:e].strip())

    def fits(self, s: int, e: int) -> bool:
        return self.tokens(s, e) <= self.limit

    def _atom(self, s: int, e: int, level: int, n: int) -> None:
        self.atoms.append((s, e, level))
        self.sizes.append(max(0, n - self.base))

    def run(self) -> list[Chunk]:
        self._split(0, len(self.text), PARAGRAPH, END, checked=False)
        atoms, out = self.atoms, []
        prev: Chunk | None = None
        i = 0
        while i < len(atoms):
            start = atoms[i][0]
            if prev is not None and self.overlap:
                start = self._overlap_start(prev, atoms[i][1], start)
            j = self._best_end(i, self._farthest(i, start))
            s, e = _trimmed(self.text, start, atoms[j][1])
            if s < e:
                prev = Chunk(s, e, self.text[s:e])
                out.append(prev)
            i = j + 1
        return out

    def _split(self, s: int, e: int, level: int, end_level: int, checked: bool) -> None:
        """Cut text[s:e] into atoms: whole if it fits, else at `level`'s boundaries (the pieces each split
        again, a level down, where they do not fit)."""
        n = 0 if checked else self.tokens(s, e)
        if not checked and n <= self.limit:
            self._atom(s, e, end_level, n)
            return
        if level == CHAR:
            self._by_chars(s, e, end_level)
            return
        cuts = [m.end() for m in _CUTS[level].finditer(self.text, s, e) if s < m.end() < e]
        if not cuts:
            self._split(s, e, level - 1, end_level, checked=True)
            return
        bounds = [s, *cuts, e]
        for k in range(len(bounds) - 1):
            self._split(bounds[k], bounds[k + 1], level - 1, level if k < len(bounds) - 2 else end_level,
                        checked=False)

    def _by_chars(self, s: int, e: int, end_level: int) -> None:
        """A word longer than a chunk: as many characters a piece as fit (at least one)."""
        while s < e:
            lo, hi = s + 1, min(e, s + self.limit * MAX_TOKEN_CHARS)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.fits(s, mid):
                    lo = mid
                else:
                    hi = mid - 1
            self._atom(s, lo, end_level if lo == e else CHAR, self.tokens(s, lo))
            s = lo

    def _farthest(self, i: int, start: int) -> int:
        """The last atom a chunk from `start` (in or before atom i, which fits with it) can end with: guessed
        from the atoms' own sizes, then counted (a step up or down, then halving where the guess was far)."""
        atoms, sizes, bound = self.atoms, self.sizes, start + self.limit * MAX_TOKEN_CHARS
        last = i
        while last + 1 < len(atoms) and atoms[last + 1][1] <= bound:
            last += 1
        room = self.limit - self.base - (self.tokens(start, atoms[i][0]) - self.base if start < atoms[i][0] else 0)
        guess, used = i, sizes[i]
        while guess < last and used + sizes[guess + 1] <= room:
            guess += 1
            used += sizes[guess]
        if guess == i or self.fits(start, atoms[guess][1]):
            lo, step = guess, 1  # fits: look further, one atom, then two, four, ...
            while lo < last:
                ahead = min(lo + step, last)
                if not self.fits(start, atoms[ahead][1]):
                    last = ahead - 1
                    break
                lo, step = ahead, step * 2
            hi = last
        else:
            lo, hi = i, guess - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.fits(start, atoms[mid][1]):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _best_end(self, i: int, j: int) -> int:
        """Of the atoms i..j a chunk could end with, the one at the best boundary that keeps at least half of
        the new text (the latest of those at that boundary)."""
        atoms = self.atoms
        first, most = atoms[i][0], atoms[j][1] - atoms[i][0]
        best = j
        for k in range(j, i - 1, -1):
            if 2 * (atoms[k][1] - first) < most:
                break
            if atoms[k][2] > atoms[best][2]:
                best = k
        return best

    def _overlap_start(self, prev: Chunk, atom_end: int, start: int) -> int:
        """Where a chunk starts that repeats the end of `prev`: the earliest start of a word of prev (after its
        first) from which prev's end is at most `overlap` tokens and the chunk, to the end of its first new atom,
        fits; `start` when none is."""
        words = [m.start() for m in _WORD_START.finditer(self.text, prev.start + 1, prev.end)]

        def ok(b: int) -> bool:
            return (self.count(self.text[b:prev.end]) - self.base <= self.overlap
                    and self.fits(b, atom_end))

        lo, hi = 0, len(words)  # the first index whose word start is ok (len: none is)
        while lo < hi:
            mid = (lo + hi) // 2
            if ok(words[mid]):
                hi = mid
            else:
                lo = mid + 1
        if lo == len(words):
            return start
        # within that, from a sentence's or a line's start where one is
        opening = next((w for w in words[lo:] if self._opens(w)), None)
        return opening if opening is not None and ok(opening) else words[lo]

    def _opens(self, w: int) -> bool:
        """Whether a word at `w` starts a sentence or a line."""
        text, k = self.text, w
        while k > 0 and text[k - 1].isspace():
            k -= 1
        if "\n" in text[k:w]:
            return True
        while k > 0 and text[k - 1] in _CLOSERS:
            k -= 1
        return k > 0 and text[k - 1] in _ENDS


_WORD_START = re.compile(r"(?<=\s)\S")
_ENDS = ".!?…。！？"
_CLOSERS = "\"'”’)]」』"


def _trimmed(text: str, s: int, e: int) -> tuple[int, int]:
    """text[s:e] less the whitespace at its ends, as (start, end)."""
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return s, e
