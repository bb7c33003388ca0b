#!/usr/bin/env python3
"""Benchmark for the load defaults (issue: defaults measured, not assumed).

For each model: one exchange (a 512-token prompt, then a 256-token greedy answer with end-of-sequence
ignored) at depth 0 and at a depth of real use (1,500 tokens already in the cache, evaluated before the
clock starts), through the engine's own generation path (sampling and all), with
  - "defaults": the settings a user gets (`LoadParams()`: the tuning record when one is in LOCALGEN_HOME,
    else the rule), and "rule": the rule alone, when a record exists;
  - every alternative: flash attention and repacking flipped (both, where repacking applies), and each of
    threads, batch threads and physical batch moved one at a time from the defaults;
  - llama.cpp's `auto` for flash attention (what llama-cli and llama-server do here), read from its log.
Each measurement is a fresh process; configurations alternate within each round; medians of --reps rounds.

usage: scripts/bench_defaults.py [--model NAME ...] [--reps 5] [--depth 1500] [--answer 256]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import harness

ROOT = Path(__file__).resolve().parents[1]


def child(model: str, settings: dict[str, Any], depth: int, answer: int, use_records: bool) -> dict[str, Any]:
    """In a fresh process: load with `settings` over the defaults, time an exchange at 0 and at `depth`."""
    from localgen.engine import defaults
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.native.prompt import Prompt
    from localgen.types import LoadParams, SamplingParams

    ref = resolve(model, offline=True)
    params = LoadParams(n_ctx=depth + 512 + answer + 64, **settings)
    if not use_records:  # the rule alone: its settings, as flags, so no record applies
        ruled, _ = defaults.resolve(ref, params, cpu_only=True, use_records=False)
        params = LoadParams(n_ctx=params.n_ctx, **{k: getattr(ruled, k) for k in TUNABLE})
    engine = Engine(ref, params)
    text = (ROOT / "README.md").read_text() * 4
    tokens = engine.raw_tokens(text)
    deep, prompt = tokens[:depth], tokens[depth:depth + 512]
    sp = SamplingParams(temperature=0.0, max_tokens=answer, ignore_eos=True)
    out: dict[str, Any] = {"settings": {k: getattr(engine.params, k) for k in TUNABLE},
                           "flash_attn_used": engine.flash_attn}
    for d in (0, depth):
        engine.kv.clear()
        if d:
            engine.kv.evaluate(Prompt.text(deep[:d]), logits=False)
        t0 = time.perf_counter()
        n = sum(1 for _ in engine.generate(Prompt.text(deep[:d] + prompt), sp))
        out[str(d)] = time.perf_counter() - t0
        out[f"tokens_{d}"] = n
    engine.close()
    return out


TUNABLE = ("flash_attn", "repack", "n_threads", "n_threads_batch", "n_ubatch")


def run_child(model: str, settings: dict[str, Any], a: argparse.Namespace, use_records: bool = True) -> dict[str, Any]:
    arg = json.dumps({"model": model, "settings": settings, "depth": a.depth, "answer": a.answer,
                      "use_records": use_records})
    r = subprocess.run([sys.executable, __file__, "--child", arg], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def alternatives(model: str, a: argparse.Namespace) -> list[tuple[str, dict[str, Any], bool]]:
    """(label, settings over the defaults, use records) for each configuration measured."""
    from localgen import hardware
    from localgen.engine import defaults
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    ref = resolve(model, offline=True)
    base, _ = defaults.resolve(ref, LoadParams(), cpu_only=True)
    ruled, _ = defaults.resolve(ref, LoadParams(), cpu_only=True, use_records=False)
    cur = {k: getattr(base, k) for k in TUNABLE}
    configs: list[tuple[str, dict[str, Any], bool]] = [("defaults", {}, True)]
    if cur != {k: getattr(ruled, k) for k in TUNABLE}:
        configs.append(("rule (no record)", {}, False))
    configs.append(("llama.cpp auto FA", {**cur, "flash_attn": "auto"}, True))
    flips = [("flash_attn",)]
    if (ref.summary.repackable_share or 0) > 0:
        flips += [("repack",), ("flash_attn", "repack")]
    for names in flips:
        configs.append((" + ".join(f"{n} {'off' if cur[n] else 'on'}" for n in names),
                        {**cur, **{n: not cur[n] for n in names}}, True))
    cores = sorted({hardware.physical_cores(), hardware.usable_cores(), max(1, hardware.usable_cores() - 1)})
    for name in ("n_threads", "n_threads_batch"):
        for t in cores:
            if t != cur[name]:
                configs.append((f"{name} {t}", {**cur, name: t}, True))
    for u in (512, 256, 128):
        if u != cur["n_ubatch"]:
            configs.append((f"n_ubatch {u}", {**cur, "n_ubatch": u}, True))
    return configs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", help="models (default: smollm2:135m and gemma3:270m)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--depth", type=int, default=1500)
    p.add_argument("--answer", type=int, default=256)
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        c = json.loads(a.child)
        print(json.dumps(child(c["model"], c["settings"], c["depth"], c["answer"], c["use_records"])))
        return
    for model in a.model or ["smollm2:135m", "gemma3:270m"]:
        configs = alternatives(model, a)
        def progress(rep: int, _: object, model: str = model) -> None:
            print(f"{model}: round {rep + 1} of {a.reps} done", file=sys.stderr, flush=True)

        # alternated, so drift hits every configuration
        runs = harness.alternate({label: partial(run_child, model, settings, a, use_records)
                                  for label, settings, use_records in configs}, a.reps, after=progress)
        med = {label: {d: harness.median(got[d] for got in runs[label]) for d in ("0", str(a.depth))}
               for label in runs}
        used = {label: {**got[-1]["settings"], "flash_attn_used": got[-1]["flash_attn_used"]}
                for label, got in runs.items()}
        best = {d: min(m[d] for m in med.values()) for d in ("0", str(a.depth))}
        print(f"\n{model}: one exchange (512-token prompt, {a.answer}-token answer), median of {a.reps} fresh runs")
        print(f"{'configuration':26} {'fa':>4} {'repack':>6} {'-t':>3} {'-tb':>3} {'-ub':>4} "
              f"{'depth 0':>9} {'× best':>7} {'depth ' + str(a.depth):>11} {'× best':>7}")
        for label, _, _ in configs:
            s = used[label]
            print(f"{label:26} {'on' if s['flash_attn_used'] else 'off':>4} {'on' if s['repack'] else 'off':>6} "
                  f"{s['n_threads']:>3} {s['n_threads_batch']:>3} {s['n_ubatch']:>4} "
                  f"{med[label]['0']:>8.2f}s {med[label]['0'] / best['0']:>6.2f}× "
                  f"{med[label][str(a.depth)]:>10.2f}s {med[label][str(a.depth)] / best[str(a.depth)]:>6.2f}×")


if __name__ == "__main__":
    main()
