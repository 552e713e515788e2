#!/usr/bin/env bash
# Installs the Debian packages lazyrt needs, then makes the project's Python environment
# (.venv, or $LAZYRT_VENV) from Debian's python3 with the pinned requirements.txt (PyTorch from
# PyPI among them). Idempotent: does nothing (and touches no network) when every package is
# installed and the environment was made from the same requirements.txt.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${LAZYRT_VENV:-$ROOT/.venv}

# ocl-icd-opencl-dev: Debian's oneDNN is built with its OpenCL runtime, and its CMake package
# config looks for OpenCL (only recommended by libdnnl-dev, which we install without
# recommends). binutils: its ld links generated kernels into shared objects at run time (g++
# depends on it too; named for that use).
PACKAGES=(
  cmake ninja-build g++ binutils make pkg-config
  libopenblas-dev libdnnl-dev ocl-icd-opencl-dev libgtest-dev libgmock-dev
  python3-dev python3-venv
  clang libgloo-dev llvm-16-dev
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  # "deinstall ok config-files" and the like count as missing, hence the exact match.
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

python_env() {
  local stamp=$VENV/.requirements
  if [[ -x $VENV/bin/python && -f $stamp ]] && cmp -s "$ROOT/requirements.txt" "$stamp"; then
    echo "setup: Python environment $VENV up to date"
    return
  fi
  local start=$SECONDS
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements.txt"
  cp "$ROOT/requirements.txt" "$stamp"
  echo "setup: Python environment $VENV made in $((SECONDS - start)) s"
}

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#PACKAGES[@]} required packages already present"
  python_env
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup: missing packages (${missing[*]}) and apt-get is not available; install them by hand" >&2
  exit 1
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "setup: missing packages (${missing[*]}); run as root or install sudo" >&2
    exit 1
  fi
fi

"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: installed ${missing[*]}"
python_env
