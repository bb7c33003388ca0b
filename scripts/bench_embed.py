#!/usr/bin/env python3
"""Embedding throughput: N short texts, the same model, pooling (mean), threads and window everywhere,
alternating runs, medians.

Both sides run with the same settings, the ones localgen's embeddings context uses (engine/embed.py): a
window of --ctx cells (2048) shared by every sequence (llama.cpp's unified KV cache), logical and physical
batch equal to the window, and up to 64 texts per llama_decode (embed.MAX_SEQS): llama-server gets `-c CTX
-b CTX -ub CTX -np 64 --kv-unified`, localgen `--ctx CTX` (and serve `-b CTX -ub CTX`). llama-embedding
refuses --kv-unified, and aborts with `-np 64` (it packs up to 256 texts a decode whatever -np says, more
than 64 sequences hold); left at its default -np it makes the cache unified itself, so it gets `-c CTX -b CTX
-ub CTX`: the same shared window, filled with as many texts as CTX tokens hold (about 180 of these).
localgen serve's embeddings do not use its generation slots, so it runs with one (`-np 1`), which changes
nothing for them and keeps 63 idle windows out of its memory.

- `localgen embed --file` against llama.cpp's llama-embedding (built from the same vendored llama.cpp):
  wall time of each command, the load included, as a user pays it;
- with --llama-server: one client sending batches of 64 to `/v1/embeddings` of llama-server
  (`--embeddings`) and of `localgen serve`, both already running: the time to embed all N.

usage: scripts/bench_embed.py [--llama-embedding PATH] [--llama-server PATH] [--model smollm2:135m]
                              [--texts 1000] [--reps 3] [--threads 2] [--ctx 2048]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["river", "mountain", "city", "forest", "history", "science", "music", "garden", "ocean", "planet",
         "engine", "market", "language", "window", "bridge", "winter", "summer", "paper", "light", "stone"]


def texts(n: int) -> list[str]:
    rng = random.Random(7)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) + "." for _ in range(n)]


def llama_settings(ctx: int, seqs: int | None) -> list[str]:
    """llama.cpp's flags for localgen's embeddings context: one window, shared, batches as wide as it; `seqs`
    texts a decode (llama-server), or None for llama-embedding, which shares the window by itself at its
    default -np and refuses --kv-unified."""
    window = ["-c", str(ctx), "-b", str(ctx), "-ub", str(ctx)]
    return window if seqs is None else [*window, "-np", str(seqs), "--kv-unified"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--llama-embedding", type=harness.executable,
                    help="compare `localgen embed --file` with this llama-embedding")
    ap.add_argument("--llama-server", type=harness.executable,
                    help="also compare /v1/embeddings of llama-server and localgen serve")
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048, help="the window (and batch) of both sides")
    a = ap.parse_args()
    if a.reps < 3:
        ap.error("--reps must be at least 3 (medians of 3 or more)")
    if not a.llama_embedding and not a.llama_server:
        ap.error("give --llama-embedding, --llama-server or both")
    sys.path.insert(0, str(ROOT))
    from localgen.engine.embed import MAX_SEQS
    from localgen.models.resolve import resolve

    a.seqs = MAX_SEQS
    path = str(resolve(a.model).path)
    items = texts(a.texts)
    if a.llama_embedding:
        commands(a, path, items)
    if a.llama_server:
        servers(a, path, items)
    return 0


def commands(a: argparse.Namespace, path: str, items: list[str]) -> None:
    """`localgen embed --file` against llama-embedding, each a whole command, load included."""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "texts.txt"
        f.write_text("\n".join(items) + "\n")
        sep = "<#sep#>"
        ours = [sys.executable, "-m", "localgen", "embed", "-m", a.model, "--file", str(f), "--pooling", "mean",
                "--threads", str(a.threads), "--ctx", str(a.ctx)]
        theirs = [a.llama_embedding, "-m", path, "-p", sep.join(items), "--embd-separator", sep, "--pooling", "mean",
                  *llama_settings(a.ctx, None), "-t", str(a.threads), "--embd-output-format", "json",
                  "--no-warmup"]
        harness.run_timed(ours, cwd=ROOT)  # warm the page cache for both
        harness.run_timed(theirs, cwd=ROOT)
        t = harness.alternate({"ours": partial(harness.run_timed, ours, cwd=ROOT),
                               "theirs": partial(harness.run_timed, theirs, cwd=ROOT)}, a.reps)
    mo, mt = harness.median(t["ours"]), harness.median(t["theirs"])
    print(f"{a.model}: {a.texts} texts of 6-14 words, mean pooling, --threads {a.threads}, window {a.ctx} "
          f"(batch {a.ctx}, unified KV) on both sides, up to {a.seqs} texts per decode for localgen and as many as "
          f"the window holds for llama-embedding, medians of {a.reps}")
    print(f"  localgen embed --file   {mo:6.2f} s  {a.texts / mo:7.1f} texts/s")
    print(f"  llama-embedding         {mt:6.2f} s  {a.texts / mt:7.1f} texts/s")
    print(f"  ratio (llama-embedding time / ours) {harness.ratio(mt, mo)}")


def _client(url: str, model: str, items: list[str]) -> float:
    """Seconds to embed `items`, 64 a request, one after another."""
    import httpx

    def embed_all() -> None:
        with httpx.Client(timeout=600) as c:
            for k in range(0, len(items), 64):
                r = c.post(f"{url}/v1/embeddings", json={"model": model, "input": items[k:k + 64]})
                r.raise_for_status()
                assert len(r.json()["data"]) == len(items[k:k + 64])

    return harness.timed(embed_all)[0]


def servers(a: argparse.Namespace, path: str, items: list[str]) -> None:
    """One client, batches of 64, against each running server."""
    pl, pn = harness.free_port(), harness.free_port()
    urls = {"llama": f"http://127.0.0.1:{pl}", "ours": f"http://127.0.0.1:{pn}"}
    cmds = {"llama": [a.llama_server, "-m", path, "--embeddings", "--pooling", "mean",
                      *llama_settings(a.ctx, a.seqs), "-t", str(a.threads), "--port", str(pl)],
            "ours": [sys.executable, "-m", "localgen", "serve", "-m", a.model, "--port", str(pn), "--threads",
                     str(a.threads), "--ctx", str(a.ctx), "-b", str(a.ctx), "-ub", str(a.ctx), "-np", "1"]}
    with ExitStack() as running:
        for key, cmd in cmds.items():
            running.enter_context(harness.server(cmd, urls[key] + "/health", cwd=ROOT))
        for url in urls.values():  # warm both
            _client(url, a.model, items[:64])
        t = harness.alternate({key: partial(_client, url, a.model, items) for key, url in urls.items()}, a.reps)
    ml, mn = harness.median(t["llama"]), harness.median(t["ours"])
    print("  one client, batches of 64, /v1/embeddings of a running server:")
    print(f"  localgen serve          {mn:6.2f} s  {len(items) / mn:7.1f} texts/s")
    print(f"  llama-server            {ml:6.2f} s  {len(items) / ml:7.1f} texts/s")
    print(f"  ratio (llama-server time / localgen serve) {harness.ratio(ml, mn)}")


if __name__ == "__main__":
    sys.exit(main())
