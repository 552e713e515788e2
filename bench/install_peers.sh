#!/usr/bin/env bash
# Installs the peers of bench/peers.py for `make bench`: bench/requirements.txt into the project's
# environment ($1, .venv) and bench/requirements-jax.txt into an environment of its own ($2,
# .venv-jax: jax 0.10 needs numpy>=2, the project numpy 1.26.4). Idempotent and cheap: an
# environment whose stamp equals its requirements file is left alone (no network). A failed
# install is not an error of `make bench`: the reason goes to <environment>/.bench-peers-failed,
# bench/peers.py reports it in the peer's row, and the other benchmarks run.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VENV=${1:?usage: install_peers.sh VENV JAX_VENV}
JAX_VENV=${2:?usage: install_peers.sh VENV JAX_VENV}

install() {  # install NAME ENVIRONMENT REQUIREMENTS
  local name=$1 env=$2 req=$3 stamp=$2/.bench-requirements failed=$2/.bench-peers-failed
  if [[ -x $env/bin/python && -f $stamp ]] && cmp -s "$req" "$stamp"; then
    echo "install_peers: $name in $env up to date"
    return
  fi
  local start=$SECONDS log
  log=$(mktemp)
  if { [[ -x $env/bin/python ]] || /usr/bin/python3 -m venv "$env"; } >"$log" 2>&1 &&
     "$env/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >>"$log" 2>&1; then
    cp "$req" "$stamp"
    rm -f "$failed"
    echo "install_peers: $name installed in $env in $((SECONDS - start)) s"
  else
    mkdir -p "$env"
    { echo "pip install -r $(basename "$req") failed:"; grep -v '^\s*$' "$log" | tail -n 3; } >"$failed"
    rm -f "$stamp"
    echo "install_peers: $name could not be installed in $env (bench/peers.py reports why):" >&2
    cat "$failed" >&2
  fi
  rm -f "$log"
}

install "PyTorch/XLA" "$VENV" "$HERE/requirements.txt"
install "JAX" "$JAX_VENV" "$HERE/requirements-jax.txt"
exit 0
