#!/usr/bin/env bash
# Build a complete CPU-only environment for sglang-pdd on a fresh Debian box:
# apt packages, a python3.11 venv with torch 2.13 (CPU), real sglang 0.5.23 (--no-deps),
# the pinned runtime set, triton (interpreter + sm_90a compile-only), and this package (editable).
#
#   bash scripts/install-cpu.sh [VENV]        (default: .venv in the repo)
#
# Idempotent and quick when nothing changed: a stamp in the venv records the inputs it was built from.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$here/.venv}
py=${PYTHON:-python3.11}

SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
TRITON_VERSION=3.8.0
APT_PKGS=(libibverbs1 iproute2 iptables procps curl)  # curl: examples/cpu-two-dc/run.sh

log() { printf '[install-cpu] %s\n' "$*" >&2; }
quiet_pip() { grep -v -e 'is ignored: it is neither a file nor a directory' -e '^$' || true; }

stamp_inputs() {
  cat "$0" "$here/requirements/sglang-cpu.txt" "$here/requirements/dev.txt" "$here/pyproject.toml" "$here/setup.py" \
    | sha256sum | cut -c1-16
}

missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "apt: ${missing[*]}"
  sudo_=""; [[ $(id -u) -eq 0 ]] || sudo_=sudo
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${missing[@]}" >/dev/null
fi

stamp="$venv/.sglang-pdd-stamp"
want=$(stamp_inputs)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]] && "$venv/bin/python" -c "import sglang_pdd, sglang" 2>/dev/null; then
  log "environment up to date: $venv"
  exit 0
fi

if [[ ! -x $venv/bin/python ]]; then
  log "venv: $venv ($($py --version))"
  $py -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)

log "torch $TORCH_VERSION (CPU build)"
"${pip[@]}" "torch==$TORCH_VERSION" 2>&1 | quiet_pip
log "pinned runtime and test set"
"${pip[@]}" -r "$here/requirements/sglang-cpu.txt" -r "$here/requirements/dev.txt" 2>&1 | quiet_pip
log "triton $TRITON_VERSION"
"${pip[@]}" "triton==$TRITON_VERSION" 2>&1 | quiet_pip
log "sglang $SGLANG_VERSION, torchvision $TORCHVISION_VERSION (--no-deps: their metadata pulls CUDA wheels)"
"${pip[@]}" --no-deps "sglang==$SGLANG_VERSION" "torchvision==$TORCHVISION_VERSION" 2>&1 | quiet_pip
log "sglang-pdd (editable, --no-deps)"
"${pip[@]}" --no-deps --no-build-isolation -e "$here" 2>&1 | quiet_pip
log "CPU compat (.pth)"
"$venv/bin/python" -m sglang_pdd.lab.compat install >/dev/null
"$venv/bin/python" -W ignore -m sglang_pdd.lab.compat check
echo "$want" > "$stamp"
log "done: $venv"
