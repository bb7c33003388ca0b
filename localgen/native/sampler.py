"""SamplingParams → a llama.cpp sampler chain. Every decoding path (plain, speculative, batched) builds
its chain here, so they sample alike. The order is llama.cpp's: logit bias → penalties → DRY → grammar →
greedy, or top-n-sigma → top-k → typical → top-p → min-p → XTC → temperature → dist (mirostat: temperature
→ mirostat). Settings at their "off" value add no stage.

`pick` chooses the next token as llama_sampler_sample would, without its pass over the whole vocabulary where
the chain allows: llama_sampler_sample copies every logit into a candidate array (262,144 entries for Gemma 3,
allocated at a chain's first use) before the first stage runs, which on a CPU was most of a step's sampling
(docs/benchmarks.md, Costs inside a step).
A greedy chain (no bias, penalties, DRY or grammar) is the row's argmax, the greedy stage's own choice (the
first of equal maxima). Until numpy is imported, a greedy chain takes llama.cpp's own pass (the same choice)
until the logits it copied would have paid for importing numpy (NUMPY_IMPORT_ENTRIES), and only then imports it:
a one-shot answer never pays for the import, a long one at most about twice its cost (docs/benchmarks.md,
"Start-up of a one-shot `run`" and "Costs noted in the code").
A chain whose first working stage is top-k may, where a request is not exact, be given only the candidates
that can survive top-k: every logit at or above the k-th largest of the maxima of 512 groups of logits (k plus
the banned tokens' count, with ignore_eos), a bound at or below the row's k-th largest logit; the chain's
stages then run on them (its logit bias bans what ignore_eos bans), and the stages after top-k see what they
see after a full pass (only which of several equal logits at the k-th place survives may differ)."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from localgen.errors import GrammarError
from localgen.native.lib import lib, logits_row
from localgen.types import SamplingParams

GREEDY, TOP_K, FULL, GRAMMAR = "greedy", "top-k", "full", "grammar"
TOKEN_DATA = [("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]  # llama_token_data
NUMPY_IMPORT_ENTRIES = 50_000_000  # logits llama.cpp's pass copies in the time numpy takes to import
BLOCKS = 512  # groups of logits whose maxima bound top-k from below (k at most BLOCKS // 4)


@dataclass
class Chain:
    """A llama.cpp sampler chain (`ptr`, free it with `free`) and how `pick` may shortcut it."""

    ptr: Any
    shortcut: str  # GREEDY, TOP_K, FULL or GRAMMAR
    k: int
    banned: tuple[int, ...]  # end-of-generation tokens a logit bias of -inf bans (ignore_eos)
    # the top-k shortcut's candidate buffer (llama_token_data entries) and the llama_token_data_array that
    # points at it, made on first use and grown as needed: a pick then allocates nothing
    buf: Any = None
    fields: Any = None  # buf's id, logit and p columns (numpy views, made once)
    arr: Any = None
    data: Any = None  # buf's address as arr.data wants it (a stage may move arr.data: XTC drops the best)
    copied: int = 0  # logits copied by greedy picks made through llama.cpp's full pass, numpy not imported
    grammar: Any = None  # the chain's grammar stage (GRAMMAR: owned by the chain)


def shortcut(s: SamplingParams, n_vocab: int) -> str:
    """Which of `pick`'s shortcuts the chain for `s` allows. Stages before greedy or top-k that read the whole
    vocabulary (a logit bias other than ignore_eos's ban, penalties, DRY, a grammar) rule both out; a grammar's
    chain is GRAMMAR (`pick` applies it and accepts the token apart, never one the grammar does not allow)."""
    neutral = s.repeat_last_n == 0 or (s.repeat_penalty == 1.0 and s.frequency_penalty == 0.0
                                       and s.presence_penalty == 0.0)
    if s.grammar:
        return GRAMMAR
    if s.logit_bias or not neutral or s.dry_multiplier > 0:
        return FULL
    if s.temperature <= 0:
        return GREEDY
    if s.mirostat or s.top_n_sigma > 0 or not 0 < s.top_k <= BLOCKS // 4 or n_vocab < 8 * BLOCKS:
        return FULL
    return TOP_K


def pick(ctx: Any, chain: Chain, row: int, n_vocab: int, top_k: bool = False) -> int:
    """The token `chain` chooses from output row `row` of the last decode (-1: the last), accepted into the
    chain as llama_sampler_sample accepts it. `top_k`: the caller allows the top-k shortcut (not exact)."""
    lc = lib()
    how = chain.shortcut
    if how == FULL or (how == TOP_K and not top_k):
        return int(lc.llama_sampler_sample(chain.ptr, ctx, row))
    if how == GREEDY and not chain.banned and chain.copied < NUMPY_IMPORT_ENTRIES and not numpy_imported():
        chain.copied += n_vocab
        return int(lc.llama_sampler_sample(chain.ptr, ctx, row))
    import numpy as np

    logits = logits_row(ctx, row, n_vocab)
    if how == GREEDY:
        tok = int(logits.argmax())
        if chain.banned and tok in chain.banned:
            masked = logits.copy()
            masked[list(chain.banned)] = -np.inf
            tok = int(masked.argmax())
    elif how == GRAMMAR:
        return _grammar_pick(lc, chain, logits, n_vocab)
    else:
        ids = top_k_candidates(logits, chain.k, chain.banned)
        if ids is None:
            return int(lc.llama_sampler_sample(chain.ptr, ctx, row))
        n = len(ids)
        if chain.buf is None or len(chain.buf) < n:
            chain.buf = np.zeros(max(n, 2 * BLOCKS), dtype=TOKEN_DATA)
            chain.fields = (chain.buf["id"], chain.buf["logit"], chain.buf["p"])
            chain.data = chain.buf.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
            chain.arr = lc.llama_token_data_array(chain.data, 0, -1, False)
        tid, logit, p = chain.fields
        arr = chain.arr
        tid[:n] = ids
        logit[:n] = logits[ids]
        p[:n] = 0.0
        arr.data, arr.size, arr.selected, arr.sorted = chain.data, n, -1, False
        lc.llama_sampler_apply(chain.ptr, ctypes.byref(arr))
        if not 0 <= arr.selected < arr.size:
            raise RuntimeError("the sampler chain selected no token")
        tok = int(arr.data[arr.selected].id)
    lc.llama_sampler_accept(chain.ptr, tok)
    return tok


def _grammar_pick(lc: Any, chain: Chain, logits: Any, n_vocab: int) -> int:
    """A grammar chain's pick, as llama_sampler_sample makes it but with the chain applied and the token accepted
    apart: llama.cpp's grammar throws a C++ exception (which aborts the process) when it accepts a token it does
    not allow, and the chain picks one when the grammar allows none (every logit -inf: a grammar complete while
    ignore_eos bans the end, or one that admits nothing this model has). A complete grammar under ignore_eos
    gives an end-of-generation token (the answer ends); one that allows nothing is a GrammarError."""
    import numpy as np

    if chain.buf is None:
        chain.buf = np.zeros(n_vocab, dtype=TOKEN_DATA)
        chain.fields = (chain.buf["id"], chain.buf["logit"], chain.buf["p"], np.arange(n_vocab, dtype=np.int32))
        chain.data = chain.buf.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        chain.arr = lc.llama_token_data_array(chain.data, 0, -1, False)
    tid, logit, p, ids = chain.fields
    tid[:] = ids  # a stage may have sorted the buffer last time
    logit[:] = logits
    p[:] = 0.0
    arr = chain.arr
    arr.data, arr.size, arr.selected, arr.sorted = chain.data, n_vocab, -1, False
    lc.llama_sampler_apply(chain.ptr, ctypes.byref(arr))
    if 0 <= arr.selected < arr.size and arr.data[arr.selected].logit != float("-inf"):
        tok = int(arr.data[arr.selected].id)
        lc.llama_sampler_accept(chain.ptr, tok)
        return tok
    end = allowed(lc, chain.grammar, chain.banned)
    if end is None:
        raise GrammarError("the grammar allows no token of this model here: the answer cannot go on")
    return end


def allowed(lc: Any, grammar: Any, tokens: Sequence[int]) -> int | None:
    """The first of `tokens` the grammar stage alone allows now, or None."""
    if not tokens:
        return None
    arr_t = (lc.llama_token_data * len(tokens))(*((t, 0.0, 0.0) for t in tokens))
    arr = lc.llama_token_data_array(arr_t, len(tokens), -1, False)
    lc.llama_sampler_apply(grammar, ctypes.byref(arr))
    return next((int(arr_t[i].id) for i in range(len(tokens)) if arr_t[i].logit != float("-inf")), None)


def numpy_imported() -> bool:
    """Whether this process has imported numpy (a pick would then pay nothing more for it)."""
    return "numpy" in sys.modules


def top_k_candidates(logits: Any, k: int, banned: tuple[int, ...] = ()) -> Any:
    """The ids (ascending) of every logit at or above the (k + len(banned))-th largest of the maxima of BLOCKS
    disjoint groups of logits: a superset of the ids top-k can keep, ties at the k-th place included. The
    banned tokens may be among them: the chain's logit-bias stage, before top-k, bans them (-inf) as it does
    in a full pass, and top-k drops them (filtering them out here in numpy made a pick slower: docs/benchmarks.md,
    `localgen serve` against llama-server). The ban's margin matters: an end-of-generation token is often among
    a row's best, and with a bound of the k-th maximum a banned one among the k left too few candidates, and
    with ignore_eos many of Gemma 3 270M's rows took the full pass (same section). The k + len(banned) maxima
    at or above the bound are as many distinct logits, at least k of them not banned. None when fewer than
    k + len(banned) are found (NaN logits, or more banned tokens than the groups allow): then only the full
    pass chooses as llama.cpp would."""
    import numpy as np

    kk = k + len(banned)
    if kk > BLOCKS:
        return None
    per = len(logits) // BLOCKS
    maxima = logits[:per * BLOCKS].reshape(per, BLOCKS).max(axis=0)  # group j: logits j, j+BLOCKS, j+2·BLOCKS…
    bound = np.partition(maxima, BLOCKS - kk)[BLOCKS - kk]
    ids = np.flatnonzero(logits >= bound)
    return ids if len(ids) >= kk else None


def build(vocab: Any, n_vocab: int, s: SamplingParams, seed: int, n_ctx: int,
          eog: tuple[int, ...] = (), history: list[int] | tuple[int, ...] = ()) -> Chain:
    """A new sampler chain (free it with `free`). `eog`: the end-of-generation tokens, banned
    when s.ignore_eos. `history`: the prompt's tokens, which the penalties and DRY see as llama.cpp's own
    tools feed them (a repeat of the prompt is a repeat too); the grammar and later stages never do."""
    lc = lib()
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
            if token >= 0:  # an image's or clip's positions hold negative placeholders (native/mtmd.py)
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
    else:
        g = None
    for stage in _pickers(lc, s, n_vocab, seed):
        add(stage)
    return Chain(chain, shortcut(s, n_vocab), s.top_k, tuple(eog) if s.ignore_eos else (), grammar=g)


def _pickers(lc: Any, s: SamplingParams, n_vocab: int, seed: int) -> list[Any]:
    """The chain's last stages, which pick the token: greedy, Mirostat, or the truncations, then temperature and
    the seeded draw (llama.cpp's own order)."""
    if s.temperature <= 0:
        return [lc.llama_sampler_init_greedy()]
    if s.mirostat:
        pick = (lc.llama_sampler_init_mirostat(n_vocab, seed, s.mirostat_ent, s.mirostat_lr, 100) if s.mirostat == 1
                else lc.llama_sampler_init_mirostat_v2(seed, s.mirostat_ent, s.mirostat_lr))
        return [lc.llama_sampler_init_temp(s.temperature), pick]
    out = [lc.llama_sampler_init_top_n_sigma(s.top_n_sigma)] if s.top_n_sigma > 0 else []
    out += [lc.llama_sampler_init_top_k(s.top_k), lc.llama_sampler_init_typical(s.typical_p, 1),
            lc.llama_sampler_init_top_p(s.top_p, 1), lc.llama_sampler_init_min_p(s.min_p, 1)]
    if s.xtc_probability > 0:
        out.append(lc.llama_sampler_init_xtc(s.xtc_probability, s.xtc_threshold, 1, seed))
    temp = (lc.llama_sampler_init_temp_ext(s.temperature, s.dynatemp_range, s.dynatemp_exp) if s.dynatemp_range > 0
            else lc.llama_sampler_init_temp(s.temperature))
    return [*out, temp, lc.llama_sampler_init_dist(seed)]


def accept(chain: Chain, tok: int) -> None:
    """Tell the chain a token was chosen without it (fed, as a reasoning budget's close tag): its penalties
    and grammar see it as they see what they pick. A token its grammar does not allow is a GrammarError, not
    accepted (llama.cpp's grammar would throw, aborting the process)."""
    lc = lib()
    if chain.grammar is not None and allowed(lc, chain.grammar, (tok,)) is None:
        raise GrammarError("the grammar does not allow a token the answer was given (a reasoning budget's close "
                           "tag): the answer cannot go on")
    lc.llama_sampler_accept(chain.ptr, tok)


def free(chain: Chain) -> None:
    """Release a sampler chain."""
    lib().llama_sampler_free(chain.ptr)

