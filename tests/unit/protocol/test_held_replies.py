"""The relay's held replies (`protocol.held_replies`): kept in order per session, taken once, bounded in
bytes (what does not fit is refused, nothing of it kept) and in age (a session's replies all go once
its oldest is older than the TTL), and forgotten with their session."""

from sglang_pdd.protocol.held_replies import HeldReplies


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_replies_are_held_in_order_and_taken_once():
    h = HeldReplies(max_bytes=100, now=Clock())
    assert h.hold(1, [b"a", b"b"]) and h.hold(2, [b"x"]) and h.hold(1, [b"c"])
    assert 1 in h and h.bytes == 4
    assert h.take(1) == [b"a", b"b", b"c"] and 1 not in h and h.take(1) == []
    assert h.forget(2) == [b"x"] and h.bytes == 0


def test_what_does_not_fit_is_refused_whole():
    h = HeldReplies(max_bytes=10, now=Clock())
    assert h.hold(1, [b"12345678"])
    assert not h.hold(2, [b"1", b"234"])  # 12 > 10: nothing of it kept
    assert 2 not in h and h.bytes == 8
    assert h.hold(2, [b"12"]) and h.bytes == 10


def test_a_session_whose_oldest_reply_is_too_old_loses_them_all():
    clock = Clock()
    h = HeldReplies(max_bytes=100, ttl_s=60, now=clock)
    h.hold(1, [b"old"])
    clock.t = 30
    h.hold(2, [b"newer"])
    h.hold(1, [b"later"])
    clock.t = 61
    assert h.take(2) == [b"newer"]  # 31 s old: kept
    assert 1 not in h and h.expired == 2 and h.bytes == 0
