"""The sglang plugin entry point: `load()` registers every hook of sglang-pdd.

sglang calls `load()` through the `sglang.srt.plugins` entry point in every process it starts
(launcher, schedulers, detokenizer), then applies all registered hooks. sglang's registry only *logs*
a target it cannot resolve, which would silently turn the plugin off after an sglang upgrade, so:

* `load()` resolves every target itself first and raises `PluginLoadError` naming the ones that are
  missing (in a process whose launcher configured a PDD role, it exits instead: a relay or main
  server without its hooks must not come up as a plain decode server);
* `require_hooks_applied()` checks, once sglang has applied the hooks, that each of ours is in place;
  the launcher calls it when a role is configured.

On an sglang with the upstream-style series of patches/ applied, a hook whose job an extension point
of the series does (`CAPABILITIES`) is not registered; `load()` logs which path each takes.

Without `--pdd-role` every hook is inert except the input guard (see sglang_pdd.server.input_guard), which
only turns requests that would crash upstream sglang into clear 400 errors.
"""

from __future__ import annotations

import functools
import logging
import pkgutil
from dataclasses import dataclass
from typing import Callable

from sglang_pdd.config import PddConfig

logger = logging.getLogger(__name__)

_SRT = "sglang.srt"


@dataclass(frozen=True)
class Hook:
    target: str
    body: str  # "module:function" under sglang_pdd.hooks, imported only when registering
    kind: str  # HookType name: BEFORE | AFTER | AROUND | REPLACE
    plugin_check: bool = False  # the body is passed `require_hooks_applied` (a hook never imports the plugin)
    retirable: bool = True  # False: kept where a capability retires its target (another hook's job there)

    def resolve_body(self) -> Callable:
        module, _, fn = self.body.partition(":")
        body = getattr(__import__(f"sglang_pdd.hooks.{module}", fromlist=[fn]), fn)
        if self.plugin_check:
            return functools.partial(body, require_hooks_applied=require_hooks_applied)
        return body


