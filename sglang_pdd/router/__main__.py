"""`python -m sglang_pdd.router`: the PDD router (one OpenAI-compatible stream across the handoff).

    python -m sglang_pdd.router --prefill http://P:30000 8998 --relay http://RLD:30001 18500 \\
        --main http://MD:30002 --tokenizer-path MODEL_DIR --host 0.0.0.0 --port 8000 [--pipeline auto]

Several of each role may be given; `--policy` picks among them (cache-aware by default: MD by
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
import functools
import logging
import sys
from urllib.parse import urlparse

from sglang_pdd.router.cache.kv_subscriber import KvEventSource
from sglang_pdd.protocol import keys
from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.peer_choice import ChoiceConfig
from sglang_pdd.policy.pipeline import PipelinePolicy, PipelinePolicyConfig
from sglang_pdd.policy.relay_pool_scale import PoolScaleConfig
from sglang_pdd.policy.site_links import SiteLinks
from sglang_pdd.protocol.request_auth import ParamsSigner
from sglang_pdd.router.api.admission import ModelLimits
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.api.client_auth import keys_from
from sglang_pdd.router.api.front_door import FrontDoorConfig
from sglang_pdd.router.api.grammar.guard import GrammarBounds
from sglang_pdd.router.request.dispatch import DispatchConfig, Dispatcher
from sglang_pdd.router.peers.pool import Peer, PeerPool
from sglang_pdd.router import flags
from sglang_pdd.policy import kv_bytes
from sglang_pdd.router.peers import role_auth


def _peer_args(values: list[list[str]], role: str, default_port: int | None, flag: str) -> list[Peer]:
    peers = []
    for v in values or []:
        most = 3 if role == "prefill" else 2  # --prefill URL [BOOTSTRAP_PORT [TOKEN_PORT]]
        if not v or len(v) > most or not v[0].startswith(("http://", "https://")):
            want = {"main": "SITE", "prefill": "BOOTSTRAP_PORT [TOKEN_PORT]"}.get(role, "PORT")
            raise SystemExit(f"{flag}: expected URL [{want}], got {' '.join(v)}")
        if role == "main":  # --main URL [SITE]
            peers.append(Peer(v[0].rstrip("/"), site=v[1] if len(v) == 2 else ""))
            continue
        port = int(v[1]) if len(v) >= 2 and v[1] != "none" else default_port
        if role == "relay":
            if port is None:
                raise SystemExit(f"{flag} {v[0]}: give the relay's token-channel port (its --pdd-token-port)")
            peers.append(Peer(v[0].rstrip("/"), token_channel=f"tcp://{urlparse(v[0]).hostname}:{port}"))
        else:  # a prefill; with a token port it relays (--pdd-relay local)
            channel = f"tcp://{urlparse(v[0]).hostname}:{int(v[2])}" if len(v) == 3 else None
            peers.append(Peer(v[0].rstrip("/"), bootstrap_port=port, token_channel=channel))
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


def _relay_pool_scale(args, relays: int) -> PoolScaleConfig | None:
    """The relay pool's scale signal (`peers.relay_pool_signal`): on with --ttft-slo-secs and an RLD."""
    if args.relay_slots < 1:
        raise ValueError(f"--relay-slots must be 1 or more, got {args.relay_slots}")
    if not 1 <= args.relay_pool_window_secs <= 3600:
        raise ValueError(f"--relay-pool-window-secs must be 1-3600, got {args.relay_pool_window_secs}")
    if args.ttft_slo_secs <= 0 or relays == 0:
        return None
    top = relays if args.relay_pool_max is None else args.relay_pool_max
    try:
        return PoolScaleConfig(args.relay_pool_instance_price, args.relay_pool_base_price, args.relay_pool_min, top)
    except ValueError:
        raise ValueError(f"--relay-pool-min ({args.relay_pool_min}) must be 0 to --relay-pool-max ({top}), and "
                         f"--relay-pool-instance-price ({args.relay_pool_instance_price:g}) and "
                         f"--relay-pool-base-price ({args.relay_pool_base_price:g}) positive") from None


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
    """The router's flags (`router.flags`), each with its help and default."""
    return flags.build_parser(__doc__.split("\n")[0])


