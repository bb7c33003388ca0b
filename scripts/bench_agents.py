#!/usr/bin/env python3
"""A load shaped like agents (#63): C clients, each a T-turn conversation over one long system prompt that
holds tool definitions (the same for every client, as an agent framework sends it), against `localgen serve`
and llama.cpp's llama-server with --cache-ram, on the same model and machine, one after the other. Halfway
(once every client has had T/2 turns) the server is stopped with SIGTERM and started again, as an upgrade or
a reboot would; the clients then go on with their conversations.

Each turn is streamed at temperature 0 with ignore_eos and a fixed answer length, so both servers do the
same work. Reported per server: throughput (tokens generated over the time the clients ran, the restart's
downtime left out and shown on its own), TTFT p50 and p99 over every turn, and where the time goes: the
first turn (the system prompt evaluated), the turns after the restart (what the server kept), the rest.
localgen keeps its prompt cache on disk across the restart (--cache-disk, on by default; its home is a fresh
folder per run, so the first turn is cold for both); llama-server's --cache-ram is in memory only.

usage: scripts/bench_agents.py [--clients 8] [--turns 20] [--system-tokens 4000] [--tokens 32]
                               [--model smollm2:135m] [--threads 2] [--ctx 6144] [--cache-ram 8192]
                               [--llama-server /work/llama-tools/bin/llama-server] [--only localgen]
                               [--no-restart] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

import harness

TOOLS = [
    ("search_files", "Search the repository for files whose path or content matches a pattern.",
     {"pattern": "a regular expression", "path": "the folder to search under", "limit": "the most results"}),
    ("read_file", "Read a file of the repository, whole or a range of its lines.",
     {"path": "the file", "start": "the first line", "end": "the last line"}),
    ("write_file", "Write a file of the repository, replacing what it held.",
     {"path": "the file", "content": "the new text"}),
    ("run_tests", "Run the project's tests, or those matching a keyword, and return their output.",
     {"keyword": "a pytest -k expression", "timeout": "seconds before the run is stopped"}),
    ("run_command", "Run a shell command in the repository and return its output and exit status.",
     {"command": "the command line", "cwd": "the folder it runs in"}),
    ("git_diff", "Show what changed in the working tree against a revision.",
     {"revision": "a commit, branch or tag", "paths": "the files to show"}),
    ("open_issue", "Read an issue of the project's tracker with its comments.", {"number": "the issue"}),
    ("web_fetch", "Fetch a web page and return its text.", {"url": "the page", "max_chars": "the most text"}),
    ("ask_user", "Ask the user a question and wait for the answer.", {"question": "what to ask"}),
    ("remember", "Keep a note for later turns of this task.", {"key": "its name", "text": "the note"}),
]


def system_prompt(tokens: int) -> str:
    """An agent's system prompt of about `tokens` tokens: its rules, then its tools as JSON schemas."""
    tools = [{"type": "function", "function": {
        "name": name, "description": what,
        "parameters": {"type": "object", "properties": {k: {"type": "string", "description": v}
                                                        for k, v in params.items()},
                       "required": list(params)[:1]}}} for name, what, params in TOOLS]
    schema = json.dumps(tools, indent=1)
    rules = ["You are a coding agent working in a software repository on the user's behalf.",
             "Call one tool at a time, as a JSON object with name and arguments, and wait for its result.",
             "Answer in plain words once the task is done, saying what changed and how it was checked."]
    i = 0
    while (len(" ".join(rules)) + len(schema)) / 3.5 < tokens:  # about 3.5 characters a token here (SmolLM2's)
        i += 1
        rules.append(f"Rule {i}: before step {i} of a task, read what step {i - 1} changed, keep the tests "
                     f"green, and write down in note r{i} why the change at step {i} was needed.")
    return "\n".join(rules) + "\n\n# Tools\n\n" + schema


def question(client: int, turn: int) -> str:
    files = ["cli.py", "server.py", "cache.py", "store.py", "tests/test_cache.py", "README.md"]
    return (f"Task {client}, step {turn}: look at {files[(client + turn) % len(files)]} and tell me which "
            f"function to change next for ticket {100 + client * 7 + turn}.")


