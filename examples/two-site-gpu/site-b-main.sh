#!/usr/bin/env bash
# Cluster B: MainDecode (MD). Keeps a decode-side radix cache (only the KV it misses crosses the WAN),
# takes relayed requests over from RLD with one EXTEND over the eager tokens, and publishes its cache's
# KV events for the router's exact view (PDD_KV_EVENTS_PORT, replay on PDD_KV_REPLAY_PORT).
#
# Proven at TP 1 (no DP attention, no speculative decoding), with sglang's default overlap scheduler or
# without it: hence --tp-size 1 (not configurable here).
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export CUDA_VISIBLE_DEVICES=$PDD_MAIN_GPUS SGLANG_HOST_IP=$PDD_MAIN_HOST
pdd_secret
pdd_server_args
pdd_transport
kv_events=$(printf '{"publisher": "zmq", "endpoint": "tcp://*:%s", "replay_endpoint": "tcp://*:%s"}' \
  "$PDD_KV_EVENTS_PORT" "$PDD_KV_REPLAY_PORT")
PDD_ARGS+=(
  --host "$PDD_MAIN_HOST" --port "$PDD_MAIN_PORT" --tp-size 1
  --disaggregation-mode decode --disaggregation-decode-enable-radix-cache
  --kv-events-config "$kv_events"
  --pdd-role main --pdd-handoff-mode "$PDD_HANDOFF_MODE" --pdd-packed-wan "$PDD_PACKED_WAN"
  --pdd-handoff-timeout "$PDD_HANDOFF_TIMEOUT_S" --pdd-relays "tcp://$PDD_RELAY_HOST:$PDD_TOKEN_PORT"
)
pdd_extra "$PDD_MAIN_EXTRA"
pdd_run "$PDD_PYTHON" -m sglang.launch_server "${PDD_ARGS[@]}"