def _signer(has_relays: bool) -> ParamsSigner | None:
    """The signer of P's and MD's PDD parameters, from the secret RLD and MD hold; relays need it."""
    try:
        secret = keys.optional_secret()
        signer = ParamsSigner(secret) if secret else None
    except ValueError as e:
        raise SystemExit(f"sglang-pdd router: error: {e}") from None
    if signer is None and has_relays:
        raise SystemExit(f"sglang-pdd router: error: --relay needs {keys.ENV_SECRET} (or {keys.ENV_SECRET_FILE}), "
                         "the secret RLD and MD hold: the router signs each request's PDD parameters with it, "
                         "and P and MD refuse unsigned ones")
    return signer


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        role_key = role_auth.export(args.role_api_key)  # the dispatcher's session sends it to every role
    except ValueError as e:
        raise SystemExit(f"sglang-pdd router: error: {e}") from None
    if role_key is None and not args.insecure_roles:
        raise SystemExit(f"sglang-pdd router: error: no role key: {role_auth.MISSING}")
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s] %(name)s: %(message)s")
    door, api_keys = _front_door(args)
    from transformers import AutoTokenizer

    try:
        choice = ChoiceConfig(args.peer_policy, load_s=args.choice_load_s, usage_s=args.choice_kv_usage_s,
                              balance_abs=args.balance_abs_threshold, balance_rel=args.balance_rel_threshold)
    except ValueError as e:
        raise SystemExit(f"--policy/--choice-*/--balance-*: {e}") from None
    prefill = PeerPool("prefill", _peer_args(args.prefill, "prefill", 8998, "--prefill"), args.peer_policy, choice)
    relay = PeerPool("relay", _peer_args(args.relay, "relay", None, "--relay"), args.peer_policy, choice)
    main_ = PeerPool("main", _peer_args(args.main, "main", None, "--main"), args.peer_policy, choice)
    kv_events = _kv_event_args(args.main_kv_events, main_.peers, args.kv_events_topic)
    tok = AutoTokenizer.from_pretrained(args.tokenizer_path)
    kvb = args.kv_bytes_per_token or kv_bytes.from_config(args.tokenizer_path)
    rtt = args.wan_rtt_ms / 1000
    bandwidth = BandwidthEstimator(args.wan_mbit * 1e6 / 8, rtt_s=rtt)
    links = _site_links(args.site, main_.peers, bandwidth, rtt)
    if args.ttft_slo_secs > 0 and args.allow_relay_only:
        raise SystemExit("--ttft-slo-secs is not supported with --allow-relay-only (an experiment without an SLA)")
    policy = PipelinePolicy(PipelinePolicyConfig(kv_bytes_per_token=kvb, wan_budget_s=args.wan_budget_s,
                                                 odd_output_threshold=args.odd_output_threshold,
                                                 allow_relay_only=args.allow_relay_only,
                                                 relay_only_below_hit=args.relay_only_below_hit,
                                                 rld_tpot_s=args.rld_tpot_ms / 1000,
                                                 ttft_slo_s=args.ttft_slo_secs),
                            bandwidth, rtt_s=rtt, links=links)
    model_name = args.model_name or args.tokenizer_path.rstrip("/").split("/")[-1]
    openai = openai_frontend(args, model_name)
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
        pool_scale = _relay_pool_scale(args, len(relay.peers))
        d = Dispatcher(prefill, relay, main_, DispatchConfig(args.pipeline, args.request_timeout, args.bandwidth_poll_s,
                                                             load_poll_s=args.load_poll_s,
                                                             migration_limit=args.migration_limit,
                                                             health_check_s=args.health_check_s,
                                                             idle_timeout_s=idle,
                                                             idle_per_token_s=args.idle_per_token_s,
                                                             migration_rate_per_s=args.migration_rate,
                                                             migration_burst=args.migration_burst,
                                                             migration_jitter_s=args.migration_jitter_s,
                                                             role_lock_s=0.0 if args.insecure_roles else 2.0,
                                                             relay_slots=args.relay_slots,
                                                             relay_pool_scale=pool_scale,
                                                             relay_pool_window_s=args.relay_pool_window_secs),
                       decode=functools.partial(tok.decode, skip_special_tokens=True), policy=policy,
                       kv_events=kv_events, signer=_signer(bool(relay.peers)),
                       kept_stop_ids=openai.kept_stop_ids if openai is not None else frozenset())
    except ValueError as e:
        raise SystemExit(f"sglang-pdd router: {e}") from None
    limits = ModelLimits.from_model_dir(args.tokenizer_path, args.context_length)
    if not args.max_body_mb_in_flight >= args.max_body_mb > 0:
        raise SystemExit(f"sglang-pdd router: --max-body-mb-in-flight ({args.max_body_mb_in_flight:g}) must be at "
                         f"least --max-body-mb ({args.max_body_mb:g}), and both positive")
    app = RouterApp(d, tok, model_name, args.default_max_tokens,
                    limits=limits, max_body_bytes=int(args.max_body_mb * (1 << 20)), door=door,
                    api_keys=tuple(api_keys), tokenizer_workers=args.tokenizer_threads,
                    tokenizer_queue=args.tokenizer_queue, openai=openai,
                    max_body_bytes_in_flight=int(args.max_body_mb_in_flight * (1 << 20)), grammar=_grammar(args))
    if app.grammar.available and args.grammar_start == "startup":
        app.grammar.start()  # the workers (a forkserver importing xgrammar) before the first grammar
    elif not app.grammar.available:
        logging.getLogger(__name__).warning("sglang-pdd router: xgrammar is not installed beside the router: requests "
                                            "with a grammar (json_schema, regex, ebnf, structural_tag, "
                                            "response_format, tools) are refused (400)")
    logging.getLogger(__name__).info("sglang-pdd router: %d prefill, %d relay, %d main; pipeline %s",
                                     len(prefill.peers), len(relay.peers), len(main_.peers), args.pipeline)
    app.serve(args.host, args.port)
    return 0


