"""Everything that runs inside a RelayDecode or MainDecode scheduler.

`role` is the interface both runtimes implement, `runtime` chooses and builds the scheduler's one runtime
(bound once, at its first use), `extension` is sglang's decode scheduler extension point (patch 0003)
that delegates to it, `rank_sync` replays rank 0's decisions on the other TP ranks, `request_errors` ends
one request with an error without touching the others. `relay/` is RelayDecode (eager tokens, the
handoff by token IDs), `main/` is MainDecode (the handoff, its one EXTEND over t1..tk, the decode radix
cache's side of it).
"""
