#!/usr/bin/env bash
# Cluster A: RelayDecode (RLD). Gets P's KV at once, streams the first ("eager") tokens, then hands the
# request to MD by token IDs over its token channel (PDD_TOKEN_PORT on PDD_RELAY_HOST, reached from MD).
#
# Proven at TP 1 and 2 (PDD_RELAY_TP), on sglang's default overlap scheduler or without it
# (--disable-overlap-schedule in PDD_RELAY_EXTRA). Streams incrementally (--incremental-streaming-output).
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export CUDA_VISIBLE_DEVICES=$PDD_RELAY_GPUS SGLANG_HOST_IP=$PDD_RELAY_HOST
pdd_secret
pdd_server_args
pdd_role_key
pdd_token_curve relay
pdd_decode_args
pdd_transport
PDD_ARGS+=(
  --host "$PDD_RELAY_HOST" --port "$PDD_RELAY_PORT" --tp-size "$PDD_RELAY_TP"
  --disaggregation-mode decode
  --pdd-role relay --pdd-token-port "$PDD_TOKEN_PORT" --pdd-handoff-timeout "$PDD_HANDOFF_TIMEOUT_S"
)
pdd_extra "$PDD_RELAY_EXTRA"
pdd_run "$PDD_PYTHON" -m sglang.launch_server "${PDD_ARGS[@]}"
