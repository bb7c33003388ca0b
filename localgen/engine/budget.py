"""Reasoning budgets, as llama.cpp's --reasoning-budget: a model still thinking inside a reasoning block
(<think> ...) after `reasoning_budget` tokens of it has the block closed for it: the end tag's tokens are fed
as if it had sampled them (and accepted into its sampler chain), and it goes on to its answer. A block the
template's generation prompt opened counts from the first token; one the model opens, from its open tag."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localgen.types import SamplingParams

# Ways a reasoning block opens, with their closing tags (tools/stream.py splits the answer by the same).
THINK_TAGS = (("<think>", "</think>"), ("<thinking>", "</thinking>"), ("[THINK]", "[/THINK]"),
              ("<|START_THINKING|>", "<|END_THINKING|>"))
_TAIL = 32  # characters of the generated text kept to find a tag split over tokens


class Budget:
    """One sequence's reasoning budget: told each token's text, it says when to feed the close tag instead."""

    def __init__(self, limit: int, tokenize: Any, opened: tuple[str, str] | None) -> None:
        self.limit = limit
        self.tokenize = tokenize  # text → tokens, special-token text becoming the control token
        self.tags = opened  # the open block's tags, None while none is open
        self.used = 0  # tokens generated inside the block
        self.queue: list[int] = []  # the close tag's tokens still to feed
        self.done = False  # the block was closed (by the model or for it): nothing more to watch
        self.tail = ""
        self.closed_for_it = False  # whether the budget closed it

    def forced(self) -> int | None:
        """The next token to feed instead of sampling, while the close tag is being put in."""
        if not self.queue and self.tags is not None and not self.done and self.used >= self.limit:
            self.queue = list(self.tokenize("\n" + self.tags[1] + "\n\n"))
            self.done = self.closed_for_it = True
        return self.queue.pop(0) if self.queue else None

    def seen(self, text: str) -> None:
        """The text of the token just generated (sampled or fed)."""
        if self.done:
            return
        self.tail = (self.tail + text)[-_TAIL:]
        if self.tags is None:
            for tags in THINK_TAGS:
                if tags[0] in self.tail:
                    self.tags, self.used, self.tail = tags, 0, ""
                    return
            return
        if self.tags[1] in self.tail:
            self.done = True
            return
        self.used += 1


def opened_by(prompt_text: str) -> tuple[str, str] | None:
    """The tags of the reasoning block a prompt leaves open (its template started the thinking)."""
    tail = prompt_text.rstrip()
    return next((tags for tags in THINK_TAGS if tail.endswith(tags[0])), None)


def budget_for(vocab: Any, s: SamplingParams, prompt: list[int]) -> Budget | None:
    """A budget for a sequence with this prompt, or None without one (reasoning_budget -1)."""
    if s.reasoning_budget < 0:
        return None
    tail = b"".join(vocab.piece(t, special=True) for t in prompt[-16:] if t >= 0).decode("utf-8", "replace")
    return Budget(s.reasoning_budget, lambda text: vocab.tokenize(text, False), opened_by(tail))


def pick(budget: Budget | None, chain: Any, sample: Callable[[], int], accept: Callable[[Any, int], None]) -> int:
    """The next token: the one the budget feeds (accepted into the sampler chain by `accept`), else what
    `sample` picks. The single stream, the scheduler and Solo all choose this way."""
    tok = budget.forced() if budget is not None else None
    if tok is None:
        return sample()
    accept(chain, tok)
    return tok


def feed(budget: Budget | None, vocab: Any, token: int) -> None:
    """Tell a budget (if any) the token just generated."""
    if budget is not None:
        budget.seen(vocab.piece(token, special=True).decode("utf-8", "replace"))
