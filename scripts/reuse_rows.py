#!/usr/bin/env python3
"""Which reused prefixes give a fresh evaluation's logits bit for bit (engine/tokens.py, reusable_prefix):
for each case, a held prompt of P tokens (plus G tokens generated one at a time after it), a new prompt of M
tokens that begins with it, and a number of tokens kept, the rest evaluated in pieces on a fresh evaluation's
ubatch grid ("grid") or in n_batch pieces from the kept length ("plain"); prints whether the final logits are
np.array_equal to a fresh evaluation's, and what the rule keeps.

usage: scripts/reuse_rows.py [--model smollm2:135m] [--ubatch 512] [--batch 512]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WORDS = ("The quick brown fox jumps over the lazy dog while the committee reviews section %d of the household "
         "handbook on shared appliances, chores, budgets and quiet hours. ")


def main() -> None:
    import numpy as np

    from localgen.engine.llama import Engine
    from localgen.engine.tokens import grid_pieces, reusable_prefix
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--length", type=int, default=1100)
    a = ap.parse_args()
    eng = Engine(resolve(a.model), LoadParams(n_ctx=2048, n_batch=a.batch, n_ubatch=a.ubatch, n_threads=2,
                                              n_threads_batch=2))
    kv, U, N = eng.kv, kv_u(eng), eng.kv.n_batch
    toks = eng.tokenize("".join(WORDS % i for i in range(60)), True)
    M = a.length

    def run(pieces: list[tuple[int, int]]) -> object:
        for s, e in pieces:
            kv._decode(toks[s:e], all_logits=False)
        return np.array(eng.logits(), dtype=np.float32).copy()

    def reused(P: int, G: int, keep: int, grid: bool) -> object:
        kv.clear()
        run(grid_pieces(0, P, U, N))
        for i in range(P, P + G):
            kv.decode([toks[i]], all_logits=False)
        kv.truncate(keep)
        return run(grid_pieces(keep, M, U, N) if grid else [(s, min(s + N, M)) for s in range(keep, M, N)])

    kv.clear()
    cold = run(grid_pieces(0, M, U, N))
    print(f"{a.model} ubatch {U} batch {N}, prompt {M} tokens")
    cases = [(M, 0, M - 1), (M, 0, M - 8), (M, 0, M - 64), (M, 0, M - 72), (M, 0, M - 71), (M, 0, M - 80),
             (M - 80, 0, M - 80), (M - 83, 0, M - 83), (M - 60, 0, M - 60), (M - 100, 20, M - 80),
             (M - 100, 20, M - 100), (1020, 0, 1020), (1020, 0, 1016), (1021, 0, 1021), (1021, 0, 1016),
             (1024, 0, 1024), (1024, 0, 1020), (M, 0, reusable_prefix(M, M, M, U, N))]
    for P, G, keep in cases:
        rule = reusable_prefix(P + G, P, M, U, N)
        for grid in (True, False):
            x = reused(P, G, keep, grid)
            diff = float(np.abs(x - cold).max())
            print(f"held {P}+{G} gen, keep {keep:5d} ({'grid ' if grid else 'plain'}): "
                  f"{'identical' if np.array_equal(x, cold) else f'differs {diff:.3g}'}"
                  f"{'  <- the rule keeps this' if keep == rule else ''} (rule: {rule})")


def kv_u(eng: object) -> int:
    return int(eng.kv.n_ubatch)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
