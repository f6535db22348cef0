#!/usr/bin/env bash
# Two datacenters on one CPU box: cluster A (P, RelayDecode, the PDD router) and cluster B (MainDecode)
# are network namespaces joined by an emulated WAN (netem: 100 Mbit/s, 20 ms RTT). One chat request goes
# through the router. The readable version of `python -m sglang_pdd.demo` (which also runs the
# baselines and the agentic benchmark); change the variables below to adapt it.
#
#   sudo bash examples/cpu-two-dc/run.sh            # needs root, iproute2 and sch_netem; ~2 min on 2 cores
#   PDD_DRY_RUN=1 bash examples/cpu-two-dc/run.sh   # print every command instead of running it
set -euo pipefail

PY=${PDD_PYTHON:-python}                      # the interpreter sglang and sglang-pdd are installed in
WORK=${PDD_WORK:-runs/cpu-two-dc}             # logs, the secret and the model go here
MODEL=${PDD_MODEL:-$WORK/tiny-model}          # built below unless it exists; any small HF model works
NS_A=${PDD_NS_A:-pdd-a} NS_B=${PDD_NS_B:-pdd-b}
IP_A=10.77.0.1 IP_B=10.77.0.2                 # cluster A's and cluster B's address on the WAN link
WAN_MBIT=${PDD_WAN_MBIT:-100} WAN_DELAY_MS=${PDD_WAN_DELAY_MS:-10}  # per direction: RTT = 2 x delay
P_PORT=30000 BOOTSTRAP_PORT=8998 RLD_PORT=30001 TOKEN_PORT=18500 MD_PORT=30002 ROUTER_PORT=8000
DRY=${PDD_DRY_RUN:-0}

# Every command goes through `run` (foreground) or `start` (a server, in the background, logged).
run() { if [[ $DRY == 1 ]]; then echo "run $(printf '%q ' "$@")"; else "$@"; fi; }
PIDS=()
start() {  # start NAME CMD...
  local name=$1; shift
  if [[ $DRY == 1 ]]; then echo "start $name $(printf '%q ' "$@")"; return; fi
  "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=("$!")
}
cleanup() {
  [[ $DRY == 1 ]] && return
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
}
trap cleanup EXIT
wait_healthy() {  # wait_healthy NS URL
  [[ $DRY == 1 ]] && return
  for _ in $(seq 600); do
    ip netns exec "$1" curl -fs "$2/health" >/dev/null && return
    sleep 1
  done
  echo "$2 did not become healthy; see $WORK/*.log" >&2
  exit 1
}

# 1. A model: the tiny Llama the tests use (built from a seed, nothing downloaded).
run mkdir -p "$WORK"
[[ -e $MODEL/config.json ]] || run "$PY" -m sglang_pdd.testing.tiny_model "$MODEL"

# 2. Two datacenters: a namespace each, one veth pair between them, the WAN shaped on both ends.
run ip netns add "$NS_A"
run ip netns add "$NS_B"
run ip link add pdd-wan-a type veth peer name pdd-wan-b
run ip link set pdd-wan-a netns "$NS_A"
run ip link set pdd-wan-b netns "$NS_B"
run ip -n "$NS_A" addr add "$IP_A/24" dev pdd-wan-a
run ip -n "$NS_B" addr add "$IP_B/24" dev pdd-wan-b
for ns in "$NS_A" "$NS_B"; do
  run ip -n "$ns" link set lo up
done
run ip -n "$NS_A" link set pdd-wan-a up
run ip -n "$NS_B" link set pdd-wan-b up
run ip netns exec "$NS_A" tc qdisc add dev pdd-wan-a root netem delay "${WAN_DELAY_MS}ms" rate "${WAN_MBIT}mbit"
run ip netns exec "$NS_B" tc qdisc add dev pdd-wan-b root netem delay "${WAN_DELAY_MS}ms" rate "${WAN_MBIT}mbit"

# 3. The token channel's secret, as a file only RLD and MD read (never on a command line).
SECRET_FILE=$WORK/secret
if [[ $DRY != 1 ]]; then (umask 077; head -c 32 /dev/urandom | base64 >"$SECRET_FILE"); fi

