#!/usr/bin/env bash
# Cluster B: MainDecode (MD). Keeps a decode-side radix cache (only the KV it misses crosses the WAN),
# takes relayed requests over from RLD with one EXTEND over the eager tokens, and publishes its cache's
# KV events for the router's exact view (PDD_KV_EVENTS_PORT, replay on PDD_KV_REPLAY_PORT).
#
# Proven at TP 1 and 2 (PDD_MAIN_TP; no DP attention, no speculative decoding), on sglang's default overlap
# scheduler or without it (--disable-overlap-schedule in PDD_MAIN_EXTRA). The packed WAN path runs only
# at TP 1 (refused at start-up otherwise), so at TP 2 MD takes the KV page by page. Streams incrementally
# (--incremental-streaming-output): its stream crosses the WAN to the router.
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export CUDA_VISIBLE_DEVICES=$PDD_MAIN_GPUS SGLANG_HOST_IP=$PDD_MAIN_HOST
pdd_secret
pdd_server_args
pdd_role_key
pdd_token_curve main
pdd_decode_args
pdd_transport
packed=$PDD_PACKED_WAN
if (( PDD_MAIN_TP > 1 )); then packed=off; fi
kv_events=$(printf '{"publisher": "zmq", "endpoint": "tcp://*:%s", "replay_endpoint": "tcp://*:%s"}' \
  "$PDD_KV_EVENTS_PORT" "$PDD_KV_REPLAY_PORT")
PDD_ARGS+=(
  --host "$PDD_MAIN_HOST" --port "$PDD_MAIN_PORT" --tp-size "$PDD_MAIN_TP"
  --disaggregation-mode decode --disaggregation-decode-enable-radix-cache
  --kv-events-config "$kv_events"
  --pdd-role main --pdd-handoff-mode "$PDD_HANDOFF_MODE" --pdd-packed-wan "$packed"
  --pdd-handoff-timeout "$PDD_HANDOFF_TIMEOUT_S" --pdd-relays "tcp://$PDD_RELAY_HOST:$PDD_TOKEN_PORT"
)
pdd_extra "$PDD_MAIN_EXTRA"
pdd_run "$PDD_PYTHON" -m sglang.launch_server "${PDD_ARGS[@]}"
