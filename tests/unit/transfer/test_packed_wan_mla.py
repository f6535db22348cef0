"""The packed WAN path on an MLA pool (DeepSeek-style latent KV: one buffer per layer, no K/V split): the
pool view sees the latent rows as K with no V, the landing offer carries that geometry (V heads and dim
both 0), and P's packed chunks land in MD's pages exactly (plain) or within e4m3 precision (fp8),
touching nothing else. The same P -> MD link as tests/unit/transfer/test_packed_wan.py (fakes, no sglang
process), with sglang's MLA pool reduced to its latent buffers (tests.fakes.kv_pool.MLATokenToKVPool)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

from sglang_pdd.kernels.kv_pack_layout import PackLayout
from sglang_pdd.protocol.landing import LandingError, decode_offer, encode_offer
from sglang_pdd.transfer.kv_pool_view import KVPoolView, view_of
from sglang_pdd.transfer.packed_receiver import SUCCESS

from tests.fakes.kv_manager import FakeKVManager
from tests.fakes.kv_pool import MHATokenToKVPool, MLATokenToKVPool
from tests.unit.transfer.packed_wan_link import assert_landed, assert_untouched, make_link, wan_pool

DST = [9, 3, 5, 1, 12, 0, 14]
SRC = [2, 7, 4, 11, 0, 15, 6]
CHUNKS = [slice(0, 3), slice(3, 4), slice(4, 7)]
MLA = dict(cls=MLATokenToKVPool, kv_lora_rank=12, qk_rope_head_dim=4)  # latent rows of 16 values


def send(link, chunk: slice):
    return link.tx.send(link.p, "s", np.asarray(SRC[chunk]), np.asarray(DST[chunk]))


def test_pool_view_of_an_mla_pool_is_its_latent_rows_as_k_alone():
    pool = wan_pool(**MLA, page_size=4)
    manager = FakeKVManager(pool)
    view = view_of(manager)
    assert isinstance(view, KVPoolView) and view.k == pool.kv_buffer and view.v == []
    assert view.geometry() == (4, 2, 1, 16, 0, 0, "float32")
    layout = view.layout(3, False)
    assert layout == PackLayout(2, 12, 1, 16, 0, 0, torch.float32) and layout.latent
    assert layout.nbytes == layout.raw_bytes == 2 * 12 * 16 * 4  # one latent row per token and layer


class DSATokenToKVPool(MLATokenToKVPool):
    pass


def _with(**attrs):
    pool = wan_pool(**MLA)
    for k, v in attrs.items():
        setattr(pool, k, v)
    return pool


@pytest.mark.parametrize("pool, reason", [
    (wan_pool(**{**MLA, "cls": DSATokenToKVPool}), "pool DSATokenToKVPool"),
    (_with(use_dsa=True), "pool with a DSA index"),
    (_with(kv_buffer=[]), "pool buffers"),
    (_with(store_dtype=torch.uint8), "pool layout"),
], ids=["dsa-subclass", "dsa-flag", "empty", "store-dtype"])
def test_pool_view_refuses_mla_pools_it_cannot_pack(pool, reason):
    assert KVPoolView.of(pool, 4).startswith(reason)


def test_the_offer_carries_mla_geometry_and_a_half_empty_v_is_refused():
    link = make_link("plain", pool=MLA)
    link.open_room(5, DST)
    _, offer = link.region(5)
    assert (offer.k_heads, offer.k_head_dim, offer.v_heads, offer.v_head_dim) == (1, 16, 0, 0)
    for bad in (dict(v_heads=0, v_head_dim=4), dict(v_heads=1, v_head_dim=0), dict(k_heads=0)):
        with pytest.raises(LandingError, match="V heads but no V head dim|non-positive"):
            decode_offer(encode_offer(msgspec.structs.replace(offer, **bad)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("mode", ["plain", "fp8"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_mla_chunks_packed_on_p_land_in_mds_pages(page_size, mode, dtype):
    link = make_link(mode, page_size, dtype=dtype, pool=MLA)
    before = link.md.pool.snapshot()
    link.open_room(77, DST)
    assert [send(link, c) for c in CHUNKS] == [0, 0, 0]
    assert link.tx_events == ["packed"] * 3 and link.rx_events == ["offered"]
    assert link.rx.on_poll(link.md, 77, SUCCESS) == (SUCCESS, None)
    assert link.rx_events == ["offered", "unpacked"]
    assert_landed(link, SRC, DST, fp8=mode == "fp8")
    assert_untouched(link, before, DST)
    assert link.rx.arena.used() == 0 and link.rx.rooms() == 0


def test_an_mha_prefill_and_an_mla_main_do_not_pack_for_each_other():
    link = make_link("plain", pool=MLA, p_pool=dict(cls=MHATokenToKVPool))
    link.open_room(1, DST)
    assert send(link, CHUNKS[0]) is None
    assert link.tx_events == ["page by page: geometry"] and link.p.batches == []
