#!/usr/bin/env bash
# Build a complete CPU-only environment for sglang-pdd on a fresh Debian box:
# apt packages, a python3.11 venv with torch 2.13 (CPU), real sglang 0.5.23 (--no-deps),
# the pinned runtime set, triton (interpreter + sm_90a compile-only), and this package.
#
#   bash scripts/install-cpu.sh [VENV]        (default: .venv)
#
# Idempotent: re-running on a complete venv only re-checks it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$here/.venv}
py=${PYTHON:-python3.11}

SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
TRITON_VERSION=3.8.0

log() { printf '[install-cpu] %s\n' "$*" >&2; }

apt_pkgs=(libibverbs1 iproute2 iptables procps)
missing=()
for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "apt: ${missing[*]}"
  if [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

if [[ ! -x $venv/bin/python ]]; then
  log "venv: $venv ($($py --version))"
  $py -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)

log "torch $TORCH_VERSION (CPU build)"
"${pip[@]}" "torch==$TORCH_VERSION"
log "pinned runtime set"
"${pip[@]}" -r "$here/requirements/sglang-cpu.txt" -r "$here/requirements/dev.txt"
log "triton $TRITON_VERSION"
"${pip[@]}" "triton==$TRITON_VERSION"
log "sglang $SGLANG_VERSION, torchvision $TORCHVISION_VERSION (--no-deps: their metadata pulls CUDA wheels)"
"${pip[@]}" --no-deps "sglang==$SGLANG_VERSION" "torchvision==$TORCHVISION_VERSION"
log "sglang-pdd (editable, --no-deps)"
"${pip[@]}" --no-deps --no-build-isolation -e "$here"
log "CPU shim (.pth)"
"$venv/bin/python" -m sglang_pdd.compat install
"$venv/bin/python" -m sglang_pdd.compat check
log "done: $venv"
