"""A plain one-shot pays only for what it uses: a real `run -p` (SmolLM2, a few tokens) leaves none of tools,
remotes, media, serve or the heavy libraries behind those in sys.modules. A structural check of what is
imported, never a timing (scripts/bench_startup.py times it against a bare llama-cpp-python script)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

# Runs the CLI as `python -m localgen` does, then writes the names of the modules it imported.
PROBE = """
import atexit, json, sys
atexit.register(lambda: open(sys.argv[1], "w").write(json.dumps(sorted(sys.modules))))
from localgen.cli.main import main
main(sys.argv[2:])
"""

# What a plain run must not import: the features it does not use, and the libraries behind them.
NOT_LOADED = (
    "localgen.tools.loop", "localgen.tools.plan", "localgen.tools.formats", "localgen.tools.spec",
    "localgen.tools.functions", "localgen.tools.mcp", "localgen.cli.run.tools", "localgen.remote",
    "localgen.media", "localgen.media_headers", "localgen.audio_headers", "localgen.fetch", "localgen.serve",
    "localgen.chat",
    "localgen.bench", "localgen.embeddings", "localgen.engine.speculative", "localgen.native.mtmd",
    "localgen.engine.embed", "localgen.engine.batch", "localgen.engine.stepcosts", "localgen.engine.scheduler",
    "localgen.engine.beams",
    "localgen.cli.log.command", "localgen.cli.serve", "localgen.cli.chat", "localgen.cli.options.tools",
    "localgen.sqlitedb",
    "sqlite_utils", "httpx", "httpcore", "starlette", "uvicorn", "sse_starlette", "pydantic", "huggingface_hub",
    "rich", "prompt_toolkit", "mcp", "openai", "gguf", "pandas", "filelock", "llama_cpp.llama",
    "prometheus_client",
    "numpy",  # a greedy pick takes llama.cpp's own pass until numpy would pay for itself (native/sampler.py)
)


def loaded_by(cli_env: dict[str, str], tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    out = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", PROBE, str(out), *args], capture_output=True, text=True,
                          env=cli_env, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=600)
    return done, set(json.loads(out.read_text()))


def heavy(modules: set[str]) -> list[str]:
    """The NOT_LOADED modules (and their submodules) among `modules`."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_LOADED))


def test_plain_run_imports_only_what_it_uses(cli_env: dict[str, str], tmp_path: Path) -> None:
    args = ("run", "-m", "smollm2:135m", "-p", "Say hi.", "-n", "4", "--temperature", "0")
    first, _ = loaded_by(cli_env, tmp_path, *args)  # the session's first logged run makes the log (sqlite-utils)
    assert first.returncode == 0, first.stderr
    done, modules = loaded_by(cli_env, tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "no answer: the run did not happen"
    assert {"localgen.engine.llama", "localgen.log.store", "llama_cpp.llama_cpp"} <= modules  # it ran and logged
    assert heavy(modules) == []
    # of tools/, only the answer stream (a thinking model's reasoning is split from its answer there)
    assert sorted(m for m in modules if m.startswith("localgen.tools")) == ["localgen.tools", "localgen.tools.stream"]


def test_run_with_tools_flags_still_loads_them(cli_env: dict[str, str], tmp_path: Path) -> None:
    """The check above is not vacuous: the same probe sees the modules a feature brings in."""
    functions = tmp_path / "fns.py"
    functions.write_text("def add(a: int, b: int) -> int:\n    \"\"\"Add two numbers.\"\"\"\n    return a + b\n")
    done, modules = loaded_by(cli_env, tmp_path, "run", "-m", "smollm2:135m", "-p", "What is 2+3?", "-n", "4",
                              "--functions", str(functions), "--yes", "--no-log")
    assert done.returncode == 0, done.stderr
    assert {"localgen.tools.loop", "localgen.cli.run.tools", "localgen.cli.options.tools"} <= modules
