"""SamplingParams → a llama.cpp sampler chain, with the bindings' stages and order (penalties → grammar →
greedy, or top-k → typical → top-p → min-p → temperature → dist), so every decoding path samples alike."""

from __future__ import annotations

from typing import Any

from localgen.errors import GrammarError
from localgen.types import SamplingParams


def build(lc: Any, vocab: Any, n_vocab: int, s: SamplingParams, seed: int, n_ctx: int) -> Any:
    """A new sampler chain (free it with llama_sampler_free)."""
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    last_n = s.repeat_last_n if s.repeat_last_n >= 0 else n_ctx
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_penalties(
        n_vocab, last_n, s.repeat_penalty, s.frequency_penalty, s.presence_penalty))
    if s.grammar:
        g = lc.llama_sampler_init_grammar(vocab, s.grammar.encode("utf-8"), b"root")
        if not g:
            lc.llama_sampler_free(chain)
            raise GrammarError("the grammar does not parse")
        lc.llama_sampler_chain_add(chain, g)
    if s.temperature == 0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
    else:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(s.top_k))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_typical(s.typical_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(s.top_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(s.min_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(s.temperature))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))
    return chain
