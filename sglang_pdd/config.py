"""PddConfig: the only place that reads `--pdd-*` flags and `SGLANG_PDD_*` environment variables
(but the test-only ones, which `test_switches` reads, and the token channel's keys, which
`protocol.keys` reads; `from_cli_args` checks those at start-up).

Flags are declared once in `FLAGS`; `add_cli_args` adds them to sglang's parser, `from_cli_args`
turns a parsed namespace into a validated, frozen `PddConfig`. The launcher hands the config to its
children (schedulers, detokenizer) in two ways: as bookkeeping on the pickled `ServerArgs` and as
`SGLANG_PDD_CONFIG` (JSON) in the environment they inherit, which also reaches processes that do not
receive `ServerArgs` and code that runs before it arrives (plugin loading).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

from sglang_pdd.protocol import keys
from sglang_pdd.server.roles import ROLE_CHOICES, Role

ENV_CONFIG = "SGLANG_PDD_CONFIG"  # JSON of PddConfig, set by the launcher for its children
SGLANG_DEFAULT_HOST = "127.0.0.1"  # sglang's --host when not given (the relay's token channel binds there)
# Test only, read by sglang_pdd.test_switches: "1" honours the negative control `drop_eager_kv`, and
# the path of a JSON file of `TestKnobs`, re-read when used (so a test can flip them at run time).
ENV_TESTING = "SGLANG_PDD_TESTING"
ENV_TEST_KNOBS = "SGLANG_PDD_TEST_KNOBS"


class PddConfigError(ValueError):
    """A `--pdd-*` flag (or its combination with sglang's flags) is invalid."""


@dataclass(frozen=True)
class FlagSpec:
    name: str  # PddConfig field
    type: type
    default: Any
    help: str
    choices: tuple | None = None

    @property
    def flag(self) -> str:
        return "--pdd-" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return "pdd_" + self.name


FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec("role", str, None, "PDD role of this server; without it the server is plain sglang.",
             choices=ROLE_CHOICES),
    FlagSpec("token_port", int, None, "relay: port of the token channel MainDecode connects to "
             "(binds on this server's --host)."),
    FlagSpec("relay", str, "off", "prefill: 'local' makes this P a relay target: a request the router relays "
             "to it stays on P after its prefill, P decodes it in its own batches between prefill steps and hands "
             "it to MainDecode by token IDs over the token channel (--pdd-token-port), as RelayDecode does; no "
             "RelayDecode instance, no second copy of the KV (docs/local-relay.md).", choices=("off", "local")),
    FlagSpec("main_bootstrap_timeout", float, 30.0, "prefill: seconds to wait for MainDecode's handshake "
             "before giving up its WAN path (the relay path is never held back)."),
    FlagSpec("relay_finished_kv", str, "keep", "main: when RelayDecode finishes a relayed request itself, "
             "'keep' lets MD's KV transfer land and keeps it in the radix cache (MD's cache stays aligned "
             "with P's: the next turn hits), 'abort' cancels the WAN transfer.", choices=("keep", "abort")),
    FlagSpec("handoff_mode", str, "adaptive", "main: how RelayDecode hands a request over: 'one-shot' (all "
             "eager tokens, one EXTEND), 'catch-up' (chunks while RLD keeps decoding, then a final step), "
             "'adaptive' (RLD picks per request from its load and MD's batch).",
             choices=("one-shot", "catch-up", "adaptive")),
    FlagSpec("catchup_chunk", int, 32, "main: tokens per catch-up chunk (the largest EXTEND a handoff adds "
             "to MD's step)."),
    FlagSpec("catchup_gap", int, 2, "main: catch-up ends once at most this many eager tokens remain."),
    FlagSpec("handoff_attention", str, "auto", "main: attention of the handoff EXTEND: 'auto' runs "
             "sglang-pdd's split-KV handoff kernel where it applies (CUDA, fp16/bf16, a plain MHA KV pool of "
             "the same dtype, no logit cap, sliding window, sinks or MLA) and sglang's attention backend "
             "elsewhere; 'sglang' always uses sglang's backend.", choices=("auto", "sglang")),
    FlagSpec("packed_wan", str, "off", "prefill and main: the packed WAN path. On main, 'plain' or 'fp8' "
             "offers P a landing region per request, so P packs the request's missed KV (all layers, K and V) "
             "into a few large writes instead of one per page run, layer and K/V (fp8: e4m3 with per-block scales, "
             "lossy, see docs/kernels.md); on prefill, anything but 'off' honours those offers. A request "
             "without an offer, or that does not fit, goes page by page.", choices=("off", "plain", "fp8")),
    FlagSpec("packed_wan_mb", int, 512, "main: MiB of host memory for packed-WAN landing regions (a request "
             "that does not fit goes page by page)."),
    FlagSpec("packed_staging_bytes", int, 64 << 20, "prefill: largest packed-WAN block in bytes (the staging "
             "buffer each transfer worker packs into; a chunk goes as several blocks when larger, at least one "
             "page each)."),
    FlagSpec("adaptive_md_batch", int, 8, "relay: adaptive handoff picks one-shot while MainDecode runs at "
             "most this many requests (a one-shot EXTEND stalls few)."),
    FlagSpec("adaptive_rld_running", int, 48, "relay: adaptive handoff picks one-shot (frees the relay at once) "
             "while this relay runs at least this many requests."),
    FlagSpec("adaptive_rld_kv", float, 0.8, "relay: adaptive handoff picks one-shot while this relay's KV pool "
             "usage is at least this fraction."),
    FlagSpec("token_curve", str, "auto", "relay and main: encrypt the token channel with ZMQ CURVE. The relay "
             "holds the secret key, MD the relay's public key, each in SGLANG_PDD_TOKEN_CURVE_KEY or the file "
             "SGLANG_PDD_TOKEN_CURVE_KEY_FILE names (python -m sglang_pdd.protocol.curve OUTDIR makes a pair). "
             "The relay admits only the MD public keys in SGLANG_PDD_TOKEN_CURVE_CLIENTS(_FILE) ('*': any), MD "
             "holds its own secret key in SGLANG_PDD_TOKEN_CURVE_CLIENT_KEY(_FILE). "
             "'auto' (default): on when a key is configured; without one a relay whose --host is not a "
             "loopback address (its token channel reachable from other hosts) refuses to start; 'on': refuse "
             "to start without a key; 'off': never encrypt (the explicit opt-out: a private or encrypted link).",
             choices=("auto", "on", "off")),
    FlagSpec("seeded_sampling", str, "auto", "any server: honour a request's sampling_seed (OpenAI `seed`) "
             "with sglang's position-hashed sampler, so a sampled request gives the same tokens whichever "
             "role samples which token (P the first, RLD the eager ones, MD the rest) and on a single "
             "server with this flag. sglang itself honours seeds only under --enable-deterministic-inference, "
             "which needs a CUDA attention backend. 'auto': on for every PDD role, off on plain servers.",
             choices=("auto", "on", "off")),
    FlagSpec("relays", str, "", "main: the relays this server trusts, as a comma-separated list of their token "
             "channels (tcp://host:port, as the router's --relay names them). A relayed request naming any other "
             "relay ends with an error; empty: no relayed request is accepted (P->MD only)."),
    FlagSpec("kv_timeout", float, 300.0, "main: seconds a relayed request may wait for its KV (admitted, or "
             "draining after the relay finished it) before MainDecode aborts it."),
    FlagSpec("handoff_timeout", float, 60.0, "main: seconds to wait for RelayDecode's eager tokens after "
             "the KV arrived before the request fails cleanly; relay: seconds a relayed request may wait "
             "for MainDecode after it finished locally."),
    FlagSpec("idle_wait_ms", float, None, "any server: with nothing to compute but transfers, handoffs or "
             "bootstraps in flight, sglang's scheduler loop spins (on_idle returns after sleep(0)); with this, it "
             "waits on its request sockets, the token channel and Mooncake's status updates for at most this many "
             "ms instead (docs/idle.md). 0: spin as upstream. Default: 5 on a PDD role, 0 on a plain server."),
    FlagSpec("transfer_poll_ms", float, None, "any server: Mooncake's synchronous batch write spins a core "
             "on its status until the write completes (seconds over a WAN); with this, the plugin submits the "
             "write and polls it with sleeps backing off from 0.05 ms to this many ms. 0: Mooncake's own spin. "
             "Default: 1 on a PDD role, 0 on a plain server."),
)

