"""A migrated copy's feeds into the client's stream (`Stitcher`): its output follows the tokens the
client already has (`Stitcher.resume`), a length finish counts from the client's start
(`rules.continued_finish`), only a relayed copy (P->RLD->MD) may hand off, and a stop string
straddling the boundary ends the stream where it completes (`stop_watch.StopWatch`)."""

from __future__ import annotations

from sglang_pdd.protocol.handoff_finish import HandoffFinish
from sglang_pdd.router.request.migration import rules as migration
from sglang_pdd.router.request.stitch import Delta, Stitcher, StitchError
from sglang_pdd.router.request.stop_watch import StopWatch


def feeds(stitcher: Stitcher, offset: int, relayed: bool, watch: StopWatch | None = None):
    """(relay feed, main feed) for a copy that goes on after `offset` tokens."""
    def watched(feed):
        def fed(output_ids: list[int], reason: dict | None) -> Delta:
            if watch is not None and watch.watching:
                have = len(stitcher.ids) - stitcher.offset
                hit = watch.first_stop(stitcher.ids, [int(t) for t in output_ids[have:]])
                if hit is not None:
                    return stitcher.end({"type": "stop", "matched": hit[1]}, list(output_ids[:have + hit[0]]))
            return feed(output_ids, reason)
        return fed

    def feed_main(output_ids: list[int], reason: dict | None) -> Delta:
        if HandoffFinish.from_finish(reason) is not None:
            raise StitchError("a handoff from a migrated copy that has no relay")
        return stitcher.feed_main(output_ids, migration.continued_finish(reason, offset))

    def feed_relay(output_ids: list[int], reason: dict | None) -> Delta:  # a handoff finish passes unchanged
        return stitcher.feed_relay(output_ids, migration.continued_finish(reason, offset))
    return watched(feed_relay if relayed else feed_main), watched(feed_main)
