#!/usr/bin/env python3
"""One-shot start: wall time of `localgen run -p` against a bare llama-cpp-python script doing the same work
(import, load with n_ctx=4096, one chat completion, print), alternating runs, medians; also
`localgen --help` and the GGUF header summary of a Llama-3-sized vocabulary (128k tokens, 280k merges),
read cold and from the summary cache. (issue: fast where a user feels it; target run ≤ 1.05× bare.)
Also the time each spends importing (the sum of `python -X importtime`'s top-level entries, one run).

--baseline DIR times a second localgen source tree in the same alternation (before and after a change, on
the same machine load): e.g. `git worktree add /tmp/base HEAD` or `git archive HEAD localgen | tar -x -C DIR`.

usage: scripts/bench_startup.py [--model smollm2:135m] [--runs 7] [--tokens 64] [--threads 2] [--baseline DIR]
                               [--no-header] [--fa-off]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import harness

PROMPT = "Name three primary colors."
BARE = """
import sys
import llama_cpp
llm = llama_cpp.Llama(sys.argv[1], n_ctx=4096, n_threads=int(sys.argv[3]), verbose=False)
out = llm.create_chat_completion(messages=[{"role": "user", "content": sys.argv[4]}], temperature=0,
                                 max_tokens=int(sys.argv[2]))
print(out["choices"][0]["message"]["content"])
"""


def timed(cmd: list[str], env: dict[str, str], cwd: str | None = None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, all threads) of one run. On a busy machine the CPU time
    moves less than the wall time; with --threads above 1 it counts llama.cpp's threads spinning too."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = harness.run_timed(cmd, env=env, cwd=cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return spent, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_seconds(cmd: list[str], env: dict[str, str], cwd: str | None = None) -> tuple[float, int]:
    """Seconds spent importing (top-level entries of -X importtime, nested ones are inside them) and the
    number of modules imported, in one run of `cmd` (a Python command line)."""
    done = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, check=True, cwd=cwd)
    total, count = 0, 0
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|", 2)
        count += 1
        if not name.startswith("  "):  # one space after the bar: a top-level import
            total += int(cumulative)
    return total / 1e6, count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-header", action="store_true", help="skip the Llama-3-sized GGUF header timing")
    ap.add_argument("--fa-off", action="store_true", help="also time `localgen run -fa off`: the bare script runs "
                                                          "without flash attention (the bindings' default), localgen "
                                                          "with it unless a tuning record says otherwise")
    ap.add_argument("--baseline", metavar="DIR", help="another localgen source tree (holding localgen/) to time "
                                                       "alongside, e.g. the last commit's")
    a = ap.parse_args()
    from localgen.models.resolve import resolve

    path = resolve(a.model).path
    with tempfile.TemporaryDirectory() as home:
        # as users run it: with bytecode caching (the warm-up writes localgen's .pyc files; site-packages has
        # the bindings' already), else every run of localgen recompiles its modules and the bare script does not
        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "LOCALGEN_HOME": home}
        ours = [sys.executable, "-m", "localgen", "run", "-m", a.model, "-p", PROMPT, "--temperature", "0",
                "--max-tokens", str(a.tokens), "--threads", str(a.threads)]
        bare = [sys.executable, "-c", BARE, path, str(a.tokens), str(a.threads), PROMPT]
        here = str(Path(__file__).resolve().parents[1])  # `-m localgen` imports the tree in the working directory
        trees = {"localgen run": here}
        if a.baseline:
            if not (Path(a.baseline) / "localgen" / "__init__.py").is_file():
                ap.error(f"--baseline {a.baseline}: no localgen/ package there")
            trees["baseline run"] = str(Path(a.baseline).resolve())
        for cwd in trees.values():  # warm the page cache and localgen's summary cache, as every later run finds them
            harness.run_timed(ours, env=env, cwd=cwd)
        harness.run_timed(bare, env=env)
        if a.fa_off:
            trees["localgen run -fa off"] = here
        cases = {"bare": partial(timed, bare, env), **{label: partial(timed, _fa(ours, label), env, cwd)
                                                      for label, cwd in trees.items()}}
        times = harness.alternate(cases, a.runs, flip=False)
        t_bare = times["bare"]
        helps = [harness.run_timed([sys.executable, "-m", "localgen", "--help"], env=env, cwd=here)
                 for _ in range(a.runs)]
        print(f"{a.model}: {a.tokens} tokens, --threads {a.threads}, medians of {a.runs} alternating runs "
              f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
        print(f"  {'':<22} {'wall':>8} {'ratio':>7} {'paired':>7}   {'CPU':>8} {'ratio':>7}   imports")
        mb, mc = (harness.median(t[i] for t in t_bare) for i in (0, 1))
        spent, count = import_seconds(bare, env)
        print(f"  {'bare llama-cpp-python':<22} {mb:7.3f}s {'':>7} {'':>7}   {mc:7.3f}s {'':>7}   "
              f"{spent:.3f} s, {count} modules")
        for label, cwd in trees.items():
            w, c = (harness.median(t[i] for t in times[label]) for i in (0, 1))
            paired = harness.paired_ratio([o[0] for o in times[label]], [b[0] for b in t_bare])
            spent, count = import_seconds(_fa(ours, label), env, cwd)
            print(f"  {label:<22} {w:7.3f}s {harness.ratio(w, mb, '6.3f')} {paired:6.3f}x   {c:7.3f}s "
                  f"{harness.ratio(c, mc, '6.3f')}   "
                  f"{spent:.3f} s, {count} modules")
        print(f"  localgen --help        {harness.median(helps):.3f} s")
        if a.no_header:
            return
        try:
            big = harness.llama3_header(Path(home) / "llama3-header.gguf")
        except ImportError:
            return
        from localgen.models import gguf_meta

        cold = [harness.timed(partial(gguf_meta.read_summary, str(big), use_cache=False))[0] for _ in range(3)]
        os.environ["LOCALGEN_HOME"] = home
        gguf_meta.read_summary(str(big))
        cached = harness.timed(partial(gguf_meta.read_summary, str(big)))[0]
        print(f"  Llama-3-sized header   {harness.median(cold) * 1000:.0f} ms read, {cached * 1000:.1f} ms cached")


def _fa(cmd: list[str], label: str) -> list[str]:
    return [*cmd, "-fa", "off"] if label.endswith("-fa off") else cmd


if __name__ == "__main__":
    main()
