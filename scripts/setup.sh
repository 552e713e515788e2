#!/usr/bin/env bash
# Installs the Debian packages lazyrt needs. Idempotent: does nothing (and touches no
# network) when every package is already installed.
set -euo pipefail

# ocl-icd-opencl-dev: Debian's oneDNN is built with its OpenCL runtime, and its CMake package
# config looks for OpenCL (only recommended by libdnnl-dev, which we install without
# recommends). binutils: its ld links generated kernels into shared objects at run time (g++
# depends on it too; named for that use).
PACKAGES=(
  cmake ninja-build g++ binutils make pkg-config
  libopenblas-dev libdnnl-dev ocl-icd-opencl-dev libgtest-dev libgmock-dev
  pybind11-dev python3-dev python3-numpy python3-pytest
  python3-torch python3-sklearn python3-matplotlib
  clang libtorch-dev libgloo-dev llvm-16-dev
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  # "deinstall ok config-files" and the like count as missing, hence the exact match.
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#PACKAGES[@]} required packages already present"
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
