#!/usr/bin/env python3
"""The tests' fork server (tests/forkserver.py) against a started interpreter: wall time of the same
`localgen` calls made as the tests make them, each way in turn, alternating rounds, medians. The outputs and
exit codes of the two must be the same in every round, or the script stops.

The calls: `--version`, a run refused before a model loads (an unknown model), `list`, and a short greedy
`run -p` on SmolLM2 (8 tokens). Each runs in a throwaway LOCALGEN_HOME, in the tests' environment (no colour,
offline, unbuffered).

usage: scripts/bench_forkserver.py [--rounds 9] [--model smollm2:135m] [--tokens 8]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--tokens", type=int, default=8)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.forkserver import ForkServer

    home = tempfile.mkdtemp(prefix="bench-forkserver-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALGEN_")}
    env.update(LOCALGEN_HOME=home, PYTHONUNBUFFERED="1", NO_COLOR="1", HF_HUB_OFFLINE="1")
    calls = {
        "--version": ["--version"],
        "run, unknown model": ["run", "-m", "no-such-model.gguf", "-p", "hi"],
        "list": ["list"],
        f"run -p, {a.tokens} tokens": ["run", "-m", a.model, "-p", "Say hi.", "-n", str(a.tokens), "--temperature",
                                       "0", "--seed", "1"],
    }

    def started(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "localgen", *args], input="", capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=600)

    started(calls[f"run -p, {a.tokens} tokens"])  # the model's first use copies it into the home
    forks = ForkServer(env, ROOT, Path(tempfile.mkdtemp(prefix="bench-forks-")))
    print(f"{'call':24} {'started':>9} {'forked':>9} {'saved':>8}  (medians of {a.rounds} rounds, seconds)")
    def call(way: str, args: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
        return harness.timed(lambda: started(args) if way == "started" else forks.run(args, env, "", 600))

    try:
        for label, args in calls.items():
            rounds = harness.alternate({w: partial(call, w, args) for w in ("started", "forked")}, a.rounds)
            for (_, mine), (_, theirs) in zip(rounds["started"], rounds["forked"], strict=True):
                if (mine.returncode, mine.stdout, mine.stderr) != (theirs.returncode, theirs.stdout, theirs.stderr):
                    raise SystemExit(f"{label}: the forked call answered differently:\n{mine}\n{theirs}")
            slow, fast = (harness.median(t for t, _ in rounds[w]) for w in ("started", "forked"))
            print(f"{label:24} {slow:9.3f} {fast:9.3f} {slow - fast:8.3f}")
    finally:
        forks.close()


if __name__ == "__main__":
    main()
