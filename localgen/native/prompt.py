"""What the engine evaluates: a Prompt, its token ids and, with images or audio, the media spans that evaluate
some of its positions (native/mtmd.py makes those). Stdlib only: the engine reads a prompt's spans without
loading libmtmd's module."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol


class MediaSpan(Protocol):
    """One image or clip of a Prompt: `n_pos` positions from its start, `n_tokens` embeddings."""

    n_pos: int
    n_tokens: int

    def evaluate(self, lctx: Any, n_past: int, seq_id: int, n_batch: int) -> float:
        """Encode the media and decode its embeddings at `n_past` in `seq_id`; the encoder's seconds."""
        ...


_NO_SPANS: Mapping[int, MediaSpan] = MappingProxyType({})


def _no_spans() -> Mapping[int, MediaSpan]:
    return _NO_SPANS


@dataclass(frozen=True)
class Prompt:
    """A prompt as the engine takes it. `tokens`: its token ids, each media position holding a placeholder id
    (the KV record holds them like tokens; not to be changed in place); `spans`: the media spans that
    evaluate those positions, by start index (none for text); `owner`: what keeps the spans' native chunks
    alive as long as the prompt. Any cut of a prompt (a cached prefix, a shared lead) is plain tokens: only
    a whole Prompt carries its spans."""

    tokens: list[int]
    spans: Mapping[int, MediaSpan] = field(default_factory=_no_spans)
    owner: Any = field(default=None, repr=False, compare=False)

    @staticmethod
    def text(tokens: list[int]) -> Prompt:
        """A prompt of text tokens alone (no media)."""
        return Prompt(tokens)

    @property
    def media_tokens(self) -> int | None:
        """The embeddings its media take; None for a prompt of text alone."""
        return sum(s.n_tokens for s in self.spans.values()) if self.spans else None
