"""Bad input gets a clear error and the server keeps serving; bad flags fail at start-up, by name."""

import subprocess
import sys

import pytest

from sglang_pdd.testing.client import greedy_body, greedy_ids
from sglang_pdd.testing.launch_args import CPU_ENV
from sglang_pdd.testing.servers import http_json

pytestmark = pytest.mark.e2e


def launch_fails(model: str, *flags: str) -> str:
    """Start a server that must refuse to start; return what it printed."""
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--device", "cpu", *flags],
        capture_output=True, text=True, timeout=180, env={**os.environ, **CPU_ENV},
    )
    assert proc.returncode != 0, proc.stdout[-2000:]
    return proc.stderr + proc.stdout


@pytest.mark.parametrize("flags, expected", [
    (["--pdd-role", "relai"], "argument --pdd-role: invalid choice: 'relai' (choose from 'prefill', 'relay', 'main')"),
    (["--pdd-role", "relay"], "--pdd-role relay runs on --disaggregation-mode decode, got --disaggregation-mode null"),
    (["--pdd-role", "main", "--disaggregation-mode", "decode"], "--pdd-role main needs --disaggregation-decode-enable-radix-cache"),
    (["--pdd-role", "relay", "--pdd-token-port", "18500", "--disaggregation-mode", "decode"],
     "sglang-pdd: error: --pdd-role relay runs only with sglang's non-overlap scheduler"),
])
def test_bad_pdd_flags_fail_at_startup_with_a_message_naming_them(private_netns, tiny_model, flags, expected):
    assert expected in launch_fails(tiny_model, *flags)


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