HOOKS: tuple[Hook, ...] = (
    Hook(f"{_SRT}.server_args.ServerArgs.add_cli_args", "server_args:after_add_cli_args", "AFTER"),
    Hook(f"{_SRT}.server_args.ServerArgs.from_cli_args", "server_args:after_from_cli_args", "AFTER",
         plugin_check=True),
    Hook(f"{_SRT}.managers.tokenizer_manager.TokenizerManager._validate_one_request",
         "tokenizer:before_validate_one_request", "BEFORE"),
    Hook(f"{_SRT}.distributed.device_communicators.mooncake_transfer_engine.MooncakeTransferEngine"
         ".batch_transfer_sync", "transfer:around_batch_transfer_sync", "AROUND"),
    Hook(f"{_SRT}.disaggregation.mooncake.conn.MooncakeKVManager.send_kvcache",
         "transfer:around_send_kvcache", "AROUND"),
    Hook(f"{_SRT}.disaggregation.mooncake.conn.MooncakeKVManager.send_aux",
         "transfer:around_send_aux", "AROUND"),
    # Prefill: the fan-out sender (RelayDecode gets all the KV, MainDecode its miss) and its main lanes
    Hook(f"{_SRT}.disaggregation.prefill.PrefillBootstrapQueue.create_sender",
         "prefill:around_create_sender", "AROUND"),
    Hook(f"{_SRT}.disaggregation.mooncake.conn.MooncakeKVManager.add_transfer_request",
         "prefill:around_add_transfer_request", "AROUND"),
    Hook(f"{_SRT}.disaggregation.mooncake.conn.MooncakeKVManager.update_status",
         "idle:around_update_status", "AROUND"),  # wakes an idle scheduler; P's refusals (process_state.fanout)
    Hook(f"{_SRT}.managers.scheduler_components.internal_state.SchedulerInternalStateController"
         ".get_internal_state", "server_info:after_get_internal_state", "AFTER"),
    # The packed WAN path (--pdd-packed-wan): MD offers landing regions, P packs into them, MD unpacks
    Hook(f"{_SRT}.disaggregation.prefill.PrefillBootstrapQueue._init_kv_manager",
         "packed_wan:after_init_kv_manager", "AFTER"),
    Hook(f"{_SRT}.disaggregation.decode.DecodePreallocQueue._init_kv_manager",
         "packed_wan:after_init_kv_manager", "AFTER"),
    Hook(f"{_SRT}.disaggregation.mooncake.conn.MooncakeKVManager.build_receiver_metadata_message",
         "packed_wan:around_build_receiver_metadata_message", "AROUND"),
    Hook(f"{_SRT}.disaggregation.mooncake.conn.TransferInfo.from_zmq",
         "packed_wan:after_transfer_info_from_zmq", "AFTER"),
    Hook(f"{_SRT}.disaggregation.common.conn.CommonKVReceiver.poll", "packed_wan:around_receiver_poll", "AROUND"),
    Hook(f"{_SRT}.disaggregation.common.conn.CommonKVReceiver.clear", "packed_wan:after_receiver_release", "AFTER"),
    Hook(f"{_SRT}.disaggregation.common.conn.CommonKVReceiver.abort", "packed_wan:after_receiver_release", "AFTER"),
    # A prefill that relays (--pdd-relay local; inert on other servers): its decode steps between prefill steps,
    # the relayed requests it keeps after their prefill, their transfers, their aborts
    Hook(f"{_SRT}.disaggregation.prefill.PrefillBootstrapQueue._process_req", "prefill_relay:around_process_req",
         "AROUND"),
    Hook(f"{_SRT}.managers.scheduler.Scheduler.get_next_disagg_prefill_batch_to_run",
         "prefill_relay:around_get_next_disagg_prefill_batch_to_run", "AROUND"),
    Hook(f"{_SRT}.managers.scheduler.Scheduler.process_batch_result_disagg_prefill",
         "prefill_relay:around_process_batch_result_disagg_prefill", "AROUND"),
    Hook(f"{_SRT}.managers.scheduler.Scheduler.process_disagg_prefill_inflight_queue",
         "prefill_relay:around_process_disagg_prefill_inflight_queue", "AROUND"),
    Hook(f"{_SRT}.managers.scheduler.Scheduler.is_fully_idle", "prefill_relay:after_is_fully_idle", "AFTER",
         retirable=False),  # patch 0003 retires the decode roles' hook on it, not a prefill's
    Hook(f"{_SRT}.managers.scheduler.Scheduler.abort_request", "prefill_relay:after_abort_request", "AFTER",
         retirable=False),  # patch 0003 retires the decode roles' hook on it, not a prefill's
    # RelayDecode and MainDecode (inert on other servers)
    Hook(f"{_SRT}.managers.scheduler.Scheduler._add_request_to_queue",
         "decode:after_add_request_to_queue", "AFTER"),
    Hook(f"{_SRT}.managers.scheduler.Scheduler.process_decode_queue",
         "decode:around_process_decode_queue", "AROUND"),
    Hook(f"{_SRT}.managers.scheduler.Scheduler.get_next_disagg_decode_batch_to_run",
         "decode:around_get_next_disagg_decode_batch_to_run", "AROUND"),
    Hook(f"{_SRT}.managers.scheduler.Scheduler.process_batch_result", "decode:around_process_batch_result",
         "AROUND"),
    Hook(f"{_SRT}.managers.scheduler.Scheduler.is_fully_idle", "decode:after_is_fully_idle", "AFTER"),
    Hook(f"{_SRT}.managers.scheduler.Scheduler.abort_request", "decode:after_abort_request", "AFTER"),
    # Any server with an idle wait (--pdd-idle-wait-ms; on for PDD roles): wait, not spin, on in-flight work
    Hook(f"{_SRT}.managers.scheduler.Scheduler.on_idle", "idle:around_on_idle", "AROUND"),
    # Seeded sampling that does not depend on which role samples (--pdd-seeded-sampling)
    Hook(f"{_SRT}.sampling.sampling_batch_info.SamplingBatchInfo.from_schedule_batch",
         "sampling:after_from_schedule_batch", "AFTER"),
    # MainDecode's handoff EXTEND: the handoff attention kernel where it applies (inert unless MD armed it)
    Hook(f"{_SRT}.layers.attention.base_attn_backend.AttentionBackend.forward",
         "attention:around_attention_forward", "AROUND"),
    # Every role: its compiled grammars bounded (sglang keeps each one it compiled, forever)
    Hook(f"{_SRT}.managers.scheduler.Scheduler.init_grammar_manager", "grammar:after_init_grammar_manager", "AFTER"),
)


