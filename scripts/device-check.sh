#!/usr/bin/env bash
# The GPU checks of the kernels and of MainDecode's attention hook, in one run on a bare CUDA box
# (the device machine: python3 with torch + triton, no sglang, no network). From the repo root:
#
#   bash scripts/device-check.sh            # hook tests, kernel tests (compiled, + bf16), H200 table
#   bash scripts/device-check.sh hook       # only tests/kernels/test_handoff_hook.py (about a minute)
#
# Logs and the benchmark's JSON go to $OUT (the device tool's result folder) or runs/device/.
# sglang_pdd is put on PYTHONPATH from a copy (kernels/ -> sglang_pdd/kernels), so nothing is installed.
set -uo pipefail
what=${1:-all}
out=${OUT:-runs/device}
py=${PYTHON:-python3}
mkdir -p "$out"
src=$(mktemp -d)
cp -r sglang_pdd "$src/sglang_pdd" && rm -rf "$src/sglang_pdd/kernels" && cp -r kernels "$src/sglang_pdd/kernels"
export PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
$py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())" \
    | tee -a "$out/gpu.txt"
rc=0
# greedy tokens with the hook on/off and the hooked EXTEND vs sglang's (stand-ins without sglang), fp16 + bf16
$py -m pytest -q -p no:cacheprovider tests/kernels/test_handoff_hook.py 2>&1 | tee "$out/hook.log" || rc=1
if [ "$what" = all ]; then
    $py -m pytest -q -p no:cacheprovider tests/kernels 2>&1 | tee "$out/kernels.log" || rc=1
    $py -m sglang_pdd.lab.micro.handoff_kernel --json "$out/handoff_h200.json" 2>&1 | tee "$out/bench_handoff.log" || rc=1
fi
rm -rf "$src"
exit $rc
