"""The benchmark against a running deployment (`--base-url URL`): no testbed, no servers started.

The workload (a preset's or a trace's) is replayed exactly as on the testbed (`replay.replay`:
sessions in parallel, warm-ups first) against `URL`, over sglang's native `/generate` (token ids
in, the PDD router's and any sglang server's API) or OpenAI's `/v1/completions` with a token-id
prompt (`openai_client`). The report is the testbed's: TTFT P50/P90/P99, TPOT, goodput against the
SLA, the hit-rate histogram. WAN bytes: the link is not ours to count, so the report has none; KV
bytes come from the `sglang_pdd_transfer_bytes_total{kind="kv"}` counters of the `/metrics` pages
given (`--metrics-url`, prefill servers with the plugin) or, by default, of the server itself if it
exposes them.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from sglang_pdd.lab.bench.client import StreamResult, stream
from sglang_pdd.lab.bench.metrics import WanBytes, summarize
from sglang_pdd.lab.bench.openai_client import stream_completion
from sglang_pdd.lab.bench.presets import Preset
from sglang_pdd.lab.bench.replay import progress_bar, replay, warm_up
from sglang_pdd.lab.bench.runner import BenchRun, SystemRun
from sglang_pdd.lab.bench.systems import KV_METRIC, kv_bytes_sent
from sglang_pdd.lab.workload.generator import measured
from sglang_pdd.lab.workload.trace import write_jsonl

logger = logging.getLogger(__name__)

APIS = ("native", "openai")
PROBE_TIMEOUT_S = 10.0


class LiveServerError(RuntimeError):
    """The server at --base-url cannot be benchmarked (unreachable, refuses the key, ...)."""


@dataclass
class LiveTarget:
    url: str
    api: str = "native"
    api_key: str | None = None
    model: str | None = None  # OpenAI `model`; None: the first of the server's /v1/models
    metrics_urls: list[str] = field(default_factory=list)  # /metrics pages with P's KV counters

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"--api must be one of {', '.join(APIS)}, got {self.api!r}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--base-url must be an http:// or https:// URL, got {self.url!r}")
        self.url = self.url.rstrip("/")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def get(self, path_or_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int, bytes]:
        url = path_or_url if "://" in path_or_url else self.url + path_or_url
        req = urllib.request.Request(url, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def probe(self) -> None:
        """Fail early and clearly: the server answers, accepts the key, and (OpenAI) names its model."""
        path = "/v1/models" if self.api == "openai" else "/health"
        try:
            status, raw = self.get(path)
        except OSError as e:
            raise LiveServerError(f"--base-url {self.url}: {path} unreachable: {e}") from None
        if status in (401, 403):
            raise LiveServerError(f"--base-url {self.url}: {path} answered {status}; give --api-key")
        if status != 200:
            raise LiveServerError(f"--base-url {self.url}: {path} answered {status}: {raw[:200]!r}")
        if self.api == "openai" and self.model is None:
            try:
                self.model = str(json.loads(raw)["data"][0]["id"])
            except (ValueError, KeyError, IndexError, TypeError):
                raise LiveServerError(f"--base-url {self.url}: /v1/models lists no model; give --model") from None

    def send(self, body: dict, timeout_s: float) -> StreamResult:
        if self.api == "openai":
            return stream_completion(self.url, body, timeout_s, self.headers, self.model or "default")
        return stream(self.url, body, timeout_s, self.headers)

    def kv_bytes(self) -> int | None:
        """Summed KV bytes of the `/metrics` pages (None if none of them has the counter)."""
        total, seen = 0, False
        for url in self.metrics_urls or [self.url + "/metrics"]:
            try:
                status, raw = self.get(url if url.endswith("/metrics") else url.rstrip("/") + "/metrics")
            except OSError as e:
                logger.warning("%s unreadable: %s", url, e)
                continue
            text = raw.decode(errors="replace")
            if status == 200 and KV_METRIC in text:
                total, seen = total + kv_bytes_sent(text), True
        return total if seen else None


def run_live(target: LiveTarget, preset: Preset, out_dir: str, show_progress: bool = True) -> BenchRun:
    """Warm up, replay the workload against `target`, and return a one-system `BenchRun`."""
    t0 = time.monotonic()
    target.probe()
    os.makedirs(out_dir, exist_ok=True)
    reqs = preset.requests()
    trace_path = os.path.join(out_dir, "trace.jsonl")
    write_jsonl(reqs, trace_path)
    vocab = preset.workload.vocab_size
    label = f"live-{target.api}"
    run = SystemRun(label, "", f"the deployment at {target.url} ({target.api} API)", None, label=label)
    logger.info("%s: %d requests (%d measured) against %s", label, len(reqs), len(measured(reqs)), target.url)
    run.warmup_failed = warm_up(target.send, reqs, vocab, preset.request_timeout_s)
    kv0 = target.kv_bytes()
    bar = progress_bar(len(measured(reqs)), label, show_progress)
    run.records = replay(target.send, reqs, vocab, preset.request_timeout_s, bar)
    kv1 = target.kv_bytes()
    run.wan = WanBytes(0, 0, kv1 - kv0 if kv0 is not None and kv1 is not None else None)
    run.summary = summarize(label, run.records, preset.sla, run.wan, link_counted=False)
    what = "/v1/completions (token-id prompts)" if target.api == "openai" else "/generate"
    client = f"client threads on this host stream {what} from {target.url}; no WAN counters (not our link)"
    return BenchRun(preset, trace_path, "", {}, [run], time.monotonic() - t0, client=client)
