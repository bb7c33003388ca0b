"""Perplexity and KL divergence, measured as llama-perplexity measures them (tools/perplexity/perplexity.cpp of the
vendored llama.cpp), so that the figures agree with it:

- the text is tokenized whole (BOS added when the vocabulary adds it, special-token text left as text) and cut into
  windows of n_ctx tokens; a text shorter than two windows is refused;
- each window is evaluated from an empty cache with BOS in its first position (when the vocabulary adds one), and
  only its second half is scored (from n_ctx/2), each position predicting the next token;
- n_batch // n_ctx windows go into one llama_decode, each its own sequence (a context of n_seq × n_ctx cells);
- PPL = exp(mean NLL), ± PPL × sqrt(var(NLL) / (count - 1));
- a reference's log-probabilities are kept in llama-perplexity's own file format (`_logits_`, n_ctx, n_vocab,
  n_chunk, the tokens, then per scored position a scale, a minimum and n_vocab uint16 steps), so its
  --kl-divergence-base files are read and ours are read by it; KL divergence, Δp and "same top token" per position
  are its formulas, in numpy over blocks of rows (float32 as it computes them, sums in float64)."""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localgen.errors import LocalgenError, UsageError
from localgen.native import context
from localgen.native import vocab as native_vocab
from localgen.native.batch import Batch

if TYPE_CHECKING:
    from localgen.engine.llama import Engine

