#!/usr/bin/env python3
"""Does one job starve another in `localgen serve`? The cases of issue #41, each against one or more source
trees side by side (say, the commit before the serving core and the one after):

1. a chat streams while an embeddings request of N texts runs and its client gives up after 2 s: the
   stream's longest gap between two pieces of text, and how long a new chat then takes to answer
   (2,000 short texts, near OpenAI's bound of 2,048 inputs a request; 60 texts of ~1,500 tokens);
2. SIGTERM while 6 image URLs are being fetched from a server that never finishes its body: how long the
   server takes to exit.

    scripts/bench_starve.py                               # this tree only
    scripts/bench_starve.py --tree before=/tmp/base --tree after=.

Each tree runs as `python -m localgen serve` with PYTHONPATH set to it (the same venv and llama.cpp build).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import harness
import httpx

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 180.0  # the longest a case waits for an answer; longer is reported as inf
sys.path.insert(0, str(ROOT / "scripts"))


@contextlib.contextmanager
def serve(tree: Path, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`localgen serve` from the source tree `tree`; yields the process and its URL, stopped with SIGINT (as
    Ctrl-C stops it) on the way out."""
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    with harness.server([sys.executable, "-m", "localgen", "serve", "--port", str(port), *args], url + "/health",
                        timeout=300, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree,
                        stop_signal=signal.SIGINT, name=f"serve from {tree}") as proc:
        yield proc, url


def _stream(url: str, gaps: list[float], stop: threading.Event, last_at: list[float]) -> None:
    """A chat that streams until `stop`; each gap between two pieces of text goes into `gaps`, the time of the
    latest piece into `last_at[0]`."""
    body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 4000, "stream": True, "ignore_eos": True}
    last = None
    with contextlib.suppress(httpx.HTTPError), \
            httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=WAIT_S) as r:
        for line in r.iter_lines():
            now = time.perf_counter()
            if line.startswith("data: {"):
                if last is not None:
                    gaps.append(now - last)
                last = last_at[0] = now
            if stop.is_set():
                return


def starve(tree: Path, texts: list[str]) -> dict[str, float]:
    """Case 1: the longest gap of a running stream while the embeddings request runs and is abandoned, and
    the time a new chat takes to answer after the abandon."""
    with serve(tree, "-np", "2") as (_, url):
        gaps: list[float] = []
        stop = threading.Event()
        last_at = [time.perf_counter()]
        t = threading.Thread(target=_stream, args=(url, gaps, stop, last_at), daemon=True)
        t.start()
        while len(gaps) < 5:
            time.sleep(0.05)
        before = max(gaps)
        mark = len(gaps)
        with contextlib.suppress(httpx.TimeoutException):  # the client gives up after 2 s
            httpx.post(f"{url}/v1/embeddings", json={"model": "smollm2:135m", "input": texts}, timeout=2)
        t0 = time.perf_counter()
        try:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=WAIT_S, json={
                "model": "smollm2:135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
            assert r.status_code == 200, r.text
            answered = time.perf_counter() - t0
        except httpx.TimeoutException:
            answered = float("inf")  # not within WAIT_S
        time.sleep(1)
        during = max([*gaps[mark:], time.perf_counter() - last_at[0]])  # a stream stalled now counts until now
        stop.set()
        return {"gap_before_s": before, "gap_during_s": during, "new_chat_s": answered}


class _Slow(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        from make_mmproj import png

        data = png(64, 64)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(data) * 100))
        self.end_headers()
        try:
            while True:  # a body that never ends
                self.wfile.write(data[:16])
                self.wfile.flush()
                time.sleep(0.5)
        except OSError:
            return

    def log_message(self, *a: Any) -> None:
        pass


def sigterm(tree: Path, proj: Path) -> dict[str, float]:
    """Case 2: SIGTERM with 6 slow image URLs in flight; seconds until the server exits."""
    pics = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=pics.serve_forever, daemon=True).start()
    helptext = subprocess.run([sys.executable, "-m", "localgen", "serve", "--help"], cwd=tree, text=True,
                              capture_output=True, env={**os.environ, "PYTHONPATH": str(tree)}).stdout
    private = ["--allow-private-urls"] if "--allow-private-urls" in helptext else []
    try:
        with serve(tree, "--mmproj", str(proj), "-np", "2", "--allow-image-urls", *private) as (proc, url):
            return _sigterm_exit(proc, url, f"http://127.0.0.1:{pics.server_address[1]}/slow.png")
    finally:
        pics.shutdown()


def _sigterm_exit(proc: subprocess.Popen[bytes], url: str, image: str) -> dict[str, float]:
    """Six chats waiting on the image at `image`, then SIGTERM: seconds until `proc` exits."""
    body = {"model": "smollm2:135m", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": image}}]}]}

    def ask() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)

    for _ in range(6):
        threading.Thread(target=ask, daemon=True).start()
    time.sleep(2)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
        took = time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        took = float("inf")
    return {"sigterm_exit_s": took}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", default=[], help="LABEL=PATH of a source tree (repeatable)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree] or [("this", ROOT)]
    from make_mmproj import write_mmproj

    proj = Path(write_mmproj(Path(os.environ.get("TMPDIR", "/tmp")) / "bench_starve_proj.gguf"))
    short = [f"note {i}: the weather is fine today" for i in range(2000)]
    long = [f"document {i}: " + "the river runs past the old mill and on to the sea. " * 125 for i in range(60)]
    rows: dict[str, dict[str, Any]] = {}
    for label, tree in trees:
        rows[label] = {"short": starve(tree, short), "long": starve(tree, long), **sigterm(tree, proj)}
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'case':<52}" + "".join(f"{label:>12}" for label in rows))
    lines = [("longest gap, stream alone (s)", lambda r: r["short"]["gap_before_s"]),
             ("longest gap, 2,000 short texts abandoned (s)", lambda r: r["short"]["gap_during_s"]),
             ("new chat answers after them (s)", lambda r: r["short"]["new_chat_s"]),
             ("longest gap, 60 texts of ~1,500 tokens abandoned (s)", lambda r: r["long"]["gap_during_s"]),
             ("new chat answers after them (s)", lambda r: r["long"]["new_chat_s"]),
             ("SIGTERM to exit, 6 slow image URLs in flight (s)", lambda r: r["sigterm_exit_s"])]
    for name, get in lines:
        print(f"{name:<52}" + "".join(f"{get(r):>12.2f}" for r in rows.values()))


if __name__ == "__main__":
    main()
