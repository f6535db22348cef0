#!/usr/bin/env bash
# Cluster A: the prefill server (P). Sends each request's KV to RLD (same site) and, in parallel, only
# the pages MD lacks to MD (across the WAN). P may run TP > 1 (PDD_PREFILL_TP); the packed WAN path
# runs only at TP 1 (the plugin refuses it at start-up otherwise), so P then writes page by page.
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pdd_secret

export CUDA_VISIBLE_DEVICES=$PDD_PREFILL_GPUS SGLANG_HOST_IP=$PDD_PREFILL_HOST
pdd_server_args
pdd_role_key
pdd_transport
packed=$PDD_PACKED_WAN
if (( PDD_PREFILL_TP > 1 )); then packed=off; fi
PDD_ARGS+=(
  --host "$PDD_PREFILL_HOST" --port "$PDD_PREFILL_PORT" --tp-size "$PDD_PREFILL_TP"
  --disaggregation-mode prefill --disaggregation-bootstrap-port "$PDD_BOOTSTRAP_PORT"
  --pdd-role prefill --pdd-packed-wan "$packed"
)
pdd_extra "$PDD_PREFILL_EXTRA"
pdd_run "$PDD_PYTHON" -m sglang.launch_server "${PDD_ARGS[@]}"
