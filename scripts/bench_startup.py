#!/usr/bin/env python3
"""One-shot start: wall time of `localgen run -p` against a bare llama-cpp-python script doing the same work
(import, load with n_ctx=4096, one chat completion, print), alternating runs, medians; also
`localgen --help` and the GGUF header summary of a Llama-3-sized vocabulary (128k tokens, 280k merges),
read cold and from the summary cache. (issue: fast where a user feels it; target run ≤ 1.05× bare.)

usage: scripts/bench_startup.py [--model smollm2:135m] [--runs 7] [--tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "Name three primary colors."
BARE = """
import sys
import llama_cpp
llm = llama_cpp.Llama(sys.argv[1], n_ctx=4096, n_threads=int(sys.argv[3]), verbose=False)
out = llm.create_chat_completion(messages=[{"role": "user", "content": sys.argv[4]}], temperature=0,
                                 max_tokens=int(sys.argv[2]))
print(out["choices"][0]["message"]["content"])
"""


def wall(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - t0


def llama3_header(path: Path) -> None:
    """A GGUF with a Llama-3-sized tokenizer and one tiny tensor (for the header-summary timing)."""
    import numpy as np
    from gguf import GGUFWriter  # dev dependency

    w = GGUFWriter(str(path), "llama")
    w.add_context_length(8192)
    w.add_block_count(32)
    w.add_embedding_length(4096)
    w.add_head_count(32)
    w.add_head_count_kv(8)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}".encode() for i in range(128_256)])
    w.add_token_merges([f"m{i} x{i}" for i in range(280_147)])
    w.add_token_types([1] * 128_256)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from localgen.models.resolve import resolve

    path = resolve(a.model).path
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALGEN_HOME": home}
        ours = [sys.executable, "-m", "localgen", "run", "-m", a.model, "-p", PROMPT, "--temperature", "0",
                "--max-tokens", str(a.tokens), "--threads", str(a.threads)]
        bare = [sys.executable, "-c", BARE, path, str(a.tokens), str(a.threads), PROMPT]
        wall(ours, env)  # warm the page cache and localgen's summary cache, as every later run finds them
        wall(bare, env)
        t_ours, t_bare = [], []
        for _ in range(a.runs):
            t_bare.append(wall(bare, env))
            t_ours.append(wall(ours, env))
        helps = [wall([sys.executable, "-m", "localgen", "--help"], env) for _ in range(a.runs)]
        ratios = [o / b for o, b in zip(t_ours, t_bare, strict=True)]
        print(f"{a.model}: {a.tokens} tokens, --threads {a.threads}, medians of {a.runs} alternating runs")
        print(f"  bare llama-cpp-python  {statistics.median(t_bare):.3f} s")
        print(f"  localgen run           {statistics.median(t_ours):.3f} s  "
              f"({statistics.median(t_ours) / statistics.median(t_bare):.2f}x; median paired ratio "
              f"{statistics.median(ratios):.2f}x)")
        print(f"  localgen --help        {statistics.median(helps):.3f} s")
        try:
            big = Path(home) / "llama3-header.gguf"
            llama3_header(big)
        except ImportError:
            return
        from localgen.models import gguf_meta

        cold = []
        for _ in range(3):
            t0 = time.perf_counter()
            gguf_meta.read_summary(str(big), use_cache=False)
            cold.append(time.perf_counter() - t0)
        os.environ["LOCALGEN_HOME"] = home
        gguf_meta.read_summary(str(big))
        t0 = time.perf_counter()
        gguf_meta.read_summary(str(big))
        cached = time.perf_counter() - t0
        print(f"  Llama-3-sized header   {statistics.median(cold) * 1000:.0f} ms read, {cached * 1000:.1f} ms cached")


if __name__ == "__main__":
    main()
