import threading

from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.transfer.accounting import TransferLedger


def test_bytes_are_counted_per_kind_and_peer_and_failures_apart():
    seen = []
    ledger = TransferLedger(on_record=lambda *a, **kw: seen.append(a))
    with ledger.kind("kv"):
        ledger.record("10.0.0.2:1", 4096, ok=True)
        ledger.record("10.0.0.2:1", 4096, ok=False)
    ledger.record("10.0.0.2:1", 100, ok=True)
    snap = ledger.snapshot()
    assert snap[("kv", "10.0.0.2:1")].bytes == 4096
    assert snap[("kv", "10.0.0.2:1")].failed_batches == 1
    assert snap[("other", "10.0.0.2:1")].bytes == 100
    assert ledger.total_bytes("kv") == 4096 and ledger.total_bytes() == 4196
    assert seen[1] == ("kv", "10.0.0.2:1", 4096, False)


def test_kind_is_per_thread():
    ledger = TransferLedger()
    inside, go = threading.Event(), threading.Event()

    def other_thread():
        inside.wait()
        ledger.record("p", 7, ok=True)  # the main thread's kind must not leak here
        go.set()

    t = threading.Thread(target=other_thread)
    t.start()
    with ledger.kind("aux"):
        inside.set()
        go.wait()
    t.join()
    assert ledger.snapshot()[("other", "p")].bytes == 7


def test_prometheus_exposition_is_parsed_by_labels():
    text = (
        "# HELP sglang_pdd_transfer_bytes_total x\n"
        'sglang_pdd_transfer_bytes_total{kind="kv",peer="a:1"} 1.6e+04\n'
        'sglang_pdd_transfer_bytes_total{kind="aux",peer="a:1"} 8.0\n'
        'sglang_pdd_transfer_bytes_created{kind="kv",peer="a:1"} 1.7e9\n'
    )
    got = parse_exposition(text, "sglang_pdd_transfer_bytes_total")
    assert got == {(("kind", "kv"), ("peer", "a:1")): 16000.0, (("kind", "aux"), ("peer", "a:1")): 8.0}


def test_path_comes_from_the_writing_thread_then_the_peer_session_else_direct():
    seen = []
    ledger = TransferLedger(on_record=lambda *a, path: seen.append(path))
    ledger.tag_sessions(["relay:1"], "relay")
    with ledger.kind("kv"):
        ledger.record("relay:1", 100, ok=True)
        ledger.record("plain:2", 10, ok=True)
        with ledger.path("main"):
            ledger.record("md:3", 7, ok=True)
            ledger.record("relay:1", 1, ok=True)  # the thread's path wins
    assert seen == ["relay", "direct", "main", "main"]
    totals = ledger.path_totals()
    assert totals[("relay", "kv")].bytes == 100 and totals[("direct", "kv")].bytes == 10
    assert totals[("main", "kv")].bytes == 8 and ledger.current_path() == "direct"
