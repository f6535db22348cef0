"""`python -m sglang_pdd.router`: the PDD router (one OpenAI-compatible stream across the handoff).

    python -m sglang_pdd.router --prefill http://P:30000 8998 --relay http://RLD:30001 18500 \\
        --main http://MD:30002 --tokenizer MODEL_DIR --host 0.0.0.0 --port 8000 [--pipeline auto]

Several of each role may be given; `--peer-policy` picks among them (cache-aware by default: MD by
its cached prefix of the prompt, its site's predicted WAN time and its load; `--main URL SITE` with
`--site SITE MBIT RTT_MS` for MD pools in several clusters). `--pipeline auto` asks the
pipeline policy (predicted WAN time of MD's missed KV against `--wan-budget-s`), `relay` always
uses P->RLD->MD, `direct` always P->MD.

MD's cache hit comes from the router's own record of what it sent there (an upper bound), or, with
`--main-kv-events tcp://MD:5557 [tcp://MD:5558]` (one per `--main`, same order), exactly from MD's
KV events (MD started with `--kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557",
"replay_endpoint": "tcp://*:5558"}'`).

With relays the router needs the secret RLD and MD hold (`SGLANG_PDD_SECRET` or
`SGLANG_PDD_SECRET_FILE`): it signs the PDD parameters it gives P and MD (`protocol.request_auth`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from urllib.parse import urlparse

from sglang_pdd.router.cache.kv_subscriber import KvEventSource
from sglang_pdd.config import ENV_SECRET, ENV_SECRET_FILE, PddConfig
from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.peer_choice import POLICIES, ChoiceConfig
from sglang_pdd.policy.pipeline import PipelinePolicy, PipelinePolicyConfig
from sglang_pdd.policy.site_links import SiteLinks
from sglang_pdd.protocol.request_auth import ParamsSigner
from sglang_pdd.router.admission import ModelLimits
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.client_auth import ENV_API_KEY, keys_from
from sglang_pdd.router.front_door import FrontDoorConfig
from sglang_pdd.router.dispatch import PIPELINE_MODES, DispatchConfig, Dispatcher
from sglang_pdd.router.peers import Peer, PeerPool
from sglang_pdd.router import role_auth


def _peer_args(values: list[list[str]], role: str, default_port: int | None, flag: str) -> list[Peer]:
    peers = []
    for v in values or []:
        if not v or len(v) > 2 or not v[0].startswith(("http://", "https://")):
            raise SystemExit(f"{flag}: expected URL [{'SITE' if role == 'main' else 'PORT'}], got {' '.join(v)}")
        if role == "main":  # --main URL [SITE]
            peers.append(Peer(v[0].rstrip("/"), site=v[1] if len(v) == 2 else ""))
            continue
        port = int(v[1]) if len(v) == 2 and v[1] != "none" else default_port
        if role == "relay":
            if port is None:
                raise SystemExit(f"{flag} {v[0]}: give the relay's token-channel port (its --pdd-token-port)")
            peers.append(Peer(v[0].rstrip("/"), token_channel=f"tcp://{urlparse(v[0]).hostname}:{port}"))
        else:
            peers.append(Peer(v[0].rstrip("/"), bootstrap_port=port))
    return peers


def _site_links(values: list[list[str]], mains: list[Peer], default: BandwidthEstimator, rtt_s: float) -> SiteLinks:
    """`--site NAME MBIT RTT_MS` per site; every site an MD names must be given."""
    links = SiteLinks.single(default, rtt_s)
    for v in values or []:
        name, mbit, rtt = v
        try:
            mbit_f, rtt_f = float(mbit), float(rtt)
        except ValueError:
            raise SystemExit(f"--site {' '.join(v)}: expected NAME MBIT RTT_MS") from None
        if not name or mbit_f <= 0 or rtt_f < 0 or name in links.sites:
            raise SystemExit(f"--site {' '.join(v)}: a new name, MBIT > 0 and RTT_MS >= 0")
        links.add(name, mbit_f * 1e6 / 8, rtt_f / 1000)
    unknown = sorted({p.site for p in mains if p.site and p.site not in links.sites})
    if unknown:
        raise SystemExit(f"--main: site {', '.join(unknown)} has no --site NAME MBIT RTT_MS (its WAN link)")
    return links


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
    ap.add_argument("--main", nargs="+", action="append", metavar=("URL", "SITE"), required=True,
                    help="a MainDecode server, and the site it runs in (its WAN link: --site)")
    ap.add_argument("--site", nargs=3, action="append", metavar=("NAME", "MBIT", "RTT_MS"), default=[],
                    help="a site of MainDecode servers and its WAN link's initial bandwidth estimate and RTT "
                         "(each --main without a site uses --wan-mbit and --wan-rtt-ms)")
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
    ap.add_argument("--peer-policy", choices=POLICIES, default="cache-aware",
                    help="how a server of each pool is chosen: cache-aware (MD by its cached prefix, its site's "
                         "predicted WAN time and load; P by its prefix, RLD by load and KV usage), "
                         "least-loaded or round-robin")
    ap.add_argument("--choice-load-s", type=float, default=ChoiceConfig.load_s,
                    help="cache-aware: the cost of one running request, in seconds of predicted WAN time")
    ap.add_argument("--choice-kv-usage-s", type=float, default=ChoiceConfig.usage_s,
                    help="cache-aware: the cost of a full KV pool, in seconds")
    ap.add_argument("--balance-abs-threshold", type=float, default=ChoiceConfig.balance_abs,
                    help="cache-aware: least-loaded when the busiest server runs this many more requests "
                         "than the idlest ...")
    ap.add_argument("--balance-rel-threshold", type=float, default=ChoiceConfig.balance_rel,
                    help="... and more than this many times as many")
    ap.add_argument("--load-poll-s", type=float, default=1.0,
                    help="read every server's load gauges (running, queued, KV usage) this often "
                         "(0: the router's own in-flight counts only)")
    ap.add_argument("--request-timeout", type=float, default=600.0,
                    help="the longest any request may take, migrations included (s; default 600): past it the "
                         "request ends with a 504, which is not counted against the server that served it")
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
                    help="experiment only (docs/sim.md, Oscillation): let requests whose MD hit is below "
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
                    help="look at each peer out of service this often (default 2): once its back-off is over, a "
                         "one-token probe generate it serves takes it back, on probation (0: never; it then gets "
                         "a try when its back-off is over)")
    # -- migration limits and idle accounting (router.migration_limits, router.idle_deadline) -----
    ap.add_argument("--migration-jitter-s", type=float, default=0.1,
                    help="each migration first waits a random delay up to this (default 0.1; 0: none), so that a "
                         "dead MD's streams do not all re-prefill on P at once")
    ap.add_argument("--migration-rate", type=float, default=20.0,
                    help="migrations per second, all requests together (a token bucket; default 20; 0: no "
                         "limit); over it a request fails with a 503 instead of migrating")
    ap.add_argument("--migration-burst", type=int, default=40,
                    help="migrations the bucket allows at once after a quiet spell (default 40)")
    ap.add_argument("--idle-per-token-s", type=float, default=1.0,
                    help="added to a request's idle deadlines for each token its own stream_interval (beyond the "
                         "first) and its longest stop string (in UTF-8 bytes) may hold a chunk back (default 1)")
    ap.add_argument(role_auth.FLAG, default=None,
                    help=f"the key the roles were started with (sglang's --api-key): the router sends it to P, RLD and "
                         f"MD on every call. Prefer {role_auth.ENV_KEY} or {role_auth.ENV_KEY_FILE} (a command line "
                         "is visible to `ps`). Default: none (the roles' API is open)")
    # -- the front door (router.front_door, router.in_flight, router.client_auth) --------------
    door = FrontDoorConfig()
    ap.add_argument("--header-timeout-s", type=float, default=door.header_timeout_s,
                    help="close a connection whose first request line and headers are not complete this long "
                         f"after it opened (default {door.header_timeout_s:g}; later requests on a kept-alive "
                         "connection: --keepalive-timeout-s)")
    ap.add_argument("--body-timeout-s", type=float, default=door.body_timeout_s,
                    help="answer 408 and close when a request's body has not arrived this long after its headers "
                         f"(default {door.body_timeout_s:g}; a 64 MB body needs ~17 Mbit/s)")
    ap.add_argument("--keepalive-timeout-s", type=float, default=door.keepalive_timeout_s,
                    help="close a kept-alive connection idle (or mid-headers) this long after its last response "
                         f"(default {door.keepalive_timeout_s:g})")
    ap.add_argument("--max-connections", type=int, default=door.max_connections,
                    help="open client connections at most; over it a new one gets 503 with Retry-After and is "
                         f"closed (default {door.max_connections}: well below a default 65k fd limit, and "
                         "several connections per request in flight)")
    ap.add_argument("--max-in-flight", type=int, default=door.max_in_flight,
                    help="requests served at once (body read, tokenization, generation); over it 503 with "
                         f"Retry-After (default {door.max_in_flight}: each holds up to --max-body-mb of body and "
                         "a request on every role; /health and /metrics are not counted)")
    ap.add_argument("--max-in-flight-per-client", type=int, default=door.max_in_flight_per_client,
                    help="requests served at once per client (its API key with --api-key, else its address; "
                         f"behind a proxy, the proxy's); over it 429 with Retry-After (default "
                         f"{door.max_in_flight_per_client}: a quarter of --max-in-flight, so one client cannot "
                         "take the router)")
    ap.add_argument("--tokenizer-threads", type=int, default=4,
                    help="threads parsing and tokenizing request bodies (default 4)")
    ap.add_argument("--tokenizer-queue", type=int, default=64,
                    help="requests waiting for a tokenizer thread at most; over it 503 with Retry-After "
                         "(default 64: a longer wait means tokenization is the bottleneck and clients should "
                         "back off)")
    ap.add_argument("--api-key", action="append", default=None, metavar="KEY",
                    help=f"clients must send Authorization: Bearer KEY (else 401); may be repeated, one key per "
                         "client (the per-client cap then counts per key). Prefer the environment variable "
                         f"{ENV_API_KEY} (one key or several, comma-separated; a command line is visible to "
                         "`ps`); the flag wins when both are set. /health and /metrics stay open (k8s probes, "
                         "Prometheus). Default: none (the router is open)")
    ap.add_argument("--log-level", default="info")
    return ap


def kv_bytes_from_config(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(c.get("torch_dtype") or c.get("dtype")), 2)
    return 2 * c["num_hidden_layers"] * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * dtype_bytes


def _signer(has_relays: bool) -> ParamsSigner | None:
    """The signer of P's and MD's PDD parameters, from the secret RLD and MD hold; relays need it."""
    try:
        secret = PddConfig().optional_secret()
        signer = ParamsSigner(secret) if secret else None
    except ValueError as e:
        raise SystemExit(f"sglang-pdd router: error: {e}") from None
    if signer is None and has_relays:
        raise SystemExit(f"sglang-pdd router: error: --relay needs {ENV_SECRET} (or {ENV_SECRET_FILE}), the secret "
                         "RLD and MD hold: the router signs each request's PDD parameters with it, and P and MD "
                         "refuse unsigned ones")
    return signer


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        role_auth.export(args.role_api_key)  # the dispatcher's session sends it to every role
    except ValueError as e:
        raise SystemExit(f"sglang-pdd router: error: {e}") from None
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s] %(name)s: %(message)s")
    door, api_keys = _front_door(args)
    from transformers import AutoTokenizer

    try:
        choice = ChoiceConfig(args.peer_policy, load_s=args.choice_load_s, usage_s=args.choice_kv_usage_s,
                              balance_abs=args.balance_abs_threshold, balance_rel=args.balance_rel_threshold)
    except ValueError as e:
        raise SystemExit(f"--peer-policy/--choice-*/--balance-*: {e}") from None
    prefill = PeerPool("prefill", _peer_args(args.prefill, "prefill", 8998, "--prefill"), args.peer_policy, choice)
    relay = PeerPool("relay", _peer_args(args.relay, "relay", None, "--relay"), args.peer_policy, choice)
    main_ = PeerPool("main", _peer_args(args.main, "main", None, "--main"), args.peer_policy, choice)
    kv_events = _kv_event_args(args.main_kv_events, main_.peers, args.kv_events_topic)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    kvb = args.kv_bytes_per_token or kv_bytes_from_config(args.tokenizer)
    rtt = args.wan_rtt_ms / 1000
    bandwidth = BandwidthEstimator(args.wan_mbit * 1e6 / 8, rtt_s=rtt)
    links = _site_links(args.site, main_.peers, bandwidth, rtt)
    policy = PipelinePolicy(PipelinePolicyConfig(kv_bytes_per_token=kvb, wan_budget_s=args.wan_budget_s,
                                                 odd_output_threshold=args.odd_output_threshold,
                                                 allow_relay_only=args.allow_relay_only,
                                                 relay_only_below_hit=args.relay_only_below_hit,
                                                 rld_tpot_s=args.rld_tpot_ms / 1000),
                            bandwidth, rtt_s=rtt, links=links)
    try:
        idle = {role: getattr(args, f"{role}_idle_timeout") for role in ("prefill", "relay", "main")}
        if any(v <= 0 for v in idle.values()) or args.request_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if args.load_poll_s < 0:
            raise ValueError("--load-poll-s must be >= 0")
        if args.migration_limit < 0:
            raise ValueError("--migration-limit must be 0 or more")
        if args.idle_per_token_s < 0:
            raise ValueError("--idle-per-token-s must be 0 or more")
        d = Dispatcher(prefill, relay, main_, DispatchConfig(args.pipeline, args.request_timeout, args.bandwidth_poll_s,
                                                             load_poll_s=args.load_poll_s,
                                                             migration_limit=args.migration_limit,
                                                             health_check_s=args.health_check_s,
                                                             idle_timeout_s=idle,
                                                             idle_per_token_s=args.idle_per_token_s,
                                                             migration_rate_per_s=args.migration_rate,
                                                             migration_burst=args.migration_burst,
                                                             migration_jitter_s=args.migration_jitter_s),
                       decode=lambda ids: tok.decode(ids, skip_special_tokens=True), policy=policy,
                       kv_events=kv_events, signer=_signer(bool(relay.peers)))
    except ValueError as e:
        raise SystemExit(f"sglang-pdd router: {e}") from None
    limits = ModelLimits.from_model_dir(args.tokenizer, args.context_length)
    app = RouterApp(d, tok, args.model_name or args.tokenizer.rstrip("/").split("/")[-1], args.default_max_tokens,
                    limits=limits, max_body_bytes=int(args.max_body_mb * (1 << 20)), door=door,
                    api_keys=tuple(api_keys), tokenizer_workers=args.tokenizer_threads,
                    tokenizer_queue=args.tokenizer_queue)
    logging.getLogger(__name__).info("sglang-pdd router: %d prefill, %d relay, %d main; pipeline %s",
                                     len(prefill.peers), len(relay.peers), len(main_.peers), args.pipeline)
    app.serve(args.host, args.port)
    return 0


def _front_door(args) -> tuple[FrontDoorConfig, list[str]]:
    try:
        if args.tokenizer_threads < 1 or args.tokenizer_queue < 0:
            raise ValueError("--tokenizer-threads must be 1 or more, --tokenizer-queue 0 or more")
        door = FrontDoorConfig(header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                               keepalive_timeout_s=args.keepalive_timeout_s, max_connections=args.max_connections,
                               max_in_flight=args.max_in_flight, max_in_flight_per_client=args.max_in_flight_per_client)
        return door, keys_from(args.api_key)
    except ValueError as e:
        raise SystemExit(f"sglang-pdd router: error: {e}") from None


if __name__ == "__main__":
    sys.exit(main())