# 4. The servers. sglang on CPU needs these flags and variables (docs/cpu.md); the --pdd-* flags make
#    the roles. RLD and MD: TP 1, non-overlap scheduler (a handoff ends a request between decode steps).
CPU_FLAGS=(--device cpu --attention-backend torch_native --sampling-backend pytorch --dtype float32
           --max-total-tokens 16384 --mem-fraction-static 0.3 --max-running-requests 8
           --chunked-prefill-size -1 --page-size 1 --disable-cuda-graph --grammar-backend none
           --disable-overlap-schedule --sleep-on-idle --skip-server-warmup --log-level info --enable-metrics
           --disaggregation-transfer-backend mooncake_tcp --disaggregation-bootstrap-port "$BOOTSTRAP_PORT")
cpu_env() {  # cpu_env HOST_IP: the environment every sglang server here runs with
  echo SGLANG_USE_CPU_ENGINE=1 MC_TCP_ENABLE_CONNECTION_POOL=true TOKENIZERS_PARALLELISM=false \
       PYTHONUNBUFFERED=1 "SGLANG_HOST_IP=$1"
}
server() {  # server NAME NS HOST_IP PORT NCCL_PORT EXTRA_ENV FLAGS...
  local name=$1 ns=$2 ip=$3 port=$4 nccl=$5 extra_env=$6; shift 6
  # shellcheck disable=SC2046,SC2086  # cpu_env and extra_env: separate VAR=value words
  start "$name" ip netns exec "$ns" env $(cpu_env "$ip") $extra_env \
    "$PY" -m sglang.launch_server --model-path "$MODEL" --tokenizer-path "$MODEL" \
    --host "$ip" --port "$port" --nccl-port "$nccl" "${CPU_FLAGS[@]}" "$@"
}
server prefill "$NS_A" "$IP_A" "$P_PORT" 31000 "SGLANG_PDD_SECRET_FILE=$SECRET_FILE" \
  --disaggregation-mode prefill --pdd-role prefill --pdd-packed-wan plain
server relay "$NS_A" "$IP_A" "$RLD_PORT" 31001 "SGLANG_PDD_SECRET_FILE=$SECRET_FILE" \
  --disaggregation-mode decode --disaggregation-decode-retraction-backup cpu_tensor \
  --pdd-role relay --pdd-token-port "$TOKEN_PORT" --tp-size 1
server main "$NS_B" "$IP_B" "$MD_PORT" 31002 "SGLANG_PDD_SECRET_FILE=$SECRET_FILE" \
  --disaggregation-mode decode --disaggregation-decode-retraction-backup cpu_tensor \
  --disaggregation-decode-enable-radix-cache --pdd-role main --pdd-packed-wan plain --tp-size 1 \
  --kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'
wait_healthy "$NS_A" "http://$IP_A:$P_PORT"
wait_healthy "$NS_A" "http://$IP_A:$RLD_PORT"
wait_healthy "$NS_B" "http://$IP_B:$MD_PORT"

# 5. The PDD router, in cluster A next to P and RLD, with the WAN's figures as its first estimate.
# It signs the PDD parameters it gives P and MD with the same secret (they refuse unsigned ones).
start router ip netns exec "$NS_A" env "SGLANG_PDD_SECRET_FILE=$SECRET_FILE" "$PY" -m sglang_pdd.router \
  --prefill "http://$IP_A:$P_PORT" "$BOOTSTRAP_PORT" --relay "http://$IP_A:$RLD_PORT" "$TOKEN_PORT" \
  --main "http://$IP_B:$MD_PORT" --main-kv-events "tcp://$IP_B:5557" "tcp://$IP_B:5558" \
  --tokenizer "$MODEL" --model-name tiny --host "$IP_A" --port "$ROUTER_PORT" --pipeline auto \
  --wan-mbit "$WAN_MBIT" --wan-rtt-ms "$((2 * WAN_DELAY_MS))"
wait_healthy "$NS_A" "http://$IP_A:$ROUTER_PORT"

# 6. One request, as any OpenAI client sends it (examples/clients for the SDK).
run ip netns exec "$NS_A" curl -fsS "http://$IP_A:$ROUTER_PORT/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model": "tiny", "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 32}'
echo
run ip netns exec "$NS_A" curl -fsS "http://$IP_A:$ROUTER_PORT/metrics"
