#!/usr/bin/env bash
# Two datacenters on one CPU box: cluster A (P, RelayDecode, the PDD router) and cluster B (MainDecode)
# are network namespaces joined by an emulated WAN (netem: 100 Mbit/s, 20 ms RTT). One chat request goes
# P -> RLD -> MD through the router; the last line says how (pipeline, handoff, the answer). The readable
# version of `python -m sglang_pdd.lab.demo` (which also runs the baselines and the agentic benchmark);
# change the variables below to adapt it. Everything it starts is stopped, and the namespaces deleted,
# when it exits (also on Ctrl-C).
#
#   sudo bash examples/cpu-two-dc/run.sh            # needs root, iproute2 and curl; ~2 min on 2 cores
#   PDD_DRY_RUN=1 bash examples/cpu-two-dc/run.sh   # print every command instead of running it
set -euo pipefail

PY=${PDD_PYTHON:-python}                      # the interpreter sglang and sglang-pdd are installed in
WORK=${PDD_WORK:-runs/cpu-two-dc}             # logs, the secret and the model go here
MODEL=${PDD_MODEL:-$WORK/tiny-model}          # built below unless it exists; any small HF model works
NS_A=${PDD_NS_A:-pdd-a} NS_B=${PDD_NS_B:-pdd-b}
IP_A=10.77.0.1 IP_B=10.77.0.2                 # cluster A's and cluster B's address on the WAN link
WAN_MBIT=${PDD_WAN_MBIT:-100} WAN_DELAY_MS=${PDD_WAN_DELAY_MS:-10}  # per direction: RTT = 2 x delay
WAN_QDISC=${PDD_WAN_QDISC:-auto}             # netem; tbf (rate only, for kernels without sch_netem); auto
PIPELINE=${PDD_PIPELINE:-relay}               # the router's --pipeline: relay, auto or direct (see step 5)
P_PORT=30000 BOOTSTRAP_PORT=8998 RLD_PORT=30001 TOKEN_PORT=18500 MD_PORT=30002 ROUTER_PORT=8000
DRY=${PDD_DRY_RUN:-0}

