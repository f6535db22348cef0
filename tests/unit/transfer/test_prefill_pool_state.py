"""What the prefill reports as still held, and the idle check the e2e leak tests rely on."""

from sglang_pdd.transfer.pool_state import idle_problems, pool_counts


def test_idle_check_names_what_a_prefill_still_holds():
    idle = {"kv_total": 100, "kv_available": 60, "kv_evictable": 40, "kv_protected": 0, "req_rows_free": 8,
            "req_rows_total": 8, "metadata_free": 16, "metadata_total": 16, "bootstrap_queue": 0,
            "inflight_queue": 0, "rooms": {"request_status": 0, "transfer_infos": 0}}
    assert idle_problems(idle) == []
    leaky = {**idle, "kv_available": 59, "metadata_free": 15, "rooms": {"request_status": 1, "transfer_infos": 0}}
    problems = idle_problems(leaky)
    assert len(problems) == 3 and any("request_status" in p for p in problems)


class _Rows:
    def __init__(self, size: int, free: int, pre_alloc_size: int | None = None):
        self.size, self._free = size, free
        if pre_alloc_size is not None:
            self.pre_alloc_size = pre_alloc_size

    def available_size(self) -> int:
        return self._free


def test_rows_total_counts_a_decode_pools_preallocation_rows():
    from sglang_pdd.transfer.pool_state import rows_total

    assert rows_total(_Rows(8, 8)) == 8  # sglang's ReqToTokenPool: `size` rows
    # DecodeReqToTokenPool: `size` rows for running requests and `pre_alloc_size` more for those whose KV
    # is on its way; idle, all 24 are free (a decode server reporting 24 free of 8 was the old gauge)
    assert rows_total(_Rows(8, 24, pre_alloc_size=16)) == 24


def test_the_rows_gauge_reads_free_equal_to_total_on_an_idle_decode_server():
    from types import SimpleNamespace

    from prometheus_client import REGISTRY

    from sglang_pdd.server import metrics

    tree = SimpleNamespace(evictable_size=lambda: 0, protected_size=lambda: 0)
    scheduler = SimpleNamespace(token_to_kv_pool_allocator=SimpleNamespace(available_size=lambda: 100),
                                tree_cache=tree, max_total_num_tokens=100,
                                req_to_token_pool=_Rows(8, 24, pre_alloc_size=16))
    metrics.publish_pool_state("unit-idle", pool_counts(scheduler))
    value = lambda state: REGISTRY.get_sample_value("sglang_pdd_req_rows", {"role": "unit-idle", "state": state})  # noqa: E731
    assert value("free") == value("total") == 24
    scheduler.req_to_token_pool = _Rows(8, 23, pre_alloc_size=16)  # one row taken: the leak checks see it
    metrics.publish_pool_state("unit-idle", pool_counts(scheduler))
    assert value("free") == 23 != value("total")