@dataclass(frozen=True)
class Capability:
    """An extension point of the upstream-style series in patches/ (patches/LEDGER.md).

    `probe` ("module:Qualified.name") exists only in an sglang with the patch applied. Where it
    does, the plugin uses sglang's extension point and does not register the hooks in `retires`;
    where it does not, those hooks serve it as on stock sglang. `use` ("module:function" under
    sglang_pdd.hooks, next to the hooks it replaces; empty when sglang needs nothing from the
    plugin) is called once by `load()` to hand the plugin's code to the extension point. `load()`
    logs which path each capability takes. Only capabilities the plugin fully serves through the
    extension point are listed.
    """

    name: str
    patch: str
    probe: str
    retires: tuple[str, ...]
    use: str = ""

    def resolve_use(self) -> Callable[[], None] | None:
        if not self.use:
            return None
        module, _, fn = self.use.partition(":")
        return getattr(__import__(f"sglang_pdd.hooks.{module}", fromlist=[fn]), fn)


CAPABILITIES: tuple[Capability, ...] = (
    # sglang rejects empty prompts and out-of-vocabulary ids itself (400), as the input guard does
    Capability("input validation", "0001",
               f"{_SRT}.managers.tokenizer_manager:TokenizerManager._validate_input_token_ids",
               (f"{_SRT}.managers.tokenizer_manager.TokenizerManager._validate_one_request",)),
    # P's fan-out: MD's room is a KV destination of sglang's multi-destination sender
    Capability("KV destinations (fan-out)", "0002",
               f"{_SRT}.disaggregation.prefill:set_kv_destinations_provider",
               (f"{_SRT}.disaggregation.prefill.PrefillBootstrapQueue.create_sender",),
               use="prefill:use_destinations_provider"),
    # RLD's and MD's runtime is sglang's decode scheduler extension, called where the six hooks were
    Capability("decode scheduler extension", "0003",
               f"{_SRT}.disaggregation.decode_extension:set_decode_scheduler_extension",
               (f"{_SRT}.managers.scheduler.Scheduler._add_request_to_queue",
                f"{_SRT}.managers.scheduler.Scheduler.process_decode_queue",
                f"{_SRT}.managers.scheduler.Scheduler.get_next_disagg_decode_batch_to_run",
                f"{_SRT}.managers.scheduler.Scheduler.process_batch_result",
                f"{_SRT}.managers.scheduler.Scheduler.is_fully_idle",
                f"{_SRT}.managers.scheduler.Scheduler.abort_request"),
               use="decode:use_decode_extension"),
    # MD's landing offer travels as a named extension of its metadata message; P reads it back
    Capability("transfer-metadata extensions", "0004",
               f"{_SRT}.disaggregation.base.metadata_extensions:register_transfer_metadata_extension",
               (f"{_SRT}.disaggregation.mooncake.conn.MooncakeKVManager.build_receiver_metadata_message",
                f"{_SRT}.disaggregation.mooncake.conn.TransferInfo.from_zmq"),
               use="packed_wan:use_metadata_extension"),
    # sglang waits on in-flight work itself (--idle-wait-ms); the token channel is a wake source
    Capability("idle wait", "0005",
               f"{_SRT}.managers.scheduler_components.idle_waiter:register_idle_wake_source",
               (f"{_SRT}.managers.scheduler.Scheduler.on_idle",),
               use="idle:use_idle_waiter"),
)


