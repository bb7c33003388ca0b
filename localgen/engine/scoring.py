"""The arithmetic of a perplexity run (engine/perplexity.py), as llama-perplexity (tools/perplexity/perplexity.cpp of
the vendored llama.cpp) does it, in numpy over blocks of rows of logits (float32 as it computes them, sums in
float64): the sums each scored position adds to (its NLL; against a reference's stored rows, its KL divergence, Δp
and "same top token"), a row's log-probabilities in the logits file's form (a scale, a minimum and n_vocab uint16
steps), and the figures the sums give (Measured, Divergence: means with their uncertainty, percentiles)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

BLOCK_ROWS = 16  # rows of logits per numpy step: a few MB, within the caches
PERCENTILES = (("max", 1.0), ("p99.9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.90), ("median", 0.5),
               ("p10", 0.10), ("p5", 0.05), ("p1", 0.01), ("p0.1", 0.001), ("min", 0.0))
DP_PERCENTILES = (("max", 1.0), ("p99.9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.90), ("p75", 0.75),
                  ("median", 0.5), ("p25", 0.25), ("p10", 0.10), ("p5", 0.05), ("p1", 0.01), ("p0.1", 0.001),
                  ("min", 0.0))


def row_width(n_vocab: int) -> int:
    """uint16 values per scored position in a logits file: 4 (two floats) and n_vocab, rounded up to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


# ---- what is summed ----------------------------------------------------------------------------------------------


class Sums:
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

    def add(self, o: Sums) -> None:
        """Another part's sums added to these."""
        for name in ("nll", "nll2", "nll_base", "nll_base2", "nll_nll_base", "kld", "kld2", "p_diff", "p_diff2",
                     "p_diff4", "same_top", "count"):
            setattr(self, name, getattr(self, name) + getattr(o, name))
        self.max_p_diff = max(self.max_p_diff, o.max_p_diff)
        self.kld_values += o.kld_values
        self.p_diff_values += o.p_diff_values


class Work:
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


def nll_sums(logits: Any, targets: Any, s: Sums, w: Work, encode: Any = None) -> None:
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


def _encode(rows: Any, mx: Any, lse: Any, w: Work) -> Any:
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
    with np.errstate(invalid="ignore"):  # NaN logits (damaged weights): the measure says so, in one line
        out[:, 4:4 + n_vocab] = a
    return out


def kld_sums(logits: Any, targets: Any, base: Any, s: Sums, w: Work) -> None:
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


def mean_err(total: float, total2: float, count: int) -> tuple[float, float]:
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


def divergence(s: Sums) -> Divergence:
    """The figures against a reference, from the sums."""
    import numpy as np

    n = s.count
    log_ppl, log_ppl_err = mean_err(s.nll, s.nll2, n)
    log_base, log_base_err = mean_err(s.nll_base, s.nll_base2, n)
    cov = ((s.nll_nll_base / n - (s.nll / n) * (s.nll_base / n)) / (n - 1)) if n >= 10 else 0.0
    ppl, ppl_err = math.exp(log_ppl), math.exp(log_ppl) * log_ppl_err
    base, base_err = math.exp(log_base), math.exp(log_base) * log_base_err
    ratio = log_ppl - log_base
    ratio_err = math.sqrt(max(0.0, log_ppl_err ** 2 + log_base_err ** 2 - 2 * cov))
    kld, kld_err = mean_err(s.kld, s.kld2, n)
    dp, dp_err = mean_err(s.p_diff, s.p_diff2, n)
    mse, mse_err = mean_err(s.p_diff2, s.p_diff4, n)
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
