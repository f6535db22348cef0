import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.api.openai import shapes as oa
from sglang_pdd.router.__main__ import _peer_args, build_parser
from sglang_pdd.router.peers.pool import Peer, PeerPool


def test_openai_sampling_params_map_to_sglang_names():
    sp = oa.sampling_params({"max_tokens": 5, "temperature": 0, "stop": "END", "seed": 3}, 128)
    assert sp == {"max_new_tokens": 5, "temperature": 0, "stop": ["END"], "sampling_seed": 3}
    assert oa.sampling_params({}, 77)["max_new_tokens"] == 77


@pytest.mark.parametrize("req, match", [({"n": 2}, "n > 1"), ({"max_tokens": 0}, "positive"),
                                        ({"max_tokens": "9"}, "positive")])
def test_bad_sampling_requests_are_rejected(req, match):
    with pytest.raises(oa.BadRequest, match=match):
        oa.sampling_params(req, 16)


class Tok(fu.CharTokenizer):
    """The fakes' tokenizer, its chat template between markers 1 and 2."""

    def apply_chat_template(self, msgs, add_generation_prompt, tokenize):
        return [1] + [ord(c) for m in msgs for c in m["content"]] + [2]


@pytest.mark.parametrize("req, chat, ids", [
    ({"prompt": "ab"}, False, [97, 98]), ({"prompt": ["ab"]}, False, [97, 98]), ({"prompt": [5, 6]}, False, [5, 6]),
    ({"messages": [{"role": "user", "content": "a"}]}, True, [1, 97, 2]),
])
def test_prompts_become_token_ids(req, chat, ids):
    assert oa.prompt_ids(Tok(), req, chat) == ids


@pytest.mark.parametrize("req, chat", [({"prompt": ""}, False), ({"prompt": ["a", "b"]}, False),
                                       ({"prompt": 3}, False), ({"messages": []}, True), ({"messages": "x"}, True)])
def test_bad_prompts_are_rejected(req, chat):
    with pytest.raises(oa.BadRequest):
        oa.prompt_ids(Tok(), req, chat)


def test_stop_trim_holds_back_a_possible_stop_and_cuts_at_the_match():
    t = oa.StopTrim(stops=["END"])
    assert t.push("hello E", None) == "hello"
    assert t.push("N", None) == " "  # only the last 2 characters could still start "END"
    assert t.push("D!", {"type": "stop", "matched": "END"}) == ""
    assert t.sent == "hello "


def test_stop_trim_without_stops_passes_text_through():
    t = oa.StopTrim()
    assert t.push("ab", None) == "ab" and t.push("c", {"type": "length"}) == "c"


def test_peer_pools_pick_least_loaded_or_round_robin():
    a, b = Peer("http://a:1"), Peer("http://b:1")
    a.in_flight = 3
    assert PeerPool("main", [a, b]).pick() is b
    rr = PeerPool("main", [a, b], policy="round-robin")
    assert [rr.pick(), rr.pick(), rr.pick()] == [a, b, a]
    with pytest.raises(LookupError, match="no relay server"):
        PeerPool("relay", []).pick()


def test_router_cli_peers():
    args = build_parser().parse_args(["--prefill", "http://p:1", "--relay", "http://r:2", "18500",
                                      "--main", "http://m:3", "--tokenizer", "x"])
    (p,) = _peer_args(args.prefill, "prefill", 8998, "--prefill")
    (r,) = _peer_args(args.relay, "relay", None, "--relay")
    assert p.bootstrap_port == 8998 and r.token_channel == "tcp://r:18500"
    with pytest.raises(SystemExit, match="token-channel port"):
        _peer_args([["http://r:2"]], "relay", None, "--relay")
    with pytest.raises(SystemExit, match="expected URL"):
        _peer_args([["r:2"]], "prefill", 8998, "--prefill")


def test_router_cli_deadlines_and_limits():
    args = build_parser().parse_args(["--prefill", "http://p:1", "--main", "http://m:3", "--tokenizer", "x",
                                      "--main-idle-timeout", "90", "--context-length", "4096", "--max-body-mb", "8"])
    assert (args.prefill_idle_timeout, args.relay_idle_timeout, args.main_idle_timeout) == (600.0, 120.0, 90.0)
    assert args.context_length == 4096 and args.max_body_mb == 8.0


def test_a_router_with_relays_needs_the_secret_to_sign_with(monkeypatch, tmp_path):
    from sglang_pdd.router.__main__ import _signer

    monkeypatch.delenv("SGLANG_PDD_SECRET", raising=False)
    monkeypatch.delenv("SGLANG_PDD_SECRET_FILE", raising=False)
    with pytest.raises(SystemExit, match="--relay needs SGLANG_PDD_SECRET"):
        _signer(has_relays=True)
    assert _signer(has_relays=False) is None  # P->MD only: no PDD parameters to sign
    f = tmp_path / "secret"
    f.write_text("from-a-file-of-16-bytes\n")
    monkeypatch.setenv("SGLANG_PDD_SECRET_FILE", str(f))
    assert _signer(has_relays=True) is not None
    monkeypatch.setenv("SGLANG_PDD_SECRET", "both")
    with pytest.raises(SystemExit, match="set one"):
        _signer(has_relays=True)
