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



@pytest.mark.parametrize("given", [
    ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"), ("HF_HOME", "XDG_CACHE_HOME"), ("XDG_CACHE_HOME",), (),
])
def test_the_model_cache_is_the_one_huggingface_hub_uses(tmp_path: Path, given: tuple[str, ...]) -> None:
    """"HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub" (and XDG_CACHE_HOME, as huggingface_hub
    reads it): localgen's cache folder is huggingface_hub's own for each combination, so pulls are shared."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")}
    env.update({k: str(tmp_path / k.lower()) for k in given}, HOME=str(tmp_path / "home"))
    probe = ("from huggingface_hub import constants; from localgen.models.hfcache import hub_cache; "
             "print(constants.HF_HUB_CACHE); print(hub_cache())")
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    theirs, ours = r.stdout.split()
    assert ours == theirs, r.stderr
    first = given[0] if given else "HOME"
    assert Path(ours).is_relative_to(tmp_path / first.lower()), ours


def test_every_folder_and_file_the_code_keeps_is_in_the_directories_table() -> None:
    """Each `paths.X_dir() / "NAME"` in localgen is named, as `NAME` or `NAME/`, in that dir's row of the page's
    Directories table (and `endpoints.toml`, `models.toml` in the config dir's): a new file is documented."""
    import re

    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = {m[1]: m[2] for m in re.finditer(r"^\| (config|data|state|cache) dir \| [^|]+ \| (.+) \|$", page, re.M)}
    assert set(rows) == {"config", "data", "state", "cache"}, rows
    found: set[tuple[str, str]] = set()
    for py in (ROOT / "localgen").rglob("*.py"):
        text = py.read_text(encoding="utf-8")
        found |= set(re.findall(r"\b(?:paths\.)?(config|data|state|cache)_dir\(\) / \"([^\"]+)\"", text))
    assert ("data", "chats") in found and ("config", "endpoints.toml") in found, found
    missing = [(d, name) for d, name in sorted(found)
               if f"`{name}`" not in rows[d] and f"`{name}/`" not in rows[d] and f"`{name}/" not in rows[d]]
    assert not missing, missing


def test_every_variable_the_page_names_is_exercised_by_a_test() -> None:
    """"Every environment variable above is exercised by the tests": each variable in the page's "By location and
    variable" table is named by a test of its feature (not only by the tests that parse or run the docs)."""
    import re

    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    table = page.split("## By location and variable", 1)[1].split("\n\n", 2)[1]
    named = {v for cell in re.findall(r"^\| ([^|]+) \|", table, re.M) for v in re.findall(r"`([A-Z][A-Z0-9_]+)", cell)}
    assert {"LOCALGEN_HOME", "LOCALGEN_PROMPT_CACHE_MB", "LLAMA_ARG_KV_UNIFIED", "NO_COLOR"} <= named, named
    docs_tests = {"test_doc_examples.py", "test_doc_examples_run.py", "test_docs_shape.py", "test_configuration_doc.py"}
    used: set[str] = set()
    for p in (ROOT / "tests").glob("test_*.py"):
        if p.name not in docs_tests:
            used |= _env_names(p.read_text(encoding="utf-8"))
    assert not [v for v in sorted(named) if v not in used], "a variable no test sets"


def _env_names(source: str) -> set[str]:
    """The variables a test's code names as a string where an environment is made: a whole string (a dict's
    key, setenv's name) or a command line's `NAME=value`; never a comment's or a docstring's mention."""
    import ast
    import re

    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            whole = re.fullmatch(r"[A-Z][A-Z0-9_]+", node.value)
            names |= {whole[0]} if whole else set(re.findall(r"(?:^|[\s;&(])([A-Z][A-Z0-9_]+)=", node.value))
    return names
