"""docs/quantize-choose.md's ladder is the one measured here: its table and closing line are what localgen prints
for the rows kept in tests/data/ladder_smollm2.json (the page's command, then `localgen bench history N -o json`),
and what the page says of them holds for those rows."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from localgen.cli import ladderview
from localgen.models.gguf_meta import read_summary
from localgen.quant.ladder import Row
from localgen.units import format_bytes
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
    ranked = sorted(kld, key=lambda t: kld[t])
    assert ranked[:2] == ["Q8_0", "Q6_K"] and "Q8_0 stays closest" in PAGE and "Q6_K close\nbehind" in PAGE
    q8 = BY_TYPE["Q8_0"]
    assert f"a mean KLD of {q8.kld:.4f}, the same top token {100 * q8.same_top:.0f} %" in PAGE  # type: ignore[operator]
    q5, q4 = BY_TYPE["Q5_K_M"], BY_TYPE["Q4_K_M"]
    assert q5.kld > q4.kld and q5.bits_per_weight > q4.bits_per_weight  # type: ignore[operator]
    assert f"Q5_K_M drifts further than Q4_K_M ({q5.kld:.3f} against {q4.kld:.3f}) with more bits" in PAGE
    assert all(r.fits == "CPU only" for r in ROWS) and "all fit this\nmachine's RAM" in PAGE
    assert "40 windows of 256 tokens" in PAGE and "(10,240\ntokens)" in PAGE and "--ctx 256 --chunks 40" in PAGE


def test_the_f16_the_page_starts_from_is_made_by_the_command_it_shows(cli_env: dict[str, str], tmp_path: Path) -> None:
    """The ladder starts from SmolLM2 as F16, which no download gives: the page shows the command that makes it
    (the checkout's tests.dequant from the embedded model, as this suite's F16 is made), before the ladder's
    command that reads it, and says its size."""
    block = PAGE[PAGE.index("```sh\n.venv/bin/python -m tests.dequant"):]
    block = block[:block.index("```\n", 6)]
    made, ladder = block.splitlines()[1:3]
    argv = shlex.split(made)
    assert argv[:3] == [".venv/bin/python", "-m", "tests.dequant"] and len(argv) == 5, made
    src, dst = argv[3:]
    assert shlex.split(ladder)[:3] == ["localgen", "quantize", dst] and f"\n{dst} " in PAGE  # the table's first row
    r = subprocess.run([sys.executable, "-m", "tests.dequant", src, str(tmp_path / dst)], cwd=ROOT, env=cli_env,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    summary = read_summary(str(tmp_path / dst))
    assert summary.quantization == "F16" and summary.architecture == "llama", summary
    assert f"({format_bytes(summary.file_size)}, " in PAGE
    r = subprocess.run([sys.executable, "-m", "tests.dequant", "nosuch:model", str(tmp_path / "x.gguf")], cwd=ROOT,
                       env=cli_env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1 and r.stderr == "tests.dequant: unknown model 'nosuch:model'\n", r.stderr