class Run:
    """One server's run: the clients' conversations, their turns' timings, the restart halfway."""

    def __init__(self, a: argparse.Namespace, target: str, cmd: list[str], url: str, env: dict[str, str]) -> None:
        self.a, self.target, self.cmd, self.url, self.env = a, target, cmd, url, env
        self.system = system_prompt(a.system_tokens)
        self.turns: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.half = threading.Barrier(a.clients + 1)
        self.resumed = threading.Event()
        self.errors: list[str] = []

    def client(self, i: int) -> None:
        import httpx

        history: list[dict[str, str]] = [{"role": "system", "content": self.system}]
        with httpx.Client(timeout=3600) as http:
            for t in range(self.a.turns):
                if t == self.a.turns // 2 and not self.a.no_restart:
                    self.half.wait()  # every client has had half its turns: the server restarts
                    self.resumed.wait()
                history.append({"role": "user", "content": question(i, t)})
                body = {"model": self.a.model_name, "messages": history, "max_tokens": self.a.tokens,
                        "temperature": 0, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}}
                t0 = time.perf_counter()
                first = None
                pieces: list[str] = []
                usage: dict[str, Any] = {}
                timings: dict[str, Any] = {}
                for attempt in range(3):  # as the openai client retries a kept-alive connection the server closed
                    try:              # (the one before the restart); the clock keeps running
                        with http.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
                            for line in r.iter_lines():
                                if not line.startswith("data: ") or line == "data: [DONE]":
                                    continue
                                doc = json.loads(line[6:])
                                usage = doc.get("usage") or usage
                                timings = doc.get("timings") or timings
                                choice = (doc.get("choices") or [{}])[0]
                                piece = (choice.get("delta") or {}).get("content")
                                if piece:
                                    first = first or time.perf_counter()
                                    pieces.append(piece)
                        break
                    except (httpx.RemoteProtocolError, httpx.ConnectError) as e:
                        if pieces or attempt == 2:
                            with self.lock:
                                self.errors.append(f"client {i} turn {t}: {e}")
                            return
                    except httpx.HTTPError as e:
                        with self.lock:
                            self.errors.append(f"client {i} turn {t}: {e}")
                        return
                t1 = time.perf_counter()
                with self.lock:
                    self.turns.append({"client": i, "turn": t, "t0": t0, "ttft": (first or t1) - t0, "t1": t1,
                                       "tokens": usage.get("completion_tokens", len(pieces)),
                                       "prompt": usage.get("prompt_tokens", 0),
                                       "cached": timings.get("cache_n", 0)})
                history.append({"role": "assistant", "content": "".join(pieces)})

    def go(self) -> dict[str, Any]:
        """Start the server, run the clients (restarting it halfway), stop it; the figures."""
        proc = start(self.cmd, self.url, self.env, self.target)
        threads = [threading.Thread(target=self.client, args=(i,)) for i in range(self.a.clients)]
        t0 = time.perf_counter()
        down = 0.0
        try:
            for th in threads:
                th.start()
            if not self.a.no_restart:
                self.half.wait()
                d0 = time.perf_counter()
                harness.stop(proc, grace=120)
                stopped = time.perf_counter() - d0
                proc = start(self.cmd, self.url, self.env, self.target)
                down = time.perf_counter() - d0
                print(f"  {self.target}: restarted ({stopped:.1f} s to stop, {down:.1f} s down)", file=sys.stderr)
                self.resumed.set()
            for th in threads:
                th.join()
        finally:
            self.resumed.set()
            harness.stop(proc, grace=120)
        wall = time.perf_counter() - t0
        return self.figures(wall, down)

    def figures(self, wall: float, down: float) -> dict[str, Any]:
        turns = self.turns
        made = sum(x["tokens"] for x in turns)
        half = self.a.turns // 2
        after = [x["ttft"] for x in turns if x["turn"] == half and not self.a.no_restart]
        first = [x["ttft"] for x in turns if x["turn"] == 0]
        rest = [x["ttft"] for x in turns if x["turn"] not in (0, half)]
        return {"target": self.target, "turns": len(turns), "errors": self.errors, "tokens": made,
                "wall_s": wall, "down_s": down, "tok_s": made / max(1e-9, wall - down),
                "ttft_p50": harness.percentile([x["ttft"] for x in turns], 0.5),
                "ttft_p99": harness.percentile([x["ttft"] for x in turns], 0.99),
                "ttft_first_p50": harness.median(first) if first else float("nan"),
                "ttft_after_restart_p50": harness.median(after) if after else float("nan"),
                "ttft_rest_p50": harness.median(rest) if rest else float("nan"),
                "cached_after_restart": sum(x["cached"] for x in turns if x["turn"] == half),
                "prompt_tokens_first": harness.median([x["prompt"] for x in turns if x["turn"] == 0] or [0]),
                "prompt_tokens_last": max([x["prompt"] for x in turns] or [0]), "each_turn": turns}


