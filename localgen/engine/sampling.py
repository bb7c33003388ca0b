"""SamplingParams → a llama.cpp sampler chain. Every decoding path (plain, speculative, batched) builds
its chain here, so they sample alike. The order is llama.cpp's: logit bias → penalties → DRY → grammar →
greedy, or top-n-sigma → top-k → typical → top-p → min-p → XTC → temperature → dist (mirostat: temperature
→ mirostat). Settings at their "off" value add no stage."""

from __future__ import annotations

import ctypes
from typing import Any

from localgen.errors import GrammarError
from localgen.types import SamplingParams


def build(lc: Any, vocab: Any, n_vocab: int, s: SamplingParams, seed: int, n_ctx: int,
          eog: tuple[int, ...] = (), history: list[int] | tuple[int, ...] = ()) -> Any:
    """A new sampler chain (free it with llama_sampler_free). `eog`: the end-of-generation tokens, banned
    when s.ignore_eos. `history`: the prompt's tokens, which the penalties and DRY see as llama.cpp's own
    tools feed them (a repeat of the prompt is a repeat too); the grammar and later stages never do."""
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())

    def add(sampler: Any) -> None:
        lc.llama_sampler_chain_add(chain, sampler)

    bias = [(t, b) for t, b in s.logit_bias if 0 <= t < n_vocab]
    if s.ignore_eos:
        bias += [(t, float("-inf")) for t in eog]
    if bias:
        arr = (lc.llama_logit_bias * len(bias))()
        for i, (t, b) in enumerate(bias):
            arr[i].token = t
            arr[i].bias = b
        add(lc.llama_sampler_init_logit_bias(n_vocab, len(bias), arr))
    last_n = s.repeat_last_n if s.repeat_last_n >= 0 else n_ctx
    add(lc.llama_sampler_init_penalties(n_vocab, last_n, s.repeat_penalty, s.frequency_penalty, s.presence_penalty))
    if s.dry_multiplier > 0:
        breakers = [b.encode("utf-8") for b in s.dry_sequence_breaker]
        arr_b = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)
        dry_last = s.dry_penalty_last_n if s.dry_penalty_last_n >= 0 else n_ctx
        add(lc.llama_sampler_init_dry(vocab, s.dry_multiplier, s.dry_base, s.dry_allowed_length, dry_last, arr_b,
                                      len(breakers)))
    if history and (s.repeat_penalty != 1.0 or s.frequency_penalty or s.presence_penalty or s.dry_multiplier > 0):
        window = max(s.repeat_last_n if s.repeat_last_n >= 0 else n_ctx,
                     (s.dry_penalty_last_n if s.dry_penalty_last_n >= 0 else n_ctx) if s.dry_multiplier > 0 else 0)
        for token in list(history)[-window:] if window else ():
            if token >= 0:  # an image's or clip's positions hold negative placeholders (engine/mtmd.py)
                lc.llama_sampler_accept(chain, token)
    if s.grammar:
        if s.grammar_triggers:  # lazy: free text until a trigger matches, then the grammar from its start on
            pats = [p.encode("utf-8") for p in s.grammar_triggers]
            arr_p = (ctypes.c_char_p * len(pats))(*pats)
            g = lc.llama_sampler_init_grammar_lazy_patterns(vocab, s.grammar.encode("utf-8"), b"root", arr_p,
                                                           len(pats), None, 0)
        else:
            g = lc.llama_sampler_init_grammar(vocab, s.grammar.encode("utf-8"), b"root")
        if not g:
            lc.llama_sampler_free(chain)
            raise GrammarError("the grammar does not parse")
        add(g)
    if s.temperature <= 0:
        add(lc.llama_sampler_init_greedy())
    elif s.mirostat:
        add(lc.llama_sampler_init_temp(s.temperature))
        if s.mirostat == 1:
            add(lc.llama_sampler_init_mirostat(n_vocab, seed, s.mirostat_ent, s.mirostat_lr, 100))
        else:
            add(lc.llama_sampler_init_mirostat_v2(seed, s.mirostat_ent, s.mirostat_lr))
    else:
        if s.top_n_sigma > 0:
            add(lc.llama_sampler_init_top_n_sigma(s.top_n_sigma))
        add(lc.llama_sampler_init_top_k(s.top_k))
        add(lc.llama_sampler_init_typical(s.typical_p, 1))
        add(lc.llama_sampler_init_top_p(s.top_p, 1))
        add(lc.llama_sampler_init_min_p(s.min_p, 1))
        if s.xtc_probability > 0:
            add(lc.llama_sampler_init_xtc(s.xtc_probability, s.xtc_threshold, 1, seed))
        add(lc.llama_sampler_init_temp(s.temperature))
        add(lc.llama_sampler_init_dist(seed))
    return chain

