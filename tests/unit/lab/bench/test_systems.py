"""Contract of the benchmark's system registry and launch wrapping (no servers started)."""

import pytest

from sglang_pdd.lab.bench import systems as S
from sglang_pdd.lab.testbed.netns import NetNS
from sglang_pdd.lab.sim.systems import SYSTEM_NAMES
from sglang_pdd.lab.testing.launch_args import ServerConfig


def test_baselines_are_registered_with_simulator_names():
    names = S.system_names()
    assert names[:3] == ["same-dc", "cross-dc", "cross-dc-drc"]
    for n in ("same-dc", "cross-dc", "cross-dc-drc"):
        sys_ = S.make_system(n)
        assert sys_.name == n and sys_.sim_name in SYSTEM_NAMES and sys_.client_side == "A"


def test_baselines_differ_where_they_should():
    same, xdc, drc = (S.make_system(n) for n in ("same-dc", "cross-dc", "cross-dc-drc"))
    assert (same.decode_side, xdc.decode_side, drc.decode_side) == ("A", "B", "B")
    assert (same.decode_radix_cache, xdc.decode_radix_cache, drc.decode_radix_cache) == (False, False, True)


def test_parse_systems_keeps_order_and_rejects_unknown_or_duplicates():
    assert S.parse_systems("cross-dc-drc, same-dc") == ["cross-dc-drc", "same-dc"]
    with pytest.raises(ValueError, match="unknown system"):
        S.parse_systems("same-dc,nope")
    with pytest.raises(ValueError, match="twice"):
        S.parse_systems("same-dc,same-dc")
    with pytest.raises(ValueError):
        S.parse_systems(" , ")


def test_a_new_system_joins_by_name_and_names_are_unique():
    name = "test-only-system"

    @S.register(name)
    class Dummy(S.System):
        def start(self, dep):
            pass

        def stop(self):
            pass

        @property
        def url(self):
            return "http://x"

    try:
        assert name in S.system_names() and isinstance(S.make_system(name), Dummy)
        with pytest.raises(ValueError, match="already registered"):
            S.register(name)(Dummy)
    finally:
        S._REGISTRY.pop(name)
    with pytest.raises(ValueError, match="unknown system"):
        S.make_system(name)


def test_servers_run_inside_their_namespace_with_their_own_address():
    cfg = ServerConfig(model="m", port=30200, host="10.77.0.2", mode="decode", decode_radix_cache=True)
    wrapped = S.InNamespace(cfg, NetNS("benchB"))
    argv = wrapped.argv()
    assert argv[:4] == ["ip", "netns", "exec", "benchB"] and argv[4:] == cfg.argv()
    assert "--disaggregation-decode-enable-radix-cache" in argv
    assert argv[argv.index("--host") + 1] == "10.77.0.2"
    assert wrapped.environ()["SGLANG_HOST_IP"] == "10.77.0.2"
    assert wrapped.url == "http://10.77.0.2:30200"


def test_a_deployment_adds_the_idle_flags_to_every_server_and_pins_it_to_its_sides_cpus(tmp_path):
    class TB:
        def ns(self, side):
            return NetNS("bench" + side)

    dep = S.Deployment(TB(), "m", str(tmp_path), server_flags=("--pdd-idle-wait-ms", "5"), cpus={"B": "1"})
    cfg = ServerConfig(model="m", port=30200, host="10.77.0.2", mode="decode")
    argv = dep.server(cfg, "B").argv()
    assert argv[:7] == ["ip", "netns", "exec", "benchB", "taskset", "-c", "1"]
    assert argv[-2:] == ["--pdd-idle-wait-ms", "5"]
    assert dep.server(ServerConfig(model="m", port=1), "A").argv()[4] != "taskset"  # A not pinned


def test_kv_bytes_are_summed_over_peers_and_exclude_aux():
    text = "\n".join([
        "# HELP sglang_pdd_transfer_bytes_total Bytes moved",
        'sglang_pdd_transfer_bytes_total{kind="kv",peer="10.77.0.2:1"} 1000.0',
        'sglang_pdd_transfer_bytes_total{kind="kv",peer="10.77.0.2:2"} 24.0',
        'sglang_pdd_transfer_bytes_total{kind="aux",peer="10.77.0.2:1"} 99.0',
        'sglang_pdd_transfer_batches_total{kind="kv"} 7.0',
    ])
    assert S.kv_bytes_sent(text) == 1024
    assert S.kv_bytes_sent("") == 0


def test_kv_slices_are_read_from_the_prefill_metrics():
    text = "\n".join([
        'sglang_pdd_transfer_slices_total{kind="kv",path="main"} 16.0',
        'sglang_pdd_transfer_slices_total{kind="kv",path="relay"} 8.0',
        'sglang_pdd_transfer_slices_total{kind="aux",path="main"} 3.0',
    ])
    assert S.kv_slices_sent(text) == 24
    assert S.kv_slices_sent("") == 0


def test_packed_systems_run_p_and_md_with_the_packed_wan_path():
    assert S.make_system("pdd-packed").packed_wan == "plain" and S.make_system("pdd").packed_wan == "off"
    direct = S.make_system("pdd-direct-packed")
    assert direct.pipeline == "direct" and direct.packed_wan == "plain"
    assert S.make_system("pdd-direct").packed_wan == "off"


def test_pdd_systems_join_the_registry():
    for name, pipeline in (("pdd", "auto"), ("pdd-relay", "relay")):
        sys_ = S.make_system(name)
        assert sys_.sim_name in SYSTEM_NAMES and sys_.pipeline == pipeline and sys_.client_side == "A"
    assert S.parse_systems("same-dc,pdd") == ["same-dc", "pdd"]


def test_pdd_router_is_told_the_testbed_link_and_the_kv_size():
    from sglang_pdd.lab.bench.pdd_system import router_link_args
    from sglang_pdd.lab.testbed.config import LinkConfig

    class FakeTestbed:
        config = LinkConfig(20.0, 0.0, 100.0, 0.0, "auto")

    args = router_link_args(FakeTestbed(), 16384)
    assert args[args.index("--wan-rtt-ms") + 1] == "40"
    assert 90 <= float(args[args.index("--wan-mbit") + 1]) <= 100
    assert args[args.index("--kv-bytes-per-token") + 1] == "16384"
    assert router_link_args(object(), None) == ["--odd-output-threshold", "0"]


def test_a_deployment_gives_each_mode_its_torch_thread_count(tmp_path):
    class TB:
        def ns(self, side):
            return NetNS("bench" + side)

    dep = S.Deployment(TB(), "m", str(tmp_path), threads={"prefill": 2, "decode": 1})
    decode = dep.server(ServerConfig(model="m", port=30200, mode="decode", env={"X": "1"}), "B")
    prefill = dep.server(ServerConfig(model="m", port=30100, mode="prefill"), "A")
    assert decode.environ()["OMP_NUM_THREADS"] == "1" and decode.environ()["X"] == "1"
    assert prefill.environ()["OMP_NUM_THREADS"] == "2"
    # 0 (or no entry) leaves torch's default: no OMP_NUM_THREADS from the deployment
    plain = S.Deployment(TB(), "m", str(tmp_path), threads={"decode": 0})
    assert "OMP_NUM_THREADS" not in plain.server(ServerConfig(model="m", port=1, mode="decode"), "B").environ()
