"""A prompt with images or audio: its tokens, media positions as placeholder ids, and the spans that evaluate
them (native/mtmd.py makes them). Stdlib only: the engine reads any token list through `spans_of` and
`media_tokens_of` without loading libmtmd's module."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class MediaSpan(Protocol):
    """One image or clip of a Prompt: `n_pos` positions from its start, `n_tokens` embeddings."""

    n_pos: int
    n_tokens: int

    def evaluate(self, lctx: Any, n_past: int, seq_id: int, n_batch: int) -> float:
        """Encode the media and decode its embeddings at `n_past` in `seq_id`; the encoder's seconds."""
        ...


class Prompt(list[int]):
    """A prompt's tokens, media positions as placeholder ids, with the spans that evaluate them (by start
    index). Slicing gives plain lists: only whole prompts carry their spans."""

    spans: dict[int, MediaSpan]
    media_tokens: int
    _owner: Any

    def __init__(self, tokens: list[int], spans: Mapping[int, MediaSpan], owner: Any) -> None:
        super().__init__(tokens)
        self.spans = dict(spans)
        self.media_tokens = sum(s.n_tokens for s in spans.values())
        self._owner = owner  # keeps the mtmd chunks alive as long as the prompt


_NONE: Mapping[int, MediaSpan] = {}


def spans_of(tokens: Sequence[int]) -> Mapping[int, MediaSpan]:
    """A prompt's media spans by start index; none for plain tokens (or a slice of a Prompt)."""
    return tokens.spans if isinstance(tokens, Prompt) else _NONE


def media_tokens_of(tokens: Sequence[int]) -> int | None:
    """The embeddings a prompt's media take; None for plain tokens."""
    return tokens.media_tokens if isinstance(tokens, Prompt) else None
