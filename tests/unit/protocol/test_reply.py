"""The router's `meta_info.pdd` (`protocol.reply`): what the router sends is what a client reads back,
versioned; a reply without it (a plain sglang server) reads as None; anything garbled is refused."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.protocol import PROTOCOL_VERSION
from sglang_pdd.protocol.messages import CHOSEN_MODES
from sglang_pdd.protocol.reply import KEY, HandoffMode, MainChoiceMeta, PipelineName, ReplyMeta, ReplyMetaError

PROMPT = [5, 6, 7]
KEYS = {"v", "pipeline", "handoff_tokens", "handoff_mode", "reason", "md_hit", "missed_bytes", "predicted_wan_s",
        "rld_in_flight", "md", "migrations", "migration_causes", "migration_pipelines"}


def _router_replies(stream: bool) -> list[dict]:
    """Every `meta_info` of a relayed request through the real router (fake roles, handoff after 4)."""
    async def go():
        async with fu.FakeCluster() as cl, fu.router_client(cl, pipeline="relay") as c:
            r = await c.post("/generate", json={"input_ids": PROMPT, "stream": stream,
                                                "sampling_params": {"max_new_tokens": 12}})
            assert r.status == 200
            return await r.text()
    text = asyncio.run(asyncio.wait_for(go(), 30))
    if not stream:
        return [json.loads(text)["meta_info"]]
    return [json.loads(x[5:])["meta_info"] for x in text.split("\n") if x.startswith("data:") and "[DONE]" not in x]


@pytest.mark.parametrize("stream", [False, True])
def test_round_trip_through_the_routers_json(stream):
    metas = _router_replies(stream)
    assert metas
    for meta in metas:
        raw = meta[KEY]
        assert set(raw) == KEYS and raw["v"] == PROTOCOL_VERSION
        got = ReplyMeta.of(meta)
        assert got.to_builtins() == raw  # nothing lost or added on the way back
    last = ReplyMeta.of(metas[-1])
    assert last.pipeline == "P->RLD->MD" and last.handoff_tokens == 4 and last.handoff_mode == "one-shot"
    assert isinstance(last.md, MainChoiceMeta) and last.md.index == 0 and last.md.hits == [0]
    assert last.migrations == 0 and last.migration_causes == [] and last.migration_pipelines == []


def test_a_reply_without_the_key_is_none_and_a_partial_one_takes_the_defaults():
    assert ReplyMeta.of({"finish_reason": {"type": "length"}, "prompt_tokens": 3}) is None  # plain sglang
    assert ReplyMeta.of({}) is None and ReplyMeta.of(None) is None
    partial = ReplyMeta.of({KEY: {"pipeline": "P->MD"}})  # no v: read as this version
    assert partial == ReplyMeta(pipeline="P->MD") and partial.v == PROTOCOL_VERSION
    assert partial.md is None and partial.migrations == 0 and partial.reason == "" and partial.handoff_tokens is None
    assert msgspec.to_builtins(ReplyMeta())["v"] == PROTOCOL_VERSION


@pytest.mark.parametrize("raw, says", [
    ({"v": 2, "pipeline": "P->MD"}, "protocol version 2"),
    ({"v": "1"}, "protocol version '1'"),
    ({"pipeline": "P->X"}, "$.pipeline"),
    ({"handoff_mode": "adaptive"}, "$.handoff_mode"),  # a request's mode, never a relay's choice
    ({"handoff_tokens": -1}, "$.handoff_tokens"),
    ({"migrations": "1"}, "$.migrations"),
    ({"migration_pipelines": ["P->MD", "sideways"]}, "$.migration_pipelines[1]"),
    ({"md": {"index": 0, "hits": [1], "loads": [0.0], "url": "http://h"}}, "unknown field `url`"),
    ({"md": {"site": "a"}}, "missing required field `index`"),
    ({"md": 3}, "$.md"),
    ({"pipeline": "P->MD", "colour": "red"}, "unknown field `colour`"),
    ("P->MD", "expected an object, got str"),
    (None, "expected an object, got NoneType"),
])
def test_garbled_values_are_refused_with_a_clear_error(raw, says):
    with pytest.raises(ReplyMetaError, match=r"^meta_info\.pdd: ") as e:
        ReplyMeta.of({KEY: raw})
    assert says in str(e.value)


def test_the_literals_follow_the_policy_and_the_channel():
    assert set(PipelineName.__args__) == {p.value for p in Pipeline}
    assert HandoffMode.__args__ == CHOSEN_MODES
