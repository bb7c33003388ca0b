"""A model's vocabulary through llama.cpp: text to tokens, a token's bytes, its special tokens."""

from __future__ import annotations

import ctypes
from typing import Any

from localgen.native.lib import lib


def of_model(model: Any) -> Any:
    """The vocabulary of a loaded model (a pointer owned by the model)."""
    return lib().llama_model_get_vocab(model)


def n_tokens(vocab: Any) -> int:
    """How many tokens the vocabulary has."""
    return int(lib().llama_vocab_n_tokens(vocab))


def tokenize(vocab: Any, data: bytes, add_special: bool, parse_special: bool = True) -> list[int]:
    """UTF-8 text to tokens; special-token text such as <|im_end|> becomes the control token (unless not
    `parse_special`: then it is plain text, as llama-perplexity reads its text)."""
    lc = lib()
    cap = len(data) + 8
    while True:
        arr = (lc.llama_token * cap)()
        n = lc.llama_tokenize(vocab, data, len(data), arr, cap, add_special, parse_special)
        if n >= 0:
            return list(arr[:n])
        cap = -n


def piece(vocab: Any, token: int, buf: Any, special: bool) -> bytes:
    """One token's bytes, leading space kept, written into `buf` (a ctypes string buffer, reused) when it fits."""
    lc = lib()
    n = lc.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = lc.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    return bytes(buf.raw[:n])


def piece_buffer() -> Any:
    """A buffer for `piece`, made once per vocabulary user."""
    return ctypes.create_string_buffer(256)


def is_eog(vocab: Any, token: int) -> bool:
    """Whether a token ends generation (EOS, EOT, <|im_end|>, ...)."""
    return bool(lib().llama_vocab_is_eog(vocab, token))


def bos(vocab: Any) -> int:
    """The beginning-of-sequence token."""
    return int(lib().llama_vocab_bos(vocab))


def eos(vocab: Any) -> int:
    """The end-of-sequence token."""
    return int(lib().llama_vocab_eos(vocab))


def sep(vocab: Any) -> int:
    """The separator token."""
    return int(lib().llama_vocab_sep(vocab))


def adds_bos(vocab: Any) -> bool:
    """Whether tokenizing with special tokens adds BOS."""
    return bool(lib().llama_vocab_get_add_bos(vocab))


def adds_eos(vocab: Any) -> bool:
    """Whether tokenizing with special tokens adds EOS."""
    return bool(lib().llama_vocab_get_add_eos(vocab))


def adds_sep(vocab: Any) -> bool:
    """Whether the vocabulary puts SEP between the texts of a pair."""
    return bool(lib().llama_vocab_get_add_sep(vocab))


def parts_text(vocab: Any, token: int) -> bool:
    """Whether a token is special (control or user-defined) and strips no spaces around it: the tokenizer parts
    text at such tokens and tokenizes each piece alone."""
    lc = lib()
    strip = lc.LLAMA_TOKEN_ATTR_LSTRIP | lc.LLAMA_TOKEN_ATTR_RSTRIP
    special = lc.LLAMA_TOKEN_ATTR_CONTROL | lc.LLAMA_TOKEN_ATTR_USER_DEFINED
    attr = int(lc.llama_vocab_get_attr(vocab, token))
    return bool(attr & special) and not attr & strip
