"""What the prefill reports as still held, and the idle check the e2e leak tests rely on."""

from sglang_pdd.transfer.pool_state import idle_problems


def test_idle_check_names_what_a_prefill_still_holds():
    idle = {"kv_total": 100, "kv_available": 60, "kv_evictable": 40, "kv_protected": 0, "req_rows_free": 8,
            "req_rows_total": 8, "metadata_free": 16, "metadata_total": 16, "bootstrap_queue": 0,
            "inflight_queue": 0, "rooms": {"request_status": 0, "transfer_infos": 0}}
    assert idle_problems(idle) == []
    leaky = {**idle, "kv_available": 59, "metadata_free": 15, "rooms": {"request_status": 1, "transfer_infos": 0}}
    problems = idle_problems(leaky)
    assert len(problems) == 3 and any("request_status" in p for p in problems)
