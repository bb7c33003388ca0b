"""A reused prefix gives, on a CPU, bit for bit the logits a fresh evaluation of the whole prompt gives
(engine/tokens.py, reusable_prefix; the measurements behind it: scripts/reuse_rows.py)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from localgen.engine.tokens import ROW_GROUP, TILE_ROWS, grid_pieces, reusable_prefix, ubatch_of


def _valid(keep: int, n: int, evaluated: int, length: int, ub: int, nb: int) -> bool:
    """What the rule must give, said plainly: every kept row computed in a ubatch of the held prompt's that
    computes it as the new prompt's fresh ubatch does, and the first piece evaluated again in the fresh
    ubatch it falls in making 64+ rows on the 8-row grid."""
    if keep > min(n, evaluated, length - 1):
        return False
    if keep > 0:
        start, held_end = ubatch_of(keep - 1, evaluated, ub, nb)
        new_end = ubatch_of(keep - 1, length, ub, nb)[1]
        width = min(held_end, new_end) - start
        if held_end != new_end and (width < TILE_ROWS or keep - start > width // ROW_GROUP * ROW_GROUP):
            return False
    start, end = ubatch_of(keep, length, ub, nb)
    return keep == start or (end - start >= TILE_ROWS and end - keep >= TILE_ROWS and (keep - start) % ROW_GROUP == 0)


def test_the_rule_keeps_the_longest_prefix_that_computes_every_row_as_a_fresh_evaluation() -> None:
    for ub, nb in ((64, 64), (128, 128), (128, 256), (128, 200), (192, 384)):
        for evaluated, extra, length in itertools.product(range(0, 420, 7), (0, 5, 30), range(1, 420, 11)):
            n = min(evaluated + extra, length)
            keep = reusable_prefix(n, evaluated, length, ub, nb)
            top = min(n, evaluated, length - 1)
            best = max(k for k in range(0, top + 1) if _valid(k, n, evaluated, length, ub, nb))
            assert keep == best, (n, evaluated, length, ub, nb, keep, best)
            assert top - keep <= TILE_ROWS + ROW_GROUP - 1, "at most 71 of the held prompt's tokens evaluated again"


def test_the_figures_measured_in_the_docs() -> None:
    # a prompt of 1,100 tokens sent again (ubatch 512): its last fresh ubatch [1024, 1100) has 76 rows, so
    # at least 64 are evaluated again from a multiple of 8: 1,032 kept, 68 evaluated
    assert reusable_prefix(1100, 1100, 1100, 512, 512) == 1032
    # a last fresh ubatch of fewer than 64 rows is evaluated whole
    assert reusable_prefix(1050, 1050, 1050, 512, 512) == 1024
    # a continued conversation: the answer's tokens (generated one at a time) are never kept
    assert reusable_prefix(1400, 1000, 1500, 512, 2048) == 960
    # the prompt's last token is always evaluated, at least 64 rows with it
    assert reusable_prefix(2894, 2894, 2894, 512, 2048) == 2824
    assert reusable_prefix(500, 500, 501, 512, 2048, logits=False) == 432  # 64+ rows again from a multiple of 8
    assert reusable_prefix(0, 0, 10, 512, 512) == 0
    assert reusable_prefix(60, 60, 63, 512, 512) == 0  # a conversation of fewer than 64 tokens reuses nothing


def test_the_pieces_end_where_a_fresh_evaluations_ubatches_end() -> None:
    for ub, nb in ((128, 128), (128, 256), (128, 200), (512, 2048)):
        for start, end in itertools.product(range(0, 700, 13), range(1, 1300, 97)):
            if start >= end:
                continue
            pieces = grid_pieces(start, end, ub, nb)
            assert pieces[0][0] == start and pieces[-1][1] == end
            assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
            for a, b in pieces:
                assert b - a <= nb
                for u in range(a, b, ub):  # llama.cpp's ubatches of the piece
                    assert ubatch_of(min(u + ub, b) - 1, end, ub, nb)[1] == min(u + ub, b), (start, end, a, b, u)


@pytest.fixture(scope="module")
def engine(smollm2_path: Any) -> Any:
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    # ubatches of 128 in pieces of 256: a fresh 300-token prompt's ubatches are [0,128) [128,256) [256,300)
    eng = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=1024, n_batch=256, n_ubatch=128))
    yield eng
    eng.close()


WORDS = ("The quick brown fox jumps over the lazy dog while the committee reviews section %d of the household "
         "handbook on shared appliances, chores, budgets and quiet hours. ")


def test_a_reused_prefix_gives_a_fresh_evaluations_logits_bit_for_bit(engine: Any) -> None:
    import numpy as np

    from localgen.native.prompt import Prompt

    kv = engine.kv
    tokens = engine.tokenize("".join(WORDS % i for i in range(20)), True)[:300]
    assert len(tokens) == 300

    def logits() -> Any:
        return np.array(engine.logits(), dtype=np.float32).copy()

    kv.clear()
    assert kv.evaluate(Prompt.text(tokens)) == 0
    cold = logits()

    # the same prompt again after an answer (its tokens generated one at a time)
    for _ in range(5):
        kv.decode([int(np.argmax(engine.logits()))], all_logits=False)
    kept = kv.evaluate(Prompt.text(tokens))
    assert np.array_equal(logits(), cold)
    assert kept == reusable_prefix(305, 300, 300, 128, 256) == 256

    # a conversation continued: a 200-token prompt, 30 tokens generated after it, then the longer prompt
    kv.clear()
    kv.evaluate(Prompt.text(tokens[:200]))
    for t in tokens[200:230]:
        kv.decode([t], all_logits=False)
    kept = kv.evaluate(Prompt.text(tokens))
    assert np.array_equal(logits(), cold)
    assert kept == reusable_prefix(230, 200, 300, 128, 256) == 192

    # a prefix evaluated without logits (run's prompt cache), then the prompt
    kv.clear()
    kv.evaluate(Prompt.text(tokens[:250]), logits=False)
    kept = kv.evaluate(Prompt.text(tokens))
    assert np.array_equal(logits(), cold)
    assert kept == reusable_prefix(250, 250, 300, 128, 256) == 192


def test_a_context_past_llama_cpps_uint32_cells_is_refused_never_wrapped(engine: Any) -> None:
    """--ctx × --parallel reaches llama.cpp as one uint32: 2**31 cells per sequence × 2 was 2**32, which ctypes
    kept as 0 (llama.cpp then took the model's trained context instead, unsaid). It is one clear error, before any
    memory is asked for; within the type it goes on as before."""
    from localgen.engine.batch import ParallelContext
    from localgen.errors import LocalgenError
    from localgen.native import context

    with pytest.raises(LocalgenError) as e:
        ParallelContext(engine, 2, 2**31)
    assert e.value.message == "llama.cpp's context takes n_ctx up to 4,294,967,295, not 4,294,967,296", e.value.message
    assert e.value.hint == "lower --ctx or --parallel"
    with pytest.raises(LocalgenError, match="takes n_seq_max up to 4,294,967,295, not -1"):
        context.new(engine.model_ptr, n_seq_max=-1)
    small = ParallelContext(engine, 2, 256)
    try:
        assert small.ctx and small.n_ctx_seq == 256
    finally:
        small.close()
