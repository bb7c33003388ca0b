"""docs/configuration.md's folders are the ones the code uses: presets, the Responses store and the warm-reload
folder where the page says (under one LOCALGEN_HOME, in process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_presets_the_responses_store_and_the_prompt_cache_live_where_the_page_says(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen import paths
    from localgen.cli.serve import command as serve
    from localgen.models import presets
    from localgen.serve import responsestore
    from localgen.serve.servelog import STDERR_LOG

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    found = {
        "<data dir>/presets/NAME.json": presets.presets_dir() / "NAME.json",
        "<data dir>/responses/responses.db": responsestore.default_path(),
        "<cache dir>/serve-prefixes/": serve._prefix_store(1 << 30, 1 << 30, STDERR_LOG).root,
    }
    dirs = {"<data dir>": paths.data_dir(), "<cache dir>": paths.cache_dir()}
    for said, path in found.items():
        assert f"`{said}`" in page, said
        where, rest = said.split("/", 1)
        assert path == dirs[where] / rest.rstrip("/"), (said, path)

