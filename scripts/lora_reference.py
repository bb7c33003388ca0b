#!/usr/bin/env python3
"""What a LoRA adapter makes SmolLM2 say, in llama.cpp's own llama-server (--lora) and in localgen
(`run --lora-scaled`), greedy, for the same prompts and scales.

The adapter is tests/tiny_lora.py's (seeded random weights on attn_q and attn_v: no LoRA for SmolLM2 ships on
PyPI). llama-server is built from the same vendored llama.cpp (../shared/tools/build-llama-bench --server);
each scale is set per request (its `lora` field), 0 being the base model. With --write it saves llama-server's
answers and the adapter's SHA-256 to tests/data/llama_server_lora.json, which tests/test_lora.py compares
localgen against without building llama.cpp.

usage: scripts/lora_reference.py --llama-server PATH/llama-server [--write]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "llama_server_lora.json"
PROMPTS = ("The capital of France is", "Once upon a time")
SCALES = (1.0, 0.5, 0.0)
N_PREDICT = 16


def theirs(server: str, model: str, adapter: Path) -> dict[str, dict[str, str]]:
    import harness
    import httpx

    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [server, "-m", model, "--lora", str(adapter), "--port", str(port), "-np", "1", "-c", "512", "--no-warmup"]
    out: dict[str, dict[str, str]] = {}
    with harness.server(cmd, url + "/health", timeout=300, name="llama-server"):
        for scale in SCALES:
            out[str(scale)] = {}
            for prompt in PROMPTS:
                body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "cache_prompt": False,
                        "lora": [{"id": 0, "scale": scale}]}
                r = httpx.post(f"{url}/completion", json=body, timeout=300)
                r.raise_for_status()
                out[str(scale)][prompt] = r.json()["content"]
    return out


def ours(adapter: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for scale in SCALES:
        out[str(scale)] = {}
        for prompt in PROMPTS:
            cmd = [sys.executable, "-m", "localgen", "run", "--raw", "-p", prompt, "-n", str(N_PREDICT), "--temp",
                   "0", "--no-log", "--lora-scaled", f"{adapter}:{scale}"]
            out[str(scale)][prompt] = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                                     env=dict(os.environ)).stdout.removesuffix("\n")
    return out


def main() -> int:
    import harness

    sys.path.insert(0, str(ROOT))
    from localgen.models.resolve import resolve
    from tests.tiny_lora import build

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True, type=harness.executable)
    ap.add_argument("--write", action="store_true", help=f"save llama-server's answers to {FIXTURE}")
    args = ap.parse_args()
    model = resolve("smollm2:135m", offline=True).path
    with tempfile.TemporaryDirectory() as d:
        adapter = build(Path(model), Path(d) / "tiny-lora.gguf")
        sha = hashlib.sha256(adapter.read_bytes()).hexdigest()
        want = theirs(args.llama_server, model, adapter)
        got = ours(adapter)
    all_same = harness.same_answers(want, got)  # by scale, then prompt
    if args.write:
        doc = {"model": "smollm2:135m", "adapter_sha256": sha, "n_predict": N_PREDICT, "answers": want}
        FIXTURE.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {FIXTURE}")
    return 0 if all_same else 1


if __name__ == "__main__":
    raise SystemExit(main())
