"""Server sets for the e2e modules (one concept: which servers a test needs, on which ports)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field

from sglang_pdd.config import ENV_TEST_KNOBS
from sglang_pdd.lab.testing.pdd_client import Roles

from sglang_pdd.lab.testing.launch_args import RouterConfig, ServerConfig
from sglang_pdd.lab.testing.servers import ServerProcess


@dataclass
class PD:
    prefill: ServerProcess
    decode: ServerProcess
    bootstrap_port: int
    router: ServerProcess | None = None
    idle_rows: float | None = None  # request rows free on the idle decode server (all of them), when read
    prefill_knobs: str | None = None  # P's test-knobs file (test_switches.TestKnobs), when it was given one

    def set_prefill_knobs(self, **knobs) -> None:
        with open(self.prefill_knobs + ".tmp", "w") as f:
            json.dump(knobs, f)
        os.replace(self.prefill_knobs + ".tmp", self.prefill_knobs)

    def clear_knobs(self) -> None:
        """P's knobs off (a pair started without a knobs file has none to clear)."""
        if self.prefill_knobs is not None:
            self.set_prefill_knobs()


def start_pd(server_set, model: str, *, base_port: int, bootstrap_port: int, router: bool = False,
             prefill_extra: list[str] = (), decode_extra: list[str] = (), decode_radix_cache: bool = False,
             page_size: int = 1, decode_env: dict | None = None) -> PD:
    p = server_set.start(f"prefill-{base_port}", ServerConfig(
        model=model, port=base_port, nccl_port=base_port + 1000, mode="prefill", page_size=page_size,
        bootstrap_port=bootstrap_port, extra=list(prefill_extra)))
    d = server_set.start(f"decode-{base_port + 1}", ServerConfig(
        model=model, port=base_port + 1, nccl_port=base_port + 1001, mode="decode", page_size=page_size,
        bootstrap_port=bootstrap_port, decode_radix_cache=decode_radix_cache, extra=list(decode_extra),
        env=dict(decode_env or {})))
    p.wait_ready()
    d.wait_ready()
    pd = PD(prefill=p, decode=d, bootstrap_port=bootstrap_port)
    if router:
        pd.router = server_set.start(f"router-{base_port + 2}", RouterConfig(
            prefill=[(p.url, bootstrap_port)], decode=[d.url], port=base_port + 2)).wait_ready()
    return pd


def kv_bytes_per_token(model_dir: str) -> int:
    with open(os.path.join(model_dir, "sglang_pdd_tiny_model.json")) as f:
        return json.load(f)["kv_bytes_per_token"]


def kv_bytes_sent(url: str) -> int:
    """KV bytes a prefill server's transfer engine moved so far, summed over its peers."""
    return int(sum(v for k, v in metric(url, "sglang_pdd_transfer_bytes_total").items() if dict(k).get("kind") == "kv"))


def metric(url: str, name: str) -> dict:
    """Samples of one metric on a server's /metrics: {sorted label pairs: value}."""
    from sglang_pdd.server.metrics import parse_exposition
    from sglang_pdd.lab.testing.servers import http_json

    status, text = http_json(url + "/metrics")
    assert status == 200
    return parse_exposition(text, name)


def by_state(url: str, name: str) -> dict:
    return {dict(k).get("state"): v for k, v in metric(url, name).items()}


def idle_rows(url: str) -> float:
    """Request rows free on an idle decode server: all of them. Not the first `free` value published:
    sglang's /health (the harness's readiness probe) runs a one-token request that holds a row for a
    moment, and a baseline read then is one short for the rest of the module (a false "leak")."""
    return wait_for_metric(url, "sglang_pdd_req_rows", "total")


def wait_until(check, what: str, timeout_s: float = 60.0, every_s: float = 0.5):
    """`check()`'s first truthy value, polled every `every_s`; an AssertionError naming `what` past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout_s:g}s")
        time.sleep(every_s)


def wait_for_metric(url: str, name: str, state: str, timeout_s: float = 30.0) -> float:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = by_state(url, name)
        if state in got:
            return got[state]
        time.sleep(0.5)
    raise AssertionError(f"{url} never published {name}")


ROLES = ("prefill", "relay", "main")


@dataclass
class PDDServers:
    prefill: ServerProcess
    relay: ServerProcess
    main: ServerProcess
    bootstrap_port: int
    token_port: int
    idle_rows: dict  # request rows free on RLD and MD when idle (all of them): what leak checks return to
    knob_files: dict  # role -> its test-knobs file (test_switches.TestKnobs), re-read by the server
    knob_values: dict = field(default_factory=dict)  # role -> the knobs set now
    more_mains: list = field(default_factory=list)  # further MDs (same relay, same knobs file as MD)

    def set_knobs(self, role: str, **knobs) -> None:
        path = self.knob_files[role]
        with open(path + ".tmp", "w") as f:
            json.dump(knobs, f)
        os.replace(path + ".tmp", path)
        self.knob_values[role] = knobs

    def clear_knobs(self) -> None:
        """Every role's knobs off (what a module sets, unset before the next takes a shared cluster)."""
        for role in self.knob_files:
            self.set_knobs(role)

    @contextlib.contextmanager
    def knobs(self, role: str, **knobs):
        """These knobs on top of the role's current ones, restored afterwards."""
        before = dict(self.knob_values.get(role, {}))
        self.set_knobs(role, **{**before, **knobs})
        try:
            yield
        finally:
            self.set_knobs(role, **before)

    @property
    def roles(self) -> Roles:
        return Roles(prefill=self.prefill.url, relay=self.relay.url, main=self.main.url, bootstrap_host="127.0.0.1",
                     bootstrap_port=self.bootstrap_port, token_channel=f"tcp://127.0.0.1:{self.token_port}")


