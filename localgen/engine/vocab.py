"""The model's vocabulary side of the Engine: tokenize, detokenize a token, end-of-generation tokens, the
chat template, and grammars checked against the vocabulary."""

from __future__ import annotations

from typing import Any

from localgen.engine.template import ChatTemplate
from localgen.errors import TemplateError
from localgen.native import vocab as native_vocab
from localgen.text import problem
from localgen.types import ModelRef


class Vocabulary:
    """Needs `vocab`, `n_vocab`, `model` and `_piece_buf` (the Engine sets them at load)."""

    vocab: Any
    n_vocab: int
    model: ModelRef
    _piece_buf: Any
    _template: ChatTemplate | None
    _eog: tuple[int, ...] | None

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        """Text to tokens; special-token text such as <|im_end|> becomes the control token (with
        `parse_special`, the default)."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # the input boundary refuses these; never a traceback from here either
            raise TemplateError(f"the text is not valid UTF-8: {problem(text)}") from None
        return native_vocab.tokenize(self.vocab, data, add_special, parse_special)

    def piece(self, token: int, special: bool = False) -> bytes:
        """One token's bytes, leading space kept (detokenizing one token alone would strip it)."""
        return native_vocab.piece(self.vocab, token, self._piece_buf, special)

    def token_text(self, token: int) -> str:
        """A token as text, control tokens spelled out (<|im_end|>)."""
        return self.piece(token, special=True).decode("utf-8", errors="replace") if token >= 0 else ""

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <|im_end|>, ...)."""
        return native_vocab.is_eog(self.vocab, token)

    @property
    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token of the vocabulary (for --ignore-eos)."""
        if self._eog is None:
            self._eog = tuple(t for t in range(self.n_vocab) if self.is_eog(t))
        return self._eog

    @property
    def template(self) -> ChatTemplate:
        """The model's chat template, compiled once; TemplateError when it has none or it is broken."""
        if self._template is None:
            source = self.model.summary.chat_template
            if not source:
                raise TemplateError(
                    f"{self.model.name} has no chat template (it may be a base model)",
                    hint="use --raw to send the prompt as a plain completion",
                )
            self._template = ChatTemplate(source, self.token_text(native_vocab.bos(self.vocab)),
                                          self.token_text(native_vocab.eos(self.vocab)))
        return self._template

    def chat_tokens(self, messages: list[dict[str, Any]], **extra: Any) -> list[int]:
        """Render the conversation with the model's template (and `extra` variables: tools) and tokenize it
        (special tokens parsed)."""
        return self.tokenize(*self.chat_text(messages, **extra))

    def chat_text(self, messages: list[dict[str, Any]], **extra: Any) -> tuple[str, bool]:
        """The rendered conversation, and whether tokenizing it adds BOS (not when the template wrote it)."""
        text = self.template.render(messages, **extra)
        bos = self.template.bos_token
        return text, not (bos and text.startswith(bos))

    def raw_tokens(self, text: str) -> list[int]:
        """Tokenize a plain completion prompt (BOS as the model asks)."""
        return self.tokenize(text, add_special=True)

    def check_grammar(self, gbnf: str) -> None:
        """Parse a GBNF grammar natively, so a bad one is an error before any work."""
        from localgen.native.grammar import check_grammar

        check_grammar(self.vocab, gbnf)
