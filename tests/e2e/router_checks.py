"""Checks of tests/e2e/test_pdd_router.py's router cluster: handoffs counted on MD, token identity of
`/generate` against a single server (plain and constrained: `json_schema`, `regex`, `ebnf`), the
OpenAI endpoints' text."""

import json
import re
import urllib.request

import jsonschema

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body, stream_generate
from sglang_pdd.lab.testing.servers import http_json
from sglang_pdd.protocol.reply import ReplyMeta

from .cluster import metric

N = 96
EAGER = 4  # RLD's relay_min_eager knob for the router module: every relayed request hands over at k >= 4


def handoffs_on_main(router) -> tuple[float, float]:
    """(handoffs, eager tokens handed over) counted on MD: deltas of these show a handoff happened."""
    m = router["main"].url
    return (sum(metric(m, "sglang_pdd_handoffs_total").values()),
            sum(metric(m, "sglang_pdd_handoff_tokens_total").values()))


def assert_one_handoff(router, before: tuple[float, float], min_k: int = EAGER) -> int:
    after = handoffs_on_main(router)
    assert after[0] - before[0] == 1, (before, after)
    k = after[1] - before[1]
    assert k >= min_k, f"handed over after {k} eager tokens"
    return int(k)


def check_generate(router, reference_server, ids, pipeline, stream, n=N, what="", **sp):
    want = identity.reference(reference_server.url, ids, n, **sp)
    url = router[pipeline].url
    body = greedy_body(ids, n, **sp)
    before = handoffs_on_main(router)
    out = stream_generate(url, body) if stream else http_json(url + "/generate", body)[1]
    identity.check(want, out["output_ids"], f"router {pipeline}{' stream' if stream else ''} {what}")
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == n
    pdd = ReplyMeta.of(meta)
    assert pdd.pipeline == ("P->RLD->MD" if pipeline == "relay" else "P->MD")
    if pipeline == "relay":
        k = assert_one_handoff(router, before)
        assert pdd.handoff_tokens == k and pdd.handoff_mode in ("one-shot", "catch-up")
    else:
        assert handoffs_on_main(router)[0] == before[0] and pdd.handoff_tokens is None
    return out


def router_metric(url: str, name: str) -> float:
    return sum(metric(url, name).values())


def main_leg_bytes(router) -> float:
    """KV bytes P wrote to MainDecode (fan-out leg and direct path): what crosses the WAN."""
    return sum(v for k, v in metric(router["prefill"].url, "sglang_pdd_transfer_bytes_total").items()
               if dict(k).get("path") in ("main", "direct"))


def openai(url: str, path: str, body: dict, stream: bool):
    req = urllib.request.Request(url + path, data=json.dumps({**body, "stream": stream}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        if not stream:
            return json.load(r)
        chunks = [json.loads(l[5:]) for l in (x.decode().strip() for x in r) if l.startswith("data:") and "[DONE]" not in l]
    return chunks


def completion_text(got, stream: bool) -> tuple[str, str]:
    if stream:
        text = "".join(c["choices"][0]["text"] for c in got if c.get("choices"))
        return text, [c["choices"][0]["finish_reason"] for c in got if c.get("choices")][-1]
    return got["choices"][0]["text"], got["choices"][0]["finish_reason"]


# -- structured output: the grammar on P (t1), RLD (t2..tk) and MD (accepts t1..tk, then masks) -----------

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "count", "ok", "tag"],
          "properties": {"name": {"type": "string", "enum": ["ls", "cat", "grep"]},
                         "count": {"type": "integer", "minimum": 0, "maximum": 999},
                         "ok": {"type": "boolean"},
                         "tag": {"type": "string", "pattern": "^[a-z]{2,6}$"}}}
REGEX = r"(yes|no)(, [a-z]{3,8} [0-9]{2,4}){8}\."
EBNF = 'root ::= call ("; " call){6}\ncall ::= name "(" num ")"\nname ::= "ls" | "cat" | "grep"\nnum ::= [0-9] | [1-9] [0-9]'
EBNF_AS_REGEX = r"(ls|cat|grep)\((0|[1-9][0-9]?)\)(; (ls|cat|grep)\((0|[1-9][0-9]?)\)){6}"
# the constraint per kind (sglang's native sampling parameter) and the check of its text
CONSTRAINTS = {"json_schema": json.dumps(SCHEMA), "regex": REGEX, "ebnf": EBNF}
MAX_NEW = 400  # the tiny model's constrained outputs end (EOS, grammar complete) after 40-130 tokens


def assert_valid(kind: str, text: str) -> None:
    if kind == "json_schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    else:
        assert re.fullmatch(REGEX if kind == "regex" else EBNF_AS_REGEX, text), (kind, text)


def constrained_body(ids: list[int], kind: str, **sp) -> dict:
    return greedy_body(ids, MAX_NEW, ignore_eos=False, **{kind: CONSTRAINTS[kind]}, **sp)


def constrained_reference(reference_server, ids: list[int], kind: str, **sp) -> identity.Reference:
    """A single server's constrained output; it is valid and ends with the grammar, long before MAX_NEW."""
    want = identity.from_output(http_json(reference_server.url + "/generate",
                                          identity.reference_body(constrained_body(ids, kind, **sp)))[1])
    assert_valid(kind, want.text)
    assert 4 * EAGER < len(want) < MAX_NEW, len(want)
    return want


def check_constrained(router, want: identity.Reference, ids: list[int], pipeline: str, kind: str, **sp) -> dict:
    """The router's constrained output is the single server's, valid, finished by the grammar; on the
    relay MD took over (one handoff) before the grammar completed."""
    before = handoffs_on_main(router)
    status, out = http_json(router[pipeline].url + "/generate", constrained_body(ids, kind, **sp))
    assert status == 200, out
    identity.check(want, out["output_ids"], f"router {pipeline} {kind}{' seeded' if sp else ''}")
    assert_valid(kind, out["text"])
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] == "stop", meta["finish_reason"]
    if pipeline == "relay":
        k = assert_one_handoff(router, before)
        assert ReplyMeta.of(meta).handoff_tokens == k < len(out["output_ids"])
    return out
