# shellcheck shell=bash
# Sourced by the role scripts: settings, the keys (as files the processes read), the KV transport, and the
# final exec (with PDD_DRY_RUN=1 the command and its environment are printed instead of run).

set -euo pipefail

PDD_EXAMPLE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

pdd_die() {
  echo "sglang-pdd example: $*" >&2
  exit 2
}

if [[ -n ${PDD_ENV:-} ]]; then
  [[ -f $PDD_ENV ]] || pdd_die "PDD_ENV=$PDD_ENV: no such file"
  # shellcheck source=pdd.env.example
  source "$PDD_ENV"
elif [[ -f $PDD_EXAMPLE_DIR/pdd.env ]]; then
  # shellcheck source=pdd.env.example
  source "$PDD_EXAMPLE_DIR/pdd.env"
fi

: "${PDD_MODEL:?set PDD_MODEL to the model directory (the same path on every host)}"
: "${PDD_PYTHON:=python3}"
: "${PDD_SERVED_MODEL_NAME:=}"
: "${PDD_PREFILL_HOST:?set PDD_PREFILL_HOST (cluster A, routable from cluster B)}"
: "${PDD_RELAY_HOST:?set PDD_RELAY_HOST (cluster A, routable from cluster B)}"
: "${PDD_MAIN_HOST:?set PDD_MAIN_HOST (cluster B, routable from cluster A)}"
: "${PDD_ROUTER_BIND:=0.0.0.0}"
: "${PDD_PREFILL_PORT:=30000}"
: "${PDD_BOOTSTRAP_PORT:=8998}"
: "${PDD_RELAY_PORT:=30001}"
: "${PDD_TOKEN_PORT:=18500}"
: "${PDD_MAIN_PORT:=30002}"
: "${PDD_KV_EVENTS_PORT:=5557}"
: "${PDD_KV_REPLAY_PORT:=5558}"
: "${PDD_ROUTER_PORT:=8000}"
: "${PDD_PREFILL_GPUS:=0}"
: "${PDD_RELAY_GPUS:=0}"
: "${PDD_MAIN_GPUS:=0}"
: "${PDD_PREFILL_TP:=1}"
: "${PDD_RELAY_TP:=1}"
: "${PDD_MAIN_TP:=1}"
: "${PDD_KV_TRANSPORT:=tcp}"
: "${PDD_IB_DEVICE:=}"
: "${PDD_MC_GID_INDEX:=}"
: "${PDD_MC_IB_TC:=}"
: "${PDD_KEY_DIR:=/etc/sglang-pdd}"
if [[ $PDD_KV_TRANSPORT == tcp ]]; then : "${PDD_PACKED_WAN:=plain}"; else : "${PDD_PACKED_WAN:=off}"; fi
: "${PDD_HANDOFF_MODE:=adaptive}"
: "${PDD_HANDOFF_TIMEOUT_S:=60}"
: "${PDD_WAN_MBIT:=1000}"
: "${PDD_WAN_RTT_MS:=20}"
: "${PDD_WAN_BUDGET_S:=0.5}"
: "${PDD_ODD_OUTPUT_THRESHOLD:=500}"
: "${PDD_RLD_TPOT_MS:=50}"
: "${PDD_KV_BYTES_PER_TOKEN:=}"
: "${PDD_PREFILL_EXTRA:=}"
: "${PDD_RELAY_EXTRA:=}"
: "${PDD_MAIN_EXTRA:=}"
: "${PDD_ROUTER_EXTRA:=}"
: "${PDD_DRY_RUN:=0}"

[[ -d $PDD_MODEL || $PDD_DRY_RUN == 1 ]] || pdd_die "PDD_MODEL=$PDD_MODEL is not a directory"
# RLD and MD are proven at TP 1 and 2 (docs/design.md, "Tensor parallelism"); nothing larger.
for v in PDD_RELAY_TP PDD_MAIN_TP; do
  [[ ${!v} == 1 || ${!v} == 2 ]] || pdd_die "$v=${!v}: RLD and MD are proven at TP 1 and 2 only"
done

# The arguments every sglang server of the example shares.
pdd_server_args() {
  PDD_ARGS=(--model-path "$PDD_MODEL" --enable-metrics)
  if [[ -n $PDD_SERVED_MODEL_NAME ]]; then PDD_ARGS+=(--served-model-name "$PDD_SERVED_MODEL_NAME"); fi
}

# What RLD and MD add: each stream chunk carries its new tokens only (sglang's default repeats the whole
# output on every chunk, O(n^2) bytes over a long output; MD's stream crosses the WAN). The router reads
# either.
pdd_decode_args() {
  PDD_ARGS+=(--incremental-streaming-output)
}

