"""Packaging: a wheel built from the checkout works in a fresh venv (with the catalogue as package data), and
install.sh never lets pip build or upgrade llama-cpp-python without localgen's build flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from localgen.errors import LocalgenError
from tests.conftest import ROOT


def _git_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [f for f in out.stdout.splitlines() if (ROOT / f).exists() or (ROOT / f).is_symlink()]


def test_the_wheel_installs_and_runs_in_a_fresh_venv(tmp_path: Path, cli_env: dict[str, str]) -> None:
    src = tmp_path / "src"
    for name in _git_files():  # the checkout as a clean clone has it
        target = src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_symlink():
            target.symlink_to(os.readlink(ROOT / name))
        else:
            target.write_bytes((ROOT / name).read_bytes())
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(wheels), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    wheel = next(wheels.glob("localgen-*.whl"))
    import zipfile

    from localgen.serve import page

    shipped = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in page.FILES if f"localgen/serve/webui/{n}" not in shipped]
    assert not missing, f"the chat page's files are not package data: {missing}"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    fresh_site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                      "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies (llama-cpp-python as built here, the models) come from this venv; localgen from the wheel
    (fresh_site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "no such option: --python" in r.stderr:
        pytest.skip("pip too old for --python")
    assert r.returncode == 0, r.stderr
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    exe = venv / "bin" / "localgen"
    listing = subprocess.run([str(exe), "list", "--catalogue", "--json"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    names = {e["name"] for e in json.loads(listing.stdout)}
    assert {"smollm2:135m", "qwen2.5:7b", "gemma3:270m"} <= names
    run = subprocess.run([str(exe), "run", "-p", "hi", "--max-tokens", "4"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip(), run.stderr
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import localgen; print(localgen.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert str(fresh_site) in where, "localgen came from the wheel, not the checkout"


def test_a_missing_shipped_catalogue_is_an_internal_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from localgen.models import catalogue

    monkeypatch.setattr(catalogue, "SHIPPED", tmp_path / "missing.toml")
    with pytest.raises(LocalgenError, match="internal error: the model catalogue shipped with localgen is missing"):
        catalogue.load()


def test_gguf_is_only_a_test_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("gguf") for d in project["dependencies"])
    assert any(d.startswith("gguf") for d in project["optional-dependencies"]["dev"])
    for path in (ROOT / "localgen").rglob("*.py"):
        text = path.read_text()
        assert "import gguf" not in text and "from gguf" not in text, path


def _fake_venv(tmp_path: Path, installed: str | None) -> tuple[Path, Path]:
    """A venv whose python only logs how it was called (with CMAKE_ARGS) and answers version probes."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls.log"
    (venv / "bin" / "python").write_text(f"""#!/bin/sh
echo "CMAKE_ARGS=[$CMAKE_ARGS] $*" >> {log}
case "$*" in
  *"sys.version_info < (3, 11)"*) exit 0 ;;
  *"print(f\\"cp"*) echo cp311 ;;
  *"m.version("*) echo {installed or "0.3.36"} ;;
  *" wheel "*) for a in "$@"; do prev="$w"; w="$a"; [ "$prev" = "-w" ] && out="$a"; done
                  mkdir -p "$out" && touch "$out/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl" ;;
esac
exit 0
""")
    (venv / "bin" / "python").chmod(0o755)
    return venv, log


@pytest.mark.parametrize(("python", "said"), [("python3.99", "no python3.99 on PATH"),
                                             ("/no/such/python", "/no/such/python is not an executable file")])
def test_install_script_says_in_one_line_that_the_interpreter_asked_is_missing(tmp_path: Path, python: str,
                                                                             said: str) -> None:
    env = {**os.environ, "LOCALGEN_VENV": str(tmp_path / "venv"), "PYTHON": python}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh")], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and r.stderr == f"install.sh: {said} (need Python 3.11 or newer)\n", r.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("backend", ["", "--cuda"])
def test_install_script_passes_the_build_flags_to_every_pip_call(tmp_path: Path, backend: str) -> None:
    venv, log = _fake_venv(tmp_path, None)
    env = {**os.environ, "LOCALGEN_VENV": str(venv), "PYTHON": str(venv / "bin" / "python"),
           "LOCALGEN_WHEEL_CACHE": str(tmp_path / "wheels")}
    args = ["bash", str(ROOT / "scripts" / "install.sh"), *([backend] if backend else [])]
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    calls = [ln for ln in log.read_text().splitlines() if (" -m pip " in ln and " install " in ln) or " wheel " in ln]
    assert calls
    for call in calls:
        flags = call.split("]", 1)[0]
        assert "-DGGML_RPC=on" in flags, call
        if os.uname().machine == "x86_64" and sys.platform == "linux":
            assert "-mno-amx-int8" in flags, call
        if backend == "--cuda":
            assert "-DGGML_CUDA=on" in flags, call
    editable = next(c for c in calls if " -e " in c)
    assert " -c " in editable, "the editable install pins the built llama-cpp-python (no silent upgrade)"
    constraints = (venv / ".localgen-constraints.txt").read_text()
    assert constraints.strip() == "llama-cpp-python==0.3.36"
    built = [c for c in calls if " wheel " in c]
    assert len(built) == 1 and "--no-cache-dir" in built[0], "built once, never from pip's flag-blind cache"
    # a second install with the same flags reuses the built wheel; another backend would build its own
    log.write_text("")
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert " wheel " not in log.read_text()
