"""docs/quantize-choose.md's ladder is the one measured here: its table and closing line are what localgen prints
for the rows kept in tests/data/ladder_smollm2.json (the page's command, then `localgen bench history N -o json`),
and what the page says of them holds for those rows."""

from __future__ import annotations

import json

from localgen.cli import ladderview
from localgen.quant.ladder import Row
from tests.conftest import ROOT

PAGE = (ROOT / "docs" / "quantize-choose.md").read_text(encoding="utf-8")
RUN = json.loads((ROOT / "tests" / "data" / "ladder_smollm2.json").read_text())
ROWS = [Row(**r) for r in RUN["rows"]]
BY_TYPE = {r.type_name: r for r in ROWS}


def test_the_pages_table_and_verdict_are_the_measured_rows() -> None:
    assert ladderview.table(ROWS) in PAGE
    assert ladderview.verdict(ROWS, ladderview.ladder.best(ROWS, RUN["kld_bound"]), RUN["kld_bound"]) in PAGE
    assert [r.type_name for r in ROWS] == ["F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M"]


def test_the_pages_command_made_them() -> None:
    assert RUN["command"].removeprefix("localgen ") in PAGE


def test_what_the_page_says_of_the_rows() -> None:
    kld = {t: r.kld for t, r in BY_TYPE.items() if r.kld is not None}
    # "bits alone do not order quality": some type with more bits per weight drifts further than one with fewer
    by_bits = sorted(kld, key=lambda t: -BY_TYPE[t].bits_per_weight)
    assert any(kld[a] > kld[b] for i, a in enumerate(by_bits) for b in by_bits[i + 1:])
    assert "Q5_K_M drifts further than Q4_K_M" in PAGE and kld["Q5_K_M"] > kld["Q4_K_M"]
    assert BY_TYPE["Q5_K_M"].bits_per_weight < BY_TYPE["Q4_K_M"].bits_per_weight or "fewer bits" not in PAGE
    assert min(kld, key=lambda t: kld[t]) == "Q8_0" and "Q8_0 stays closest" in PAGE
    assert all(r.fits == "CPU only" for r in ROWS) and "all fit this machine's RAM" in PAGE
