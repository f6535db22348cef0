"""The lab's router command line: a router in front of roles without a key says so (`--insecure-roles`,
which the router refuses to start without), one given the roles' key does not and carries the key in its
environment only."""

from sglang_pdd.lab.testing.launch_args import PddRouterConfig
from sglang_pdd.router.__main__ import build_parser


def _router(**kw) -> PddRouterConfig:
    return PddRouterConfig(prefill=[("http://127.0.0.1:30000", 8998)], relay=[("http://127.0.0.1:30001", 18500)],
                           main=["http://127.0.0.1:30002"], tokenizer="m", port=8000, **kw)


def test_a_router_in_front_of_open_roles_says_so():
    argv = _router().argv()
    assert build_parser().parse_args(argv[3:]).insecure_roles
    assert "SGLANG_PDD_ROLE_API_KEY" not in _router().environ()


def test_control_a_router_with_the_roles_key_is_not_insecure():
    r = _router(role_api_key="k" * 16)
    assert not build_parser().parse_args(r.argv()[3:]).insecure_roles
    assert r.environ()["SGLANG_PDD_ROLE_API_KEY"] == "k" * 16 and "k" * 16 not in r.argv()


def test_the_harness_routers_start_their_grammar_workers_at_first_use():
    """The test harness's routers mostly see no grammar: their grammar workers (a forkserver importing
    xgrammar and torch, seconds of CPU on the 2-core box) start at the first one; the command's default
    starts them at start-up."""
    assert build_parser().parse_args(_router().argv()[3:]).grammar_start == "first-use"
    assert build_parser().parse_args(_router().argv()[3:-2]).grammar_start == "startup"
