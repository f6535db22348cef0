"""`python -m sglang_pdd.router`: the PDD router (one OpenAI-compatible stream across the handoff).

    python -m sglang_pdd.router --prefill http://P:30000 8998 --relay http://RLD:30001 18500 \\
        --main http://MD:30002 --tokenizer MODEL_DIR --host 0.0.0.0 --port 8000 [--pipeline auto]

Several of each role may be given; `--peer-policy` picks among them. `--pipeline auto` asks the
pipeline policy (predicted WAN time of MD's missed KV against `--wan-budget-s`), `relay` always
uses P->RLD->MD, `direct` always P->MD.

MD's cache hit comes from the router's own record of what it sent there (an upper bound), or, with
`--main-kv-events tcp://MD:5557 [tcp://MD:5558]` (one per `--main`, same order), exactly from MD's
KV events (MD started with `--kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557",
"replay_endpoint": "tcp://*:5558"}'`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from urllib.parse import urlparse

from aiohttp import web

from sglang_pdd.cache.kv_subscriber import KvEventSource
from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.pipeline import PipelinePolicy, PipelinePolicyConfig
from sglang_pdd.router.admission import ModelLimits
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.dispatch import PIPELINE_MODES, DispatchConfig, Dispatcher
from sglang_pdd.router.peers import Peer, PeerPool


def _peer_args(values: list[list[str]], role: str, default_port: int | None, flag: str) -> list[Peer]:
    peers = []
    for v in values or []:
        if not v or len(v) > 2 or not v[0].startswith(("http://", "https://")):
            raise SystemExit(f"{flag}: expected URL [PORT], got {' '.join(v)}")
        port = int(v[1]) if len(v) == 2 and v[1] != "none" else default_port
        if role == "relay":
            if port is None:
                raise SystemExit(f"{flag} {v[0]}: give the relay's token-channel port (its --pdd-token-port)")
            peers.append(Peer(v[0].rstrip("/"), token_channel=f"tcp://{urlparse(v[0]).hostname}:{port}"))
        else:
            peers.append(Peer(v[0].rstrip("/"), bootstrap_port=port))
    return peers


def _kv_event_args(values: list[list[str]], mains: list[Peer], topic: str) -> dict[str, KvEventSource]:
    """`--main-kv-events ENDPOINT [REPLAY_ENDPOINT]` per --main, in order ("none": that MD has none)."""
    if not values:
        return {}
    if len(values) != len(mains):
        raise SystemExit(f"--main-kv-events: given {len(values)} times for {len(mains)} --main "
                         "(one per --main, in the same order; 'none' for an MD without events)")
    out = {}
    for v, md in zip(values, mains):
        if len(v) > 2:
            raise SystemExit(f"--main-kv-events: expected ENDPOINT [REPLAY_ENDPOINT], got {' '.join(v)}")
        if v[0] == "none":
            continue
        try:
            out[md.url] = KvEventSource(v[0], v[1] if len(v) == 2 else None, topic)
        except ValueError as e:
            raise SystemExit(f"--main-kv-events: {e}") from None
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.router", description=__doc__.split("\n")[0])
    ap.add_argument("--prefill", nargs="+", action="append", metavar=("URL", "BOOTSTRAP_PORT"), required=True)
    ap.add_argument("--relay", nargs="+", action="append", metavar=("URL", "TOKEN_PORT"), default=[])
    ap.add_argument("--main", nargs=1, action="append", metavar="URL", required=True)
    ap.add_argument("--main-kv-events", nargs="+", action="append", metavar=("ENDPOINT", "REPLAY_ENDPOINT"),
                    default=[], help="one per --main, same order: where that MD publishes its KV events "
                    "(its --kv-events-config endpoint and replay_endpoint, e.g. tcp://MD:5557 tcp://MD:5558; "
                    "'none': no events). The router then routes on MD's exact cache; while the events "
                    "cannot be trusted (lost and not replayable) it falls back to its approximate view")
    ap.add_argument("--kv-events-topic", default="", help="the topic of MD's --kv-events-config")
    ap.add_argument("--tokenizer", required=True, help="model or tokenizer directory (chat template, detokenization)")
    ap.add_argument("--model-name", default=None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--pipeline", choices=PIPELINE_MODES, default="auto")
    ap.add_argument("--peer-policy", choices=("least-loaded", "round-robin"), default="least-loaded")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="the longest any request may take (s)")
    for role, default, what in (("prefill", 600.0, "P's reply (it answers once its KV went out)"),
                                ("relay", 120.0, "RLD's next stream chunk"),
                                ("main", 180.0, "MD's next stream chunk (its first comes after the handoff: "
                                                "keep this above MD's --pdd-handoff-timeout)")):
        ap.add_argument(f"--{role}-idle-timeout", type=float, default=default,
                        help=f"end a request with a 504 when {what} takes longer than this (s)")
    ap.add_argument("--context-length", type=int, default=None,
                    help="refuse (400) prompts + max tokens beyond this (default: the model's "
                         "max_position_embeddings; set it to the servers' --context-length)")
    ap.add_argument("--max-body-mb", type=float, default=64.0, help="refuse (413) request bodies over this")
    ap.add_argument("--default-max-tokens", type=int, default=128)
    ap.add_argument("--kv-bytes-per-token", type=int, default=None, help="for --pipeline auto (default: from the model config)")
    ap.add_argument("--wan-mbit", type=float, default=1000.0, help="initial WAN bandwidth estimate")
    ap.add_argument("--wan-rtt-ms", type=float, default=20.0)
    ap.add_argument("--wan-budget-s", type=float, default=0.5, help="P->MD when MD's missed KV crosses within this")
    ap.add_argument("--odd-output-threshold", type=int, default=500,
                    help="auto: a request with fewer output tokens whose WAN transfer would outlast its "
                         "decode on RLD is odd traffic, served P->RLD alone (0 turns this off)")
    ap.add_argument("--rld-tpot-ms", type=float, default=50.0,
                    help="expected RLD time per output token (odd traffic: decode on RLD vs the WAN)")
    ap.add_argument("--allow-relay-only", action="store_true",
                    help="experiment only (PDD.md §4): let requests whose MD hit is below "
                         "--relay-only-below-hit finish on RLD alone; MD's cache then falls behind")
    ap.add_argument("--relay-only-below-hit", type=float, default=0.9)
    ap.add_argument("--bandwidth-poll-s", type=float, default=2.0,
                    help="read prefill's completed-transfer counters this often to update the WAN "
                         "bandwidth estimate (0: keep --wan-mbit)")
    ap.add_argument("--migration-limit", type=int, default=1,
                    help="re-issue a request whose serving role failed mid-stream (unreachable, 5xx, an abort "
                         "the router did not ask for, an idle deadline) this many times, from its prompt plus "
                         "the tokens already streamed, on a healthy path (0: the client gets the error)")
    ap.add_argument("--health-check-s", type=float, default=2.0,
                    help="ask each peer out of service for /health this often; a 200 takes it back (0: never)")
    ap.add_argument("--log-level", default="info")
    return ap


def kv_bytes_from_config(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(c.get("torch_dtype") or c.get("dtype")), 2)
    return 2 * c["num_hidden_layers"] * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * dtype_bytes


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s] %(name)s: %(message)s")
    from transformers import AutoTokenizer

    prefill = PeerPool("prefill", _peer_args(args.prefill, "prefill", 8998, "--prefill"), args.peer_policy)
    relay = PeerPool("relay", _peer_args(args.relay, "relay", None, "--relay"), args.peer_policy)
    main_ = PeerPool("main", _peer_args(args.main, "main", None, "--main"), args.peer_policy)
    kv_events = _kv_event_args(args.main_kv_events, main_.peers, args.kv_events_topic)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    kvb = args.kv_bytes_per_token or kv_bytes_from_config(args.tokenizer)
    rtt = args.wan_rtt_ms / 1000
    policy = PipelinePolicy(PipelinePolicyConfig(kv_bytes_per_token=kvb, wan_budget_s=args.wan_budget_s,
                                                 odd_output_threshold=args.odd_output_threshold,
                                                 allow_relay_only=args.allow_relay_only,
                                                 relay_only_below_hit=args.relay_only_below_hit,
                                                 rld_tpot_s=args.rld_tpot_ms / 1000),
                            BandwidthEstimator(args.wan_mbit * 1e6 / 8, rtt_s=rtt), rtt_s=rtt)
    try:
        idle = {role: getattr(args, f"{role}_idle_timeout") for role in ("prefill", "relay", "main")}
        if any(v <= 0 for v in idle.values()) or args.request_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if args.migration_limit < 0:
            raise ValueError("--migration-limit must be 0 or more")
        d = Dispatcher(prefill, relay, main_, DispatchConfig(args.pipeline, args.request_timeout, args.bandwidth_poll_s,
                                                             migration_limit=args.migration_limit,
                                                             health_check_s=args.health_check_s,
                                                             idle_timeout_s=idle),
                       decode=lambda ids: tok.decode(ids, skip_special_tokens=True), policy=policy,
                       kv_events=kv_events)
    except ValueError as e:
        raise SystemExit(f"sglang-pdd router: {e}") from None
    limits = ModelLimits.from_model_dir(args.tokenizer, args.context_length)
    app = RouterApp(d, tok, args.model_name or args.tokenizer.rstrip("/").split("/")[-1], args.default_max_tokens,
                    limits=limits, max_body_bytes=int(args.max_body_mb * (1 << 20)))
    logging.getLogger(__name__).info("sglang-pdd router: %d prefill, %d relay, %d main; pipeline %s",
                                     len(prefill.peers), len(relay.peers), len(main_.peers), args.pipeline)
    web.run_app(app.app, host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
