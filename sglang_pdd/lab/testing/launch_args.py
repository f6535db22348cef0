"""Command lines for real sglang servers and the upstream router on a CPU-only box.

Every flag here is a verified requirement of sglang 0.5.23 on CPU (docs/cpu.md): the torch-native
attention and sampling backends, fp32, a small static KV pool, no CUDA graphs, no overlap scheduler unless asked (`overlap`; prefill's overlap path calls torch.cuda.Event, a decode server's runs) and `--sleep-on-idle` (without
it every idle scheduler busy-polls a core, which starves a 2-core box). Features a user would have on
stay on: sglang's default grammar backend (xgrammar, whose token bitmask has a CPU kernel) serves
`json_schema` / `regex` / `ebnf` / `structural_tag` on every test server.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "MC_TCP_ENABLE_CONNECTION_POOL": "true",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


@dataclass
class ServerConfig:
    """One sglang server: role, where it listens, and any extra flags (e.g. `--pdd-role`)."""

    model: str
    port: int
    host: str = "127.0.0.1"
    mode: str = "null"  # sglang's --disaggregation-mode: null | prefill | decode
    bootstrap_port: int = 8998
    nccl_port: int | None = None
    transfer_backend: str = "mooncake_tcp"
    max_total_tokens: int = 16384
    max_running_requests: int = 8
    page_size: int = 1
    chunked_prefill_size: int = -1  # -1: whole prompts (sglang's default on CPU is a chunk size)
    decode_radix_cache: bool = False
    overlap: bool = False  # sglang's overlap scheduler (its default; on CPU it works for decode only)
    enable_metrics: bool = True
    api_key: str | None = None  # sglang's --api-key: callers of its API (not /health, /metrics) need it
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        a = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", self.model, "--tokenizer-path", self.model,
            "--host", self.host, "--port", str(self.port),
            "--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
            "--dtype", "float32", "--max-total-tokens", str(self.max_total_tokens),
            "--mem-fraction-static", "0.3", "--max-running-requests", str(self.max_running_requests),
            "--chunked-prefill-size", str(self.chunked_prefill_size), "--page-size", str(self.page_size),
            "--disable-cuda-graph", "--grammar-backend", "xgrammar",
            "--sleep-on-idle", "--skip-server-warmup", "--log-level", "info",
        ]
        if not self.overlap:
            a.append("--disable-overlap-schedule")
        if self.enable_metrics:
            a.append("--enable-metrics")
        if self.nccl_port is not None:
            a += ["--nccl-port", str(self.nccl_port)]
        if self.api_key is not None:
            a += ["--api-key", self.api_key]
        if self.mode != "null":
            a += [
                "--disaggregation-mode", self.mode,
                "--disaggregation-transfer-backend", self.transfer_backend,
                "--disaggregation-bootstrap-port", str(self.bootstrap_port),
            ]
        if self.mode == "decode":
            a += ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
            if self.decode_radix_cache:
                a.append("--disaggregation-decode-enable-radix-cache")
        return a + list(self.extra)

    def environ(self) -> dict[str, str]:
        return {**CPU_ENV, "SGLANG_HOST_IP": self.host, **self.env}


@dataclass
class RouterConfig:
    """Upstream sglang-router in PD mode (Python mini load balancer by default)."""

    prefill: list[tuple[str, int]]  # (url, bootstrap port)
    decode: list[str]
    port: int
    host: str = "127.0.0.1"
    mini_lb: bool = True

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        a = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        if self.mini_lb:
            a.append("--mini-lb")
        for url, *ports in self.prefill:  # (url, bootstrap port[, token port: a prefill that relays])
            a += ["--prefill", url, *map(str, ports)]
        for url in self.decode:
            a += ["--decode", url]
        return a + ["--host", self.host, "--port", str(self.port)]

    def environ(self) -> dict[str, str]:
        return {"PYTHONUNBUFFERED": "1"}


@dataclass
class PddRouterConfig:
    """The PDD router (`python -m sglang_pdd.router`) in front of P, RLD and MD servers."""

    prefill: list[tuple[str, int]]  # (url, bootstrap port)
    relay: list[tuple[str, int]]  # (url, token-channel port)
    main: list[str]
    tokenizer: str
    port: int
    host: str = "127.0.0.1"
    pipeline: str = "relay"
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # e.g. SGLANG_PDD_SECRET: it signs P's and MD's parameters
    role_api_key: str | None = None  # the roles' --api-key, given as SGLANG_PDD_ROLE_API_KEY (None: the roles
    # are open, so the router is started with --insecure-roles, which the router refuses to start without)
    # --openai-frontend: "builtin" for a router that serves /generate alone (its start skips sglang's chat
    # layer, some 10 s of CPU on the 2-core box); "auto" (sglang's, installed here) for the OpenAI endpoints
    openai_frontend: str = "auto"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        a = [sys.executable, "-m", "sglang_pdd.router", "--tokenizer", self.tokenizer,
             "--host", self.host, "--port", str(self.port), "--pipeline", self.pipeline]
        for url, *ports in self.prefill:  # (url, bootstrap port[, token port: a prefill that relays])
            a += ["--prefill", url, *map(str, ports)]
        for url, tport in self.relay:
            a += ["--relay", url, str(tport)]
        for url in self.main:
            a += ["--main", url]
        if self.role_api_key is None:
            a.append("--insecure-roles")
        if self.openai_frontend != "auto":
            a += ["--openai-frontend", self.openai_frontend]
        # the grammar workers (seconds of CPU each start) only for a router that sees a grammar
        return a + ["--grammar-start", "first-use"] + list(self.extra)

    def environ(self) -> dict[str, str]:
        key = {"SGLANG_PDD_ROLE_API_KEY": self.role_api_key} if self.role_api_key is not None else {}
        return {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **key, **self.env}