def start_pdd(server_group, model: str, *, base_port: int, bootstrap_port: int, token_port: int,
              handoff_timeout: float, page_size: int = 1, prefill_chunk: int = -1,
              prefill_extra: tuple = (), relay_extra: tuple = (), main_extra: tuple = (),
              mains: int = 1, decode_overlap: bool = False, tp: int = 1, role_api_key: str | None = None,
              env: dict | None = None) -> PDDServers:
    """P (--pdd-role prefill), RLD (relay) and MD (main, decode radix cache) in one namespace, each
    with a test-knobs file (`PDDServers.knobs`); `mains` > 1 starts more MDs (ports base + 10, + 11, ...)
    at the same time; `decode_overlap` runs RLD and MD on sglang's overlap scheduler (P cannot on CPU);
    `tp` > 1 runs every role at that TP size (gloo), its ranks bound to cores 0, 1, ...; `role_api_key`
    starts every role with sglang's --api-key (its API, but /health and /metrics, then needs the key);
    `env` is added to every role's environment (the MLA model's attention stand-in)."""
    timeout = ["--pdd-handoff-timeout", f"{handoff_timeout:g}"]
    files = {r: os.path.join(server_group.log_dir, f"pdd-{base_port}-{r}-knobs.json") for r in ROLES}
    for f in files.values():
        with open(f, "w") as fh:
            fh.write("{}")
    common = dict(model=model, bootstrap_port=bootstrap_port, page_size=page_size, api_key=role_api_key)
    tp_env = dict(env or {})
    if tp > 1:
        cores = os.cpu_count() or 1
        tp_env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(i % cores) for i in range(tp))
        prefill_extra, relay_extra, main_extra = (("--tp-size", str(tp), *x) for x in (prefill_extra, relay_extra, main_extra))
    decode = dict(common, overlap=decode_overlap)
    p = server_group.start(f"pdd-prefill-{base_port}", ServerConfig(
        port=base_port, nccl_port=base_port + 1000, mode="prefill", chunked_prefill_size=prefill_chunk, **common,
        extra=["--pdd-role", "prefill", *prefill_extra], env={**tp_env, ENV_TEST_KNOBS: files["prefill"]}))
    rld = server_group.start(f"pdd-relay-{base_port + 1}", ServerConfig(
        port=base_port + 1, nccl_port=base_port + 1001, mode="decode", **decode,
        extra=["--pdd-role", "relay", "--pdd-token-port", str(token_port), *timeout, *relay_extra],
        env={**tp_env, ENV_TEST_KNOBS: files["relay"]}))
    mds = [server_group.start(f"pdd-main-{port}", ServerConfig(
        port=port, nccl_port=port + 1000, mode="decode", decode_radix_cache=True, **decode,
        extra=["--pdd-role", "main", "--pdd-relays", f"tcp://127.0.0.1:{token_port}", *timeout, *main_extra],
        env={**tp_env, ENV_TEST_KNOBS: files["main"]})) for port in [base_port + 2] + [base_port + 10 + i for i in range(mains - 1)]]
    for s in (p, rld, *mds):
        s.wait_ready()
    idle = {s.url: idle_rows(s.url) for s in (rld, *mds)}
    return PDDServers(p, rld, mds[0], bootstrap_port, token_port, idle, files, more_mains=mds[1:])


