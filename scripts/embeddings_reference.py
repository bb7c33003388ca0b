#!/usr/bin/env python3
"""llama.cpp's own embeddings against localgen's, for the same texts, models and pooling.

Runs llama-embedding (built from the same vendored llama.cpp: ../shared/tools/build-llama-bench
--with llama-embedding) on each model, prints the cosine similarity of each of its vectors with
`localgen embed`'s, and with --write saves llama-embedding's vectors as tests/data/llama_embedding_<model>.json,
which the tests compare against without building llama.cpp.

usage: scripts/embeddings_reference.py --llama-embedding PATH/llama-embedding [--write]
                                      [--models smollm2:135m,gemma3:270m]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["The cat sat on the mat.", "A feline rested on the rug.", "Quarterly revenue grew 8 percent.",
         "Llamas are members of the camel family, native to South America.", "def add(a, b):\n    return a + b"]
POOLING = "mean"


def reference(binary: str, model_path: str, texts: list[str]) -> list[list[float]]:
    """llama-embedding's normalised vectors, one per text (texts separated by a marker no text holds)."""
    sep = "<#sep#>"
    cmd = [binary, "-m", model_path, "-p", sep.join(texts), "--embd-separator", sep, "--pooling", POOLING,
           "--embd-normalize", "2", "--embd-output-format", "json", "-c", "2048", "-b", "2048", "-ub", "2048",
           "-t", "2", "--no-warmup"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    doc = json.loads(out[out.index("{"):])
    return [d["embedding"] for d in sorted(doc["data"], key=lambda d: d["index"])]


def ours(model: str, texts: list[str]) -> list[list[float]]:
    out = subprocess.run([sys.executable, "-m", "localgen", "embed", "-m", model, "--pooling", POOLING, *texts],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return [json.loads(line)["embedding"] for line in out.splitlines()]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--llama-embedding", required=True)
    ap.add_argument("--models", default="smollm2:135m,gemma3:270m")
    ap.add_argument("--write", action="store_true", help="save the reference vectors under tests/data/")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from localgen.models.resolve import resolve

    worst = 1.0
    for model in a.models.split(","):
        path = resolve(model).path
        ref = reference(a.llama_embedding, str(path), TEXTS)
        mine = ours(model, TEXTS)
        sims = [cosine(x, y) for x, y in zip(mine, ref, strict=True)]
        worst = min(worst, *sims)
        print(f"{model}: cosine with llama-embedding ({POOLING} pooling, {len(TEXTS)} texts): "
              + " ".join(f"{s:.7f}" for s in sims))
        if a.write:
            target = ROOT / "tests" / "data" / f"llama_embedding_{model.split(':')[0]}.json"
            target.parent.mkdir(exist_ok=True)
            target.write_text(json.dumps({"model": model, "pooling": POOLING, "texts": TEXTS,
                                          "embeddings": [[round(x, 7) for x in v] for v in ref]}) + "\n")
            print(f"  wrote {target.relative_to(ROOT)}")
    print(f"worst cosine {worst:.7f} (target > {1 - 1e-4})")
    return 0 if worst > 1 - 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
