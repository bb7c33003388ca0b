"""localgen perplexity against llama-perplexity (built from the same vendored llama.cpp) on the same model, text,
context and threads: the figures (PPL, and with --kld TYPE the KL divergence of a quantization against the F16's
logits) and the time, each tool run in turn, --rounds times, the fastest of each kept (the machine is shared).
Speed is wall-clock of the whole process, load included; the CPU seconds each used (user + system) are
reported beside it, a figure a shared machine disturbs less. `--only ppl` runs the PPL row alone.

    .venv/bin/python scripts/bench_perplexity.py --f16 smollm2-f16.gguf --quant smollm2-q4_k_m.gguf \
        [--ctx 512] [--chunks 16] [--threads 2] [--rounds 3] [--tools /work/llama-tools/bin] [--only ppl]
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


CPU: dict[str, list[float]] = {}  # "what/tool" -> CPU seconds of each run


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def _timed(argv: list[str], key: str = "") -> tuple[float, str]:
    """Seconds the command took, and what it printed (stdout, then stderr); its CPU seconds go to CPU[key]."""
    t0, c0 = time.perf_counter(), _cpu()
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{argv[0]} failed:\n{r.stderr[-2000:]}")
    CPU.setdefault(key, []).append(_cpu() - c0)
    return time.perf_counter() - t0, r.stdout + "\n" + r.stderr


def _json(out: str) -> dict[str, object]:
    """localgen's --json document: the first line of what it printed."""
    return dict(json.loads(out.splitlines()[0]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--f16", required=True)
    ap.add_argument("--quant", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tools", default="/work/llama-tools/bin")
    ap.add_argument("--only", choices=["ppl"], help="run the PPL row alone")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from localgen.quant.text import default_text

    lp = str(Path(args.tools) / "llama-perplexity")
    lg = str(ROOT / ".venv" / "bin" / "localgen")
    with tempfile.TemporaryDirectory() as d:
        text = Path(d) / "text.txt"
        text.write_text(default_text(), encoding="utf-8")
        common = ["-f", str(text), "-c", str(args.ctx), "--chunks", str(args.chunks), "-t", str(args.threads)]
        base_ll, base_lg = Path(d) / "ll.logits", Path(d) / "lg.logits"
        rows: dict[str, dict[str, list[float]]] = {}

        def add(what: str, tool: str, seconds: float, value: float) -> None:
            rows.setdefault(what, {}).setdefault(f"{tool}_s", []).append(seconds)
            rows[what][f"{tool}_value"] = [value]

        for _ in range(args.rounds):
            s, out = _timed([lp, "-m", args.quant, *common], "ppl/llama")
            add("ppl", "llama", s, float(re.search(r"PPL = ([0-9.]+)", out).group(1)))  # type: ignore[union-attr]
            s, out = _timed([lg, "perplexity", "-m", args.quant, *common, "--json"], "ppl/localgen")
            add("ppl", "localgen", s, float(_json(out)["ppl"]))  # type: ignore[arg-type]
            if args.only:
                continue
            s, _ = _timed([lp, "-m", args.f16, *common, "--kl-divergence-base", str(base_ll)], "save/llama")
            add("save", "llama", s, 0.0)
            s, _ = _timed([lg, "perplexity", "-m", args.f16, *common, "--save-logits", str(base_lg)], "save/localgen")
            add("save", "localgen", s, 0.0)
            s, out = _timed([lp, "-m", args.quant, *common, "--kl-divergence-base", str(base_ll),
                             "--kl-divergence"], "kld/llama")
            add("kld", "llama", s, float(re.search(r"Mean\s+KLD:\s+([0-9.]+)", out).group(1)))  # type: ignore[union-attr]
            s, out = _timed([lg, "perplexity", "-m", args.quant, "-c", str(args.ctx), "-t", str(args.threads),
                             "--reference", str(base_lg), "--json"], "kld/localgen")
            add("kld", "localgen", s, _json(out)["divergence"]["kld"])  # type: ignore[index]
            base_ll.unlink(missing_ok=True)
            base_lg.unlink(missing_ok=True)
    report = {"ctx": args.ctx, "chunks": args.chunks, "threads": args.threads, "rounds": args.rounds}
    for what, r in rows.items():
        best_ll, best_lg = min(r["llama_s"]), min(r["localgen_s"])
        report[what] = {"llama_s": round(best_ll, 2), "localgen_s": round(best_lg, 2),
                        "speed_vs_llama": round(best_ll / best_lg, 3),
                        "llama_cpu_s": round(min(CPU.get(f"{what}/llama", [0.0])), 2),
                        "localgen_cpu_s": round(min(CPU.get(f"{what}/localgen", [0.0])), 2),
                        "llama": r["llama_value"][0], "localgen": r["localgen_value"][0]}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
