#!/usr/bin/env bash
# Cluster A: the PDD router, the only endpoint clients see (/generate, /v1/completions,
# /v1/chat/completions, /metrics). It picks P->MD or P->RLD->MD per request from MD's cache (exact,
# from MD's KV events) and its WAN figures (PDD_WAN_MBIT, PDD_WAN_RTT_MS; the bandwidth estimate then
# follows P's completed transfers).
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pdd_secret
pdd_router_key

PDD_ARGS=(
  --prefill "http://$PDD_PREFILL_HOST:$PDD_PREFILL_PORT" "$PDD_BOOTSTRAP_PORT"
  --relay "http://$PDD_RELAY_HOST:$PDD_RELAY_PORT" "$PDD_TOKEN_PORT"
  --main "http://$PDD_MAIN_HOST:$PDD_MAIN_PORT"
  --main-kv-events "tcp://$PDD_MAIN_HOST:$PDD_KV_EVENTS_PORT" "tcp://$PDD_MAIN_HOST:$PDD_KV_REPLAY_PORT"
  --tokenizer "$PDD_MODEL" --host "$PDD_ROUTER_BIND" --port "$PDD_ROUTER_PORT" --pipeline auto
  --wan-mbit "$PDD_WAN_MBIT" --wan-rtt-ms "$PDD_WAN_RTT_MS" --wan-budget-s "$PDD_WAN_BUDGET_S"
  --odd-output-threshold "$PDD_ODD_OUTPUT_THRESHOLD" --rld-tpot-ms "$PDD_RLD_TPOT_MS"
)
if [[ -n $PDD_SERVED_MODEL_NAME ]]; then PDD_ARGS+=(--model-name "$PDD_SERVED_MODEL_NAME"); fi
if [[ -n $PDD_KV_BYTES_PER_TOKEN ]]; then PDD_ARGS+=(--kv-bytes-per-token "$PDD_KV_BYTES_PER_TOKEN"); fi
pdd_extra "$PDD_ROUTER_EXTRA"
pdd_run "$PDD_PYTHON" -m sglang_pdd.router "${PDD_ARGS[@]}"
