#!/usr/bin/env python3
"""Do `localgen bench` numbers agree with llama.cpp's own llama-bench? (issue: bench, target within 5 %)

Runs both on the same model file, threads, batch sizes and flash attention, alternating for several
rounds in the order llama-bench, localgen, localgen, llama-bench, ... so that machine drift hits both and neither
always runs first or second (on an H200 the one run second in every round, localgen, rose round by round:
8,344, 8,588, 8,984 t/s against llama-bench's 8,966, 9,037, 9,058), and compares the median
of each test's per-round means. llama-bench comes from ../shared/tools/build-llama-bench, which builds
it from the llama.cpp sources vendored in the llama-cpp-python source package, with the same flags.

With `--batched LLAMA_BATCHED_BENCH --npl 8,32` it compares `localgen bench -npl` (several sequences decoded
together, through the scheduler `serve` and `run --file` use) with llama.cpp's llama-batched-bench instead:
S_PP (every sequence's prompt evaluated, tokens per second) against `ppP xN`, S_TG against `tgN xN`. Both keep a KV
stream per sequence by default; `--kvu` gives both one pool of cells (llama-batched-bench -kvu, localgen --kv-unified).

usage: scripts/bench_vs_llama_bench.py LLAMA_BENCH [--model PATH] [--rounds 4] [-p 512] [-n 128] [-t N]
       scripts/bench_vs_llama_bench.py --batched LLAMA_BATCHED_BENCH --npl 8,32 [--kvu] [--model PATH] [-p 512] ...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from functools import partial

import harness


def llama_bench(exe: str, model: str, p: int, n: int, t: int, reps: int) -> dict[str, float]:
    out = subprocess.run([exe, "-m", model, "-p", str(p), "-n", str(n), "-t", str(t), "-fa", "1", "-b", "2048",
                          "-ub", "512", "-r", str(reps), "-o", "jsonl"], capture_output=True, text=True, check=True)
    recs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {(f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"): r["avg_ts"] for r in recs}


def batched_bench(exe: str, model: str, p: int, n: int, t: int, npl: list[int], kvu: bool) -> dict[str, float]:
    """llama-batched-bench's S_PP and S_TG for each sequence count, named as `localgen bench -npl` names them."""
    out = subprocess.run([exe, "-m", model, "-npp", str(p), "-ntg", str(n), "-npl", ",".join(map(str, npl)),
                          "-c", str(max(npl) * (p + n)), "-t", str(t), "-fa", "on", "-b", "2048", "-ub", "512",
                          *(["-kvu"] if kvu else []), "--output-format", "jsonl"], capture_output=True, text=True,
                         check=True)
    found: dict[str, float] = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            found[f"pp{p} x{r['pl']}"] = r["speed_pp"]
            found[f"tg{n} x{r['pl']}"] = r["speed_tg"]
    return found


def localgen_bench(model: str, p: int, n: int, t: int, reps: int, env: dict[str, str],
                   npl: list[int] | None = None, kvu: bool = False) -> dict[str, float]:
    more = ["-npl", ",".join(map(str, npl)), *(["--kv-unified"] if kvu else [])] if npl else []
    out = subprocess.run([sys.executable, "-m", "localgen", "bench", "-m", model, "-p", str(p), "-n", str(n),
                          "-t", str(t), "-fa", "1", "-b", "2048", "-ub", "512", "-r", str(reps), "--no-e2e",
                          *more, "-o", "jsonl"], capture_output=True, text=True, check=True, env=env)
    found = {json.loads(line)["test"]: json.loads(line)["avg_ts"] for line in out.stdout.splitlines()}
    return {k: v for k, v in found.items() if " x" in k} if npl else found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("llama_bench", nargs="?", type=harness.executable)
    ap.add_argument("--batched", metavar="LLAMA_BATCHED_BENCH", type=harness.executable,
                    help="compare -npl with llama-batched-bench")
    ap.add_argument("--npl", default="8,32", help="sequence counts for --batched")
    ap.add_argument("--kvu", action="store_true", help="with --batched: one pool of KV cells on both sides")
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=None)
    ap.add_argument("-r", type=int, default=5)
    a = ap.parse_args()
    if not (a.llama_bench or a.batched):
        ap.error("give LLAMA_BENCH, or --batched LLAMA_BATCHED_BENCH")
    if a.kvu and not a.batched:
        ap.error("--kvu goes with --batched")
    npl = [int(x) for x in a.npl.split(",")] if a.batched else None
    name = "llama-batched-bench" if a.batched else "llama-bench"
    from localgen import hardware
    from localgen.models.resolve import resolve

    model = a.model or resolve("smollm2:135m").path
    threads = a.t or hardware.usable_cores()

    def show(rnd: int, got: dict[str, list[dict[str, float]]]) -> None:
        print(f"round {rnd + 1}: {name} " + ", ".join(f"{k} {v:.1f}" for k, v in got["theirs"][-1].items())
              + " | localgen " + ", ".join(f"{k} {v:.1f}" for k, v in got["ours"][-1].items()), flush=True)

    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALGEN_HOME": home}
        runs = harness.alternate({
            "theirs": (partial(batched_bench, a.batched, model, a.p, a.n, threads, npl, a.kvu) if npl
                       else partial(llama_bench, a.llama_bench, model, a.p, a.n, threads, a.r)),
            "ours": partial(localgen_bench, model, a.p, a.n, threads, a.r, env, npl, a.kvu)}, a.rounds,
            after=show)
    theirs = {k: [got[k] for got in runs["theirs"] if k in got] for k in runs["theirs"][0]}
    ours = {k: [got[k] for got in runs["ours"] if k in got] for k in runs["ours"][0]}
    print(f"{os.path.basename(model)}, {threads} threads, fa 1, "
          + ("one pool of KV cells (-kvu), " if a.kvu else "a KV stream per sequence, " if npl else "")
          + f"median of {a.rounds} rounds" + ("" if npl else f" of -r {a.r}") + ":")
    for k in theirs:
        t, o = harness.median(theirs[k]), harness.median(ours.get(k, [float("nan")]))
        print(f"  {k:10} {name} {t:8.2f} t/s   localgen {o:8.2f} t/s   localgen/{name} {o / t * 100:6.1f} %")


if __name__ == "__main__":
    main()
