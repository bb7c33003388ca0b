#!/usr/bin/env python3
"""Speculative decoding benchmark (issue: past one stream): the same greedy task with and without
prompt lookup (and, optionally, a draft model), fresh processes, medians. The task copies from its
prompt (an extraction), where lookup drafts are strong. Speed-ups are against "default", a plain run with the
settings a user gets (the tuning record, else the rule: flash attention on); "plain" pins what speculation pins
(flash attention and repacking off), and the speculative outputs must be identical to its text.

usage: scripts/bench_speculative.py [--model smollm2:135m] [--draft MODEL] [--reps 3] [-n 200]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from functools import partial

import harness

TEXT = "\n".join(
    f"Item {i}: the {c} box holds {i * 3} apples, {i + 2} pears and a note saying 'ship to warehouse {i % 5}'."
    for i, c in enumerate(["red", "blue", "green", "yellow", "black", "white", "purple", "orange"] * 2)
)
PROMPT = f"{TEXT}\n\nCopy the list above exactly, line by line."


# what speculation turns off unless asked (docs/run.md, Speculative decoding)
PINNED = ["--no-flash-attn", "--no-repack"]


def once(model: str, n: int, extra: list[str], raw: bool) -> dict[str, object]:
    args = [sys.executable, "-m", "localgen", "run", "-m", model, "-p", PROMPT, "-n", str(n), "--temperature", "0",
            "--json", "--no-prompt-cache", *(["--raw"] if raw else []), *extra]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--draft-max", default="2,4,6")
    ap.add_argument("--raw", action="store_true", help="plain completion (for base models such as gemma3:270m)")
    a = ap.parse_args()
    variants: dict[str, list[str]] = {"default": [], "plain": PINNED}
    for k in a.draft_max.split(","):
        variants[f"lookup{k}"] = ["--lookup", "--draft-max", k]
    if a.draft:
        variants["draft"] = ["--draft", a.draft]
    # interleaved, so drift hits every variant
    results = harness.alternate({k: partial(once, a.model, a.n, extra, a.raw) for k, extra in variants.items()},
                                a.reps, flip=False)
    base_text = results["plain"][0]["text"]
    base = harness.median(r["stats"]["decode_tps"] for r in results["default"])  # type: ignore[index]
    print(f"{a.model}, greedy, up to {a.n} tokens, median of {a.reps}; speed-up against the default settings; "
          f"plain pins {' '.join(PINNED)}, as speculation does")
    for k, rs in results.items():
        s = [r["stats"] for r in rs]
        rate = harness.median(x["decode_tps"] for x in s)  # type: ignore[index]
        total = harness.median(x["total_s"] for x in s)  # type: ignore[index]
        same = all(r["text"] == base_text for r in rs) if k != "default" else "(not compared)"
        acc = ""
        if s[0].get("drafted"):  # type: ignore[union-attr]
            d, ok = s[0]["drafted"], s[0]["accepted"]  # type: ignore[index]
            acc = f" · drafted {d}, accepted {ok} ({ok / d:.0%})"
        print(f"  {k:7} decode {rate:7.1f} tok/s · total {total:5.2f} s · "
              f"speed-up {harness.ratio(rate, base, '4.2f')} · same text: {same}{acc}")


if __name__ == "__main__":
    main()