# Every command goes through `run` (foreground) or `start` (a server, in the background, logged).
say() { [[ $DRY == 1 ]] || echo "$@"; }
run() { if [[ $DRY == 1 ]]; then echo "run $(printf '%q ' "$@")"; else "$@"; fi; }
NAMES=() PIDS=()
start() {  # start NAME CMD...
  local name=$1; shift
  if [[ $DRY == 1 ]]; then echo "start $name $(printf '%q ' "$@")"; return; fi
  "$@" >"$WORK/$name.log" 2>&1 &
  NAMES+=("$name") PIDS+=("$!")
}
cleanup() {  # stop the servers (sglang stops its own children), then anything left in the two namespaces
  [[ $DRY == 1 ]] && return
  local ns left i
  kill "${PIDS[@]}" 2>/dev/null || true
  for i in $(seq 40); do  # 20 s to exit cleanly (sglang takes about 5), then SIGKILL
    left=$(for ns in "$NS_A" "$NS_B"; do ip netns pids "$ns" 2>/dev/null; done)
    [[ -z $left ]] && break
    if ((i == 40)); then kill -KILL $left 2>/dev/null || true; fi
    sleep 0.5
  done
  { wait; } 2>/dev/null || true  # (quietly: sglang ends itself with SIGKILL)
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
wait_healthy() {  # wait_healthy NS URL: until its /health answers 200; fail at once if a server exited
  [[ $DRY == 1 ]] && return
  local deadline=$((SECONDS + 600)) i
  until ip netns exec "$1" curl -fs -m 10 "$2/health" >/dev/null; do
    for i in "${!PIDS[@]}"; do
      if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
        echo "${NAMES[$i]} exited while $2 was starting; the end of $WORK/${NAMES[$i]}.log:" >&2
        tail -n 20 "$WORK/${NAMES[$i]}.log" >&2
        exit 1
      fi
    done
    if ((SECONDS > deadline)); then echo "$2 did not become healthy; see $WORK/*.log" >&2; exit 1; fi
    sleep 0.5
  done
}

# 1. A model: the tiny Llama the tests use (built from a seed, nothing downloaded).
run mkdir -p "$WORK"
[[ -e $MODEL/config.json ]] || run "$PY" -m sglang_pdd.lab.testing.tiny_model "$MODEL"

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
# netem delays and rate-limits each end's egress. A kernel without sch_netem (some VMs) gets tbf: the rate
# without the delay (sglang_pdd.lab.testbed's delay daemon adds the delay there; docs/testbed.md).
if [[ $WAN_QDISC == auto ]]; then  # netem if the kernel has it (tried on A's loopback, then removed)
  WAN_QDISC=netem
  if [[ $DRY != 1 ]]; then
    if ip netns exec "$NS_A" tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
      ip netns exec "$NS_A" tc qdisc del dev lo root
    else
      WAN_QDISC=tbf
    fi
  fi
fi
for end in "$NS_A pdd-wan-a" "$NS_B pdd-wan-b"; do
  read -r ns dev <<<"$end"
  if [[ $WAN_QDISC == netem ]]; then
    run ip netns exec "$ns" tc qdisc add dev "$dev" root netem delay "${WAN_DELAY_MS}ms" rate "${WAN_MBIT}mbit"
  else
    run ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "${WAN_MBIT}mbit" burst 128kb latency 50ms
  fi
done
if [[ $WAN_QDISC == netem ]]; then say "WAN: netem, ${WAN_MBIT} Mbit/s and ${WAN_DELAY_MS} ms each way"
else say "WAN: tbf, ${WAN_MBIT} Mbit/s each way, no added delay (no sch_netem in this kernel?)"; fi

# 3. The keys, as files only the processes read (never on a command line), fresh on every run
#    (python -m sglang_pdd.protocol.keygen: every key a deployment needs):
#    secret             the token channel's HMAC and the signed PDD parameters: every role and the router
#    role-api-key(.yaml) the roles' sglang --api-key (as sglang's --config file) and the router's copy of it:
#                       the roles take calls only with it, and the router refuses a role that answers without
#    relay.key/.pub, main.key, curve-clients   the token channel's CURVE encryption: RLD's secret key and the
#                       MD keys it admits, MD's own key and RLD's public one (the channel crosses the WAN)
KEYS=$WORK/keys
run "$PY" -m sglang_pdd.protocol.keygen "$KEYS" --force
SECRET_FILE=$KEYS/secret

# 4. The servers. sglang on CPU needs these flags and variables (docs/cpu.md); the --pdd-* flags make
#    the roles. --disable-overlap-schedule: prefill's overlap path needs CUDA (RLD and MD could overlap).
#    RLD and MD stream incrementally (--incremental-streaming-output: each chunk carries its new tokens
#    only; sglang's default repeats the whole output every chunk, O(n^2) bytes, and MD's crosses the WAN).
CPU_FLAGS=(--device cpu --attention-backend torch_native --sampling-backend pytorch --dtype float32
           --max-total-tokens 16384 --mem-fraction-static 0.3 --max-running-requests 8
           --chunked-prefill-size -1 --page-size 1 --disable-cuda-graph --grammar-backend xgrammar
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
ROLE_KEY=(--config "$KEYS/role-api-key.yaml")  # sglang's --api-key, read from the file (off the command line)
server prefill "$NS_A" "$IP_A" "$P_PORT" 31000 "SGLANG_PDD_SECRET_FILE=$SECRET_FILE" \
  "${ROLE_KEY[@]}" --disaggregation-mode prefill --pdd-role prefill --pdd-packed-wan plain
server relay "$NS_A" "$IP_A" "$RLD_PORT" 31001 "SGLANG_PDD_SECRET_FILE=$SECRET_FILE \
SGLANG_PDD_TOKEN_CURVE_KEY_FILE=$KEYS/relay.key SGLANG_PDD_TOKEN_CURVE_CLIENTS_FILE=$KEYS/curve-clients" \
  "${ROLE_KEY[@]}" --disaggregation-mode decode --disaggregation-decode-retraction-backup cpu_tensor \
  --pdd-role relay --pdd-token-port "$TOKEN_PORT" --pdd-token-curve on --tp-size 1 --incremental-streaming-output
server main "$NS_B" "$IP_B" "$MD_PORT" 31002 "SGLANG_PDD_SECRET_FILE=$SECRET_FILE \
SGLANG_PDD_TOKEN_CURVE_KEY_FILE=$KEYS/relay.pub SGLANG_PDD_TOKEN_CURVE_CLIENT_KEY_FILE=$KEYS/main.key" \
  "${ROLE_KEY[@]}" --disaggregation-mode decode --disaggregation-decode-retraction-backup cpu_tensor \
  --disaggregation-decode-enable-radix-cache --pdd-role main --pdd-packed-wan plain --tp-size 1 \
  --incremental-streaming-output --pdd-token-curve on \
  --pdd-relays "tcp://$IP_A:$TOKEN_PORT" \
  --kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'
wait_healthy "$NS_A" "http://$IP_A:$P_PORT"
wait_healthy "$NS_A" "http://$IP_A:$RLD_PORT"
wait_healthy "$NS_B" "http://$IP_B:$MD_PORT"

# 5. The PDD router, in cluster A next to P and RLD, with the WAN's figures as its first estimate.
# It signs the PDD parameters it gives P and MD with the same secret (they refuse unsigned ones), and calls
# every role with the role key (it refuses to start without one, and refuses a role that answers without it).
# --pipeline relay sends every request P -> RLD -> MD; with auto the policy sends a request P -> MD when
# MD's missed KV crosses the WAN within --wan-budget-s (0.5 s), as this short prompt's would (16 tokens,
# 0.26 MB of KV).
start router ip netns exec "$NS_A" env "SGLANG_PDD_SECRET_FILE=$SECRET_FILE" \
  "SGLANG_PDD_ROLE_API_KEY_FILE=$KEYS/role-api-key" "$PY" -m sglang_pdd.router \
  --prefill "http://$IP_A:$P_PORT" "$BOOTSTRAP_PORT" --relay "http://$IP_A:$RLD_PORT" "$TOKEN_PORT" \
  --main "http://$IP_B:$MD_PORT" --main-kv-events "tcp://$IP_B:5557" "tcp://$IP_B:5558" \
  --tokenizer "$MODEL" --model-name tiny --host "$IP_A" --port "$ROUTER_PORT" --pipeline "$PIPELINE" \
  --wan-mbit "$WAN_MBIT" --wan-rtt-ms "$((2 * WAN_DELAY_MS))"
wait_healthy "$NS_A" "http://$IP_A:$ROUTER_PORT"

# 6. One request, as any OpenAI client sends it (examples/clients for the SDK). Sampled with a seed: every
#    PDD role samples position by position from it, so the answer is a single server's, run after run.
REQUEST='{"model": "tiny", "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 32, '
REQUEST+='"temperature": 0.8, "top_p": 0.9, "seed": 42}'
ANSWER=$(run ip netns exec "$NS_A" curl -fsS -m 300 "http://$IP_A:$ROUTER_PORT/v1/chat/completions" \
  -H 'Content-Type: application/json' -d "$REQUEST")
echo "$ANSWER"

# 7. What the router did with it (its /metrics): the pipeline, how many tokens RLD decoded before it
#    handed the request to MD, and MD's share.
METRICS=$(run ip netns exec "$NS_A" curl -fsS "http://$IP_A:$ROUTER_PORT/metrics")
if [[ $DRY == 1 ]]; then echo "$METRICS"; exit 0; fi
echo "$METRICS" | grep -E '^sglang_pdd_router_(requests|handoffs|output_tokens)_total' || true
"$PY" - "$ANSWER" "$METRICS" <<'EOF'
import json, sys
from prometheus_client.parser import text_string_to_metric_families
answer, families = json.loads(sys.argv[1]), text_string_to_metric_families(sys.argv[2])
seen = {f.name: [(s.labels, s.value) for s in f.samples if s.name.endswith("_total") and s.value] for f in families}
pipeline = ",".join(lab["pipeline"] for lab, _ in seen["sglang_pdd_router_requests"] if lab["outcome"] == "ok")
handoff = ",".join(lab["mode"] for lab, _ in seen["sglang_pdd_router_handoffs"]) or "none"
tokens = {lab["source"]: int(v) for lab, v in seen["sglang_pdd_router_output_tokens"]}
print(f"PDD result: pipeline={pipeline or 'none'} handoff={handoff} rld_tokens={tokens.get('relay', 0)} "
      f"md_tokens={tokens.get('main', 0)} text={json.dumps(answer['choices'][0]['message']['content'])}")
EOF
