"""What the router tells its client about one `/generate` request, in the reply's `meta_info["pdd"]`:

    {"v": 1, "pipeline": "P->RLD->MD", "handoff_tokens": k, "handoff_mode": "catch-up",
     "reason": "...", "md_hit": 900, "missed_bytes": ..., "predicted_wan_s": ..., "rld_in_flight": 2,
     "md": {"index": 0, "site": "b", "reason": "cache-aware ...", "hits": [...], "loads": [...]},
     "migrations": 0, "migration_causes": [], "migration_pipelines": []}

The router (`router/app.py`) builds a `ReplyMeta` and sends it, every key present, in each chunk of a
stream (the last one is final: the handoff and the migrations are known once they happened); a
client reads it back with `ReplyMeta.of(meta_info)`, None for a reply without the key (a plain
sglang server, a baseline's router). A reply without `v` is read as this version (as a handoff
finish is); one of another version, with an unknown key or a value out of range raises a
`ReplyMetaError` that says which.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from sglang_pdd.protocol import PROTOCOL_VERSION

KEY = "pdd"

PipelineName = Literal["P->MD", "P->RLD->MD", "P->RLD"]  # policy.pipeline.Pipeline's values
HandoffMode = Literal["one-shot", "catch-up"]  # messages.CHOSEN_MODES: what a relay handed off with
Count = Annotated[int, msgspec.Meta(ge=0)]


class ReplyMetaError(ValueError):
    """A `meta_info.pdd` that cannot be accepted (not an object, unknown version, key or value)."""


class MainChoiceMeta(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Which MD the router chose and what the choice saw (`router.peers.placement.MainChoice.public()`)."""

    index: Count  # in --main order
    site: str | None = None
    reason: str = ""  # cache-aware, imbalanced, stale, least-loaded, round-robin, only ...
    hits: list[Count] = []  # every MD's cached prompt tokens, in --main order
    loads: list[float] = []


class ReplyMeta(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    v: int = PROTOCOL_VERSION
    pipeline: PipelineName | None = None  # None: not chosen yet
    handoff_tokens: Count | None = None  # k: the eager tokens RLD handed over (None: no handoff)
    handoff_mode: HandoffMode | None = None
    reason: str = ""  # why the router chose the pipeline
    md_hit: Count | None = None  # prompt tokens the router saw in MD's cache at the decision
    missed_bytes: Count | None = None  # MD's predicted missed KV bytes (what P->MD would send over the WAN)
    predicted_wan_s: float | None = None
    rld_in_flight: Count | None = None  # requests in flight on the chosen relay at the decision
    md: MainChoiceMeta | None = None
    migrations: Count = 0
    migration_causes: list[str] = []  # the cause of each migration, in order
    migration_pipelines: list[PipelineName] = []  # the pipeline each migration took

    def to_builtins(self) -> dict:
        """The JSON object the router puts under `meta_info["pdd"]`."""
        return msgspec.to_builtins(self)

    @classmethod
    def of(cls, meta_info: dict | None) -> "ReplyMeta | None":
        """The router's `meta_info["pdd"]` of a reply (or stream chunk); None without the key."""
        if not meta_info or KEY not in meta_info:
            return None
        raw = meta_info[KEY]
        if not isinstance(raw, dict):
            raise ReplyMetaError(f"meta_info.{KEY}: expected an object, got {type(raw).__name__}")
        v = raw.get("v", PROTOCOL_VERSION)
        if v != PROTOCOL_VERSION:
            raise ReplyMetaError(f"meta_info.{KEY}: protocol version {v!r}, this side speaks {PROTOCOL_VERSION}")
        try:
            return msgspec.convert(raw, cls)
        except msgspec.ValidationError as e:
            raise ReplyMetaError(f"meta_info.{KEY}: {e}") from None
