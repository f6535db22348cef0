"""The transfer path's test seams (transfer/controls.py): production values without a knobs file, the
knobs re-read at each use with one, and each seam handed to its user when the process builds it (P's
fan-out builder, MD's packed receiver) or asked at each KV write (P's write hook)."""

import json

import pytest

from sglang_pdd.config import PddConfig
from sglang_pdd.hooks import transfer as transfer_hooks
from sglang_pdd.process_state import fanout, packed_wan
from sglang_pdd.process_state.transfer_ledger import LEDGER
from sglang_pdd.server.roles import Role
from sglang_pdd.test_switches import OFF, TestSwitches
from sglang_pdd.transfer import controls
from sglang_pdd.transfer.accounting import DIRECT_PATH
from sglang_pdd.transfer.controls import PRODUCTION, TransferControls, from_switches
from sglang_pdd.transfer.lanes import MAIN_PATH, RELAY_PATH
from tests.fakes.clock import FakeClock


@pytest.fixture(autouse=True)
def uncached_config(monkeypatch):
    """process_state.packed_wan caches the process's config on first use: these tests leave it unread
    (later tests export their own)."""
    monkeypatch.setattr(packed_wan, "cfg", PddConfig)


def test_without_a_knobs_file_the_seams_are_productions():
    for switches in (OFF, TestSwitches(testing=True)):
        assert from_switches(switches) is PRODUCTION
    assert PRODUCTION.extra_skip_pages() == 0 and PRODUCTION.skip_unpack() is False
    assert PRODUCTION.before_kv_write is controls.nothing  # no sleep before a write to MD


def test_with_a_knobs_file_each_seam_reads_its_knob_at_each_use(tmp_path):
    knobs = tmp_path / "knobs.json"
    clock = FakeClock()
    c = from_switches(TestSwitches(knobs_file=str(knobs)), sleep=clock.sleep)
    c.before_kv_write(MAIN_PATH)  # the file is not there yet: the defaults
    assert (c.extra_skip_pages(), c.skip_unpack(), clock.naps) == (0, False, [0.0])
    knobs.write_text(json.dumps({"main_write_delay": 0.25, "main_extra_skip_pages": 2, "packed_skip_unpack": True}))
    for path in (MAIN_PATH, RELAY_PATH, DIRECT_PATH):
        c.before_kv_write(path)
    assert (c.extra_skip_pages(), c.skip_unpack(), clock.naps) == (2, True, [0.0, 0.25])  # the main path only
    knobs.write_text(json.dumps({"main_write_delay": 1}))  # a test changes them while the server runs
    c.before_kv_write(MAIN_PATH)
    assert (c.extra_skip_pages(), c.skip_unpack(), clock.naps[-1]) == (0, False, 1.0)


def test_the_kv_write_hook_runs_the_seam_with_the_writes_path_before_each_write(monkeypatch):
    seen: list = []
    monkeypatch.setattr(controls, "for_process", lambda: TransferControls(before_kv_write=seen.append))

    def original(manager, session_id, prefill_pages, dst_ptrs, dst_pages):
        seen.append("write")
        return 0

    with LEDGER.path(MAIN_PATH):
        assert transfer_hooks.around_send_kvcache(original, object(), "peer", [1], [2], [3]) == 0
    transfer_hooks.around_send_kvcache(original, object(), "peer", [1], [2], [3])
    assert seen == [MAIN_PATH, "write", DIRECT_PATH, "write"]


@pytest.fixture
def process_controls(monkeypatch):
    """The process's controls, each seam a function of its own to find again."""
    c = TransferControls(extra_skip_pages=lambda: 3, skip_unpack=lambda: True)
    monkeypatch.setattr(controls, "for_process", lambda: c)
    return c


def test_the_process_builds_p_and_mds_transfer_objects_with_its_seams(process_controls, monkeypatch):
    monkeypatch.setenv("SGLANG_PDD_SECRET", "a-test-secret-of-32-bytes-length")
    PddConfig(role=Role.PREFILL).export_env()
    try:
        assert fanout.builder.__wrapped__().extra_skip_pages is process_controls.extra_skip_pages
    finally:
        PddConfig().export_env()
    assert packed_wan.receiver.__wrapped__()._skip_unpack is process_controls.skip_unpack
