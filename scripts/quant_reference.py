"""What llama.cpp's own tools (llama-quantize, llama-perplexity, built from the same vendored sources) give on the
suite's inputs, kept in tests/data/llama_quant_reference.json for tests/test_quantize.py (CI has no such tools):

- the F16 the suite makes from SmolLM2's Q4_1 (tests/dequant.py), by its SHA-256;
- llama-quantize's output from it for each type of TYPES, by SHA-256 (localgen quantize must write the same bytes);
- llama-perplexity's PPL of SmolLM2 (Q4_1) on the test text, and its KL-divergence statistics of each type against
  the F16's --kl-divergence-base, at the test's context and windows.

    .venv/bin/python scripts/quant_reference.py [--tools /work/llama-tools/bin]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from localgen.models.download import sha256_file  # noqa: E402  (after the checkout is on the path)

OUT = ROOT / "tests" / "data" / "llama_quant_reference.json"
TYPES = ("Q8_0", "Q6_K", "Q4_K_M", "Q3_K_M")
# llama-quantize's options, each on Q4_K_M: what localgen quantize must write with the same ones
OPTIONS = {"pure": ["--pure"], "leave-output-tensor": ["--leave-output-tensor"],
           "tensor-types": ["--output-tensor-type", "q8_0", "--token-embedding-type", "q4_0"]}
KLD_TYPES = ("Q8_0", "Q4_K_M")
TEXT_CHARS = 12_000  # the test text: the shipped text's first characters
CTX, CHUNKS, THREADS = 128, 8, 1




def test_text() -> str:
    """The text the tests measure on (also written to a file for llama-perplexity)."""
    from localgen.quant.text import default_text

    return default_text()[:TEXT_CHARS]


def logits_summary(path: Path) -> dict[str, object]:
    """A logits file in brief: its size, the SHA-256 of its header and tokens, and the sum of its uint16 steps
    (llama.cpp's and localgen's may differ in the rounding of a few in millions; each row's scale and minimum,
    float32, in their last bits)."""
    import numpy as np

    data = path.read_bytes()
    head = 20 + 4 * CTX * CHUNKS
    n_vocab = int(np.frombuffer(data[12:16], dtype="<i4")[0])
    rows = np.frombuffer(data[head:], dtype="<u2").reshape(-1, 2 * ((n_vocab + 1) // 2) + 4)
    return {"size": len(data), "head_sha256": hashlib.sha256(data[:head]).hexdigest(),
            "u16_sum": int(rows[:, 4:].sum(dtype=np.int64))}


def _stats(out: str) -> dict[str, float]:
    """llama-perplexity's final statistics, by label."""
    found: dict[str, float] = {}
    for label, key in (("Mean PPL(Q)", "ppl"), ("Mean PPL(base)", "ppl_base"), ("Mean    KLD", "kld"),
                       ("Maximum KLD", "kld_max"), ("99.0%   KLD", "kld_p99"), ("RMS Δp", "rms_dp"),
                       ("Same top p", "same_top")):
        m = re.search(re.escape(label) + r"\s*:\s*(-?[0-9.]+)", out)
        if m:
            found[key] = float(m.group(1))
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tools", default="/work/llama-tools/bin")
    args = ap.parse_args()
    tools = Path(args.tools)
    from localgen.models import embedded
    from tests.dequant import dequantize_to_f16

    q41 = embedded.locate(embedded.EMBEDDED["smollm2:135m"])
    ref: dict[str, object] = {"text_chars": TEXT_CHARS, "ctx": CTX, "chunks": CHUNKS, "threads": THREADS}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        f16 = dequantize_to_f16(q41, tmp / "smollm2-f16.gguf")
        ref["f16_sha256"] = sha256_file(f16)
        text = tmp / "text.txt"
        text.write_text(test_text(), encoding="utf-8")
        common = ["-f", str(text), "-c", str(CTX), "--chunks", str(CHUNKS), "-t", str(THREADS)]
        run = subprocess.run([str(tools / "llama-perplexity"), "-m", str(q41), *common],
                             capture_output=True, text=True, check=True)
        out = run.stdout + run.stderr
        m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
        assert m, out[-2000:]
        ref["q4_1_ppl"], ref["q4_1_ppl_err"] = float(m.group(1)), float(m.group(2))
        base = tmp / "f16.logits"
        subprocess.run([str(tools / "llama-perplexity"), "-m", str(f16), *common, "--kl-divergence-base", str(base)],
                       capture_output=True, text=True, check=True)
        ref["f16_logits"] = logits_summary(base)
        ours = tmp / "localgen-f16.logits"  # localgen's --save-logits, read by llama-perplexity below
        subprocess.run([str(ROOT / ".venv" / "bin" / "localgen"), "perplexity", "-m", str(f16), *common,
                        "--save-logits", str(ours)], capture_output=True, text=True, check=True)
        quants: dict[str, object] = {}
        for t in TYPES:
            q = tmp / f"{t}.gguf"
            subprocess.run([str(tools / "llama-quantize"), str(f16), str(q), t, "2"], capture_output=True,
                           check=True)
            entry: dict[str, object] = {"sha256": sha256_file(q), "size": q.stat().st_size}
            if t in KLD_TYPES:
                run = subprocess.run([str(tools / "llama-perplexity"), "-m", str(q), *common, "--kl-divergence-base",
                                      str(base), "--kl-divergence"], capture_output=True, text=True, check=True)
                entry.update(_stats(run.stdout + run.stderr))
                run = subprocess.run([str(tools / "llama-perplexity"), "-m", str(q), *common, "--kl-divergence-base",
                                      str(ours), "--kl-divergence"], capture_output=True, text=True, check=True)
                entry["kld_on_localgen_logits"] = _stats(run.stdout + run.stderr)["kld"]
            quants[t] = entry
            q.unlink()
        ref["quantized"] = quants
        variants: dict[str, str] = {}
        for label, flags in OPTIONS.items():
            q = tmp / f"{label}.gguf"
            subprocess.run([str(tools / "llama-quantize"), *flags, str(f16), str(q), "Q4_K_M", "2"],
                           capture_output=True, check=True)
            variants[label] = sha256_file(q)
            q.unlink()
        ref["options_q4_k_m"] = variants
    OUT.write_text(json.dumps(ref, indent=2) + "\n")
    print(json.dumps(ref, indent=2))


if __name__ == "__main__":
    main()
