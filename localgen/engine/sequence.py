"""The one per-sequence decoder stage: every decoding path (plain, speculative, batched, beams) feeds it the
tokens it samples, and it decides the rest the same way for all of them: end-of-generation, incremental
UTF-8 (a character split over tokens waits for its last byte; one the answer ends inside is left out), stop
strings (text that could begin one is held back, and the text ends before the earliest one), the token limit
(the request's max_tokens, or the window), and which log-probabilities belong to the answer. New ways to
finish go here, once."""

from __future__ import annotations

import bisect
import codecs
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from localgen.engine.stops import StopMatcher
from localgen.types import FinishReason, SamplingParams, TokenLogprob


@dataclass(frozen=True)
class Limit:
    """How many tokens a sequence may generate, and whether that is the request's max_tokens (finish
    "length") or the room left in the window (finish "context")."""

    tokens: int
    by_request: bool

    @property
    def reason(self) -> FinishReason:
        """The finish reason when the limit is reached."""
        return "length" if self.by_request else "context"


def limit_for(s: SamplingParams, prompt_len: int, n_ctx: int) -> Limit:
    """How many tokens may be generated: max_tokens (0: none, -1: no limit), within the window."""
    room = max(0, n_ctx - prompt_len)
    if 0 <= s.max_tokens <= room:
        return Limit(s.max_tokens, True)
    return Limit(room, False)


class SequenceDecoder:
    """One sequence's sampled tokens → its text. `push` takes each token and returns the text that is now
    safe to show; once `reason` is set the sequence has ended. Log-probabilities appended to `logprobs` (one
    per pushed token, by the caller that has the logits) are kept only for tokens of the answer: a stop string's
    tokens are dropped (as llama-server drops them), and a token whose text the answer ends inside is kept."""

    def __init__(self, piece: Callable[[int], bytes], is_eog: Callable[[int], bool], stops: Iterable[str],
                 limit: Limit, ignore_eos: bool = False, grammar: bool = False) -> None:
        self.piece = piece
        self.is_eog = is_eog
        self.limit = limit
        # ignore_eos bans the end tokens (a bias of -inf): one sampled all the same is a grammar's, complete (only the
        # end is left to it; native/sampler.py), and ends the answer
        self.ignore_eos = ignore_eos and not grammar
        self.stops = StopMatcher(tuple(stops))
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.tokens: list[int] = []
        self.starts: list[int] = []  # where each token's text begins in `text` (to cut the logprobs at a stop)
        self.logprobs: list[TokenLogprob] = []
        self.text = ""
        self.emitted = 0  # characters of text already returned
        self.reason: FinishReason | None = None

    @classmethod
    def for_request(cls, piece: Callable[[int], bytes], is_eog: Callable[[int], bool], s: SamplingParams,
                    prompt_len: int, n_ctx: int) -> SequenceDecoder:
        """A decoder with the request's stop strings, ignore_eos and limit."""
        return cls(piece, is_eog, s.stop, limit_for(s, prompt_len, n_ctx), s.ignore_eos, s.grammar is not None)

    def push(self, token: int) -> str:
        """Take one sampled token; returns the text it makes safe to show ("" if none)."""
        assert self.reason is None, "a sequence that ended takes no more tokens"
        if not self.ignore_eos and self.is_eog(token):
            self.reason = "eos"
            del self.logprobs[len(self.tokens):]  # the end token is not part of the answer
            return self._flush()
        self.tokens.append(token)
        self.starts.append(len(self.text))
        self.text += self.utf8.decode(self.piece(token))
        hit = self.stops.find(self.text)
        if hit is not None:
            self.text = self.text[:hit]
            del self.logprobs[bisect.bisect_left(self.starts, hit):]  # the tokens that begin at the stop or after
            self.reason = "stop"
            return self._take(len(self.text))
        out = self._take(self.stops.safe(self.text))
        if len(self.tokens) >= self.limit.tokens:
            self.reason = self.limit.reason
            out += self._flush()
        return out

    def end(self, reason: FinishReason) -> str:
        """End the sequence now (cancelled, or no tokens at all) unless it has ended: returns the held-back
        text, which turned out not to begin a stop string."""
        if self.reason is not None:
            return ""
        self.reason = reason
        return self._flush()

    def _flush(self) -> str:
        # bytes of a character the answer ended inside are left out (as llama-server does), not shown as U+FFFD:
        # the decoder holds back only the start of a character that could still be whole (bad bytes mid-text are
        # replaced as they come)
        self.utf8.reset()
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        if upto <= self.emitted:
            return ""
        piece, self.emitted = self.text[self.emitted:upto], upto
        return piece


def decode_all(piece: Callable[[int], bytes], tokens: Iterable[int], stops: Iterable[str]) -> tuple[str, bool]:
    """A finished token list's text (beams), ended before its earliest stop string; and whether one was
    found."""
    seq = SequenceDecoder(piece, lambda t: False, stops, Limit(2**62, True))
    for t in tokens:
        seq.push(t)
        if seq.reason is not None:
            break
    seq.end("length")
    return seq.text, seq.reason == "stop"
