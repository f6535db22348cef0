"""The router's command line: every flag, its help and its default (`--help` shows each).

Where sglang-router (sgl-router) has a flag of the same meaning its name is the main one, and ours stays
as an alias on the same argument: `--tokenizer-path` (`--tokenizer`), `--policy` (`--peer-policy`; its
`cache_aware` and `round_robin` spellings are accepted too), `--request-timeout-secs`
(`--request-timeout`), `--health-check-interval-secs` (`--health-check-s`); `--host`, `--port`,
`--api-key`, `--log-level`, `--balance-abs-threshold`, `--balance-rel-threshold` and `--prefill URL
BOOTSTRAP_PORT` are named as there. The others are the router's own (sgl-router's
`--max-concurrent-requests` queues what is over it, `--max-in-flight` refuses it; `--max-payload-size`
is in bytes, `--max-body-mb` in MB), time flags with an `-s` suffix among them.
"""

from __future__ import annotations

import argparse

from sglang_pdd.policy.peer_choice import POLICIES, ChoiceConfig
from sglang_pdd.router.peers import role_auth
from sglang_pdd.router.api.client_auth import ENV_API_KEY
from sglang_pdd.router.request.dispatch import PIPELINE_MODES
from sglang_pdd.router.api.front_door import FrontDoorConfig
from sglang_pdd.router.api.grammar.guard import GrammarBounds

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")  # sglang-router's


def _shown(value) -> str:
    if value is None or value == []:
        return "none"
    if value == "":
        return "''"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


class HelpWithDefaults(argparse.HelpFormatter):
    """Each flag's help ends with its default, or says it is required; a help that states its default
    itself ("(default ...") is left as it is, so none is said twice."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.default is argparse.SUPPRESS:
            return text
        if action.required:
            return f"{text} (required)"
        return f"{text} (default: {_shown(action.default).replace('%', '%%')})"


def _non_negative(value: str) -> float:
    v = float(value)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return v


def _policy(value: str) -> str:
    """A peer policy; sglang-router's spellings (cache_aware, round_robin) too."""
    return value.replace("_", "-")


