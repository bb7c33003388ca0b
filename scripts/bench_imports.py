#!/usr/bin/env python3
"""What each command costs before it does its work, as users run it: the venv's `localgen` console script, in a
home of its own, with bytecode caching (the first run writes the .pyc files). For `--version`, `list`, `run`,
`chat` (one message piped), `embed` (one line) and `serve` (started until /health answers): the wall time
(median of alternated rounds), the time spent importing (the sum of the top-level entries of
PYTHONPROFILEIMPORTTIME, one run) and the number of modules imported. Beside them, measured in the same
rounds: the interpreter alone (`python -c pass`: the floor of any Python command), a bare llama-cpp-python
script doing `run`'s work, and where llama.cpp's tools are given (--llama-bin), llama-embedding for `embed`
and llama-server's start for `serve`.

tests/test_user_processes.py holds what each command must not import; this script holds the timings (no test
asserts a time).

usage: scripts/bench_imports.py [--model smollm2:135m] [--runs 5] [--threads 2] [--llama-bin DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import harness

BIN = Path(sys.executable).parent / "localgen"
PROMPT = "Name three primary colors."
BARE = """
import sys
import llama_cpp
llm = llama_cpp.Llama(sys.argv[1], n_ctx=4096, n_threads=int(sys.argv[2]), verbose=False)
out = llm.create_chat_completion(messages=[{"role": "user", "content": sys.argv[3]}], temperature=0, max_tokens=16)
print(out["choices"][0]["message"]["content"])
"""


def commands(model: str, threads: int) -> dict[str, tuple[list[str], str]]:
    """Each command's arguments and its stdin."""
    t = ["--threads", str(threads)]
    return {
        "--version": (["--version"], ""),
        "list": (["list"], ""),
        "run": (["run", "-m", model, "-p", PROMPT, "-n", "16", "--temperature", "0", *t], ""),
        "chat": (["chat", "-m", model, "-n", "16", "--temperature", "0", *t], PROMPT + "\n"),
        "embed": (["embed", "-m", model, *t], PROMPT + "\n"),
    }


def once(cmd: list[str], stdin: str, env: dict[str, str]) -> float:
    """Wall seconds of one run of `cmd` to its end."""
    return harness.timed(lambda: subprocess.run(cmd, input=stdin.encode(), env=env, check=True,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))[0]


def served(cmd: list[str], url: str, env: dict[str, str]) -> float:
    """Wall seconds from a server's start until `url` answers (it is then stopped)."""
    def up() -> None:
        with harness.server(cmd, url, env=env, timeout=300):
            pass
    return harness.timed(up)[0]


def imports(cmd: list[str], stdin: str, env: dict[str, str], serve_url: str | None = None) -> tuple[float, int]:
    """Seconds spent importing and the number of modules, from PYTHONPROFILEIMPORTTIME's report of one run."""
    with tempfile.TemporaryFile("w+") as err:
        env = {**env, "PYTHONPROFILEIMPORTTIME": "1"}
        if serve_url is None:
            subprocess.run(cmd, input=stdin.encode(), env=env, check=True, stdout=subprocess.DEVNULL, stderr=err)
        else:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
            try:
                while not harness.answers(serve_url):
                    if proc.poll() is not None:
                        raise harness.ServerError(f"serve exited ({proc.returncode})")
            finally:
                harness.stop(proc)
        err.seek(0)
        total, count = 0, 0
        for line in err:
            if not line.startswith("import time:") or "cumulative" in line:
                continue
            _, cumulative, name = line.split("|", 2)
            count += 1
            if not name.startswith("  "):  # one space after the bar: a top-level import
                total += int(cumulative)
        return total / 1e6, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-bin", metavar="DIR", help="llama.cpp's tools (llama-embedding, llama-server) to time "
                                                       "beside embed and serve")
    a = ap.parse_args()
    if not BIN.is_file():
        ap.error(f"no console script at {BIN}: run scripts/install.sh")
    from localgen.models.resolve import resolve

    path = resolve(a.model).path
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("LOCALGEN_") and k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")}
        env["LOCALGEN_HOME"] = home
        port = harness.free_port()
        serve = [str(BIN), "serve", "-m", a.model, "--port", str(port), "--threads", str(a.threads)]
        url = f"http://127.0.0.1:{port}/health"
        cases: dict[str, Callable[[], float]] = {
            name: partial(once, [str(BIN), *args], stdin, env) for name, (args, stdin) in commands(a.model,
                                                                                                  a.threads).items()}
        cases["serve (until /health answers)"] = partial(served, serve, url, env)
        cases["python -c pass"] = partial(once, [sys.executable, "-c", "pass"], "", env)
        cases["bare llama-cpp-python run"] = partial(once, [sys.executable, "-c", BARE, path, str(a.threads), PROMPT],
                                                     "", env)
        if a.llama_bin:
            tool = Path(a.llama_bin)
            cases["llama-embedding"] = partial(once, [str(tool / "llama-embedding"), "-m", path, "-p", PROMPT, "-t",
                                                      str(a.threads), "--log-disable"], "", env)
            peer_port = harness.free_port()
            cases["llama-server (until /health answers)"] = partial(
                served, [str(tool / "llama-server"), "-m", path, "--port", str(peer_port), "-t", str(a.threads)],
                f"http://127.0.0.1:{peer_port}/health", env)
        for case in cases.values():  # warm-up: bytecode written, the page cache and localgen's caches filled
            case()
        times = harness.alternate(cases, a.runs)
        print(f"{a.model}, --threads {a.threads}, medians of {a.runs} alternated rounds (load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)\n")
        print("| command | wall | imports | modules |\n| --- | --- | --- | --- |")
        for name, (args, stdin) in commands(a.model, a.threads).items():
            spent, count = imports([str(BIN), *args], stdin, env)
            wall = harness.median(times[name])
            print(f"| `localgen {args[0]}` | {wall:.3f} s | {spent:.3f} s | {count} |")
        spent, count = imports(serve, "", env, url)
        wall = harness.median(times["serve (until /health answers)"])
        print(f"| `localgen serve` (until /health answers) | {wall:.3f} s | {spent:.3f} s | {count} |")
        for name in cases:
            if name.startswith(("python", "bare", "llama")):
                print(f"| {name} | {harness.median(times[name]):.3f} s | | |")


if __name__ == "__main__":
    main()
