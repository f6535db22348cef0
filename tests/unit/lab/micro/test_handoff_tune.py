"""The tile sweep's candidates: tiles no taller than the rows of a request call for, never the launcher's
own tiling twice, and its tiles with other partition counts; the best of a sweep is its fastest ok row."""

from __future__ import annotations

from sglang_pdd.lab.micro.handoff_tune import SPLIT_TARGETS, TILES, Candidate, best, candidates


def test_candidates_follow_the_rows_of_one_request() -> None:
    chosen = Candidate(16, 64, 4, 2)
    one = candidates(4, 1, chosen)  # 4 rows: 16-row tiles only, besides the partition counts
    assert {c.block_m for c in one} == {16} and chosen not in one
    assert {c.target_sms for c in one if c.target_sms is not None} == set(SPLIT_TARGETS)
    many = candidates(4, 256, Candidate(128, 64, 8, 2))
    assert {c.block_m for c in many} == {16, 32, 64, 128}
    assert len([c for c in many if c.target_sms is None]) == len(TILES) - 1  # all but the chosen one
    assert {c.block_m for c in candidates(8, 8, chosen)} >= {16, 32, 64, 128}  # 64 rows: up to 128
    assert all(c.block_m >= 8 for c in candidates(8, 1, chosen))


def test_best_is_the_fastest_row_that_ran_within_tolerance() -> None:
    rows = [{"status": "BAD", "us": 1.0}, {"status": "ok", "us": 3.0, "label": "a"},
            {"status": "ok", "us": 2.0, "label": "b"}, {"status": "ERROR"}]
    assert best(rows)["label"] == "b"
    assert best([{"status": "STALL"}]) is None
