"""native/sampler.py's shortcuts choose what llama_sampler_sample's pass over the whole vocabulary chooses:
the argmax for a greedy chain, a top-k chain given only the logits that can survive top-k. Checked on real
logits (SmolLM2, 49,152 tokens) and on rows made to tie, seed by seed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from localgen.engine.batch import ParallelContext
from localgen.native import sampler as sampling
from localgen.native.lib import lib
from localgen.types import SamplingParams


@pytest.fixture(scope="module")
def decoded(smollm2_engine: Any) -> Any:
    """A pooled context holding one decode with 4 output rows (four different prompts' last tokens)."""
    eng: Any = smollm2_engine
    pc = ParallelContext(eng, 4, 256, pooled=True)
    prompts = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "Roses are red,"]
    pc.batch.n_tokens = 0
    for slot, p in enumerate(prompts):
        toks = list(eng.tokenize(p, add_special=True))
        for pos, t in enumerate(toks):
            pc.add(t, pos, slot, pos == len(toks) - 1)
    pc.decode(4)
    rows = [i for i in range(pc.batch.n_tokens) if pc.batch.wants_logits(i)]
    yield pc, rows
    pc.close()


def _both(pc: Any, s: SamplingParams, seed: int, row: int, draws: int = 3) -> tuple[list[int], list[int]]:
    """`draws` tokens from the same logits row by the full pass and by pick, each with a fresh chain."""
    lc, n_vocab = lib(), pc.n_vocab
    full, short = pc.sampler(s, seed), pc.sampler(s, seed)
    try:
        a = [int(lc.llama_sampler_sample(full.ptr, pc.ctx, row)) for _ in range(draws)]
        b = [sampling.pick(pc.ctx, short, row, n_vocab, top_k=True) for _ in range(draws)]
    finally:
        lc.llama_sampler_free(full.ptr)
        lc.llama_sampler_free(short.ptr)
    return a, b


def test_which_chains_take_a_shortcut() -> None:
    S, n = SamplingParams, 49152
    assert sampling.shortcut(S(temperature=0), n) == sampling.GREEDY
    assert sampling.shortcut(S(temperature=0, ignore_eos=True), n) == sampling.GREEDY
    assert sampling.shortcut(S(temperature=0.8), n) == sampling.TOP_K
    assert sampling.shortcut(S(temperature=0.8, repeat_penalty=1.1, repeat_last_n=0), n) == sampling.TOP_K
    for s in (S(temperature=0, repeat_penalty=1.1), S(temperature=0.8, presence_penalty=0.5),
              S(temperature=0, frequency_penalty=0.1), S(temperature=0.8, dry_multiplier=0.8),
              S(temperature=0, logit_bias=((5, 2.0),)),
              S(temperature=0.8, mirostat=2), S(temperature=0.8, top_n_sigma=1.0), S(temperature=0.8, top_k=0),
              S(temperature=0.8, top_k=1000)):
        assert sampling.shortcut(s, n) == sampling.FULL, s
    assert sampling.shortcut(S(temperature=0.8), 1000) == sampling.FULL  # too few tokens for 512 groups
    for s in (S(temperature=0.8, grammar='root ::= "a"'), S(temperature=0, grammar='root ::= "a"', top_k=1000)):
        assert sampling.shortcut(s, n) == sampling.GRAMMAR, s


@pytest.mark.parametrize("s", [
    SamplingParams(temperature=0.0, grammar='root ::= [a-z]+ "."'),
    SamplingParams(temperature=0.8, grammar='root ::= ("yes" | "no" | [0-9]+) " " [A-Za-z ]*'),
    SamplingParams(temperature=1.0, top_k=0, grammar='root ::= [^x]*', repeat_penalty=1.2),
], ids=["greedy", "sampled", "penalties"])
def test_grammar_picks_are_the_full_pass_s(decoded: Any, s: SamplingParams) -> None:
    """A grammar chain is applied and its token accepted apart (so a token the grammar does not allow is never
    accepted): the same draws as llama_sampler_sample's."""
    pc, rows = decoded
    assert sampling.shortcut(s, pc.n_vocab) == sampling.GRAMMAR
    for row in rows:
        for seed in range(4):
            a, b = _both(pc, s, seed, row, draws=4)
            assert a == b, (row, seed)


def test_greedy_shortcut_is_the_greedy_stage(decoded: Any) -> None:
    pc, rows = decoded
    for row in rows:
        a, b = _both(pc, SamplingParams(temperature=0.0), 0, row, draws=1)
        assert a == b == [int(np.argmax(pc.logits(row)))]