def openai_frontend(args, model_name: str):
    """sglang's OpenAI chat layer for the router (`router.api.openai.sglang_server`), or None for the builtin one;
    a flag that cannot be served is refused here, naming it."""
    import importlib.util

    wants = [f for f, v in (("--tool-call-parser", args.tool_call_parser), ("--reasoning-parser", args.reasoning_parser),
                            ("--chat-template", args.chat_template)) if v is not None]
    have = importlib.util.find_spec("sglang") is not None
    if args.openai_frontend == "builtin" or (args.openai_frontend == "auto" and not have):
        if wants:
            why = "--openai-frontend builtin" if have else "sglang is not installed beside the router"
            raise SystemExit(f"sglang-pdd router: {', '.join(wants)} need sglang's OpenAI layer ({why})")
        return None
    if not have:
        raise SystemExit("sglang-pdd router: --openai-frontend sglang needs sglang installed beside the router")
    from sglang_pdd.router.api.openai.sglang_server import OpenAIConfig, SglangOpenAI

    try:
        return SglangOpenAI(OpenAIConfig(args.tokenizer_path, model_name, args.tool_call_parser,
                                         args.reasoning_parser, args.chat_template))
    except ValueError as e:
        raise SystemExit(f"sglang-pdd router: {e}") from None


def _grammar(args) -> GrammarBounds:
    try:
        return GrammarBounds(args.grammar_compile_timeout_s, args.grammar_compile_memory_mb, args.grammar_workers)
    except ValueError as e:
        raise SystemExit(f"sglang-pdd router: error: {e}") from None


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
