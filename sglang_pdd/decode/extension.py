"""sglang's decode scheduler extension (patch 0003) served by the plugin's decode runtime.

With patch 0003, sglang calls a `DecodeSchedulerExtension` at the six places of its decode loop where
the plugin otherwise hooks private scheduler methods (hooks/decode.py). `DecodeExtension` is that
object for RelayDecode and MainDecode: each method delegates to the scheduler's `DecodeRole`
(`decode.runtime.runtime`), exactly as the hook at the same place does. `create` is the factory the
plugin installs (`hooks/decode.use_decode_extension`); sglang calls it once per decode scheduler, at
the end of its construction, and keeps what it returns as `scheduler.decode_extension`.

The class implements every method of sglang's `DecodeSchedulerExtension` instead of deriving from it,
so this module imports nothing of sglang's (and its tests run on stock sglang).

`path(scheduler)` says which entry serves a scheduler's runtime ("extension", "hooks", or None with
no runtime); PDD servers report it in `/get_server_info` (`internal_states[i]["pdd_decode_path"]`).
"""

from __future__ import annotations

from typing import Any

from sglang_pdd.decode.role import DecodeRole
from sglang_pdd.decode.runtime import current, runtime

KEY = "pdd_decode_path"


class DecodeExtension:
    """sglang's DecodeSchedulerExtension contract, each call one `DecodeRole` method."""

    def __init__(self, role: DecodeRole) -> None:
        self.role = role

    def on_request_queued(self, req: Any) -> None:
        self.role.take_request(req)

    def poll(self) -> None:
        self.role.after_process_decode_queue()

    def get_next_batch(self, running_batch: Any) -> tuple[Any, Any]:
        return self.role.next_batch(running_batch)

    def process_batch_result(self, batch: Any, result: Any) -> bool:
        return self.role.on_batch_result(batch, result)

    def has_pending_work(self) -> bool:
        return not self.role.settle_idle()

    def on_abort_request(self, recv_req: Any) -> None:
        self.role.after_abort_request(recv_req)


def create(scheduler: Any) -> DecodeExtension | None:
    """The extension of a relay or main scheduler (attention-TP rank 0); None elsewhere (sglang's
    scheduler then runs unchanged)."""
    rt = runtime(scheduler)
    return None if rt is None else DecodeExtension(rt)


def path(scheduler: Any) -> str | None:
    """"extension" when sglang's decode scheduler extension serves the runtime, "hooks" when the
    hooks do, None when the scheduler has no runtime (yet, or not a relay or main server)."""
    if isinstance(getattr(scheduler, "decode_extension", None), DecodeExtension):
        return "extension"
    return "hooks" if current(scheduler) is not None else None
