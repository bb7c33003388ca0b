#!/usr/bin/env python3
"""llama.cpp's own embeddings and rerank scores against localgen's, for the same texts, models and pooling.

Runs llama-embedding (built from the same vendored llama.cpp: ../shared/tools/build-llama-bench
--with llama-embedding) on each model, prints the cosine similarity of each of its vectors with
`localgen embed`'s, the same for the tiny BERT of tests/tiny_bert.py (its own CLS pooling) and the
rerank scores of its reranker variant against `localgen rerank`'s; with --write it saves llama-embedding's
numbers under tests/data/, which the tests compare against without building llama.cpp.

usage: scripts/embeddings_reference.py --llama-embedding PATH/llama-embedding [--write]
                                      [--models smollm2:135m,gemma3:270m]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["The cat sat on the mat.", "A feline rested on the rug.", "Quarterly revenue grew 8 percent.",
         "Llamas are members of the camel family, native to South America.", "def add(a, b):\n    return a + b"]
POOLING = "mean"


QUERY = "what is the capital of france?"
DOCS = ["paris is the capital of france.", "the cat sat on the mat.", "llamas are native to south america.",
        "france has a capital city on a river."]


def _run(cmd: list[str]) -> str:
    """llama-embedding's stdout. Its JSON is now and then cut short (its log thread writes to stdout as
    it exits, it seems): run again, up to 5 times, until the output holds whole JSON."""
    for _ in range(5):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        try:
            json.loads(out[out.index("{"):])
            return out
        except ValueError:
            continue
    raise SystemExit("llama-embedding gave no whole JSON in 5 runs")


def _json(binary_out: str) -> list[list[float]]:
    doc = json.loads(binary_out[binary_out.index("{"):])
    return [d["embedding"] for d in sorted(doc["data"], key=lambda d: d["index"])]


def reference(binary: str, model_path: str, texts: list[str], pooling: str | None = POOLING) -> list[list[float]]:
    """llama-embedding's normalised vectors, one per text (texts separated by a marker no text holds);
    pooling None: the model's own."""
    sep = "<#sep#>"
    cmd = [binary, "-m", model_path, "-p", sep.join(texts), "--embd-separator", sep, "--embd-normalize", "2",
           "--embd-output-format", "json", "-c", "2048", "-b", "2048", "-ub", "2048", "-t", "2", "--no-warmup"]
    cmd += ["--pooling", pooling] if pooling else []
    return _json(_run(cmd))


def reference_scores(binary: str, model_path: str, query: str, docs: list[str]) -> list[float]:
    """llama-embedding's rerank scores of (query, document) pairs (its first output of each)."""
    sep = "<#sep#>"
    cmd = [binary, "-m", model_path, "-p", sep.join(f"{query}\t{d}" for d in docs), "--embd-separator", sep,
           "--embd-normalize", "-1", "--embd-output-format", "json", "-c", "2048", "-b", "2048", "-ub", "2048",
           "-t", "2", "--no-warmup"]
    # only the first value of each is a score: llama-embedding prints n_embd values, the rest are not numbers
    for _ in range(5):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        scores = [float(x) for x in re.findall(r'"embedding":\s*\[\s*([-+0-9.eE]+)', out)]
        if len(scores) == len(docs):
            return scores
    raise SystemExit("llama-embedding gave no rerank scores in 5 runs")


def ours(model: str, texts: list[str], pooling: str | None = POOLING) -> list[list[float]]:
    args = ["--pooling", pooling] if pooling else []
    out = subprocess.run([sys.executable, "-m", "localgen", "embed", "-m", model, *args, *texts],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return [json.loads(line)["embedding"] for line in out.splitlines()]


def our_scores(model: str, query: str, docs: list[str]) -> list[float]:
    out = subprocess.run([sys.executable, "-m", "localgen", "rerank", "-m", model, query, *docs],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    by_id = {int(d["id"]): d["score"] for d in map(json.loads, out.splitlines())}
    return [by_id[i] for i in range(1, len(docs) + 1)]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _save(name: str, doc: dict[str, object]) -> None:
    """A fixture, with the CPU kernels it was made with (tests/test_embed.py holds another CPU's results to a
    looser bound: its kernels sum in another order)."""
    import llama_cpp

    target = ROOT / "tests" / "data" / name
    target.parent.mkdir(exist_ok=True)
    target.write_text(json.dumps({**doc, "cpu": llama_cpp.llama_print_system_info().decode().strip()}) + "\n")
    print(f"  wrote {target.relative_to(ROOT)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--llama-embedding", required=True, type=harness.executable)
    ap.add_argument("--models", default="smollm2:135m,gemma3:270m")
    ap.add_argument("--write", action="store_true", help="save the reference vectors under tests/data/")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from localgen.models.resolve import resolve

    worst = 1.0
    for model in a.models.split(","):
        path = resolve(model).path
        ref = reference(a.llama_embedding, str(path), TEXTS)
        sims = [cosine(x, y) for x, y in zip(ours(model, TEXTS), ref, strict=True)]
        worst = min(worst, *sims)
        print(f"{model}: cosine with llama-embedding ({POOLING} pooling, {len(TEXTS)} texts): "
              + " ".join(f"{s:.7f}" for s in sims))
        if a.write:
            _save(f"llama_embedding_{model.split(':')[0]}.json", {
                "model": model, "pooling": POOLING, "texts": TEXTS,
                "embeddings": [[round(x, 7) for x in v] for v in ref]})
    import tempfile

    from tests.tiny_bert import build

    with tempfile.TemporaryDirectory() as d:
        bert, reranker = build(Path(d) / "tiny-bert.gguf"), build(Path(d) / "tiny-bert-reranker.gguf", rank=True)
        plain = TEXTS[:4]  # llama-embedding prints nothing for the tiny BERT when a text holds a newline
        ref = reference(a.llama_embedding, str(bert), plain, pooling=None)
        sims = [cosine(x, y) for x, y in zip(ours(str(bert), plain, pooling=None), ref, strict=True)]
        worst = min(worst, *sims)
        print("tiny BERT (tests/tiny_bert.py, its own CLS pooling): " + " ".join(f"{s:.7f}" for s in sims))
        scores = reference_scores(a.llama_embedding, str(reranker), QUERY, DOCS)
        mine = our_scores(str(reranker), QUERY, DOCS)
        gap = max(abs(x - y) for x, y in zip(mine, scores, strict=True))
        print(f"tiny BERT reranker: scores {' '.join(f'{x:.6f}' for x in mine)}; llama-embedding's "
              f"{' '.join(f'{x:.6f}' for x in scores)}; largest gap {gap:.2e}")
        worst = min(worst, 1 - gap)
        if a.write:
            _save("llama_embedding_tiny_bert.json", {"texts": plain, "pooling": "cls",
                                                     "embeddings": [[round(x, 7) for x in v] for v in ref]})
            _save("llama_rerank_tiny_bert.json", {"query": QUERY, "documents": DOCS,
                                                  "scores": [round(x, 7) for x in scores]})
    print(f"worst cosine {worst:.7f} (target > {1 - 1e-4})")
    return 0 if worst > 1 - 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
