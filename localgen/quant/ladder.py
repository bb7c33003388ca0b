"""The ladder: which quantization to run here, by measurement. For each file (the types `quantize --ladder` made, or
files already here with `bench --quality`): its size and bits per weight, pp and tg speed on this machine (bench's
runner), PPL and KL divergence against the reference (the source's logits, measured once), top-1 agreement, and
whether it fits this machine at the asked context. A closing verdict names the fastest within a KLD bound."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localgen.quant import measure as ms
from localgen.types import ModelRef

if TYPE_CHECKING:
    from localgen.engine.perplexity import Text

DEFAULT_KLD_BOUND = 0.05
QUALITY_TEST = "quality"


@dataclass(frozen=True)
class Speed:
    """bench's tests for each row: prompt and generation lengths, repetitions, threads (None: the rule)."""

    n_prompt: int = 512
    n_gen: int = 128
    reps: int = 3
    threads: int | None = None

    @property
    def timed(self) -> bool:
        """Whether any speed is measured (`-p 0 -n 0`: none)."""
        return self.n_prompt > 0 or self.n_gen > 0


@dataclass(frozen=True)
class Row:
    """One rung: a file and its figures (`reference`: the source every other row is measured against)."""

    model: str
    path: str
    type_name: str
    size: int
    bits_per_weight: float
    pp_ts: float | None
    tg_ts: float | None
    ppl: float
    ppl_err: float
    kld: float | None
    kld_err: float | None
    kld_p99: float | None
    kld_max: float | None
    same_top: float | None
    rms_dp: float | None
    fits: str
    reference: bool = False

    def record(self, settings: ms.Settings, speed: Speed, text: str) -> dict[str, Any]:
        """The row as a bench history record (test "quality")."""
        # the file's absolute path, as bench's rows keep it: `bench compare` pairs rows by it
        return {"test": QUALITY_TEST, "model_filename": os.path.abspath(self.path), "model_name": self.model,
                **asdict(self),
                "n_ctx": settings.ctx, "n_prompt": speed.n_prompt, "n_gen": speed.n_gen, "text": text,
                "n_threads": speed.threads, "n_gpu_layers": settings.gpu_layers, "n_batch": settings.batch,
                "n_ubatch": settings.ubatch, "flash_attn": None, "type_k": "f16", "type_v": "f16"}


def fits_here(ref: ModelRef, n_ctx: int) -> str:
    """Whether the model fits this machine at `n_ctx` (full GPU, partial GPU, CPU only, won't fit): the one place the
    ladder asks, so a better planner can take its place."""
    from localgen.models import fit, footprint
    from localgen.native.devices import backend_info
    from localgen.types import LoadParams

    offload = bool(backend_info()["gpu_offload"])
    plan = fit.plan(ref.summary, footprint.layout(ref.path), fit.this_machine(offload), LoadParams(n_ctx=n_ctx),
                    ctx=n_ctx, shrink=False)
    return plan.verdict


def _bpw(ref: ModelRef) -> float:
    s = ref.summary
    return round(s.tensor_bytes * 8 / s.n_params, 2) if s.n_params else 0.0


def _type_name(ref: ModelRef) -> str:
    return (ref.summary.quantization or "?").upper()


def speed_of(ref: ModelRef, speed: Speed, settings: ms.Settings) -> tuple[float | None, float | None]:
    """pp and tg tokens/s of the model here (bench's runner: random tokens, warm-up, repetitions)."""
    from localgen.bench.runner import run

    if not speed.timed:
        return None, None
    plan = speed_plan([ref.path], speed, settings.gpu_layers if settings.gpu_layers is not None
                      else (-1 if _offload() else 0))
    pp = tg = None
    for result in run(plan, open_model=lambda _: ref):
        if result.test.kind == "pp":
            pp = result.avg_ts
        elif result.test.kind == "tg":
            tg = result.avg_ts
    return pp, tg