def has_capability(cap: Capability) -> bool:
    try:
        pkgutil.resolve_name(cap.probe)
    except Exception:  # ImportError, AttributeError, ValueError
        return False
    return True


def capability_paths(caps: tuple[Capability, ...] = CAPABILITIES) -> dict[str, bool]:
    """Capability name -> True where sglang's extension point serves it (patched), False: hook."""
    return {c.name: has_capability(c) for c in caps}


def active_hooks(hooks: tuple[Hook, ...] = HOOKS, caps: tuple[Capability, ...] = CAPABILITIES) -> tuple[Hook, ...]:
    """The hooks to register: all of them, less those retired by an extension point sglang has."""
    retired = {t for c in caps if has_capability(c) for t in c.retires}
    return tuple(h for h in hooks if h.target not in retired or not h.retirable)


def use_capabilities(caps: tuple[Capability, ...] = CAPABILITIES) -> None:
    """Hand the plugin's code to every extension point sglang has (`Capability.use`)."""
    for c in caps:
        use = c.resolve_use() if has_capability(c) else None
        if use is not None:
            use()


def _log_capabilities(caps: tuple[Capability, ...] = CAPABILITIES) -> None:
    for c in caps:
        if has_capability(c):
            logger.info("sglang-pdd: %s: sglang's extension point (patch %s); hook not registered: %s",
                        c.name, c.patch, ", ".join(c.retires))
        else:
            logger.info("sglang-pdd: %s: hook (stock sglang, patch %s not applied)", c.name, c.patch)


class PluginLoadError(RuntimeError):
    """A hook target does not exist in the installed sglang (or its hooks were not applied)."""


_loaded = False


def missing_targets(hooks: tuple[Hook, ...] = HOOKS) -> list[str]:
    """Targets that do not resolve in the installed sglang, each with the reason."""
    out = []
    for h in hooks:
        owner, _, attr = h.target.rpartition(".")
        try:
            obj = pkgutil.resolve_name(owner)
        except Exception as e:  # ImportError, AttributeError, ValueError
            out.append(f"{h.target} ({type(e).__name__}: {e})")
            continue
        if not hasattr(obj, attr):
            out.append(f"{h.target} (no attribute {attr!r} on {owner})")
    return out


def load() -> None:
    """Register all hooks (idempotent). Called by sglang's `load_plugins()` in every process."""
    global _loaded
    if _loaded:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    missing = missing_targets()
    if missing:
        msg = (
            "sglang-pdd cannot hook the installed sglang (it is built for sglang 0.5.23); "
            "missing targets: " + "; ".join(missing)
        )
        if PddConfig.from_env().active:
            raise SystemExit(msg)
        raise PluginLoadError(msg)
    _log_capabilities()
    from sglang_pdd.server import thread_names  # ctypes and subprocess: not at plugin import
    from sglang_pdd.process_state import capabilities

    thread_names.install()  # only with SGLANG_PDD_THREAD_NAMES=1 (the benchmark's servers)
    use_capabilities()
    capabilities.record(capability_paths())
    for h in active_hooks():
        HookRegistry.register(h.target, h.resolve_body(), HookType[h.kind])
    _loaded = True


def require_hooks_applied() -> None:
    """Raise unless sglang applied every hook of ours (call after `load_plugins()` finished)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    if not _loaded:
        raise PluginLoadError("sglang-pdd hooks were never registered (plugin not loaded?)")
    not_applied = [h.target for h in active_hooks() if h.target not in HookRegistry._patched]
    if not_applied:
        raise PluginLoadError("sglang-pdd hooks not applied to: " + ", ".join(not_applied))
