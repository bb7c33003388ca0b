"""Token sequences: common prefixes, and where a prefix may end without cutting a media span."""

from __future__ import annotations

from typing import Any

from localgen.native.prompt import Prompt


def common_prefix(a: Any, b: Any) -> int:
    """Length of the common leading run of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def starts_with(seq: Any, prefix: Any) -> bool:
    """Whether token sequence `seq` begins with `prefix`."""
    return len(seq) >= len(prefix) and seq[:len(prefix)] == prefix


def safe_prefix(prompt: Prompt, n: int) -> int:
    """`n` moved back to the start of a media span of `prompt` it would cut (a span is evaluated whole or not
    at all); `n` itself for a prompt of text alone."""
    for start, span in prompt.spans.items():
        if start < n < start + span.n_pos:
            return int(start)
    return n



TILE_ROWS = 64  # ggml-cpu's flash attention takes its tiled kernel from this many query rows (GGML_FA_TILE_Q)
ROW_GROUP = 8  # K-quant and repacked matmuls take rows 8 and 4 at a time: the last (width mod 8) are leftovers


def ubatch_of(row: int, length: int, ubatch: int, n_batch: int) -> tuple[int, int]:
    """The ubatch [start, end) that holds `row` when a prompt of `length` tokens is evaluated afresh: in
    `n_batch` pieces from 0, which llama.cpp cuts into ubatches of `ubatch` from each piece's start."""
    piece = row // n_batch * n_batch
    start = piece + (row - piece) // ubatch * ubatch
    return start, min(start + ubatch, piece + n_batch, length)


def reusable_prefix(n: int, evaluated: int, length: int, ubatch: int, n_batch: int, logits: bool = True) -> int:
    """How many of `n` held tokens that begin a prompt of `length` tokens to keep, so that evaluating the rest
    in `grid_pieces` gives, on a CPU, bit for bit the KV entries and logits a fresh evaluation of the whole
    prompt gives.

    llama.cpp's CPU kernels round a row differently by the shape of the ubatch it is computed in: flash
    attention tiles ubatches of 64+ rows and takes fewer rows one at a time, and the K-quant and repacked
    matmuls take rows 8 and 4 at a time, the last (width mod 8) alone. So a row is reused only where it was
    computed as a fresh evaluation of the new prompt computes it:
    - of the held tokens, only the first `evaluated` (those evaluated as a prompt, in a fresh evaluation's
      ubatches; a token generated after them was computed alone, one row at a time); with `logits`, never the
      prompt's last token;
    - where the held prompt's ubatch and the new prompt's around the last kept row differ in width (one of
      them is cut short by its prompt's end), rows of it only if both have 64+ rows, and only up to a
      multiple of 8 rows into it (the leftover rows differ);
    - the rows evaluated again inside the new prompt's ubatch [a, b) that holds the first of them make a
      piece [keep, b) of 64+ rows that starts a multiple of 8 rows after a (so its leftover rows are the
      fresh evaluation's); in a ubatch of fewer than 64 rows, nothing of it is kept.
    The evidence: tests/test_reuse_exact.py (logits np.array_equal to a fresh evaluation's) and
    scripts/reuse_rows.py (SmolLM2 Q4_1 and Gemma 3 Q4_K_M, ubatch 512, a 1,100-token prompt): what this keeps
    gives identical logits; a last row evaluated alone, an 8- to 60-row piece, or answer tokens kept differ by
    0.4 to 1.2. A piece of 64+ rows that starts off the 8-row grid gave identical logits for both models on a
    2-core x86 CPU; the 8-row rule stays, as the kernels' code treats leftover rows apart."""
    keep = max(0, min(n, evaluated, length - 1 if logits else length))
    if ubatch <= 0 or n_batch <= 0:
        return keep
    ubatch = min(ubatch, n_batch)
    while keep > 0:
        start, held_end = ubatch_of(keep - 1, evaluated, ubatch, n_batch)
        new_end = ubatch_of(keep - 1, length, ubatch, n_batch)[1]
        width = min(held_end, new_end) - start
        if held_end == new_end or (width >= TILE_ROWS and keep <= start + width // ROW_GROUP * ROW_GROUP):
            break
        keep = start + width // ROW_GROUP * ROW_GROUP if width >= TILE_ROWS else start
    start, end = ubatch_of(keep, length, ubatch, n_batch)
    if keep > start:
        most = (end - start - TILE_ROWS) // ROW_GROUP  # at least 64 rows evaluated again in [start, end)
        keep = start + ROW_GROUP * min((keep - start) // ROW_GROUP, most) if most >= 0 else start
    return keep


def grid_end(start: int, end: int, ubatch: int, n_batch: int) -> int:
    """Where the piece that evaluates tokens from `start` (of `end`) ends so that its ubatches end where a
    fresh evaluation's (in `n_batch` pieces from 0) do: at the end of the fresh ubatch it starts inside, else
    at the end of the fresh piece."""
    ubatch = min(ubatch, n_batch)
    if ubatch > 0:
        first, stop = ubatch_of(start, end, ubatch, n_batch)
        if first != start:
            return stop
    return min(end, (start // n_batch + 1) * n_batch)


def grid_pieces(start: int, end: int, ubatch: int, n_batch: int) -> list[tuple[int, int]]:
    """The pieces (`grid_end`) that evaluate tokens [start, end) in a fresh evaluation's ubatches."""
    pieces = []
    while start < end:
        stop = grid_end(start, end, ubatch, n_batch)
        pieces.append((start, stop))
        start = stop
    return pieces
