#!/usr/bin/env bash
# The device check of the kernels and of MainDecode's attention hook, in one bounded run and one table,
# on a bare CUDA box (python3 with torch + triton; no sglang, no network, nothing installed). From a clone:
#
#   bash scripts/device-check.sh              # tests/kernels compiled (+ bf16), handoff and pack figures, rooflines
#   bash scripts/device-check.sh hook         # only tests/kernels/test_handoff_hook.py
#   bash scripts/device-check.sh --dry-run    # the same steps on CPU (interpreter, smoke shapes), a few minutes
#
# Environment: PYTHON (default python3), OUT (logs, JSON and the table; default runs/device, or
# runs/device-dry-run for --dry-run). Exit status 1 when a test, a benchmark point (STALL, ERROR, BAD) or a
# step failed. The steps and the table: sglang_pdd/lab/micro/device_check.py and docs/kernels.md.
#
# Nothing is installed: the repo is copied into a temporary tree laid out as the installed package
# (sglang_pdd/ with kernels/ inside it, tests/, pyproject.toml) and everything runs from inside that tree,
# so python's first sys.path entry (the current directory, or pytest's rootdir) is the copy and never the
# clone's own sglang_pdd/, which has no kernels/.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac  # a relative path, before the cd
dry=0
for arg in "$@"; do [ "$arg" = --dry-run ] && dry=1; done
if [ "$dry" = 1 ]; then out=${OUT:-$repo/runs/device-dry-run}; else out=${OUT:-$repo/runs/device}; fi
mkdir -p "$out" && out=$(cd "$out" && pwd)

tree=$(mktemp -d "${TMPDIR:-/tmp}/sglang-pdd-device-check.XXXXXX")
trap 'rm -rf "$tree"' EXIT
cp -r "$repo/sglang_pdd" "$repo/tests" "$repo/pyproject.toml" "$tree/" || exit 1
rm -rf "$tree/sglang_pdd/kernels" && cp -r "$repo/kernels" "$tree/sglang_pdd/kernels" || exit 1
find "$tree" -name __pycache__ -prune -exec rm -rf {} + 2>/dev/null

cd "$tree" || exit 1
export PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" 2>&1
fi
"$py" -m sglang_pdd.lab.micro.device_check --out "$out" "$@" 2>&1 | tee "$out/device_check.log"
exit "${PIPESTATUS[0]}"
