"""The one stop-string matcher, for every decoding path (plain, speculative, batched, beams): the text
ends before the earliest occurrence of any stop string, and text that could still become a stop string
is held back, never emitted."""

from __future__ import annotations


class StopMatcher:
    """Watches a growing text for stop strings."""

    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self._searched = 0  # text before this index holds no stop string

    def find(self, text: str) -> int | None:
        """Where the earliest stop string begins in `text` (only the new part is searched), or None."""
        if not self.stops:
            return None
        start = max(0, self._searched - self.longest + 1)
        best: int | None = None
        for stop in self.stops:
            i = text.find(stop, start)
            if i != -1 and (best is None or i < best):
                best = i
        self._searched = len(text)
        return best

    def safe(self, text: str) -> int:
        """How much of `text` can be emitted: all but a tail that could begin a stop string."""
        held = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:n]):
                    held = n
                    break
        return len(text) - held


def cut(text: str, stops: tuple[str, ...] | list[str]) -> tuple[str, bool]:
    """`text` ended before its earliest stop string, and whether one was found."""
    i = StopMatcher(stops).find(text)
    return (text, False) if i is None else (text[:i], True)