# What --pdd-idle-wait-ms and --pdd-transfer-poll-ms mean when not given: on for the PDD roles.
ROLE_IDLE_WAIT_MS = 5.0
ROLE_TRANSFER_POLL_MS = 1.0


@dataclass(frozen=True)
class PddConfig:
    role: Role | None = None
    token_port: int | None = None
    relay: str = "off"
    relay_finished_kv: str = "keep"
    main_bootstrap_timeout: float = 30.0
    handoff_timeout: float = 60.0
    handoff_mode: str = "adaptive"
    catchup_chunk: int = 32
    catchup_gap: int = 2
    adaptive_md_batch: int = 8
    adaptive_rld_running: int = 48
    adaptive_rld_kv: float = 0.8
    handoff_attention: str = "auto"
    packed_wan: str = "off"
    packed_wan_mb: int = 512
    packed_staging_bytes: int = 64 << 20
    seeded_sampling: str = "auto"
    token_curve: str = "auto"
    relays: str = ""
    kv_timeout: float = 300.0
    idle_wait_ms: float | None = None
    transfer_poll_ms: float | None = None

    @property
    def active(self) -> bool:
        return self.role is not None

    @property
    def relays_locally(self) -> bool:
        """A prefill that decodes the requests relayed to it (`--pdd-relay local`)."""
        return self.role is Role.PREFILL and self.relay == "local"

    @property
    def relay_set(self) -> frozenset[str]:
        """The token channels named by `--pdd-relays`."""
        return frozenset(a.strip() for a in self.relays.split(",") if a.strip())

    @property
    def idle_wait_s(self) -> float:
        """How long an idle scheduler with work in flight waits (0: it spins, as upstream)."""
        ms = self.idle_wait_ms if self.idle_wait_ms is not None else (ROLE_IDLE_WAIT_MS if self.active else 0.0)
        return ms / 1000.0

    @property
    def transfer_poll_s(self) -> float:
        """The longest sleep between status checks of a Mooncake write (0: Mooncake's own spin)."""
        ms = self.transfer_poll_ms if self.transfer_poll_ms is not None else (
            ROLE_TRANSFER_POLL_MS if self.active else 0.0)
        return ms / 1000.0

    @property
    def honours_seeds(self) -> bool:
        return self.seeded_sampling == "on" or (self.seeded_sampling == "auto" and self.active)

    def to_json(self) -> str:
        d = asdict(self)
        d["role"] = self.role.value if self.role else None
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "PddConfig":
        try:
            d = json.loads(text)
        except ValueError as e:
            raise PddConfigError(f"{ENV_CONFIG} is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise PddConfigError(f"{ENV_CONFIG} must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise PddConfigError(f"{ENV_CONFIG}: unknown keys {unknown}")
        return cls._checked(d)

    @classmethod
    def _checked(cls, d: dict) -> "PddConfig":
        role = d.get("role")
        if role is not None and role not in ROLE_CHOICES:
            raise PddConfigError(f"--pdd-role: invalid choice {role!r} (choose from {', '.join(ROLE_CHOICES)})")
        port = d.get("token_port")
        if port is not None and not 0 < int(port) < 65536:
            raise PddConfigError(f"--pdd-token-port: {port} is not a TCP port (1..65535)")
        for addr in (a.strip() for a in str(d.get("relays") or "").split(",") if a.strip()):
            if not _is_tcp_endpoint(addr):
                raise PddConfigError(f"--pdd-relays: {addr!r} is not tcp://host:port")
        for name in ("main_bootstrap_timeout", "handoff_timeout", "kv_timeout"):
            if name in d and not float(d[name]) > 0:
                raise PddConfigError(f"--pdd-{name.replace('_', '-')}: must be > 0 seconds, got {d[name]}")
        for spec in FLAGS:  # every flag with choices, as the CLI parser checks them
            if spec.choices and spec.name != "role" and d.get(spec.name, spec.default) not in spec.choices:
                raise PddConfigError(f"{spec.flag}: invalid choice {d[spec.name]!r} ({', '.join(spec.choices)})")
        if "catchup_chunk" in d and not 1 <= int(d["catchup_chunk"]) <= 65536:
            raise PddConfigError(f"--pdd-catchup-chunk: must be 1..65536 tokens, got {d['catchup_chunk']}")
        if "catchup_gap" in d and not 0 <= int(d["catchup_gap"]) <= int(d.get("catchup_chunk", 32)):
            raise PddConfigError(f"--pdd-catchup-gap: must be 0..--pdd-catchup-chunk, got {d['catchup_gap']}")
        if "packed_wan_mb" in d and not 1 <= int(d["packed_wan_mb"]) <= 1 << 20:
            raise PddConfigError(f"--pdd-packed-wan-mb: must be 1..1048576 MiB, got {d['packed_wan_mb']}")
        if "packed_staging_bytes" in d and not 1 <= int(d["packed_staging_bytes"]) <= 1 << 40:
            raise PddConfigError(f"--pdd-packed-staging-bytes: must be 1..2^40, got {d['packed_staging_bytes']}")
        for name in ("adaptive_md_batch", "adaptive_rld_running"):
            if name in d and not int(d[name]) >= 0:
                raise PddConfigError(f"--pdd-{name.replace('_', '-')}: must be >= 0, got {d[name]}")
        if "adaptive_rld_kv" in d and not 0.0 <= float(d["adaptive_rld_kv"]) <= 1.0:
            raise PddConfigError(f"--pdd-adaptive-rld-kv: must be 0..1, got {d['adaptive_rld_kv']}")
        for name in ("idle_wait_ms", "transfer_poll_ms"):
            v = d.get(name)
            if v is not None and not 0.0 <= float(v) <= 1000.0:
                raise PddConfigError(f"--pdd-{name.replace('_', '-')}: must be 0..1000 ms, got {v}")
        types = {spec.name: spec.type for spec in FLAGS}
        rest = {f.name: (d[f.name] if d[f.name] is None else types.get(f.name, lambda x: x)(d[f.name]))
                for f in fields(cls) if f.name != "role" and f.name in d}
        return cls(role=Role(role) if role else None, **rest)

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "PddConfig":
        """The config the launcher exported; an inactive config when there is none."""
        text = (environ if environ is not None else os.environ).get(ENV_CONFIG)
        return cls.from_json(text) if text else cls()

    def export_env(self, environ: dict | None = None) -> None:
        env = environ if environ is not None else os.environ
        if self.active or self != PddConfig():
            env[ENV_CONFIG] = self.to_json()
        else:
            env.pop(ENV_CONFIG, None)

    def describe(self) -> str:
        waits = f", idle wait {self.idle_wait_s * 1e3:g} ms, transfer poll {self.transfer_poll_s * 1e3:g} ms"
        if not self.active:
            return ("role=none (plain sglang)" + (", seeded sampling on" if self.honours_seeds else "")
                    + (waits if self.idle_wait_s or self.transfer_poll_s else ""))
        extra = f", token channel :{self.token_port}" if self.role is Role.RELAY or self.relays_locally else ""
        if self.role is Role.MAIN:
            extra = (f", handoff {self.handoff_mode} (chunk {self.catchup_chunk}, gap {self.catchup_gap}), "
                     f"handoff attention {self.handoff_attention}")
        return f"role={self.role.value}{extra}{waits}"


def _is_tcp_endpoint(addr: str) -> bool:
    host, sep, port = addr.removeprefix("tcp://").rpartition(":")
    return addr.startswith("tcp://") and bool(sep and host) and port.isdigit() and 0 < int(port) < 65536


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sglang-pdd (Prefill -> RelayDecode -> MainDecode)")
    for spec in FLAGS:
        group.add_argument(spec.flag, dest=spec.dest, type=spec.type, default=spec.default,
                           choices=spec.choices, help=spec.help)


def from_cli_args(args: argparse.Namespace, disaggregation_mode: str = "null",
                  decode_radix_cache: bool = False) -> PddConfig:
    """Validate the parsed `--pdd-*` flags against each other and against sglang's PD flags."""
    cfg = PddConfig._checked({s.name: getattr(args, s.dest, s.default) for s in FLAGS})
    if cfg.role is None:
        return cfg
    if disaggregation_mode != cfg.role.disaggregation_mode:
        raise PddConfigError(
            f"--pdd-role {cfg.role.value} runs on --disaggregation-mode {cfg.role.disaggregation_mode}, "
            f"got --disaggregation-mode {disaggregation_mode}"
        )
    if cfg.role is Role.RELAY and cfg.token_port is None:
        raise PddConfigError("--pdd-role relay needs --pdd-token-port (MainDecode connects there for the eager tokens)")
    if cfg.relay != "off" and cfg.role is not Role.PREFILL:
        raise PddConfigError(f"--pdd-relay {cfg.relay} is a prefill's flag (--pdd-role prefill), this is "
                             f"--pdd-role {cfg.role.value}")
    if cfg.relays_locally and cfg.token_port is None:
        raise PddConfigError("--pdd-relay local needs --pdd-token-port (MainDecode connects there for the eager tokens)")
    if cfg.role.needs_decode_radix_cache and not decode_radix_cache:
        raise PddConfigError(
            f"--pdd-role {cfg.role.value} needs --disaggregation-decode-enable-radix-cache "
            "(MainDecode's decode-side radix cache is what keeps WAN bytes low)"
        )
    try:  # the token channel's keys: fail at start-up, not at the first handoff
        if cfg.role in (Role.RELAY, Role.MAIN) or cfg.relays_locally:
            keys.secret()
            if cfg.role is Role.RELAY or cfg.relays_locally:
                keys.curve_clients(cfg.token_curve)  # its key, and the MD keys it admits
                keys.refuse_clear_channel(cfg.token_curve, getattr(args, "host", SGLANG_DEFAULT_HOST))
            else:
                keys.curve_client_key(cfg.token_curve)  # the relay's key, and its own
        else:
            keys.optional_secret()  # a prefill's is optional, but one that is given must be readable
    except keys.ChannelKeyError as e:
        raise PddConfigError(str(e)) from None
    return cfg
