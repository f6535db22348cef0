"""The two ends of the handoff microbenchmark: RelayDecode in cluster A, MainDecode in cluster B.

    python -m sglang_pdd.lab.micro.handoff_peers md  --host ADDR_B ...            (started by handoff_micro)
    python -m sglang_pdd.lab.micro.handoff_peers rld --host ADDR_A --peer JSON ...

Each is a process inside its testbed namespace; `handoff_micro` starts them and talks to them over
stdin/stdout, one JSON line per message (other stdout lines, e.g. Mooncake's logs, are skipped).

RLD holds a KV pool (2 x layers buffers of `[slots, kv_heads, head_dim]`, registered with its Mooncake
engine) with the eager tokens' KV at scattered slots, as decode steps interleaved with other requests
leave them, and a registered staging buffer. It answers each `Ready(room)` on the project's token
channel (`RelayChannel`), according to the path the room number encodes (`room % len(PATHS)`):

  ids        `Tokens(room, ids)` at once: the token-ID handoff
  kv_paged   one `batch_transfer_sync_write` of layers x 2 x tokens slices (one per layer, K/V and
             token: what sglang's Mooncake sender does at page size 1 when slots are not contiguous on
             both sides), then `Tokens(room, ids)` (MD needs the IDs on this path too)
  kv_packed  `pack_kv` into the staging buffer, one slice into MD's staging buffer, then `Tokens`

MD (`MainChannel`) sends `Ready(room)` and waits for `Tokens`; on the ids path it then recomputes the
eager tokens' KV in one extend forward over a cached prefix (`handoff_recompute`), on the packed path it
unpacks into its pool. Both ends derive the eager token IDs and their own slots from the seed, which
stands for what sglang exchanges at bootstrap (MD's slot list) and is not timed here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import zmq

from sglang_pdd.lab.micro.handoff_recompute import make_recompute
from sglang_pdd.lab.micro.mooncake_tcp import MAX_BATCH_SLICES, register, tcp_engine
from sglang_pdd.kernels.kv_pack import pack_kv, unpack_kv
from sglang_pdd.kernels.kv_pack_layout import PackLayout
from sglang_pdd.protocol.channel import MainChannel, RelayChannel
from sglang_pdd.protocol.messages import Ready, Reject, Tokens

logger = logging.getLogger(__name__)

PATHS = ("ids", "kv_paged", "kv_packed")
POLL_S = 0.0002  # MD's wait loop (the real MD polls once per scheduler iteration)


@dataclass(frozen=True)
class Setup:
    tokens: int
    prefix_tokens: int
    pool_slots: int
    seed: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def slot_bytes(self) -> int:
        return self.kv_heads * self.head_dim * 4  # fp32, the tiny model's dtype

    def eager_ids(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed)
        return torch.randint(16, self.vocab, (self.tokens,), generator=g).tolist()

    def prefix_ids(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed + 1)
        return torch.randint(16, self.vocab, (self.prefix_tokens,), generator=g).tolist()

    def slots(self, side: str) -> torch.Tensor:
        """This side's slots for the eager tokens: scattered over its pool."""
        g = torch.Generator().manual_seed(self.seed + (2 if side == "rld" else 3))
        return torch.randperm(self.pool_slots, generator=g)[: self.tokens]


def room_for(seq: int, path: str) -> int:
    return seq * len(PATHS) + PATHS.index(path)


def path_of(room: int) -> str:
    return PATHS[room % len(PATHS)]


class KvPool:
    """One side's KV pool and staging buffer, registered with a Mooncake TCP engine on `host`."""

    def __init__(self, host: str, setup: Setup, fill: bool):
        shape = (2 * setup.layers, setup.pool_slots, setup.kv_heads, setup.head_dim)
        g = torch.Generator().manual_seed(setup.seed + 4)
        self.backing = torch.randn(shape, generator=g) if fill else torch.zeros(shape)
        bufs = list(self.backing.unbind(0))
        self.k, self.v = bufs[: setup.layers], bufs[setup.layers :]
        self.nbytes_packed = PackLayout.for_buffers(self.k, self.v, setup.tokens, False).nbytes
        self.staging = torch.zeros(self.nbytes_packed + 4096, dtype=torch.uint8)
        self.engine = tcp_engine(host)
        register(self.engine, self.backing)
        register(self.engine, self.staging)
        self.session = f"{host}:{self.engine.get_rpc_port()}"

    def describe(self) -> dict[str, Any]:
        return {"session": self.session, "pool": self.backing.data_ptr(), "staging": self.staging.data_ptr(),
                "buffer_bytes": self.backing[0].numel() * 4, "packed_bytes": self.nbytes_packed}


