"""The elastic relay pool of `pdd-never-lose` (issue 46): relay instances that join and leave with the
relayed load, billed for the time they are up.

An instance is down (not billed), starting (billed: it takes `startup_s` to serve), up, or
draining (billed, takes nothing new, goes down when its last relayed request leaves). Every
`tick_s` the pool asks the scale signal (`policy.relay_pool_scale.target`) how many instances it
should have, from the placement decisions of the last `window_s` (how many were at risk), and
starts instances to reach it at once; it stops one only after the target has been below the count
for `hold_s` (a Kubernetes HPA's scale-down stabilisation window). The defaults and why
(docs/sim.md §9):

* `startup_s` 10 s: "billed for the time it is up" presumes the instance's GPUs do other work while it
  is down, so a relay instance sleeps on GPUs lent to lower-priority work (batch inference, evals),
  its process alive and its weights in host memory, as sglang's `release_memory_occupation` /
  `resume_memory_occupation` let RL frameworks time-share GPUs: waking is the borrowed work's
  preemption and the weights back over PCIe (some 29 GB per chip of the paper's 230 GB fp8 model, 1-2 s
  at 20-25 GB/s). A node started from nothing (VM, image, weights from storage, CUDA graphs) takes
  30 s to minutes; with 30 s the shared trace's compressed replays lose their first half minute
  (docs/sim.md §9 has that table too).
* `chips_per_instance` None: a P instance's shape (8 A). 4 A (the smallest that holds the weights)
  halves an instance's price but its KV holds few of the paper workload's 64K contexts, so a second
  instance came up wherever one did, and the first came up sooner (its price is a smaller share).
* `min_instances` 0: an instance kept up is 11 % of xdc-pd-drc's bill (8 A of 72), which is what
  the dedicated pool loses where relaying does not pay; with 0 the bill is xdc-pd-drc's there.
* `max_instances` 2: the relayed load of the four P instances (the shared trace relays up to 60 % of
  its requests, short outputs) fits one instance's batch; the second is for bursts.
* `hold_s` 120 s (a Kubernetes HPA waits 300 s by default before it scales down; the fluctuating
  line's dips come every 10 s, so an instance that left after one would be wanted back at the next),
  `window_s` 30 s, `tick_s` 5 s. None of these was tuned on the goal tables.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

from sglang_pdd.policy.relay_placement import PoolView
from sglang_pdd.policy.relay_pool_scale import PoolScaleConfig, PoolScaleInputs, target
from sglang_pdd.lab.sim.decode import DecodeInstance
from sglang_pdd.lab.sim.engine import EventLoop


@dataclass(frozen=True)
class RelayPoolSpec:
    startup_s: float = 10.0
    chips_per_instance: Optional[int] = None  # None: a P instance's (8 A)
    min_instances: int = 0
    max_instances: int = 2
    hold_s: float = 120.0
    up_hold_s: float = 0.0  # the target must stay above the count this long before an instance starts
    # (0: at once; 30-60 s kept the pool from one minute's burst on the paper workload but made it late on
    # the shared trace's compressed replays)
    window_s: float = 30.0
    tick_s: float = 5.0

    def __post_init__(self) -> None:
        if (self.startup_s < 0 or not 0 <= self.min_instances <= self.max_instances or self.hold_s < 0
                or self.window_s <= 0 or self.tick_s <= 0):
            raise ValueError(f"invalid relay pool {self}")


class ElasticRelayPool:
    def __init__(self, loop: EventLoop, instances: list[DecodeInstance], spec: RelayPoolSpec,
                 scale: PoolScaleConfig):
        self.loop, self.inst, self.spec, self.scale = loop, instances, spec, scale
        self.state = ["down"] * len(instances)
        self.pending = [0] * len(instances)  # placed, not yet reserved (their prefill runs)
        self.spells: list[list] = []  # billed spells: [start, stop or None]
        self._spell: list[Optional[list]] = [None] * len(instances)
        self._recent: deque[tuple[float, bool]] = deque()
        self._below_since: Optional[float] = None
        self._above_since: Optional[float] = None
        self.starts = 0
        self.peak = 0
        for i in range(spec.min_instances):
            self._start(i, up_now=True)
        loop.after(spec.tick_s, self._tick)

    # ----- what the router sees -----
    def _free(self, i: int) -> int:
        d = self.inst[i]
        if self.state[i] != "up" or d.kv_usage >= 0.95:
            return 0
        return max(0, d.max_batch - len(d.reserved) - len(d.waiting) - self.pending[i])

    def view(self) -> PoolView:
        return PoolView(sum(s == "up" for s in self.state), sum(self._free(i) for i in range(len(self.inst))))

    def place(self) -> int:
        """The up instance with the most free slots (the caller checked there is one)."""
        i = max(range(len(self.inst)), key=self._free)
        self.pending[i] += 1
        return i

    def reserved(self, i: int) -> None:
        self.pending[i] -= 1

    def note(self, at_risk: bool) -> None:
        self._recent.append((self.loop.now, at_risk))

    # ----- scaling -----
    def count(self) -> int:
        return sum(s in ("starting", "up") for s in self.state)

    def _start(self, i: int, up_now: bool = False) -> None:
        self.state[i] = "up" if up_now else "starting"
        self._spell[i] = [self.loop.now, None]
        self.spells.append(self._spell[i])
        self.starts += 1
        if not up_now:
            self.loop.after(self.spec.startup_s, self._up, i)

    def _up(self, i: int) -> None:
        if self.state[i] == "starting":
            self.state[i] = "up"

    def _stop_if_idle(self, i: int) -> None:
        if self.state[i] == "draining" and self.inst[i].load == 0 and self.pending[i] == 0:
            self.state[i] = "down"
            self._spell[i][1] = self.loop.now
            self._spell[i] = None

    def _tick(self) -> None:
        now = self.loop.now
        while self._recent and self._recent[0][0] < now - self.spec.window_s:
            self._recent.popleft()
        for i in range(len(self.inst)):
            self._stop_if_idle(i)
        n = self.count()
        up = [i for i, s in enumerate(self.state) if s == "up"]
        occ = sum(min(1.0, self.inst[i].occupancy) for i in up) / len(up) if up else 0.0
        want = target(self.scale, PoolScaleInputs(len(self._recent), sum(r for _, r in self._recent), n, occ))
        if want > n:
            self._below_since = None
            self._above_since = now if self._above_since is None else self._above_since
            if now - self._above_since >= self.spec.up_hold_s:
                for i in [i for i, s in enumerate(self.state) if s == "down"][:want - n]:
                    self._start(i)
                self._above_since = None
        elif want < n:
            self._above_since = None
            self._below_since = now if self._below_since is None else self._below_since
            if now - self._below_since >= self.spec.hold_s:
                live = [i for i, s in enumerate(self.state) if s in ("starting", "up")]
                i = min(live, key=lambda i: (self.state[i] == "up", self.inst[i].load))
                self.state[i] = "draining"
                self._below_since = now
                self._stop_if_idle(i)
        else:
            self._above_since = self._below_since = None
        self.peak = max(self.peak, self.count())
        self.loop.after(self.spec.tick_s, self._tick)

    def instance_seconds(self, start_s: float, end_s: float) -> float:
        """Billed instance-seconds within [start_s, end_s] (an open spell counts to `end_s`)."""
        return sum(max(0.0, min(end_s, b if b is not None else end_s) - max(start_s, a)) for a, b in self.spells)
