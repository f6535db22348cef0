"""A decode runtime (`sglang_pdd.decode.role.DecodeRole`: RelayRuntime, MainRuntime) recording what the
decode hooks or sglang's decode scheduler extension ask of it, and the decode scheduler it hangs on."""

from __future__ import annotations

from types import SimpleNamespace

from sglang_pdd.server import metrics
from sglang_pdd.decode.role import DecodeRole
from sglang_pdd.transfer import pool_state


class RecordingRole(DecodeRole):
    """Records each call in `calls`. `batch`: the batch of its own `next_batch` runs (None: none, sglang's
    batch runs) and whose result it consumes; `running`: the running batch `next_batch` answers (None: the
    one given); `held`: work only it sees (busy)."""

    def __init__(self, scheduler, role: str = "main", batch=None, running=None):
        super().__init__(scheduler)
        self.role = role
        self.calls: list[tuple] = []
        self.batch, self.running, self.held = batch, running, False

    def admit(self, req):
        self.calls.append(("admit", req.rid))

    def poll(self):
        self.calls.append(("poll",))

    def next_batch(self, running_batch):
        self.calls.append(("next_batch", running_batch))
        return self.batch, running_batch if self.running is None else self.running

    def on_batch_result(self, batch, result):
        self.calls.append(("result", getattr(batch, "name", batch), result))
        return self.batch is not None and batch is self.batch

    def busy(self):
        return self.held

    def on_abort_request(self, rid, message, abort_all=False):
        self.calls.append(("abort", rid, message, abort_all))


def decode_scheduler(monkeypatch, make_runtime=RecordingRole) -> SimpleNamespace:
    """sglang's decode scheduler as the decode hooks read it (its DP-attention adapter passes a batch
    through), its runtime `make_runtime(scheduler)`; the pool gauges published go to `scheduler.published`
    (the role label of each)."""
    published: list[str] = []
    monkeypatch.setattr(metrics, "publish_pool_state", lambda role, counts: published.append(role))
    monkeypatch.setattr(pool_state, "pool_counts", lambda scheduler: {})
    scheduler = SimpleNamespace(dp_attn_adapter=SimpleNamespace(maybe_prepare_mlp_sync_batch=lambda b: b),
                                published=published)
    scheduler._pdd_runtime = make_runtime(scheduler)
    return scheduler
