"""What each PDD role is proven with; a role started with anything else exits at start-up.

RelayDecode and MainDecode end and take over requests between two decode steps, in one scheduler
per server (the token channel, the handoff tables and the held requests live in the attention-TP
rank 0 scheduler). Both of sglang's decode loops are proven: the non-overlap loop and the overlap
loop (sglang's default), where a batch's result is processed after the next batch is launched (a
handoff ends a request as sglang's own finish does, its in-flight token dropped; a catch-up chunk's
result is matched by its requests, not by the batch object: docs/overlap.md). With TP > 1 rank 0
decides and the other ranks replay its decisions (rank_sync.py; proven at TP 2 on every role). Until
they are proven elsewhere the decode roles run with no PP, no data parallelism (replicas or DP
attention) and no speculative decoding.
Every role's transfer hooks are Mooncake's (`mooncake`, `mooncake_tcp`).

`unsupported(cfg, args)` reads sglang's parsed flags (an argparse namespace or ServerArgs) and
returns one line per problem, each naming the flag and what to do.
"""

from __future__ import annotations

from typing import Any

from sglang_pdd.config import PddConfig
from sglang_pdd.server.roles import Role

MOONCAKE_BACKENDS = ("mooncake", "mooncake_tcp")


def _int(args: Any, name: str, default: int = 1) -> int:
    value = getattr(args, name, default)
    return default if value is None else int(value)


def unsupported(cfg: PddConfig, args: Any) -> list[str]:
    if not cfg.active:
        return []
    role = f"--pdd-role {cfg.role.value}"
    out = []
    backend = getattr(args, "disaggregation_transfer_backend", "mooncake") or "mooncake"
    if backend not in MOONCAKE_BACKENDS:
        out.append(f"{role} runs only on a Mooncake transfer backend, got --disaggregation-transfer-backend "
                   f"{backend}: use --disaggregation-transfer-backend mooncake (or mooncake_tcp)")
    if cfg.packed_wan != "off" and _int(args, "tp_size") > 1:
        out.append(f"{role} runs the packed WAN path only at --tp-size 1, got --tp-size {_int(args, 'tp_size')} "
                   f"(each rank's landing offer is not proven): drop --pdd-packed-wan {cfg.packed_wan} (Mooncake "
                   "then sends page by page) or run --tp-size 1")
    if cfg.role is Role.PREFILL:
        return out + (_local_relay(args) if cfg.relays_locally else [])
    why = "a handoff ends a request between two decode steps of one scheduler"
    for flag, name in (("--pp-size", "pp_size"), ("--dp-size", "dp_size"), ("--attn-dp-size", "attn_dp_size")):
        if _int(args, name) > 1:
            out.append(f"{role} runs only at {flag} 1, got {flag} {_int(args, name)} ({why}): start one "
                       f"{cfg.role.value} server per GPU with {flag} 1")
    if getattr(args, "enable_dp_attention", False):
        out.append(f"{role} does not run with DP attention ({why}): drop --enable-dp-attention")
    spec = getattr(args, "speculative_algorithm", None)
    if spec:
        out.append(f"{role} does not run with speculative decoding, got --speculative-algorithm {spec} (the "
                   "handoff EXTEND and RLD's eager tokens are proven with one token per step): drop "
                   "--speculative-algorithm")
    return out


