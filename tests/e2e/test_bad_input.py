"""Bad input gets a clear error and the server keeps serving; bad flags fail at start-up, by name."""

import subprocess
import sys

import pytest

from sglang_pdd.lab.testing.client import greedy_body, greedy_ids
from sglang_pdd.lab.testing.launch_args import CPU_ENV
from sglang_pdd.lab.testing.servers import http_json

pytestmark = pytest.mark.e2e


# One command line per check the real launcher runs: sglang's parser (the plugin's flags on it), the plugin's
# config (a role against sglang's disaggregation flags) and what a role is proven with (server.supported).
# Their other refusals leave through the same server-args hook's SystemExit; their messages are pinned by
# tests/unit/test_config.py (MD without the decode radix cache, ...) and tests/unit/server/test_supported.py
# (through the hook). Each launch here costs an import of sglang (~18 s of the 2-core box).
BAD_FLAGS = [
    (["--pdd-role", "relai"], "argument --pdd-role: invalid choice: 'relai' (choose from 'prefill', 'relay', 'main')"),
    (["--pdd-role", "relay"], "--pdd-role relay runs on --disaggregation-mode decode, got --disaggregation-mode null"),
    (["--pdd-role", "prefill", "--disaggregation-mode", "prefill", "--pdd-packed-wan", "plain", "--tp-size", "2"],
     "sglang-pdd: error: --pdd-role prefill runs the packed WAN path only at --tp-size 1, got --tp-size 2"),
]


@pytest.fixture(scope="module")
def refusals(private_netns, tiny_model) -> dict[tuple[str, ...], tuple[int, str]]:
    """Every bad command line launched at once (each costs ~18 s of sglang's import): flags -> (exit
    status, what the launcher printed)."""
    import os

    procs = [(tuple(flags), subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", tiny_model, "--device", "cpu", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **CPU_ENV}))
        for flags, _ in BAD_FLAGS]
    out = {}
    for flags, proc in procs:
        try:
            printed = proc.communicate(timeout=180)[0]
            out[flags] = (proc.returncode, printed)
        except subprocess.TimeoutExpired:  # it came up instead of refusing: None fails the test
            proc.kill()
            out[flags] = (None, proc.communicate()[0])
    return out


@pytest.mark.parametrize("flags, expected", BAD_FLAGS)
def test_bad_pdd_flags_fail_at_startup_with_a_message_naming_them(refusals, flags, expected):
    status, printed = refusals[tuple(flags)]
    assert status not in (0, None), printed[-2000:]
    assert expected in printed, printed[-2000:]


@pytest.mark.parametrize("ids", [[5, 2048, 7], [5, 10 ** 9], [-1, 5]])
def test_out_of_vocab_ids_are_rejected_and_the_server_keeps_serving(reference_server, prompts, ids):
    status, body = http_json(reference_server.url + "/generate", greedy_body(ids, 4))
    assert status == 400
    assert "outside the model's vocabulary" in body["error"]["message"]
    ok = prompts.ids(20, seed=7)
    assert len(greedy_ids(reference_server.url, ok, 4)) == 4
    assert reference_server.alive()


@pytest.mark.parametrize("request_body", [
    {"text": "", "sampling_params": {"max_new_tokens": 4}},
    {"input_ids": [], "sampling_params": {"max_new_tokens": 4}},
])
def test_empty_prompt_is_rejected_and_the_server_keeps_serving(reference_server, prompts, request_body):
    status, body = http_json(reference_server.url + "/generate", request_body)
    assert status == 400
    assert "empty" in body["error"]["message"]
    assert len(greedy_ids(reference_server.url, prompts.ids(20, seed=8), 4)) == 4
