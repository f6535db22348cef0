"""Benchmark: a prompt's missed KV over the emulated WAN, page by page vs packed, with Mooncake TCP.

    python -m sglang_pdd.lab.micro.wan_pack                       # 4K tokens, 100 Mbit/s, 20 ms one way
    python -m sglang_pdd.lab.micro.wan_pack --tokens 4096 --rate-mbit 100 --delay-ms 20 --json out.json

Needs root, `sglang_pdd.lab.testbed` and `mooncake-transfer-engine(-non-cuda)`. The testbed's two namespaces
stand for the clusters: a Mooncake target in B holds MD's KV pool and a staging buffer; an initiator in A
holds P's pool and sends one request's KV (every layer's K and V rows of `tokens` tokens) three ways:

  paged       one slice per (layer, K/V, page), pages scattered on both sides: what the upstream
              Mooncake sender does when neither pool has the pages in one run (in batches of at
              most 1024 slices: one batch of 2048 failed with Mooncake TCP here)
  packed      `pack_kv` into one staging buffer, sent as `--chunks` slices (default 1)
  packed fp8  the same with the opt-in e4m3 packing (fewer bytes; lossy)

Each is timed around `batch_transfer_sync_write`, after a warm-up write that opens the connections.
Rate = payload bytes / time; "of link" = rate / the configured link rate. Pack (on A) and unpack (a
local scatter into a second pool) are timed separately on the CPU path (torch), since on a GPU they are
device copies. The geometry defaults to the tiny test model (4 layers, 8 KV heads, head dim 64, fp32:
16 KiB per token, so 4K tokens are 64 MiB). `--arch mla` sends an MLA pool's KV instead: one latent
buffer per layer, rows of `--kv-lora-rank` + `--head-dim` (the rope key) values, no K/V split, as
sglang's `MLATokenToKVPool` holds it (e.g. DeepSeek-V3: `--arch mla --layers 61 --kv-lora-rank 512
--head-dim 64 --dtype bfloat16`, 70 KB per token).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from sglang_pdd.lab.micro.mooncake_tcp import MAX_BATCH_SLICES, register, tcp_engine
from sglang_pdd.kernels.kv_pack import pack_kv, unpack_kv
from sglang_pdd.kernels.kv_pack_layout import PackLayout

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Geometry:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    tokens: int
    page_size: int
    kv_lora_rank: int = 0  # > 0: an MLA pool (one latent buffer per layer)

    @property
    def buffers_per_layer(self) -> int:
        return 1 if self.kv_lora_rank else 2

    @property
    def row(self) -> tuple[int, int]:
        """(heads, values per head) of one token's row in one buffer."""
        return (1, self.kv_lora_rank + self.head_dim) if self.kv_lora_rank else (self.kv_heads, self.head_dim)

    @property
    def page_bytes(self) -> int:
        item = torch.empty((), dtype=DTYPES[self.dtype]).element_size()
        heads, dim = self.row
        return self.page_size * heads * dim * item

    @property
    def buffers(self) -> int:
        return self.buffers_per_layer * self.layers

    @property
    def pages(self) -> int:
        return -(-self.tokens // self.page_size)

    @property
    def pool_pages(self) -> int:
        return 2 * self.pages  # half free, so the request's pages land scattered

    def buffer_bytes(self) -> int:
        """One layer's K (or V) buffer."""
        return self.pool_pages * self.page_bytes


def run_target(host: str, geo: Geometry) -> None:
    """MD's side: a pool (its buffers) and a staging buffer, registered; then wait for "quit"."""
    engine = tcp_engine(host)
    pool = torch.zeros(geo.buffers * geo.buffer_bytes(), dtype=torch.uint8)
    staging = torch.zeros(geo.buffers * geo.pages * geo.page_bytes + 4096, dtype=torch.uint8)
    register(engine, pool)
    register(engine, staging)
    print(json.dumps({"session": f"{host}:{engine.get_rpc_port()}", "pool": pool.data_ptr(),
                      "staging": staging.data_ptr()}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break


def _timed_write(engine: Any, session: str, srcs: list[int], dsts: list[int], lens: list[int]) -> float:
    t0 = time.perf_counter()
    rc = engine.batch_transfer_sync_write(session, srcs, dsts, lens)
    dt = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"batch_transfer_sync_write returned {rc}")
    return dt


def run_initiator(host: str, peer: dict[str, Any], geo: Geometry, chunks: int, seed: int) -> dict[str, Any]:
    """P's side: build a pool, send the request's KV paged, packed and packed-fp8; return the timings."""
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[geo.dtype]
    slots_per_buf = geo.pool_pages * geo.page_size
    backing = torch.randn((geo.buffers, slots_per_buf, *geo.row), generator=gen).to(dtype)
    bufs = list(backing.unbind(0))
    k_bufs, v_bufs = bufs[: geo.layers], bufs[geo.layers :]  # MLA: the latent buffers, no V
    src_pages = torch.randperm(geo.pool_pages, generator=gen)[: geo.pages]
    dst_pages = torch.randperm(geo.pool_pages, generator=gen)[: geo.pages]
    slots = (src_pages[:, None] * geo.page_size + torch.arange(geo.page_size)[None, :]).reshape(-1)[: geo.tokens]

    engine = tcp_engine(host)
    staging = torch.zeros(geo.buffers * geo.pages * geo.page_bytes + 4096, dtype=torch.uint8)
    register(engine, backing)
    register(engine, staging)
    session = peer["session"]
    _timed_write(engine, session, [staging.data_ptr()], [peer["staging"]], [4096])  # connect

    results: dict[str, Any] = {}
    # paged: every (buffer, page) is its own slice, source and destination pages both scattered
    buf_bytes = geo.buffer_bytes()
    srcs, dsts, lens = [], [], []
    for b in range(geo.buffers):
        src_base = backing[b].data_ptr()
        dst_base = peer["pool"] + b * buf_bytes
        for sp, dp in zip(src_pages.tolist(), dst_pages.tolist()):
            srcs.append(src_base + sp * geo.page_bytes)
            dsts.append(dst_base + dp * geo.page_bytes)
            lens.append(geo.page_bytes)
    # consecutive batches of at most MAX_BATCH_SLICES (see mooncake_tcp)
    seconds = 0.0
    for i in range(0, len(lens), MAX_BATCH_SLICES):
        seconds += _timed_write(engine, session, srcs[i : i + MAX_BATCH_SLICES], dsts[i : i + MAX_BATCH_SLICES],
                                lens[i : i + MAX_BATCH_SLICES])
    results["paged"] = {"bytes": sum(lens), "slices": len(lens), "seconds": seconds}
    for name, fp8 in (("packed", False), ("packed fp8", True)):
        nbytes = PackLayout.for_buffers(k_bufs, v_bufs, geo.tokens, fp8).nbytes
        t0 = time.perf_counter()
        packed, _ = pack_kv(k_bufs, v_bufs, slots, fp8=fp8, out=staging[:nbytes])  # straight into registered memory
        pack_s = time.perf_counter() - t0
        step = -(-nbytes // chunks)
        offs = list(range(0, nbytes, step))
        seconds = _timed_write(engine, session, [staging.data_ptr() + o for o in offs],
                               [peer["staging"] + o for o in offs], [min(step, nbytes - o) for o in offs])
        dst_k = [torch.zeros_like(k_bufs[0]) for _ in range(geo.layers)]
        dst_v = [torch.zeros_like(v) for v in v_bufs]
        dst_slots = (dst_pages[:, None] * geo.page_size + torch.arange(geo.page_size)[None, :]).reshape(-1)
        t0 = time.perf_counter()
        unpack_kv(packed, dst_k, dst_v, dst_slots[: geo.tokens], fp8=fp8)
        unpack_s = time.perf_counter() - t0
        results[name] = {"bytes": nbytes, "slices": len(offs), "seconds": seconds, "pack_s": pack_s,
                         "unpack_s": unpack_s}
    return results


def _geometry(args: argparse.Namespace) -> Geometry:
    return Geometry(args.layers, args.kv_heads, args.head_dim, args.dtype, args.tokens, args.page_size,
                    args.kv_lora_rank if args.arch == "mla" else 0)


def _role_argv(args: argparse.Namespace, role: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "sglang_pdd.lab.micro.wan_pack", "--role", role,
            "--layers", str(args.layers), "--kv-heads", str(args.kv_heads), "--head-dim", str(args.head_dim),
            "--dtype", args.dtype, "--tokens", str(args.tokens), "--page-size", str(args.page_size),
            "--chunks", str(args.chunks), "--arch", args.arch, "--kv-lora-rank", str(args.kv_lora_rank), *extra]


def orchestrate(args: argparse.Namespace) -> int:
    try:
        from sglang_pdd.lab.testbed import Testbed
    except ImportError as e:
        print(f"testbed unavailable ({e}): benchmark (a) pending", file=sys.stderr)
        return 2
    env = dict(os.environ, MC_LOG_LEVEL=os.environ.get("MC_LOG_LEVEL", "ERROR"))
    with Testbed(args.prefix, delay_ms=args.delay_ms, rate_mbit=args.rate_mbit) as tb:
        target = subprocess.Popen(tb.ns("B").argv(_role_argv(args, "target", ["--host", tb.addr("B")])),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        try:
            line = target.stdout.readline()  # type: ignore[union-attr]
            while line and not line.startswith("{"):
                line = target.stdout.readline()  # type: ignore[union-attr]
            if not line:
                raise RuntimeError("Mooncake target in B did not start")
            before = tb.link_bytes()
            proc = subprocess.run(
                tb.ns("A").argv(_role_argv(args, "initiator", ["--host", tb.addr("A"), "--peer", line.strip()])),
                capture_output=True, text=True, env=env, timeout=args.timeout_s,
            )
            after = tb.link_bytes()
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            results = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
        finally:
            if target.poll() is None:
                target.communicate("quit\n", timeout=10)
    link_rate = args.rate_mbit * 1e6 / 8
    geo = _geometry(args)
    shape = (f"1 latent of {geo.kv_lora_rank} + {geo.head_dim} rope (MLA)" if geo.kv_lora_rank
             else f"{geo.kv_heads} KV heads x {geo.head_dim}")
    print(f"{geo.tokens} tokens x {geo.layers} layers x {shape} ({geo.dtype}), "
          f"page {geo.page_size}; link {args.rate_mbit:g} Mbit/s, {args.delay_ms:g} ms one way; "
          f"wire bytes A->B {after['A->B'] - before['A->B']}")
    print(f"{'mode':<12} {'MB':>8} {'slices':>7} {'seconds':>8} {'Mbit/s':>8} {'of link':>8} "
          f"{'pack s':>7} {'unpack s':>8}")
    for mode, r in results.items():
        rate = r["bytes"] / r["seconds"]
        r["of_link"] = rate / link_rate
        print(f"{mode:<12} {r['bytes'] / 1e6:>8.2f} {r['slices']:>7} {r['seconds']:>8.2f} {rate * 8 / 1e6:>8.1f} "
              f"{r['of_link']:>7.0%} {r.get('pack_s', float('nan')):>7.2f} {r.get('unpack_s', float('nan')):>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"geometry": geo.__dict__, "rate_mbit": args.rate_mbit, "delay_ms": args.delay_ms,
                       "results": results}, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=list(DTYPES), default="float32")
    ap.add_argument("--arch", choices=["mha", "mla"], default="mha",
                    help="mha: K and V buffers per layer (--kv-heads x --head-dim); mla: one latent buffer per "
                         "layer, rows of --kv-lora-rank + --head-dim (the rope key)")
    ap.add_argument("--kv-lora-rank", type=int, default=512, help="--arch mla: the latent width")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=1, help="slices the packed buffer is sent as")
    ap.add_argument("--rate-mbit", type=float, default=100.0)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--prefix", default="pdkp", help="testbed name prefix")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--role", choices=["orchestrate", "target", "initiator"], default="orchestrate",
                    help=argparse.SUPPRESS)
    ap.add_argument("--host", help=argparse.SUPPRESS)
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "target":
        run_target(args.host, _geometry(args))
        return 0
    if args.role == "initiator":
        print(json.dumps(run_initiator(args.host, json.loads(args.peer), _geometry(args), args.chunks, args.seed)))
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
