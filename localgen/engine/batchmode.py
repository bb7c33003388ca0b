"""Which batch scheduler a load gets (engine/batch.py): exact where keeping greedy answers identical to
running alone is (nearly) free, throughput elsewhere; --exact / --no-exact force one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localgen.engine.llama import Engine


@dataclass(frozen=True)
class Mode:
    """How a batch of requests is scheduled: `exact` as ParallelContext.run takes it (None: greedy requests
    exact; True: all), or `throughput` (every request batched, the mixed scheduler); and why."""

    throughput: bool
    exact: bool | None
    why: str

    @property
    def name(self) -> str:
        """One word for start-up lines and JSON."""
        return "throughput" if self.throughput else "exact"


def exact_price(engine: Engine) -> str | None:
    """Why keeping greedy answers identical to running alone costs more than 10 % of batched speed on this
    load, or None where it is (nearly) free: CPU weights whose matmul computes a row the same in any batch,
    and no flash attention (which gives a long sequence a call of its own)."""
    if engine.offloaded:
        return ("offloaded layers (a GPU's or an RPC server's devices) may compute a row differently in another "
                "batch size, so each exact sequence would decode alone")
    if engine.exact_rows:
        return f"this model's CPU kernels compute more than {engine.exact_rows} rows differently"
    if engine.flash_attn:
        return "flash attention splits a long sequence's keys differently in a batch"
    return None


def batching_mode(engine: Engine, exact: bool | None, lookup: bool = False) -> Mode:
    """The mode for `--exact` (True), `--no-exact` (False) or the default (None): exact for greedy requests
    where that is free, throughput elsewhere. `lookup` (drafting by prompt lookup, which only the throughput
    scheduler does) makes throughput the default."""
    if exact is True:
        return Mode(False, True, "--exact: every answer identical to running alone" +
                    (" (so nothing is drafted: --lookup is off)" if lookup else ""))
    if exact is False:
        return Mode(True, False, "--no-exact: every request batched" +
                    (", its drafts (--lookup) checked in the batch" if lookup else ""))
    if lookup:
        return Mode(True, False, "--lookup: every request batched, its drafts checked in the batch; --exact forces "
                                 "answers identical to running alone, without drafting")
    price = exact_price(engine)
    if price is None:
        return Mode(False, None, "greedy answers identical to running alone (free with this model here)")
    return Mode(True, False, f"every request batched; exactness would cost more than 10 % ({price}): --exact "
                             "forces it")


def exactness(engine: Engine, exact: bool | None, greedy: bool, lookup: bool = False) -> str:
    """What one batched answer promises against running it alone (`run --file --json`'s `exact`): "identical"
    (the exact path on a CPU: the same bits as `run -p` alone, which the tests hold), "alone" (the exact path with
    offloaded layers: each sequence decoded in calls of its own, the calls a run alone makes; llama.cpp does not
    promise that its GPU kernels give the same bits from one run to the next, so localgen does not promise
    identical text there: scripts/gpu_check reports what a GPU gave), or "no" (batched with others: it may
    differ from running alone after some tokens, as with llama-server)."""
    mode = batching_mode(engine, exact, lookup)
    if not (mode.exact is True or (mode.exact is None and greedy)):
        return "no"
    return "alone" if engine.offloaded else "identical"


def kv_pool(engine: Engine, throughput: bool) -> bool:
    """Whether the throughput scheduler's sequences share one pool of KV cells (llama.cpp's kv_unified) rather than
    each keeping a stream of its own. --kv-unified / --no-kv-unified decide; by default a stream per sequence, on a
    CPU and on a GPU alike, as llama-server and llama-batched-bench keep them: in one pool every row's attention
    spans every slot's cells, which on a CPU slowed decoding steps at 32 sequences, and on an H200 halved serve's
    rate at 8 and 32 clients and multiplied its time to first token (docs/benchmarks.md). The exact scheduler
    always keeps a stream per sequence: a row's attention then spans only its own cells, as running alone."""
    if not throughput:
        return False
    return bool(engine.params.kv_unified)