# The KV transport (Mooncake) of P, RLD and MD: appended to PDD_ARGS, Mooncake's variables exported.
# sglang starts one Mooncake engine per server and Mooncake installs one network transport per engine,
# and a writer reaches a peer only over the transport that peer registered: all three roles use the same.
pdd_transport() {
  case $PDD_KV_TRANSPORT in
    tcp)
      # sglang turns mooncake_tcp into mooncake with MC_FORCE_TCP=1 (no RDMA device is opened).
      PDD_ARGS+=(--disaggregation-transfer-backend mooncake_tcp)
      # Reuse TCP connections between transfers: without the pool every transfer opens a connection
      # (a handshake and a slow start per transfer, one WAN round trip or more each).
      export MC_TCP_ENABLE_CONNECTION_POOL=${MC_TCP_ENABLE_CONNECTION_POOL:-1}
      ;;
    rdma)
      [[ -n $PDD_IB_DEVICE ]] || pdd_die "PDD_KV_TRANSPORT=rdma needs PDD_IB_DEVICE (e.g. mlx5_0)"
      PDD_ARGS+=(--disaggregation-transfer-backend mooncake --disaggregation-ib-device "$PDD_IB_DEVICE")
      if [[ -n $PDD_MC_GID_INDEX ]]; then export MC_GID_INDEX=$PDD_MC_GID_INDEX; fi
      if [[ -n $PDD_MC_IB_TC ]]; then export MC_IB_TC=$PDD_MC_IB_TC; fi
      ;;
    *) pdd_die "PDD_KV_TRANSPORT must be tcp or rdma, got '$PDD_KV_TRANSPORT'" ;;
  esac
}

# The keys are files in PDD_KEY_DIR, as `python -m sglang_pdd.protocol.keygen` writes them (README, "Keys"):
# the processes read them; no key is ever on a command line or in this script's variables. A secret must
# be readable by its owner only; a public key (relay.pub, curve-clients) only has to be there.
pdd_key_file() {  # NAME [public]: PDD_KEY_PATH=$PDD_KEY_DIR/NAME, or exit naming what is wrong
  PDD_KEY_PATH=$PDD_KEY_DIR/$1
  [[ -r $PDD_KEY_PATH && -s $PDD_KEY_PATH ]] \
    || pdd_die "$PDD_KEY_PATH is missing, empty or unreadable (PDD_KEY_DIR; README, \"Keys\")"
  [[ ${2:-} == public ]] && return 0
  local mode
  mode=$(stat -c %a "$PDD_KEY_PATH")
  [[ $mode =~ ^[0-7]?[0-7]00$ ]] || pdd_die "$PDD_KEY_PATH has mode $mode: make it 0600 or 0400"
}

# Every role and the router: the shared secret. RLD and MD authenticate the token channel with it; the
# router signs the PDD parameters it gives P and MD with it, and P and MD verify them.
pdd_secret() {
  local v
  for v in SGLANG_PDD_SECRET SGLANG_PDD_ROLE_API_KEY; do
    if [[ -n ${!v:-} ]]; then pdd_die "$v is set in the environment; these scripts read the keys from PDD_KEY_DIR"; fi
  done
  pdd_key_file secret
  export SGLANG_PDD_SECRET_FILE=$PDD_KEY_PATH
}

# P, RLD and MD: sglang's --api-key, from its --config file (off the command line). Without the key their
# whole API (abort every request, flush the cache, load other weights) is open to whoever reaches the port.
pdd_role_key() {
  pdd_key_file role-api-key.yaml
  PDD_ARGS+=(--config "$PDD_KEY_PATH")
}

# The router: the same key, which it sends to every role (it refuses to start without one, and refuses a
# role that answers without it).
pdd_router_key() {
  pdd_key_file role-api-key
  export SGLANG_PDD_ROLE_API_KEY_FILE=$PDD_KEY_PATH
}

# RLD and MD: the token channel (every relayed request's output tokens, across the WAN) encrypted with CURVE.
# RLD holds its secret key and the MD public keys it admits, MD the relay's public key and its own secret key.
pdd_token_curve() {  # relay | main
  case $1 in
    relay)
      pdd_key_file relay.key && export SGLANG_PDD_TOKEN_CURVE_KEY_FILE=$PDD_KEY_PATH
      pdd_key_file curve-clients public && export SGLANG_PDD_TOKEN_CURVE_CLIENTS_FILE=$PDD_KEY_PATH
      ;;
    main)
      pdd_key_file relay.pub public && export SGLANG_PDD_TOKEN_CURVE_KEY_FILE=$PDD_KEY_PATH
      pdd_key_file main.key && export SGLANG_PDD_TOKEN_CURVE_CLIENT_KEY_FILE=$PDD_KEY_PATH
      ;;
    *) pdd_die "pdd_token_curve relay|main, got '$1'" ;;
  esac
  PDD_ARGS+=(--pdd-token-curve on)  # refuse to start without the keys, rather than fall back to clear text
}

# Extra flags of one role (a space-separated string) appended to PDD_ARGS.
pdd_extra() {
  local extra=()
  read -r -a extra <<<"$1"
  PDD_ARGS+=("${extra[@]}")
}

# Run the command in "$@" (or, with PDD_DRY_RUN=1, print its environment and argv, one shell-quoted line).
pdd_run() {
  export PYTHONUNBUFFERED=1
  if [[ $PDD_DRY_RUN == 1 ]]; then
    local v
    for v in CUDA_VISIBLE_DEVICES SGLANG_HOST_IP SGLANG_PDD_SECRET_FILE SGLANG_PDD_ROLE_API_KEY_FILE \
      SGLANG_PDD_TOKEN_CURVE_KEY_FILE SGLANG_PDD_TOKEN_CURVE_CLIENTS_FILE SGLANG_PDD_TOKEN_CURVE_CLIENT_KEY_FILE \
      MC_TCP_ENABLE_CONNECTION_POOL MC_GID_INDEX MC_IB_TC; do
      if [[ -n ${!v:-} ]]; then printf 'env %s=%q\n' "$v" "${!v}"; fi
    done
    printf 'exec'
    printf ' %q' "$@"
    printf '\n'
    return 0
  fi
  exec "$@"
}
