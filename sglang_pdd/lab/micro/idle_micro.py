"""What spinning costs and what waiting costs, without servers (docs/idle.md).

    python -m sglang_pdd.lab.micro.idle_micro [--repeat 3] [--json OUT]

1. **Idle loop**: a loop shaped like sglang's scheduler with work in flight and nothing to compute
   (each iteration does a little bookkeeping, then `on_idle`), for `--seconds`, while another thread
   signals "transfer done" at random moments. Upstream returns from `on_idle` after `sleep(0)`
   (spin); the plugin waits on `IdleWaiter` (timeout `--idle-wait-ms`), which the signal wakes.
   Reported: CPU seconds per wall second of the loop's thread, and the delay from a signal to the
   loop seeing it (P50 / max).
2. **Mooncake write** (real Mooncake, TCP on loopback, in one process): `batch_transfer_sync_write`
   against `write_wait.write` of the same slices; the calling thread's CPU seconds and the wall time.
   On loopback the write is fast; over a WAN it lasts seconds and the sync call spins all of it.

Each case runs `--repeat` times interleaved (ABAB); figures are medians with min-max and the ratio
of the polite variant to the spinning one per repeat.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time

from sglang_pdd.server.idle_wait import IdleWaiter
from sglang_pdd.transfer import write_wait


def idle_loop(mode: str, seconds: float, wait_ms: float, signals_per_s: float = 20.0, seed: int = 1) -> dict:
    """One run of the fake scheduler loop: 'spin' (sleep(0), as upstream) or 'wait' (IdleWaiter)."""
    waiter = IdleWaiter(wait_ms / 1000.0)
    state = {"done_at": None}
    delays: list[float] = []
    stop = threading.Event()
    rng = random.Random(seed)

    def signaller():
        while not stop.wait(rng.expovariate(signals_per_s)):
            if state["done_at"] is None:
                state["done_at"] = time.perf_counter()  # a transfer finished (KV manager's thread)
                waiter.wake()

    t = threading.Thread(target=signaller, daemon=True)
    c0, w0 = time.thread_time(), time.perf_counter()
    t.start()
    iterations = 0
    while time.perf_counter() - w0 < seconds:
        iterations += 1
        sum(range(50))  # the loop's bookkeeping: ingest, poll the queues, pick no batch
        done = state["done_at"]
        if done is not None:
            delays.append(time.perf_counter() - done)
            state["done_at"] = None
            continue
        if mode == "spin":
            time.sleep(0)
        else:
            waiter.wait()
    cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
    stop.set()
    t.join()
    delays.sort()
    return {"mode": mode, "cpu_per_wall": cpu / wall, "iterations_per_s": iterations / wall,
            "signals": len(delays), "delay_p50_ms": 1e3 * delays[len(delays) // 2] if delays else None,
            "delay_max_ms": 1e3 * delays[-1] if delays else None}


def mooncake_write(mode: str, mib: int = 128, slices: int = 8, poll_ms: float = 1.0) -> dict:
    import numpy as np

    engines = _engines()
    src, dst = engines
    n = mib << 20
    a, b = np.ones(n, dtype=np.uint8), np.zeros(n, dtype=np.uint8)
    assert src.register_memory(a.ctypes.data, n) == 0 and dst.register_memory(b.ctypes.data, n) == 0
    try:
        sess = f"127.0.0.1:{dst.get_rpc_port()}"
        per = n // slices
        bufs = [a.ctypes.data + i * per for i in range(slices)]
        peers = [b.ctypes.data + i * per for i in range(slices)]
        lens = [per] * slices
        c0, w0 = time.thread_time(), time.perf_counter()
        if mode == "sync":
            ret = src.batch_transfer_sync_write(sess, bufs, peers, lens)
        else:
            ret = write_wait.write(src, sess, bufs, peers, lens, poll_ms / 1000.0)
        cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        ok = ret == 0 and bool(b[:: 1 << 12].all())
    finally:
        src.unregister_memory(a.ctypes.data)
        dst.unregister_memory(b.ctypes.data)
    return {"mode": mode, "ok": ok, "wall_ms": wall * 1e3, "caller_cpu_ms": cpu * 1e3,
            "caller_cpu_per_wall": cpu / wall}


_ENGINES: list = []


def _engines():
    if not _ENGINES:
        from mooncake.engine import TransferEngine

        for _ in range(2):
            e = TransferEngine()
            if e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
                raise RuntimeError("Mooncake TransferEngine did not initialize")
            _ENGINES.append(e)
    return _ENGINES


def _spread(vals: list[float]) -> str:
    return f"{statistics.median(vals):.3g} ({min(vals):.3g}-{max(vals):.3g})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.micro.idle_micro", description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="length of each idle-loop run")
    ap.add_argument("--idle-wait-ms", type=float, default=5.0)
    ap.add_argument("--transfer-poll-ms", type=float, default=1.0)
    ap.add_argument("--mib", type=int, default=128, help="Mooncake write size")
    ap.add_argument("--no-mooncake", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out: dict = {"idle_loop": [], "mooncake": []}
    for r in range(args.repeat):
        for mode in ("spin", "wait"):
            out["idle_loop"].append({"repeat": r, **idle_loop(mode, args.seconds, args.idle_wait_ms, seed=r)})
        if not args.no_mooncake:
            for mode in ("sync", "polled"):
                out["mooncake"].append({"repeat": r, **mooncake_write(mode, args.mib, poll_ms=args.transfer_poll_ms)})
    print(f"idle loop, {args.seconds:g} s per run, wait {args.idle_wait_ms:g} ms, {args.repeat} repeats "
          "(median (min-max)):")
    for mode in ("spin", "wait"):
        rows = [x for x in out["idle_loop"] if x["mode"] == mode]
        print(f"  {mode:5s} CPU/wall {_spread([x['cpu_per_wall'] for x in rows])}, "
              f"signal->seen P50 {_spread([x['delay_p50_ms'] for x in rows])} ms, "
              f"max {_spread([x['delay_max_ms'] for x in rows])} ms")
    ratios = [w["cpu_per_wall"] / s["cpu_per_wall"] for s, w in
              zip(out["idle_loop"][0::2], out["idle_loop"][1::2])]
    print(f"  wait/spin CPU ratio per repeat: {', '.join(f'{x:.3f}' for x in ratios)}")
    if out["mooncake"]:
        print(f"Mooncake TCP loopback write, {args.mib} MiB in 8 slices:")
        for mode in ("sync", "polled"):
            rows = [x for x in out["mooncake"] if x["mode"] == mode]
            print(f"  {mode:6s} wall {_spread([x['wall_ms'] for x in rows])} ms, caller-thread CPU "
                  f"{_spread([x['caller_cpu_ms'] for x in rows])} ms, ok {all(x['ok'] for x in rows)}")
        ratios = [p["caller_cpu_ms"] / s["caller_cpu_ms"] for s, p in
                  zip(out["mooncake"][0::2], out["mooncake"][1::2])]
        print(f"  polled/sync caller-CPU ratio per repeat: {', '.join(f'{x:.3f}' for x in ratios)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