def test_greedy_picks_before_numpy_is_imported_are_the_same_tokens(decoded: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Until numpy is imported (a one-shot `run` never imports it), a greedy chain takes llama.cpp's own pass,
    for as many logits as the import would cost, then the argmax: both choose the same token, row by row."""
    pc, rows = decoded
    monkeypatch.setattr(sampling, "numpy_imported", lambda: False)
    monkeypatch.setattr(sampling, "NUMPY_IMPORT_ENTRIES", 2 * pc.n_vocab)  # two picks through llama.cpp
    chain = pc.sampler(SamplingParams(temperature=0.0), 0)
    try:
        assert chain.shortcut == sampling.GREEDY
        for row in rows:
            want = int(np.argmax(pc.logits(row)))
            before = chain.copied
            assert sampling.pick(pc.ctx, chain, row, pc.n_vocab) == want
            assert chain.copied == min(before + pc.n_vocab, 2 * pc.n_vocab)  # llama.cpp's pass, then numpy's
    finally:
        lib().llama_sampler_free(chain.ptr)
    assert len(rows) > 2 and chain.copied == 2 * pc.n_vocab


def test_a_fed_token_the_grammar_does_not_allow_is_an_error_not_an_abort(decoded: Any) -> None:
    """A token fed to a grammar chain (a reasoning budget's close tag) that the grammar does not allow: llama.cpp's
    grammar threw accepting it, through ctypes, and the process aborted."""
    from localgen.errors import GrammarError

    pc, _ = decoded
    chain = pc.sampler(SamplingParams(temperature=0.0, grammar='root ::= "yes"'), 0)
    try:
        with pytest.raises(GrammarError, match="does not allow a token the answer was given"):
            sampling.accept(chain, pc.engine.tokenize("no", add_special=False)[0])
        sampling.accept(chain, pc.engine.tokenize("yes", add_special=False)[0])  # one it allows is taken
    finally:
        sampling.free(chain)


def test_banned_end_of_generation_tokens_stay_banned(decoded: Any) -> None:
    """ignore_eos bans the end tokens with a bias of -inf; the greedy shortcut masks them the same way."""
    pc, rows = decoded
    lc = lib()
    for row in rows:
        best = int(np.argmax(pc.logits(row)))
        full = pc.sampler(SamplingParams(temperature=0.0, logit_bias=((best, float("-inf")),)), 0)
        short = sampling.Chain(pc.sampler(SamplingParams(temperature=0.0), 0).ptr, sampling.GREEDY, 40, (best,))
        try:
            a = int(lc.llama_sampler_sample(full.ptr, pc.ctx, row))
            b = sampling.pick(pc.ctx, short, row, pc.n_vocab)
        finally:
            lc.llama_sampler_free(full.ptr)
            lc.llama_sampler_free(short.ptr)
        assert a == b != best


@pytest.mark.parametrize("s", [
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=1.5, top_k=100, top_p=1.0, min_p=0.0),
    SamplingParams(temperature=1.0, top_k=5, typical_p=0.9),
    SamplingParams(temperature=1.2, top_k=60, xtc_probability=0.7, xtc_threshold=0.05),
    SamplingParams(temperature=0.8, ignore_eos=True),
], ids=["defaults", "wide", "typical", "xtc", "ignore_eos"])
def test_top_k_shortcut_draws_what_the_full_pass_draws(decoded: Any, s: SamplingParams) -> None:
    pc, rows = decoded
    assert sampling.shortcut(s, pc.n_vocab) == sampling.TOP_K
    for row in rows:
        for seed in range(12):
            a, b = _both(pc, s, seed, row)
            assert a == b, (row, seed)


def test_top_k_shortcut_bans_what_ignore_eos_bans(decoded: Any) -> None:
    """Banned tokens among the candidates (the row's two best, banned as ignore_eos bans end-of-generation
    tokens): the chain's logit bias bans them there as in the full pass, so the draws are the full pass's and
    never a banned token."""
    pc, rows = decoded
    lc = lib()
    s = SamplingParams(temperature=1.5, ignore_eos=True)
    for row in rows:
        logits = pc.logits(row)
        banned = tuple(int(i) for i in np.argsort(logits)[::-1][:2])
        ids = sampling.top_k_candidates(logits, s.top_k, banned)
        assert ids is not None and set(banned) <= set(ids.tolist())
        for seed in range(12):
            full, short = (sampling.build(pc.vocab, pc.n_vocab, s, seed, pc.n_ctx_seq, banned) for _ in range(2))
            try:
                assert short.shortcut == sampling.TOP_K and short.banned == banned
                a = [int(lc.llama_sampler_sample(full.ptr, pc.ctx, row)) for _ in range(3)]
                b = [sampling.pick(pc.ctx, short, row, pc.n_vocab, top_k=True) for _ in range(3)]
            finally:
                lc.llama_sampler_free(full.ptr)
                lc.llama_sampler_free(short.ptr)
            assert a == b, (row, seed)
            assert not set(b) & set(banned), (row, seed)


def test_top_k_shortcut_only_where_allowed(decoded: Any) -> None:
    """Without top_k=True (an exact request), a top-k chain takes the full pass: same draws either way."""
    pc, rows = decoded
    s = SamplingParams(temperature=0.8)
    chain = pc.sampler(s, 7)
    ref = pc.sampler(s, 7)
    try:
        assert chain.shortcut == sampling.TOP_K
        got = [sampling.pick(pc.ctx, chain, rows[0], pc.n_vocab) for _ in range(4)]
        want = [int(lib().llama_sampler_sample(ref.ptr, pc.ctx, rows[0])) for _ in range(4)]
    finally:
        lib().llama_sampler_free(chain.ptr)
        lib().llama_sampler_free(ref.ptr)
    assert got == want


def test_top_k_candidates_keep_every_logit_that_can_survive() -> None:
    """Rows whose k best lie side by side or all in one of the bound's groups, with many ties at the k-th
    place, random, and with a banned token among the best: the candidates hold every id top-k may keep (all
    at or above the k-th largest logit once the banned are banned), and at least k that are not banned (the
    chain's logit bias bans the banned among them)."""
    rng = np.random.default_rng(3)
    n, k = 49152, 40
    for case in ("one run", "one group", "ties", "random", "banned", "tail"):
        row = rng.standard_normal(n + (77 if case == "tail" else 0)).astype(np.float32)
        banned: tuple[int, ...] = ()
        if case == "one run":
            row[96 * 7: 96 * 7 + k] = 50 + np.arange(k, dtype=np.float32)
        elif case == "one group":  # every 512th logit: the bound's groups
            row[7: 7 + 512 * k: 512] = 50 + np.arange(k, dtype=np.float32)
        elif case == "ties":
            row[rng.choice(n, 300, replace=False)] = 9.0
        elif case == "banned":
            banned = (int(np.argmax(row)),)
        elif case == "tail":  # the best few past the last whole group
            row[n + 10: n + 20] = 50.0
        ids = sampling.top_k_candidates(row, k, banned)
        assert ids is not None
        kept = row.copy()
        kept[list(banned)] = -np.inf
        kth = np.sort(kept)[::-1][k - 1]
        assert set(np.flatnonzero(kept >= kth)) <= set(ids.tolist()), case
        assert len(set(ids.tolist()) - set(banned)) >= k, case
        assert list(ids) == sorted(ids) and len(set(ids.tolist())) == len(ids)
    nan = np.full(n, np.nan, dtype=np.float32)
    assert sampling.top_k_candidates(nan, k) is None


def test_banned_tokens_among_the_best_keep_the_shortcut() -> None:
    """ignore_eos bans end-of-generation tokens that are often among a row's best: the bound leaves room for
    them, so the candidates still hold k ids besides them (the shortcut holds, no full pass), and every id
    top-k keeps."""
    rng = np.random.default_rng(5)
    n, k = 262144, 40
    for _ in range(20):
        row = rng.standard_normal(n).astype(np.float32)
        banned = tuple(int(i) for i in np.argsort(row)[::-1][:3])  # the three best are banned
        ids = sampling.top_k_candidates(row, k, banned)
        assert ids is not None and len(set(ids.tolist()) - set(banned)) >= k
        kept = row.copy()
        kept[list(banned)] = -np.inf
        kth = np.sort(kept)[::-1][k - 1]
        assert set(np.flatnonzero(kept >= kth)) <= set(ids.tolist())
    assert sampling.top_k_candidates(row, sampling.BLOCKS - 2, banned) is None, "more than the groups allow"


def test_logits_views_follow_each_row_and_each_decode(smollm2_engine: Any) -> None:
    """logits_row keeps its numpy views by address: every row of every decode reads what llama.cpp holds for
    it then (checked against a fresh view of the bindings' own pointer), as the rows move and the output
    buffer grows."""
    from localgen.native.lib import logits_row

    eng: Any = smollm2_engine
    pc = ParallelContext(eng, 4, 256, pooled=True)
    lc = lib()

    def fresh(row: int) -> Any:
        return np.ctypeslib.as_array(lc.llama_get_logits_ith(pc.ctx, row), shape=(pc.n_vocab,)).copy()

    try:
        seen: list[Any] = []
        for n_rows, prompt in ((1, "Once upon a time"), (4, "The capital of France is"), (2, "Roses are red,"),
                               (4, "def fibonacci(n):")):
            pc.clear()
            pc.batch.n_tokens = 0
            toks = list(eng.tokenize(prompt, add_special=True))
            for slot in range(n_rows):  # each slot's prompt ends on a different token: rows that differ
                seq = [*toks, toks[-1 - slot]]
                for pos, t in enumerate(seq):
                    pc.add(t, pos, slot, pos == len(seq) - 1)
            pc.decode(n_rows)
            rows = [i for i in range(pc.batch.n_tokens) if pc.batch.wants_logits(i)]
            got = [logits_row(pc.ctx, r, pc.n_vocab).copy() for r in rows]
            for r, g in zip(rows, got, strict=True):
                assert np.array_equal(g, fresh(r))
            assert np.array_equal(logits_row(pc.ctx, -1, pc.n_vocab), fresh(-1))
            assert all(not np.array_equal(got[0], g) for g in got[1:]), "rows differ"
            assert all(not np.array_equal(got[0], s) for s in seen), "each decode's values, not an old one's"
            seen.append(got[0])
    finally:
        pc.close()