def build_parser(description: str = "the PDD router") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.router", description=description,
                                 formatter_class=HelpWithDefaults)
    # -- the roles ---------------------------------------------------------------------------
    ap.add_argument("--prefill", nargs="+", action="append", metavar=("URL", "BOOTSTRAP_PORT"), required=True,
                    help="a prefill server, and its PD bootstrap port (8998 when not given); may be repeated. A third "
                         "value, TOKEN_PORT, names a prefill that relays (its --pdd-relay local and --pdd-token-port): "
                         "a request relayed from it is relayed on it (no RelayDecode copy)")
    ap.add_argument("--relay", nargs="+", action="append", metavar=("URL", "TOKEN_PORT"), default=[],
                    help="a RelayDecode server, and its token-channel port (its --pdd-token-port); may be "
                         "repeated (none: every request goes P->MD, and --pipeline must be direct)")
    ap.add_argument("--main", nargs="+", action="append", metavar=("URL", "SITE"), required=True,
                    help="a MainDecode server, and the site it runs in (its WAN link: --site); may be repeated")
    ap.add_argument("--site", nargs=3, action="append", metavar=("NAME", "MBIT", "RTT_MS"), default=[],
                    help="a site of MainDecode servers and its WAN link's initial bandwidth estimate and RTT "
                         "(each --main without a site uses --wan-mbit and --wan-rtt-ms)")
    ap.add_argument("--main-kv-events", nargs="+", action="append", metavar=("ENDPOINT", "REPLAY_ENDPOINT"),
                    default=[], help="one per --main, same order: where that MD publishes its KV events "
                    "(its --kv-events-config endpoint and replay_endpoint, e.g. tcp://MD:5557 tcp://MD:5558; "
                    "'none': no events). The router then routes on MD's exact cache; while the events "
                    "cannot be trusted (lost and not replayable) it falls back to its approximate view")
    ap.add_argument("--kv-events-topic", default="", help="the topic of MD's --kv-events-config")
    # -- the model and the front ---------------------------------------------------------------
    ap.add_argument("--tokenizer-path", "--tokenizer", dest="tokenizer_path", required=True, metavar="PATH",
                    help="model or tokenizer directory (chat template, detokenization, config.json)")
    ap.add_argument("--model-name", default=None,
                    help="the model's name in /v1/models and replies (default: the last part of --tokenizer-path)")
    ap.add_argument("--openai-frontend", choices=("auto", "sglang", "builtin"), default="auto",
                    help="who serves /v1/chat/completions: sglang's own OpenAI chat layer (tools, response_format, "
                         "reasoning, logprobs: needs sglang installed beside the router), the router's builtin one "
                         "(text only), or auto: sglang's where it is installed (default: auto)")
    ap.add_argument("--tool-call-parser", default=None, metavar="NAME",
                    help="sglang's tool-call parser for the model's tool calls, as sglang's server takes it "
                         "(e.g. qwen25, llama3, deepseekv3; default: none, tool calls come back as text)")
    ap.add_argument("--reasoning-parser", default=None, metavar="NAME",
                    help="sglang's reasoning parser, as sglang's server takes it (e.g. qwen3, deepseek-r1; "
                         "default: none, reasoning stays in the content)")
    ap.add_argument("--chat-template", default=None, metavar="PATH_OR_NAME",
                    help="a chat template in place of the tokenizer's, as sglang's server takes it (default: the "
                         "tokenizer's)")
    ap.add_argument("--host", default="127.0.0.1", help="the address to serve on")
    ap.add_argument("--port", type=int, default=8000, help="the port to serve on")
    ap.add_argument("--log-level", default="info", type=str.lower, choices=LOG_LEVELS, help="the router's log level")
    # -- choosing the pipeline and the servers ----------------------------------------------------
    ap.add_argument("--pipeline", choices=PIPELINE_MODES, default="auto",
                    help="auto: the pipeline policy decides (MD's missed KV's predicted WAN time against "
                         "--wan-budget-s); relay: always P->RLD->MD; direct: always P->MD")
    ap.add_argument("--policy", "--peer-policy", dest="peer_policy", type=_policy, choices=POLICIES,
                    default="cache-aware", metavar="POLICY",
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
    ap.add_argument("--kv-bytes-per-token", type=int, default=None,
                    help="KV bytes per token, for --pipeline auto (default: from the model's config.json: K and V per "
                         "KV head and layer, or MLA's latent and rope key per layer)")
    ap.add_argument("--wan-mbit", type=float, default=1000.0, help="the WAN's initial bandwidth estimate (Mbit/s)")
    ap.add_argument("--wan-rtt-ms", type=float, default=20.0, help="the WAN's round-trip time (ms)")
    ap.add_argument("--wan-budget-s", type=float, default=0.5,
                    help="auto: P->MD when MD's missed KV crosses the WAN within this (--ttft-slo-secs "
                         "replaces it)")
    ap.add_argument("--ttft-slo-secs", type=_non_negative, default=0.0, metavar="SECONDS",
                    help="auto: the TTFT SLA. Above 0, P->MD when MD's missed KV, queued behind what P's lane "
                         "already holds for that site, crosses the WAN within half of it; else relayed only "
                         "while the chosen P has no queue, else P->MD (default 0: --wan-budget-s, relay "
                         "whenever over it)")
    ap.add_argument("--relay-slots", type=int, default=16, metavar="N",
                    help="with --ttft-slo-secs: requests one RLD takes at once before the relay placement counts "
                         "it full (set it to RLD's --max-running-requests or less); a full RLD relays nothing more")
    ap.add_argument("--relay-pool-min", type=int, default=0, metavar="N",
                    help="with --ttft-slo-secs: the fewest RLD instances the scale signal asks for "
                         "(sglang_pdd_router_relay_pool_target)")
    ap.add_argument("--relay-pool-max", type=int, default=None, metavar="N",
                    help="... and the most (default: the number of --relay addresses)")
    ap.add_argument("--relay-pool-instance-price", type=float, default=8.0, metavar="PRICE",
                    help="one RLD instance's price per hour, and --relay-pool-base-price the rest of the "
                         "deployment's (P and MD), in any one unit: an instance pays once the share of requests "
                         "the line puts over the SLA is its share of the bill")
    ap.add_argument("--relay-pool-base-price", type=float, default=72.0, metavar="PRICE",
                    help="see --relay-pool-instance-price (the defaults: the paper deployment's 8 of 72 accelerators)")
    ap.add_argument("--relay-pool-window-secs", type=int, default=30, metavar="SECONDS",
                    help="the scale signal counts the requests placed over this window (1-3600)")
    ap.add_argument("--odd-output-threshold", type=int, default=500,
                    help="auto: a request with fewer output tokens whose WAN transfer would outlast its "
                         "decode on RLD is odd traffic, served P->RLD alone (0 turns this off)")
    ap.add_argument("--rld-tpot-ms", type=float, default=50.0,
                    help="expected RLD time per output token (odd traffic: decode on RLD vs the WAN)")
    ap.add_argument("--allow-relay-only", action="store_true",
                    help="experiment only (docs/sim.md, Oscillation): let requests whose MD hit is below "
                         "--relay-only-below-hit finish on RLD alone; MD's cache then falls behind")
    ap.add_argument("--relay-only-below-hit", type=float, default=0.9,
                    help="with --allow-relay-only: the MD hit rate below which a request finishes on RLD alone")
    ap.add_argument("--bandwidth-poll-s", type=float, default=2.0,
                    help="read prefill's completed-transfer counters this often to update the WAN "
                         "bandwidth estimate (0: keep --wan-mbit)")
    # -- deadlines, failures, migration -------------------------------------------------------------
    ap.add_argument("--request-timeout-secs", "--request-timeout", dest="request_timeout", type=float,
                    default=600.0, metavar="SECONDS",
                    help="the longest any request may take, migrations included: past it the request ends "
                         "with a 504, which is not counted against the server that served it")
    for role, default, what in (("prefill", 600.0, "P's reply (it answers once its KV went out)"),
                                ("relay", 120.0, "RLD's next stream chunk"),
                                ("main", 180.0, "MD's next stream chunk (its first comes after the handoff: "
                                                "keep this above MD's --pdd-handoff-timeout)")):
        ap.add_argument(f"--{role}-idle-timeout", type=float, default=default, metavar="SECONDS",
                        help=f"end a request with a 504 when {what} takes longer than this")
    ap.add_argument("--migration-limit", type=int, default=1,
                    help="re-issue a request whose serving role failed mid-stream (unreachable, 5xx, an abort "
                         "the router did not ask for, an idle deadline) this many times, from its prompt plus "
                         "the tokens already streamed, on a healthy path (0: the client gets the error; a request "
                         "whose MD fails then cannot fall back to RLD alone)")
    ap.add_argument("--health-check-interval-secs", "--health-check-s", dest="health_check_s", type=float,
                    default=2.0, metavar="SECONDS",
                    help="look at each peer out of service this often: once its back-off is over, a one-token "
                         "probe generate it serves takes it back, on probation (0: never; it then gets a try "
                         "when its back-off is over)")
    ap.add_argument("--migration-jitter-s", type=float, default=0.1,
                    help="each migration first waits a random delay up to this (0: none), so that a dead MD's "
                         "streams do not all re-prefill on P at once")
    ap.add_argument("--migration-rate", type=float, default=20.0,
                    help="migrations per second, all requests together (a token bucket; 0: no limit); over it "
                         "a request fails with a 503 instead of migrating")
    ap.add_argument("--migration-burst", type=int, default=40,
                    help="migrations the bucket allows at once after a quiet spell")
    ap.add_argument("--idle-per-token-s", type=float, default=1.0,
                    help="added to a request's idle deadlines for each token its own stream_interval (beyond the "
                         "first) and its longest stop string (in UTF-8 bytes) may hold a chunk back")
    ap.add_argument(role_auth.FLAG, default=None, metavar="KEY",
                    help=f"the key the roles were started with (sglang's --api-key): the router sends it to P, RLD "
                         f"and MD on every call. Prefer {role_auth.ENV_KEY} or {role_auth.ENV_KEY_FILE} (a command "
                         "line is visible to `ps`) (default: none; the router then refuses to start unless "
                         "--insecure-roles)")
    ap.add_argument("--insecure-roles", action="store_true",
                    help="call roles whose API is open: start without a role key, and serve through a role that "
                         "answers without one. Without it the router refuses to start with no role key, and with "
                         "one it asks every role (at start-up, then every 2 s until it asks for the key, every "
                         "60 s after) for GET /model_info without the key: a role that answers is refused service "
                         "(no request goes to it; /ready says so) until it asks for the key (docs/faults.md, "
                         "\"Who may talk to a role\"). For a test or a private network only: anyone who "
                         "reaches an open role's port can abort every request, flush its cache or load other weights")
    _front_door_flags(ap)
    return ap


def _front_door_flags(ap: argparse.ArgumentParser) -> None:
    """The front door (router.api.front_door, router.api.in_flight, router.api.client_auth) and request limits."""
    door = FrontDoorConfig()
    ap.add_argument("--context-length", type=int, default=None,
                    help="refuse (400) prompts + max tokens beyond this (default: the model's "
                         "max_position_embeddings; set it to the servers' --context-length)")
    ap.add_argument("--max-body-mb", type=float, default=64.0, help="refuse (413) request bodies over this (MB)")
    ap.add_argument("--max-body-mb-in-flight", type=float, default=256.0,
                    help="request bodies the router holds at once, all clients together (MB); a body that does not "
                         "fit what is left gets 503 with Retry-After as its bytes arrive (default 256: four bodies of "
                         "the default --max-body-mb; --max-in-flight alone would let 1024 x 64 MB in)")
    ap.add_argument("--default-max-tokens", type=int, default=128,
                    help="max tokens for a request that gives none")
    ap.add_argument("--header-timeout-s", type=float, default=door.header_timeout_s,
                    help="close a connection whose first request line and headers are not complete this long "
                         "after it opened (later requests on a kept-alive connection: --keepalive-timeout-s)")
    ap.add_argument("--body-timeout-s", type=float, default=door.body_timeout_s,
                    help="answer 408 and close when a request's body has not arrived this long after its headers "
                         "(a 64 MB body in 30 s needs ~17 Mbit/s)")
    ap.add_argument("--keepalive-timeout-s", type=float, default=door.keepalive_timeout_s,
                    help="close a kept-alive connection idle (or mid-headers) this long after its last response")
    ap.add_argument("--max-connections", type=int, default=door.max_connections,
                    help="open client connections at most; over it a new one gets 503 with Retry-After and is "
                         f"closed (default {door.max_connections}: well below a default 65k fd limit, and "
                         "several connections per request in flight)")
    ap.add_argument("--max-in-flight", type=int, default=door.max_in_flight,
                    help="requests served at once (body read, tokenization, generation); over it 503 with "
                         f"Retry-After (default {door.max_in_flight}: each holds up to --max-body-mb of body and "
                         "a request on every role; the probes and /metrics are not counted)")
    ap.add_argument("--max-in-flight-per-client", type=int, default=door.max_in_flight_per_client,
                    help="requests served at once per client (its API key with --api-key, else its address; "
                         f"behind a proxy, the proxy's); over it 429 with Retry-After (default "
                         f"{door.max_in_flight_per_client}: a quarter of --max-in-flight, so one client cannot "
                         "take the router)")
    ap.add_argument("--tokenizer-threads", type=int, default=4,
                    help="threads parsing and tokenizing request bodies")
    ap.add_argument("--tokenizer-queue", type=int, default=64,
                    help="requests waiting for a tokenizer thread at most; over it 503 with Retry-After "
                         "(default 64: a longer wait means tokenization is the bottleneck and clients should "
                         "back off)")
    grammar = GrammarBounds()
    ap.add_argument("--grammar-compile-timeout-s", type=float, default=grammar.timeout_s,
                    help="a request's grammar (json_schema, regex, ebnf, structural_tag; a chat body's response_format "
                         "and tools) must compile within this, wall clock and CPU, in one of the router's grammar "
                         "workers before any role sees it; else 400 naming the field (every role would compile it "
                         "in its scheduler's process, unstoppable)")
    ap.add_argument("--grammar-compile-memory-mb", type=int, default=grammar.memory_mb,
                    help="memory a grammar's compile may take in a grammar worker (its address space past what it "
                         "holds at rest); past it 400 naming the field")
    ap.add_argument("--grammar-workers", type=int, default=grammar.workers,
                    help="grammar worker processes (one compile each at a time; a worker past a bound is killed and "
                         "replaced); with four compiles waiting per worker, more are 503 with Retry-After")
    ap.add_argument("--grammar-start", choices=("startup", "first-use"), default="startup",
                    help="when the grammar workers start (a forkserver importing xgrammar and torch: seconds of CPU): "
                         "at start-up, before the first grammar; or at the first request with a grammar, which then "
                         "waits for them (a router that may never see a grammar: the test harness's) (default: "
                         "startup)")
    ap.add_argument("--api-key", action="append", default=None, metavar="KEY",
                    help="clients must send Authorization: Bearer KEY (else 401); may be repeated, one key per "
                         "client (the per-client cap then counts per key). Prefer the environment variable "
                         f"{ENV_API_KEY} (one key or several, comma-separated; a command line is visible to "
                         "`ps`); the flag wins when both are set. /live, /ready, /health and /metrics stay open "
                         "(probes, Prometheus) (default: none: the router is open)")