def start(cmd: list[str], url: str, env: dict[str, str], name: str) -> Any:
    """The server started and answering /health (stopped by the caller)."""
    import subprocess

    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not harness.answers(url + "/health"):
        if proc.poll() is not None:
            raise harness.ServerError(f"{name} exited ({proc.returncode}): {' '.join(cmd)}")
        if time.monotonic() > deadline:
            harness.stop(proc)
            raise harness.ServerError(f"{name} did not answer {url}/health")
        time.sleep(0.1)
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--system-tokens", type=int, default=4000)
    ap.add_argument("--tokens", type=int, default=32, help="tokens each answer is (ignore_eos)")
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--threads", type=int, default=2, help="threads for decoding and for prompts (-t and -tb, both)")
    ap.add_argument("--ctx", type=int, default=6144, help="each slot's window")
    ap.add_argument("--cache-ram", type=int, default=8192, help="MiB of host memory for prefixes (both)")
    ap.add_argument("--llama-server", default="/work/llama-tools/bin/llama-server")
    ap.add_argument("--only", choices=["localgen", "llama-server"])
    ap.add_argument("--no-restart", action="store_true", help="no restart halfway")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each server, alternating (medians reported)")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()

    from localgen.models.resolve import resolve

    path = resolve(a.model, offline=True).path  # the file llama-server reads; localgen serves the same file
    a.model_name = os.path.basename(path)
    targets = ["localgen", "llama-server"] if a.only is None else [a.only]
    runs = harness.alternate({t: lambda t=t: run(a, t, path) for t in targets}, a.rounds)
    results = [summary(target, runs[target]) for target in targets]
    print(f"{a.clients} clients x {a.turns} turns, a system prompt of {results[0]['prompt_tokens_first']:.0f} "
          f"tokens with {len(TOOLS)} tools, {a.tokens}-token answers, "
          f"{'no restart' if a.no_restart else 'a restart after turn ' + str(a.turns // 2)}, {a.threads} threads, "
          f"medians of {a.rounds} round(s)")
    head = ("", "tok/s", "TTFT p50", "TTFT p99", "first turn p50", "after restart p50", "other turns p50",
            "cached after restart", "down s", "errors")
    print("  ".join(f"{h:>18s}" for h in head))
    for r in results:
        cells = [r["target"], f"{r['tok_s']:.2f}", f"{r['ttft_p50']:.2f}", f"{r['ttft_p99']:.2f}",
                 f"{r['ttft_first_p50']:.2f}", f"{r['ttft_after_restart_p50']:.2f}", f"{r['ttft_rest_p50']:.2f}",
                 f"{r['cached_after_restart']:.0f}", f"{r['down_s']:.1f}", str(len(r["errors"]))]
        print("  ".join(f"{c:>18s}" for c in cells))
    if len(results) == 2:
        ours, theirs = runs["localgen"], runs["llama-server"]
        print("localgen / llama-server (the median of each round's ratio): throughput "
              f"{harness.paired_ratio([x['tok_s'] for x in ours], [x['tok_s'] for x in theirs]):.2f}x, TTFT p50 "
              f"{harness.paired_ratio([x['ttft_p50'] for x in ours], [x['ttft_p50'] for x in theirs]):.2f}x, "
              f"TTFT p99 {harness.paired_ratio([x['ttft_p99'] for x in ours], [x['ttft_p99'] for x in theirs]):.2f}x")
    for r in results:
        for e in r["errors"][:3]:
            print(f"  {r['target']}: {e}", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)


def run(a: argparse.Namespace, target: str, path: str) -> dict[str, Any]:
    """One run of one server, in a fresh home (so localgen's prompt cache on disk starts empty)."""
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as home:
        env = {**os.environ, "LOCALGEN_HOME": home}
        if target == "localgen":
            cmd = [sys.executable, "-m", "localgen", "serve", "-m", path, "--port", str(port), "-np",
                   str(a.clients), "-t", str(a.threads), "-tb", str(a.threads), "-c", str(a.ctx), "--cache-ram",
                   str(a.cache_ram),
                   "--quiet"]
        else:
            cmd = [harness.executable(a.llama_server), "-m", path, "--port", str(port), "-np", str(a.clients),
                   "-t", str(a.threads), "-tb", str(a.threads), "-c", str(a.ctx * a.clients), "-fa", "on", "--no-webui",
                   "--cache-ram", str(a.cache_ram)]
        print(f"{target}: {' '.join(cmd)}", file=sys.stderr)
        r = Run(a, target, cmd, url, env).go()
        print(f"  {target}: {r['tok_s']:.2f} tok/s, TTFT p50 {r['ttft_p50']:.2f} s, p99 {r['ttft_p99']:.2f} s",
              file=sys.stderr)
        return r


def summary(target: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A server's rounds as one row: each figure's median over the rounds; the errors of all."""
    keys = [k for k, v in rounds[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    row: dict[str, Any] = {k: harness.median(r[k] for r in rounds) for k in keys}
    row.update(target=target, errors=[e for r in rounds for e in r["errors"]])
    return row


if __name__ == "__main__":
    main()