def abort_while_held(pdd, body: dict) -> dict:
    """A relayed request that MD holds (KV landed, waiting for tokens) while RLD decodes with no handoff
    in sight (RLD's knob wants more eager tokens than the request has), then an abort on MD and RLD.
    Returns what was seen: `decoded` (RLD decoded past the prompt), `held` (MD's gauge at the abort),
    `ended` (the request came back), and the result or error."""
    import threading

    from sglang_pdd.lab.testing.client import GenerateError
    from sglang_pdd.lab.testing.pdd_client import held_on_main, relayed_generate
    from sglang_pdd.lab.testing.servers import http_json

    out: dict = {}

    def run():
        try:
            out["r"] = relayed_generate(pdd.roles, body, main_first=True)
        except GenerateError as e:
            out["error"] = str(e)

    n_prompt = len(body["input_ids"])
    with pdd.knobs("relay", relay_min_eager=body["sampling_params"]["max_new_tokens"] + 1):
        t = threading.Thread(target=run)
        t.start()
        decoded = False
        while t.is_alive() and not decoded:  # RLD has decoded past the prompt: its KV use grows
            kv = by_state(pdd.relay.url, "sglang_pdd_kv_pool_tokens")
            decoded = bool(kv) and kv["total"] - kv["available"] - kv["evictable"] > n_prompt + 16
            time.sleep(0.05)
        out["held"] = held_on_main(pdd.main.url)
        for url in (pdd.main.url, pdd.relay.url):
            http_json(url + "/abort_request", {"rid": "", "abort_all": True})
        t.join(120)
    out.update(decoded=decoded, ended=not t.is_alive())
    return out


def decode_roles_idle(pdd, timeout_s: float = 60.0, roles: tuple = ("relay", "main")) -> list:
    """[(url, pool, rows, held)] of each decode role (of `roles`) not back to idle within the timeout
    (empty: all idle): every KV slot free or only cached, no row taken, nothing held."""
    from sglang_pdd.lab.testing.pdd_client import held_on_main

    busy = []
    for url in (getattr(pdd, role).url for role in roles):
        deadline = time.monotonic() + timeout_s
        while True:
            pool, rows = by_state(url, "sglang_pdd_kv_pool_tokens"), by_state(url, "sglang_pdd_req_rows")
            held = held_on_main(url)
            idle = (pool and pool["available"] + pool["evictable"] == pool["total"] and pool["protected"] == 0
                    and rows["free"] == pdd.idle_rows[url] and held == 0)
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if not idle:
            busy.append((url, pool, rows, held))
    return busy


@contextlib.contextmanager
def junk_at(port: int, *, frames: int, size: int, parts: int):
    """Unauthenticated garbage at a token-channel port on this host: four connections sending bytes that
    are not ZMTP, then `frames` random frames of `size` bytes and `parts` three-part messages from a ZMQ
    peer without the secret, which stays connected until the block ends (the relay drains its queue at
    its own pace)."""
    import socket

    import zmq

    for _ in range(4):
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(os.urandom(256 << 10))
    ctx = zmq.Context()
    peer = ctx.socket(zmq.DEALER)
    peer.connect(f"tcp://127.0.0.1:{port}")
    try:
        for _ in range(frames):
            peer.send(os.urandom(size))
        for _ in range(parts):
            peer.send_multipart([b"x", b"y"])  # the ROUTER reads three frames: the peer's id and these
        yield
    finally:
        peer.close(0)
        ctx.term()


def relayed_at(pdd, body: dict, k: int, *, main_first: bool = True, **kw):
    """One request P -> RLD -> MD with RLD's `relay_min_eager` knob at `k` (`relayed_generate`'s options in
    `kw`; `main_first`: MD's legs first, so RLD answers at exactly k); asserts a handoff at k or later."""
    from sglang_pdd.lab.testing.pdd_client import relayed_generate

    with pdd.knobs("relay", relay_min_eager=k):
        r = relayed_generate(pdd.roles, body, main_first=main_first, **kw)
    assert r.handed_over and r.k >= k, r.relay["meta_info"]
    return r


def assert_handoff_identical(want, r, what: str) -> None:
    """RLD's eager tokens a prefix of the reference's, and MD's whole output equal to it."""
    from sglang_pdd.lab.testing import identity

    identity.check(want, r.relay["output_ids"], f"{what}: RLD's eager tokens (k={r.k})", prefix=True)
    identity.check(want, r.main["output_ids"], f"{what}: MD after the handoff at k={r.k}")


def assert_tp(pdd, tp: int = 2) -> None:
    """Every role runs at TP `tp`, and on RLD and MD rank 1 runs the follower (decode.rank_sync)."""
    from sglang_pdd.lab.testing.servers import http_json

    for s in (pdd.prefill, pdd.relay, pdd.main):
        info = http_json(s.url + "/get_server_info")[1]
        assert info["tp_size"] == tp, info.get("tp_size")
    for s, role in ((pdd.relay, "relay"), (pdd.main, "main")):
        assert f"sglang-pdd {role}: TP rank 1 replays rank 0's decisions" in s.log_text(), role