def paged_slices(src_base: int, dst_base: int, buffer_bytes: int, buffers: int, src_slots: list[int],
                 dst_slots: list[int], slot_bytes: int) -> tuple[list[int], list[int], list[int]]:
    """One (src, dst, len) per buffer and token, as sglang's Mooncake sender builds them at page size 1."""
    srcs, dsts, lens = [], [], []
    for b in range(buffers):
        s0, d0 = src_base + b * buffer_bytes, dst_base + b * buffer_bytes
        for s, d in zip(src_slots, dst_slots):
            srcs.append(s0 + s * slot_bytes)
            dsts.append(d0 + d * slot_bytes)
            lens.append(slot_bytes)
    return srcs, dsts, lens


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _secret() -> bytes:
    secret = os.environ.get("SGLANG_PDD_SECRET", "")
    if not secret:
        raise SystemExit("SGLANG_PDD_SECRET is not set")
    return secret.encode()


def run_rld(host: str, peer: dict[str, Any], setup: Setup) -> None:
    pool = KvPool(host, setup, fill=True)
    ids = setup.eager_ids()
    src_slots, dst_slots = setup.slots("rld"), setup.slots("md").tolist()
    session = peer["session"]
    rc = pool.engine.transfer_sync_write(session, pool.staging.data_ptr(), peer["staging"], 4096)  # connect
    if rc != 0:
        raise RuntimeError(f"Mooncake warm-up write returned {rc}")
    chan = RelayChannel(f"tcp://{host}:0", _secret(), vocab_size=setup.vocab)
    _emit({"channel": chan.address})
    poller = zmq.Poller()
    poller.register(chan.sock, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    timings: dict[int, dict[str, float]] = {}
    while True:
        events = dict(poller.poll(1000))
        if sys.stdin.fileno() in events or sys.stdin in events:
            line = sys.stdin.readline()
            if not line or line.strip() == "quit":
                break
        for peer_id, msg in chan.poll():
            if not isinstance(msg, Ready):
                continue
            timings[msg.room] = _ship(path_of(msg.room), pool, peer, setup, src_slots, dst_slots)
            chan.send(peer_id, Tokens(room=msg.room, ids=ids))
    chan.close()
    _emit({"timings": {str(k): v for k, v in timings.items()}})


def _ship(path: str, pool: KvPool, peer: dict[str, Any], setup: Setup, src_slots: torch.Tensor,
          dst_slots: list[int]) -> dict[str, float]:
    """RLD's work for one `Ready` before it sends `Tokens`: nothing, or the eager tokens' KV to MD."""
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    if path == "kv_paged":
        srcs, dsts, lens = paged_slices(pool.backing.data_ptr(), peer["pool"], peer["buffer_bytes"],
                                        2 * setup.layers, src_slots.tolist(), dst_slots, setup.slot_bytes)
        t["build_s"] = time.perf_counter() - t0
        rc = _write_batches(pool.engine, peer["session"], srcs, dsts, lens)
        t["slices"] = len(lens)
    elif path == "kv_packed":
        pack_kv(pool.k, pool.v, src_slots, out=pool.staging[: pool.nbytes_packed])
        t["pack_s"] = time.perf_counter() - t0
        rc = pool.engine.batch_transfer_sync_write(peer["session"], [pool.staging.data_ptr()], [peer["staging"]],
                                                   [pool.nbytes_packed])
        t["slices"] = 1
    else:
        rc = 0
    t["write_s"] = time.perf_counter() - t0 - t.get("pack_s", 0.0) - t.get("build_s", 0.0)
    if rc != 0:
        raise RuntimeError(f"Mooncake write ({path}) returned {rc}")
    return t


def _write_batches(engine: Any, session: str, srcs: list[int], dsts: list[int], lens: list[int]) -> int:
    for i in range(0, len(lens), MAX_BATCH_SLICES):
        rc = engine.batch_transfer_sync_write(session, srcs[i : i + MAX_BATCH_SLICES], dsts[i : i + MAX_BATCH_SLICES],
                                              lens[i : i + MAX_BATCH_SLICES])
        if rc != 0:
            return rc
    return 0


def _wait_tokens(chan: Any, addr: str, room: int, timeout_s: float) -> Any:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        for _, msg in chan.poll():
            if isinstance(msg, Tokens) and msg.room == room:
                return msg
            if isinstance(msg, Reject):
                raise RuntimeError(f"RLD rejected room {msg.room}: {msg.reason}")
        time.sleep(POLL_S)
    raise TimeoutError(f"no Tokens for room {room} from {addr} in {timeout_s} s")


def run_md(host: str, model_dir: str, setup: Setup, engine: str, timeout_s: float) -> None:
    pool = KvPool(host, setup, fill=False)
    _emit(pool.describe())
    ids = setup.eager_ids()
    recompute = make_recompute(engine, model_dir, setup.prefix_ids(), setup.tokens)
    check = recompute.check(ids)
    dst_slots = setup.slots("md")
    addr = json.loads(_next_json_line())["channel"]
    chan = MainChannel(_secret(), vocab_size=setup.vocab)
    _emit({"ready": True, "recompute_engine": recompute.engine_name, "recompute_check_max_abs_logit": check})
    seq, kv_ran = 0, False
    while True:
        cmd = json.loads(_next_json_line())
        if cmd.get("cmd") == "quit":
            break
        rounds = []
        kv_ran = kv_ran or cmd["path"] != "ids"
        for _ in range(cmd["rounds"]):
            room = room_for(seq, cmd["path"])
            seq += 1
            if cmd["path"] == "ids":
                recompute.prepare()  # untimed: MD's prefix is cached before the handoff starts
            t0 = time.perf_counter()
            chan.send(addr, Ready(room=room))
            msg = _wait_tokens(chan, addr, room, timeout_s)
            t1 = time.perf_counter()
            if msg.ids != ids:
                raise RuntimeError(f"room {room}: RLD sent other token IDs")
            if cmd["path"] == "ids":
                recompute(msg.ids)
            elif cmd["path"] == "kv_packed":
                unpack_kv(pool.staging[: pool.nbytes_packed], pool.k, pool.v, dst_slots)
            t2 = time.perf_counter()
            rounds.append({"room": room, "transfer_s": t1 - t0, "local_s": t2 - t1, "total_s": t2 - t0})
        _emit({"rounds": rounds})
    if kv_ran and not torch.equal(pool.backing[:, dst_slots].flatten(), _expected_kv(setup)):
        raise RuntimeError("the KV that landed in MD's pool is not RLD's")
    chan.close()


def _expected_kv(setup: Setup) -> torch.Tensor:
    g = torch.Generator().manual_seed(setup.seed + 4)
    rld = torch.randn((2 * setup.layers, setup.pool_slots, setup.kv_heads, setup.head_dim), generator=g)
    return rld[:, setup.slots("rld")].flatten()


def _next_json_line() -> str:
    for line in sys.stdin:
        if line.startswith("{"):
            return line
    raise SystemExit("stdin closed")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["md", "rld"])
    ap.add_argument("--host", required=True)
    ap.add_argument("--setup", required=True, help="JSON of Setup")
    ap.add_argument("--peer", help="rld: MD's Mooncake session and buffers (JSON)")
    ap.add_argument("--model-dir", help="md: the model directory")
    ap.add_argument("--recompute", choices=["sglang", "transformers"], default="sglang")
    ap.add_argument("--threads", type=int, default=0, help="md: torch threads (0: torch's default)")
    ap.add_argument("--timeout-s", type=float, default=60.0)
    args = ap.parse_args(argv)
    setup = Setup(**json.loads(args.setup))
    if args.role == "rld":
        run_rld(args.host, json.loads(args.peer), setup)
    else:
        if args.threads:
            torch.set_num_threads(args.threads)
        run_md(args.host, args.model_dir, setup, args.recompute, args.timeout_s)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.exit(main())