MAGIC = b"_logits_"
BLOCK_ROWS = 16  # rows of logits per numpy step: a few MB, within the caches
PART_ROWS = 64  # rows of a window one thread scores at a time
PERCENTILES = (("max", 1.0), ("p99.9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.90), ("median", 0.5),
               ("p10", 0.10), ("p5", 0.05), ("p1", 0.01), ("p0.1", 0.001), ("min", 0.0))
DP_PERCENTILES = (("max", 1.0), ("p99.9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.90), ("p75", 0.75),
                  ("median", 0.5), ("p25", 0.25), ("p10", 0.10), ("p5", 0.05), ("p1", 0.01), ("p0.1", 0.001),
                  ("min", 0.0))


def row_width(n_vocab: int) -> int:
    """uint16 values per scored position in a logits file: 4 (two floats) and n_vocab, rounded up to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


@dataclass(frozen=True)
class Windows:
    """The text's tokens and how they are cut: n_chunk windows of n_ctx tokens."""

    tokens: Any  # numpy int32, at least n_chunk × n_ctx
    n_ctx: int
    n_chunk: int

    @property
    def first(self) -> int:
        """The first scored position of a window."""
        return self.n_ctx // 2

    @property
    def scored(self) -> int:
        """Positions scored per window (each predicts the next token)."""
        return self.n_ctx - 1 - self.first


def check_length(n_tokens: int, n_ctx: int) -> None:
    """A UsageError for a text of `n_tokens` shorter than two windows of `n_ctx`."""
    if n_tokens < 2 * n_ctx:
        raise UsageError(f"the text is {n_tokens:,} tokens; perplexity at a context of {n_ctx} needs at least "
                         f"{2 * n_ctx:,} (two windows)", hint="give a longer text, or a smaller --ctx")


def windows(engine: Engine, text: str, n_ctx: int, chunks: int | None = None) -> Windows:
    """The text's windows as llama-perplexity cuts them; a text shorter than two windows is a UsageError."""
    import numpy as np

    if native_vocab.adds_eos(engine.vocab):
        raise UsageError(f"{engine.model.name}'s vocabulary adds an end token to every text: perplexity needs a "
                         "model that predicts text (llama-perplexity refuses it too)")
    tokens = engine.tokenize(text, add_special=True, parse_special=False)
    check_length(len(tokens), n_ctx)
    n_chunk = len(tokens) // n_ctx
    if chunks is not None and chunks > 0:
        n_chunk = min(n_chunk, chunks)
    return Windows(np.asarray(tokens, dtype=np.int32), n_ctx, n_chunk)


# ---- logits files ----------------------------------------------------------------------------------------------


class LogitsReader:
    """A logits file (ours or llama-perplexity's --kl-divergence-base), checked against its size, read by chunk."""

    def __init__(self, path: Path) -> None:
        import numpy as np

        self.path = path
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(20)
        except OSError as e:
            raise UsageError(f"cannot read the reference {path}: {e.strerror or e}") from None
        if len(head) < 20 or head[:8] != MAGIC:
            raise UsageError(f"{path} is not a logits file (llama-perplexity's or localgen's --save-logits)")
        self.n_ctx, self.n_vocab, self.n_chunk = (int(x) for x in np.frombuffer(head[8:20], dtype="<i4"))
        if self.n_ctx < 4 or self.n_vocab < 2 or self.n_chunk < 1:
            raise UsageError(f"{path} is a damaged logits file (context {self.n_ctx}, vocabulary {self.n_vocab}, "
                             f"{self.n_chunk} chunks)")
        self.width = row_width(self.n_vocab)
        self.scored = self.n_ctx - 1 - self.n_ctx // 2
        self.data_at = 20 + 4 * self.n_ctx * self.n_chunk
        need = self.data_at + 2 * self.width * self.scored * self.n_chunk
        if size < need:
            raise UsageError(f"{path} ends early: {size:,} bytes of the {need:,} its header announces")
        self.tokens = np.fromfile(path, dtype="<i4", count=self.n_ctx * self.n_chunk, offset=20).astype(np.int32)
        self._rows: Any = np.memmap(path, dtype="<u2", mode="r", offset=self.data_at,
                               shape=(self.n_chunk, self.scored, self.width))

    def chunk(self, i: int) -> Any:
        """Chunk i's rows: scored × width uint16."""
        return self._rows[i]

    def close(self) -> None:
        """Let go of the file."""
        mm = getattr(self._rows, "_mmap", None)
        self._rows = None
        if mm is not None:
            mm.close()


class LogitsWriter:
    """Writes a logits file in llama-perplexity's format to a hidden temp file, renamed when complete (`commit`);
    `discard` removes it."""

    def __init__(self, path: Path, w: Windows, n_vocab: int) -> None:
        import numpy as np

        self.path = path
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
        self.f = open(self.tmp, "wb")  # noqa: SIM115 (closed by commit or discard)
        self.f.write(MAGIC + np.array([w.n_ctx, n_vocab, w.n_chunk], dtype="<i4").tobytes())
        self.f.write(np.ascontiguousarray(w.tokens[: w.n_ctx * w.n_chunk], dtype="<i4").tobytes())

    def write(self, rows: bytes) -> None:
        """Append encoded rows (n × width uint16, as bytes)."""
        self.f.write(rows)

    def commit(self) -> None:
        """Close and move into place."""
        self.f.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        """Close and remove."""
        self.f.close()
        self.tmp.unlink(missing_ok=True)


def size_of_logits(w: Windows, n_vocab: int) -> int:
    """The bytes a logits file of these windows takes."""
    return 20 + 4 * w.n_ctx * w.n_chunk + 2 * row_width(n_vocab) * w.scored * w.n_chunk


# ---- what is summed ----------------------------------------------------------------------------------------------


class _Sums:
    """llama-perplexity's running sums (its kl_divergence_result, and nll, nll2 for perplexity alone)."""

    def __init__(self) -> None:
        self.nll = self.nll2 = 0.0
        self.nll_base = self.nll_base2 = self.nll_nll_base = 0.0
        self.kld = self.kld2 = 0.0
        self.p_diff = self.p_diff2 = self.p_diff4 = 0.0
        self.max_p_diff = 0.0
        self.same_top = 0
        self.count = 0
        self.kld_values: list[Any] = []
        self.p_diff_values: list[Any] = []

    def add(self, o: _Sums) -> None:
        """Another part's sums added to these."""
        for name in ("nll", "nll2", "nll_base", "nll_base2", "nll_nll_base", "kld", "kld2", "p_diff", "p_diff2",
                     "p_diff4", "same_top", "count"):
            setattr(self, name, getattr(self, name) + getattr(o, name))
        self.max_p_diff = max(self.max_p_diff, o.max_p_diff)
        self.kld_values += o.kld_values
        self.p_diff_values += o.p_diff_values


class _Work:
    """Buffers for a block of rows, made once: a fresh array of a few MB per numpy step costs its page faults, more
    than the arithmetic."""

    def __init__(self, n_vocab: int) -> None:
        import numpy as np

        shape = (BLOCK_ROWS, n_vocab)
        self.a = np.empty(shape, dtype=np.float32)
        self.b = np.empty(shape, dtype=np.float32)
        self.c = np.empty(shape, dtype=np.float32)
        self.mask = np.empty(shape, dtype=np.bool_)
        self.out = np.zeros((BLOCK_ROWS, row_width(n_vocab)), dtype=np.uint16)


def _nll(logits: Any, targets: Any, s: _Sums, w: _Work, encode: Any = None) -> None:
    """Perplexity's sums over rows of logits (float32, rows × n_vocab); with `encode`, each row's log-probabilities
    in the file format are handed to it."""
    import numpy as np

    for at in range(0, len(targets), BLOCK_ROWS):
        rows = logits[at:at + BLOCK_ROWS]
        tgt = targets[at:at + BLOCK_ROWS]
        n = len(tgt)
        idx = np.arange(n)
        mx = rows.max(axis=1)
        a = w.a[:n]
        np.subtract(rows, mx[:, None], out=a)
        np.exp(a, out=a)
        log_sum = np.log(a.sum(axis=1).astype(np.float64))
        if encode is not None:
            lse = log_sum.astype(np.float32)
            nll = (mx + lse - rows[idx, tgt]).astype(np.float64)
            encode(_encode(rows, mx, lse, w))
        else:
            nll = -((rows[idx, tgt] - mx).astype(np.float64) - log_sum)
        s.nll += float(nll.sum())
        s.nll2 += float((nll * nll).sum())
        s.count += n


def _encode(rows: Any, mx: Any, lse: Any, w: _Work) -> Any:
    """Rows of logits as llama-perplexity stores log-probabilities: per row a scale and a minimum (two float32), then
    round((logit - min) / scale) as uint16 for each token, min = max(min logit, max - 16), 0 below it."""
    import numpy as np

    n, n_vocab = rows.shape
    out = w.out[:n]
    lo = np.maximum(rows.min(axis=1), mx - np.float32(16))
    min_log_prob = (lo - mx - lse).astype(np.float32)
    scale = ((mx - lo) / np.float32(65535)).astype(np.float32)
    out[:, :4] = np.stack([scale, min_log_prob], axis=1).astype(np.float32).view(np.uint16)
    inv = np.zeros_like(scale)
    live = scale != 0
    inv[live] = np.float32(1) / scale[live]  # a row of equal logits: every step 0, as llama-perplexity writes it
    a = w.a[:n]
    np.subtract(rows, lo[:, None], out=a)
    np.multiply(a, inv[:, None], out=a)
    np.rint(a, out=a)  # float32, rounded half to even as llama's nearest_int
    np.maximum(a, np.float32(0), out=a)  # at or below the minimum: 0
    out[:, 4:4 + n_vocab] = a
    return out


def _kld(logits: Any, targets: Any, base: Any, s: _Sums, w: _Work) -> None:
    """The KL-divergence sums of rows of logits against the reference's stored rows (llama-perplexity's
    log_softmax with base_log_prob, in numpy)."""
    import numpy as np

    n_vocab = logits.shape[1]
    for at in range(0, len(targets), BLOCK_ROWS):
        rows = logits[at:at + BLOCK_ROWS]
        tgt = targets[at:at + BLOCK_ROWS]
        n = len(tgt)
        stored = base[at:at + BLOCK_ROWS]
        idx = np.arange(n)
        mx = rows.max(axis=1)
        top = rows.argmax(axis=1)
        a, b, c, mask = w.a[:n], w.b[:n], w.c[:n], w.mask[:n]
        np.subtract(rows, mx[:, None], out=a)
        np.exp(a, out=a)
        lse = np.log(a.sum(axis=1).astype(np.float64)).astype(np.float32)
        head = np.ascontiguousarray(stored[:, :4]).view(np.float32)
        scale, min_log_prob = head[:, 0], head[:, 1]
        steps = stored[:, 4:4 + n_vocab]
        nll = (mx + lse - rows[idx, tgt]).astype(np.float32)
        nll_base = (-(scale * steps[idx, tgt].astype(np.float32) + min_log_prob)).astype(np.float32)
        s.nll += float(nll.sum(dtype=np.float64))
        s.nll2 += float((nll * nll).sum(dtype=np.float64))
        s.nll_base += float(nll_base.sum(dtype=np.float64))
        s.nll_base2 += float((nll_base * nll_base).sum(dtype=np.float64))
        s.nll_nll_base += float((nll * nll_base).sum(dtype=np.float64))
        np.multiply(steps, scale[:, None], out=b)  # log p of the reference, each token
        np.add(b, min_log_prob[:, None], out=b)
        np.greater(b, np.float32(-16), out=mask)  # llama-perplexity skips what is below e^-16
        np.exp(b, out=c)
        np.subtract(b, rows, out=a)
        np.add(a, (mx + lse)[:, None], out=a)  # log p_ref - log p
        np.multiply(c, a, out=c)
        np.multiply(c, mask, out=c)
        kld = c.sum(axis=1).astype(np.float64)
        s.kld += float(kld.sum())
        s.kld2 += float((kld * kld).sum())
        s.same_top += int((top == steps.argmax(axis=1)).sum())
        p_diff = (np.exp(-nll) - np.exp(-nll_base)).astype(np.float32)
        d2 = p_diff.astype(np.float64) ** 2
        s.p_diff += float(p_diff.sum(dtype=np.float64))
        s.p_diff2 += float(d2.sum())
        s.p_diff4 += float((d2 * d2).sum())
        s.max_p_diff = max(s.max_p_diff, float(np.abs(p_diff).max()))
        s.count += n
        s.kld_values.append(kld.astype(np.float32))
        s.p_diff_values.append(p_diff)


# ---- the figures -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Divergence:
    """Against a reference: llama-perplexity's "Perplexity", "KL divergence" and "Token probability" statistics."""

    ppl_base: float
    ppl_base_err: float
    ln_ratio: float
    ln_ratio_err: float
    ppl_ratio: float
    ppl_ratio_err: float
    ppl_diff: float
    ppl_diff_err: float
    correlation: float | None
    kld: float
    kld_err: float
    kld_percentiles: dict[str, float] | None  # None under 100 positions, as llama-perplexity prints none
    dp_mean: float
    dp_mean_err: float
    dp_percentiles: dict[str, float] | None
    rms_dp: float
    rms_dp_err: float
    same_top: float
    same_top_err: float


@dataclass(frozen=True)
class Measured:
    """What a run measured (all of it, or up to an interrupt: `complete` says)."""

    model: str
    n_ctx: int
    n_batch: int
    n_seq: int
    threads: int
    chunks: int
    chunks_total: int
    tokens: int  # positions scored
    ppl: float
    ppl_err: float
    seconds: float
    tokens_per_s: float  # positions evaluated (windows × n_ctx) per second
    complete: bool
    divergence: Divergence | None = None

    def as_dict(self) -> dict[str, Any]:
        """Every figure, for --json."""
        return asdict(self)


def _mean_err(total: float, total2: float, count: int) -> tuple[float, float]:
    """llama-perplexity's mean_and_uncertainty."""
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def _percentile(values: Any, fraction: float) -> float:
    if fraction <= 0:
        return float(values[0])
    if fraction >= 1:
        return float(values[-1])
    p = fraction * (len(values) - 1)
    i = int(p)
    p -= i
    return float((1 - p) * values[i] + p * values[min(i + 1, len(values) - 1)])


def _median(values: Any) -> float:
    n = len(values)
    return float(0.5 * (values[n // 2] + values[n // 2 - 1])) if n % 2 == 0 else float(values[n // 2])


def _divergence(s: _Sums) -> Divergence:
    import numpy as np

    n = s.count
    log_ppl, log_ppl_err = _mean_err(s.nll, s.nll2, n)
    log_base, log_base_err = _mean_err(s.nll_base, s.nll_base2, n)
    cov = ((s.nll_nll_base / n - (s.nll / n) * (s.nll_base / n)) / (n - 1)) if n >= 10 else 0.0
    ppl, ppl_err = math.exp(log_ppl), math.exp(log_ppl) * log_ppl_err
    base, base_err = math.exp(log_base), math.exp(log_base) * log_base_err
    ratio = log_ppl - log_base
    ratio_err = math.sqrt(max(0.0, log_ppl_err ** 2 + log_base_err ** 2 - 2 * cov))
    kld, kld_err = _mean_err(s.kld, s.kld2, n)
    dp, dp_err = _mean_err(s.p_diff, s.p_diff2, n)
    mse, mse_err = _mean_err(s.p_diff2, s.p_diff4, n)
    rms = math.sqrt(mse)
    same = s.same_top / n
    kp = dpp = None
    if n >= 100:
        kv = np.sort(np.concatenate(s.kld_values))
        pv = np.sort(np.concatenate(s.p_diff_values))
        kp = {name: (_median(kv) if name == "median" else _percentile(kv, f)) for name, f in PERCENTILES}
        dpp = {name: (_median(pv) if name == "median" else _percentile(pv, f)) for name, f in DP_PERCENTILES}
    return Divergence(
        ppl_base=base, ppl_base_err=base_err, ln_ratio=ratio, ln_ratio_err=ratio_err,
        ppl_ratio=math.exp(ratio), ppl_ratio_err=math.exp(ratio) * ratio_err, ppl_diff=ppl - base,
        ppl_diff_err=math.sqrt(max(0.0, ppl_err ** 2 + base_err ** 2 - 2 * ppl * base * cov)),
        correlation=(cov / (log_ppl_err * log_base_err)) if log_ppl_err and log_base_err else None,
        kld=kld, kld_err=kld_err, kld_percentiles=kp, dp_mean=dp, dp_mean_err=dp_err, dp_percentiles=dpp,
        rms_dp=rms, rms_dp_err=(0.5 / rms * mse_err) if rms else 0.0, same_top=same,
        same_top_err=math.sqrt(same * (1 - same) / (n - 1)) if n > 1 else 0.0)


# ---- the run -----------------------------------------------------------------------------------------------------


class Perplexity:
    """One measurement on an Engine's model: a context of its own (n_seq windows of n_ctx cells), then `run()`
    yields the chunks done after each decode, and `measured()` gives the figures so far. `save` writes the
    log-probabilities of every scored position (a reference); `reference` measures KL divergence against one."""

    def __init__(self, engine: Engine, w: Windows, n_batch: int = 2048, n_ubatch: int = 512,
                 threads: tuple[int, int] | None = None, save: LogitsWriter | None = None,
                 reference: LogitsReader | None = None) -> None:
        n_ctx = w.n_ctx
        n_seq = max(1, n_batch // n_ctx)
        if not (n_batch < n_ctx or n_batch % n_ctx == 0):
            raise UsageError(f"the batch ({n_batch}) must be smaller than the context ({n_ctx}) or a multiple of it",
                             hint="as llama-perplexity requires")
        if reference is not None and reference.n_vocab != engine.n_vocab:
            raise UsageError(f"the reference has another vocabulary ({reference.n_vocab:,} tokens; "
                             f"{engine.model.name} has {engine.n_vocab:,}): KL divergence compares the same model's "
                             "quantizations")
        self.engine, self.w, self.save, self.reference = engine, w, save, reference
        self.n_seq = n_seq
        self.n_batch = min(n_batch, n_seq * n_ctx)
        p = engine.params
        self.threads = threads or (p.n_threads or 1, p.n_threads_batch or p.n_threads or 1)
        given = engine.origins.get("flash_attn") == "flag"
        engine.release_context()  # its own single window is not used: free its cells
        from localgen.types import KV_CACHE_TYPES

        self.ctx = context.new(
            engine.model_ptr, n_ctx=n_seq * n_ctx, n_batch=self.n_batch, n_ubatch=min(n_ubatch, self.n_batch),
            n_seq_max=n_seq, n_threads=self.threads[0], n_threads_batch=self.threads[1],
            flash_attn_type=(1 if engine.flash_attn else 0) if given else -1,
            type_k=KV_CACHE_TYPES[p.cache_type_k], type_v=KV_CACHE_TYPES[p.cache_type_v], no_perf=True)
        if not self.ctx:
            from localgen.native import logs

            raise LocalgenError(f"llama.cpp could not make a context of {n_seq} × {n_ctx} tokens: "
                                f"{logs.first_error() or 'see --verbose'}", hint="try a smaller --batch-size")
        # a decode holds n_batch tokens (2048 by default: seconds on a busy CPU): Ctrl-C stops it where it is
        self._abort = context.stop_on_ctrl_c(self.ctx)
        self.batch = Batch(self.n_batch)
        import threading
        from concurrent.futures import ThreadPoolExecutor

        self._local = threading.local()
        # the scoring between two decodes, on as many threads as the decode uses (llama-perplexity's workers)
        self.pool = ThreadPoolExecutor(max(1, self.threads[1]), thread_name_prefix="perplexity")
        self.layout: int | None = None  # rows of the batch laid out (positions, sequences, outputs), when one decode
        self.sums = _Sums()
        self.done = 0
        self.seconds = 0.0
        self.add_bos = native_vocab.adds_bos(engine.vocab)
        self.bos = native_vocab.bos(engine.vocab)

    def run(self) -> Iterator[int]:
        """Evaluate the windows, n_seq at a time; yields the number of windows done after each group."""
        import numpy as np

        from localgen.native import logs

        w, n_ctx, first = self.w, self.w.n_ctx, self.w.first
        num_batches = (n_ctx + self.n_batch - 1) // self.n_batch
        mem = context.memory(self.ctx)
        tokens = w.tokens
        for i in range(self.done, w.n_chunk, self.n_seq):
            t0 = time.perf_counter()
            start = i * n_ctx
            n_seq_batch = min(self.n_seq, w.n_chunk - i)
            context.clear(mem, True)
            kept: list[Any] = []
            for j in range(num_batches):
                batch_start = start + j * self.n_batch
                size = min(start + n_ctx - batch_start, self.n_batch)
                b = self.batch
                if num_batches == 1:  # the same rows every time but their tokens: laid out once, tokens set at once
                    n_out = self._tokens(tokens, start, n_seq_batch)
                else:
                    b.n_tokens = 0
                    n_out = 0
                    for seq in range(n_seq_batch):
                        seq_start = batch_start + seq * n_ctx
                        for k in range(size):
                            pos = j * self.n_batch + k
                            tok = self.bos if (self.add_bos and j == 0 and k == 0) else int(tokens[seq_start + k])
                            b.add(tok, pos, seq, pos >= first)
                            n_out += pos >= first
                rc = context.decode(self.ctx, b)
                logs.raise_deferred()
                if rc != 0:
                    raise LocalgenError(f"llama.cpp failed to decode a window (code {rc})")
                if num_batches > 1 and n_out:
                    kept.append(np.array(context.logits(self.ctx, n_out, self.engine.n_vocab)))
            per = n_ctx - first
            if num_batches > 1:
                everything = np.concatenate(kept)
            else:
                everything = context.logits(self.ctx, per * n_seq_batch, self.engine.n_vocab)
            parts = [(seq, a, min(a + PART_ROWS, w.scored)) for seq in range(n_seq_batch)
                     for a in range(0, w.scored, PART_ROWS)]

            # parts in the pool's threads (numpy lets go of the GIL), each with buffers of its own; sums and the
            # saved rows taken back in order
            score = functools.partial(self._score, everything, per, start, i)
            for sums, encoded in self.pool.map(score, parts):
                self.sums.add(sums)
                for block in encoded:
                    self.save.write(block)  # type: ignore[union-attr]  # only saving encodes
            self.done = i + n_seq_batch
            self.seconds += time.perf_counter() - t0
            yield self.done

    def _score(self, everything: Any, per: int, start: int, i: int,
               part: tuple[int, int, int]) -> tuple[_Sums, list[bytes]]:
        """One part of a window (rows a to z of window i + seq): its sums, and its rows encoded when saving."""
        seq, a, z = part
        n_ctx, first = self.w.n_ctx, self.w.first
        rows = everything[seq * per + a: seq * per + z]
        at = start + seq * n_ctx + first + 1
        targets = self.w.tokens[at + a: at + z]
        sums, encoded = _Sums(), []
        work = self._work()
        if self.reference is not None:
            _kld(rows, targets, self.reference.chunk(i + seq)[a:z], sums, work)
        elif self.save is not None:
            _nll(rows, targets, sums, work, lambda r: encoded.append(r.tobytes()))
        else:
            _nll(rows, targets, sums, work)
        return sums, encoded

    def _work(self) -> _Work:
        """The calling thread's buffers."""
        work: _Work | None = getattr(self._local, "work", None)
        if work is None:
            work = self._local.work = _Work(self.engine.n_vocab)
        return work

    def _tokens(self, tokens: Any, start: int, n_seq_batch: int) -> int:
        """One decode's rows for n_seq_batch whole windows from `start` (the windows one after another: a shorter
        last group is a prefix of the layout); the outputs it asks for."""
        n_ctx, first = self.w.n_ctx, self.w.first
        b = self.batch
        if self.layout is None:
            b.n_tokens = 0
            for seq in range(self.n_seq):
                for k in range(n_ctx):
                    b.add(0, k, seq, k >= first)
            self.layout = self.n_seq
            self.view = b.token_view()
        n = n_seq_batch * n_ctx
        self.view[:n] = tokens[start:start + n]
        if self.add_bos:
            self.view[0:n:n_ctx] = self.bos
        b.n_tokens = n
        return n_seq_batch * (n_ctx - first)

    def measured(self) -> Measured:
        """The figures so far (PPL over the positions scored; with a reference, the divergence)."""
        s = self.sums
        if self.reference is not None:
            log_ppl, err = _mean_err(s.nll, s.nll2, s.count)
            ppl, ppl_err = math.exp(log_ppl), math.exp(log_ppl) * err
        else:
            mean = s.nll / s.count if s.count else 0.0
            var = s.nll2 / s.count - mean * mean if s.count else 0.0
            ppl = math.exp(mean)
            ppl_err = math.sqrt(var / (s.count - 1)) * ppl if var > 0 and s.count > 1 else 0.0
        evaluated = self.done * self.w.n_ctx
        return Measured(
            model=self.engine.model.name, n_ctx=self.w.n_ctx, n_batch=self.n_batch, n_seq=self.n_seq,
            threads=self.threads[1], chunks=self.done, chunks_total=self.w.n_chunk, tokens=s.count, ppl=ppl,
            ppl_err=ppl_err, seconds=self.seconds, tokens_per_s=evaluated / self.seconds if self.seconds else 0.0,
            complete=self.done >= self.w.n_chunk,
            divergence=_divergence(s) if self.reference is not None and s.count > 1 else None)

    def close(self) -> None:
        """Free the context and the batch."""
        if self.ctx is not None:
            self.pool.shutdown()
            self.batch.free()
            context.free(self.ctx)
            self.ctx = None
