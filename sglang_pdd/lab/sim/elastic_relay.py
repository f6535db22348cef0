"""Elastic RLD: no dedicated relay pool; one P instance switches into the relay role and back.

The host (the last P instance) leaves the P role when the router first picks a relayed pipeline
and no relay is up: it takes no new prefill, drains (its queue empty and every prompt KV it held
released, i.e. its WAN transfers done), then pays `switch_s` (sglang's role switch: memory pool
re-layout and scheduler restart; the weights stay) and serves as RLD. It switches back, paying
`switch_s` again, once it has had no relayed request for `idle_back_s`. While the relay is not
up, relayed routes fall back to P->MD (the router cannot use a relay that does not exist yet).
The bill counts the P and MD pools only; the relay's price is the prefill it does not do.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from sglang_pdd.lab.sim.cluster import Cluster
from sglang_pdd.lab.sim.systems import PoolSpec, SystemSpec

DIRECT = "P->MD"
_AT_RLD = ("none", "waiting", "admitted", "running")  # a relayed request RLD still owes work


class ElasticCluster(Cluster):
    """`Cluster` whose single RLD instance is the last P instance in its other role."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.host = len(self.P) - 1
        if self.host < 1:
            raise ValueError(f"{self.spec.name}: an elastic relay needs at least 2 P instances")
        self.role = "P"  # P | drain | to-rld | RLD | to-p
        self.switches = 0  # P -> RLD switches started
        self.fallbacks = 0  # relayed routes served P->MD because the relay was not up
        self.spells: list[list] = []  # the host's times out of the P role: [left P at, back in P at or None]
        self._idle_since = 0.0

    # ----- routing hooks -----
    def _p_eligible(self) -> range:
        return range(len(self.P) if self.role == "P" else self.host)

    def _route(self, w, md_hit):
        pipe, reason = super()._route(w, md_hit)
        if pipe.value == DIRECT or self.role == "RLD":
            return pipe, reason
        if self.role == "P":
            self._switch_in()
        self.fallbacks += 1
        return type(pipe)(DIRECT), f"{reason}; relay role not up ({self.role})"

    # ----- role switches -----
    def _switch_in(self) -> None:
        self.role = "drain"
        self.switches += 1
        self.spells.append([self.loop.now, None])
        self._poll_drain()

    def _poll_drain(self) -> None:
        p = self.P[self.host]
        if p.queue or p.used > 0:
            self.loop.after(self.spec.poll_s, self._poll_drain)
            return
        self.role = "to-rld"
        self.loop.after(self.spec.switch_s, self._relay_up)

    def _relay_up(self) -> None:
        self.role = "RLD"
        self._idle_since = self.loop.now
        self.loop.after(self.spec.poll_s, self._poll_idle)

    def _relaying(self) -> bool:
        if self.R[0].load:
            return True
        return any(st.rec.pipeline != DIRECT and st.rld in _AT_RLD for st in self.states.values())

    def _poll_idle(self) -> None:
        now = self.loop.now
        if self._relaying():
            self._idle_since = now
        elif now - self._idle_since >= self.spec.idle_back_s:
            self.role = "to-p"
            self.loop.after(self.spec.switch_s, self._p_up)
            return
        self.loop.after(self.spec.poll_s, self._poll_idle)

    def _p_up(self) -> None:
        self.role = "P"
        self.spells[-1][1] = self.loop.now
        self.P[self.host]._kick()

    def off_p_share(self, span_s: float) -> float:
        """Share of `span_s` the host spent out of the P role (an open interval counts to now)."""
        off_s = sum((self.loop.now if back is None else back) - left for left, back in self.spells)
        return off_s / span_s if span_s > 0 else 0.0


@dataclass(frozen=True)
class ElasticRelaySpec(SystemSpec):
    """A PDD system whose `relay` pool (one instance) is the hardware of its last P instance."""

    switch_s: float = 2.0  # role switch latency, each way, after the drain
    idle_back_s: float = 10.0  # no relayed request for this long -> back to P
    poll_s: float = 0.1  # how often the drain and the idleness are checked

    cluster_class: ClassVar[type] = ElasticCluster

    @property
    def pools(self) -> dict[str, PoolSpec]:
        return {"P": self.prefill, "MD": self.decode}  # the relay is a P instance: no extra bill


def elastic_system(base: SystemSpec, name: str = "pdd-elastic", **kw) -> ElasticRelaySpec:
    """`base` (a PDD spec: its routing and handoff) with its relay pool replaced by the role
    switch of one of its P instances."""
    args = {f.name: getattr(base, f.name) for f in fields(SystemSpec)}
    p = base.prefill
    args.update(name=name, relay=PoolSpec(p.chip, 1, p.chips_per_instance, p.max_batch))
    return ElasticRelaySpec(**args, **kw)
