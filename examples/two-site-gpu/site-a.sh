#!/usr/bin/env bash
# Cluster A on one host: P (PDD_PREFILL_GPUS) and RLD (PDD_RELAY_GPUS) in the background, logs under
# PDD_LOG_DIR, then the router in the foreground once both answer /health. Ctrl-C or the router's exit
# stops P and RLD. For one role per host run site-a-prefill.sh, site-a-relay.sh and site-a-router.sh.
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
: "${PDD_LOG_DIR:=./pdd-logs}"
: "${PDD_START_TIMEOUT_S:=900}"

here=$PDD_EXAMPLE_DIR
if [[ $PDD_DRY_RUN == 1 ]]; then
  "$here/site-a-prefill.sh"
  "$here/site-a-relay.sh"
  exec "$here/site-a-router.sh"
fi

mkdir -p "$PDD_LOG_DIR"
pids=()
stop() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT TERM

"$here/site-a-prefill.sh" >"$PDD_LOG_DIR/prefill.log" 2>&1 &
pids+=($!)
"$here/site-a-relay.sh" >"$PDD_LOG_DIR/relay.log" 2>&1 &
pids+=($!)

wait_healthy() {  # URL LOG PID
  local deadline=$((SECONDS + PDD_START_TIMEOUT_S))
  until curl -fsS -o /dev/null "$1/health"; do
    kill -0 "$3" 2>/dev/null || pdd_die "$(basename "$2" .log) exited while starting; see $2"
    ((SECONDS < deadline)) || pdd_die "$1 not healthy after ${PDD_START_TIMEOUT_S}s; see $2"
    sleep 2
  done
}
wait_healthy "http://$PDD_PREFILL_HOST:$PDD_PREFILL_PORT" "$PDD_LOG_DIR/prefill.log" "${pids[0]}"
wait_healthy "http://$PDD_RELAY_HOST:$PDD_RELAY_PORT" "$PDD_LOG_DIR/relay.log" "${pids[1]}"
echo "sglang-pdd example: P and RLD up (logs in $PDD_LOG_DIR); starting the router on :$PDD_ROUTER_PORT" >&2
"$here/site-a-router.sh"