def _local_relay(args: Any) -> list[str]:
    """What a prefill that relays (--pdd-relay local) is not proven with yet."""
    flag, out = "--pdd-relay local", []
    for name, dest in (("--tp-size", "tp_size"), ("--pp-size", "pp_size"), ("--dp-size", "dp_size")):
        if _int(args, dest) > 1:
            out.append(f"{flag} runs only at {name} 1, got {name} {_int(args, dest)}: drop {flag} (serve relays "
                       "from a RelayDecode instance) or run one prefill per GPU")
    if getattr(args, "enable_dp_attention", False):
        out.append(f"{flag} does not run with DP attention: drop --enable-dp-attention or {flag}")
    if getattr(args, "speculative_algorithm", None):
        out.append(f"{flag} does not run with speculative decoding: drop --speculative-algorithm or {flag}")
    if not getattr(args, "disable_overlap_schedule", False):
        out.append(f"{flag} runs on sglang's non-overlap prefill loop only (its decode steps ride between the "
                   f"prefill steps of that loop): add --disable-overlap-schedule or drop {flag}")
    if _int(args, "optimistic_prefill_attempts", 0) > 0:
        out.append(f"{flag} relays only requests whose MD handshake came before their prefill: drop "
                   "--optimistic-prefill-attempts")
    if getattr(args, "disaggregation_decode_allocation_policy", None) == "prefill_complete":
        out.append(f"{flag} relays only requests whose MD handshake came before their prefill: drop "
                   "--disaggregation-decode-allocation-policy prefill_complete")
    return out


def unsupported_kv_pool(cfg: PddConfig, pool: Any) -> str | None:
    """A PDD role on a KV pool it is not proven on, as one line (None: proven, or no role). Proven:
    sglang's MHA pools (MHA, GQA, MQA attention: `MHATokenToKVPool` and its subclasses) and MLA pools
    (DeepSeek-V2/V3-style latent KV: `MLATokenToKVPool` and its subclasses, one latent buffer per
    layer): the fan-out, the decode radix cache, the token-ID handoff and MD's EXTEND (on MLA through
    sglang's own MLA extend), the packed WAN path (on the plain classes; the pool view sends any other
    page by page). Not yet: sparse indexed attention (DSA/NSA: DeepSeek-V3.2, `DSATokenToKVPool`),
    sliding-window and hybrid linear-attention pools, whose pages the fan-out and the handoff EXTEND
    have not been checked against."""
    if not cfg.active:
        return None
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool

    role, kind = f"--pdd-role {cfg.role.value}", type(pool).__name__
    if isinstance(pool, DSATokenToKVPool):  # an MLATokenToKVPool subclass
        return (f"{role} does not run on sparse indexed attention (DSA/NSA, DeepSeek-V3.2 class), this model's KV "
                f"pool is {kind} (not proven with PDD): serve this model without --pdd-role")
    if isinstance(pool, MLATokenToKVPool) and cfg.relays_locally:
        return (f"--pdd-relay local is proven on MHA KV pools only, this model's KV pool is {kind} (a relay on P "
                "over latent KV is not tested yet): drop --pdd-relay local (relay through a RelayDecode instance)")
    if isinstance(pool, (MHATokenToKVPool, MLATokenToKVPool)):
        return None
    return (f"{role} runs only on sglang's MHA and MLA KV pools (MHA, GQA, MQA or DeepSeek-style latent "
            f"attention), this model's KV pool is {kind} (sliding-window and hybrid linear attention are not proven "
            "with PDD yet): serve this model without --pdd-role")


def require_kv_pool(cfg: PddConfig, pool: Any) -> None:
    """At the KV manager's start (scheduler start-up): refuse a pool the role is not proven on."""
    problem = unsupported_kv_pool(cfg, pool)
    if problem is not None:
        raise RuntimeError(f"sglang-pdd: error: {problem}")


def validated(args: Any) -> PddConfig:
    """The `--pdd-*` options of `args` (sglang's parsed flags plus the plugin's, by their dest names)
    checked against each other and against sglang's; PddConfigError lists every problem."""
    from sglang_pdd import config

    cfg = config.from_cli_args(
        args,
        disaggregation_mode=getattr(args, "disaggregation_mode", "null") or "null",
        decode_radix_cache=bool(getattr(args, "disaggregation_decode_enable_radix_cache", False)),
    )
    problems = unsupported(cfg, args)
    if problems:
        raise config.PddConfigError("\nsglang-pdd: error: ".join(problems))
    return cfg