def speed_plan(models: list[str], speed: Speed, gpu_layers: int) -> Any:
    """bench's plan for the speed columns of these models (its sizes checked as a sweep's are)."""
    from localgen.bench import sweep

    return sweep.build(models=models, threads=[speed.threads], ngl=[gpu_layers], batch=[2048], ubatch=[None],
                       fa=[None], ctk=["f16"], ctv=["f16"], prompts=[speed.n_prompt] if speed.n_prompt > 0 else [],
                       gens=[speed.n_gen] if speed.n_gen > 0 else [], pg=[], depths=[0], reps=speed.reps, e2e=False)


def check_speed(speed: Speed, trained: dict[str, int | None]) -> None:
    """Refuse the speed columns' sizes before anything is made or measured, as a sweep refuses them: -r past
    bench's bound, -p or -n past a C int or past a model's trained context (`trained`, by model)."""
    from localgen.bench import sweep

    if speed.timed:
        sweep.check_context(speed_plan(list(trained), speed, 0), trained)


def _offload() -> bool:
    from localgen.native.devices import backend_info

    return bool(backend_info()["gpu_offload"])


def rows(reference: ModelRef, files: list[ModelRef], text: Text | str, settings: ms.Settings, speed: Speed,
         on_chunk: ms.OnChunk | None = None, on_step: Callable[[str], None] | None = None) -> Iterator[Row]:
    """The reference's row (its logits kept in a temp file), then one per file, each as soon as it is measured.
    A file with another vocabulary than the reference's is refused before any work; a file given twice, or that
    is the reference, has one row."""
    measured = {os.path.realpath(reference.path): reference}
    for f in files:
        measured.setdefault(os.path.realpath(f.path), f)
    files = list(measured.values())[1:]
    for f in files:
        ms.same_vocabulary(f, reference)
    step = on_step or (lambda _s: None)
    temp = ms.temp_logits("ladder")
    try:
        step(f"measuring the reference {reference.name}")
        engine = ms.open_model(reference, settings)
        try:
            base = ms.perplexity(engine, text, settings, save=temp, on_chunk=on_chunk,
                                 saving=f"the reference {reference.name}'s logits (the others are measured against "
                                        "them)")
        finally:
            engine.close()
        if speed.timed:
            step(f"timing {reference.name}")
        pp, tg = speed_of(reference, speed, settings)
        yield Row(reference.name, os.path.abspath(reference.path), _type_name(reference), reference.summary.file_size,
                  _bpw(reference), pp, tg, base.ppl, base.ppl_err, None, None, None, None, None, None,
                  fits_here(reference, settings.ctx), reference=True)
        for f in files:
            step(f"measuring {f.name}")
            engine = ms.open_model(f, settings)
            try:
                m = ms.against(engine, temp, settings, text, on_chunk)
            finally:
                engine.close()
            if speed.timed:
                step(f"timing {f.name}")
            pp, tg = speed_of(f, speed, settings)
            d = m.divergence
            kp = (d.kld_percentiles or {}) if d else {}
            yield Row(f.name, os.path.abspath(f.path), _type_name(f), f.summary.file_size, _bpw(f), pp, tg, m.ppl,
                      m.ppl_err, d.kld if d else None, d.kld_err if d else None, kp.get("p99"), kp.get("max"),
                      d.same_top if d else None, d.rms_dp if d else None, fits_here(f, settings.ctx))
    finally:
        Path(temp).unlink(missing_ok=True)


def best(found: list[Row], kld_bound: float) -> Row | None:
    """The fastest row (generation, then prompt speed) whose mean KLD is within the bound and that fits here; the
    reference counts, with a KLD of 0. None where nothing was timed (-p 0 -n 0: no speed picks one) or no
    quantization was measured (only the reference): nothing there is the fastest."""
    if all(r.reference for r in found) or all(r.tg_ts is None and r.pp_ts is None for r in found):
        return None
    ok = [r for r in found if (r.reference or (r.kld is not None and r.kld <= kld_bound)) and r.fits != "won't fit"]
    if not ok:
        return None
    return max(ok, key=lambda r: (r.tg_ts or 0.0, r.pp_ts or 0.0, -(r.kld or 0.0)))
