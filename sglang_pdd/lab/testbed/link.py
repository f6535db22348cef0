"""The wire between two namespaces: a veth pair, its addresses, shaping qdiscs, queue rules, counters.

Each namespace sees its end of the pair as `wan0` (created directly inside the namespaces, so the
root namespace never holds a device of ours). IPv6 is off and neighbours are static on `wan0`, so
the byte counters hold only the traffic that the programs in the namespaces send to each other.

Per direction X -> Y:
* rate: `tbf` on X's wan0 egress;
* delay/jitter/loss, netem backend: `netem` on X's wan0 egress (tbf as its child);
* delay/jitter/loss, nfqueue backend: `iptables -t raw -A PREROUTING -i wan0 -j NFQUEUE` in Y,
  served by a delay daemon running in Y. Ingress, not egress: an egress hold would keep each skb
  charged to the sender's socket and TCP small queues would throttle the flow.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import shutil
import subprocess

from .netns import NetNS, NetnsError
from .config import LinkConfig

logger = logging.getLogger(__name__)

IFNAME = "wan0"
NFQUEUE_NUM = 0
# Socket buffer ceilings inside the namespaces: the netns default (4 MB) caps a 20 ms RTT flow near
# 1.6 Gbit/s, and a 1 Gbit/s x 40 ms flow needs 5 MB in flight.
SOCKET_BUF_MAX = 128 << 20


class LinkError(RuntimeError):
    """Setting up the link failed (missing tool, refused by the kernel)."""


def tools_missing(backend: str = "nfqueue") -> list[str]:
    """The command-line tools this backend needs that are not installed."""
    needed = ["ip", "tc"] + (["iptables"] if backend in ("nfqueue", "auto") else [])
    return [t for t in needed if shutil.which(t) is None]


def subnet_hosts(subnet: str) -> tuple[str, str]:
    """The two host addresses of a /30 (or larger) subnet, with prefix length: (A, B)."""
    net = ipaddress.ip_network(subnet)
    hosts = list(net.hosts())[:2] if net.num_addresses <= 256 else [net.network_address + 1, net.network_address + 2]
    if len(hosts) < 2:
        raise ValueError(f"subnet {subnet} has fewer than two host addresses")
    return f"{hosts[0]}/{net.prefixlen}", f"{hosts[1]}/{net.prefixlen}"


def _run(ns: NetNS, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        return ns.run(argv, check=check)
    except NetnsError as e:
        raise LinkError(str(e)) from e


def create_pair(a: NetNS, b: NetNS, cidr_a: str, cidr_b: str) -> None:
    """veth a:wan0 <-> b:wan0, addressed, up, IPv6 off, static neighbours, big socket buffers."""
    proc = subprocess.run(
        ["ip", "link", "add", IFNAME, "netns", a.name, "type", "veth", "peer", "name", IFNAME, "netns", b.name],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise LinkError(f"veth {a.name}<->{b.name}: {proc.stderr.strip()}")
    for ns, cidr in ((a, cidr_a), (b, cidr_b)):
        _run(ns, ["sysctl", "-q", "-w", f"net.ipv6.conf.{IFNAME}.disable_ipv6=1"], check=False)
        _run(ns, ["ip", "addr", "add", cidr, "dev", IFNAME])
        _run(ns, ["ip", "link", "set", IFNAME, "up"])
        for key, val in (
            ("net.ipv4.tcp_rmem", f"4096 131072 {SOCKET_BUF_MAX}"),
            ("net.ipv4.tcp_wmem", f"4096 16384 {SOCKET_BUF_MAX}"),
            ("net.core.rmem_max", str(SOCKET_BUF_MAX)),
            ("net.core.wmem_max", str(SOCKET_BUF_MAX)),
        ):
            if _run(ns, ["sysctl", "-q", "-w", f"{key}={val}"], check=False).returncode != 0:
                logger.warning("%s: could not set %s", ns.name, key)
    # Static neighbours: no ARP on the link, so its counters hold only the programs' traffic.
    for ns, peer, peer_cidr in ((a, b, cidr_b), (b, a, cidr_a)):
        mac = link_info(peer)["address"]
        _run(ns, ["ip", "neigh", "replace", peer_cidr.split("/")[0], "lladdr", mac, "dev", IFNAME, "nud", "permanent"])


def link_info(ns: NetNS) -> dict:
    """`ip -j -s link show wan0` in that namespace."""
    out = _run(ns, ["ip", "-j", "-s", "link", "show", IFNAME]).stdout
    return json.loads(out)[0]


def _read_net_dev() -> str:
    # /proc/self/net follows the thread-group leader's namespace; thread-self follows this thread's.
    with open("/proc/thread-self/net/dev") as f:
        return f.read()


def counters(ns: NetNS) -> dict[str, int]:
    """wan0's rx/tx byte and packet counters in that namespace, read in-process (about 0.2 ms: a
    thread enters the namespace and reads /proc/thread-self/net/dev; no subprocess)."""
    for line in ns.call(_read_net_dev, timeout=10).splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == IFNAME:
            f = [int(x) for x in rest.split()]
            return {"rx_bytes": f[0], "rx_packets": f[1], "tx_bytes": f[8], "tx_packets": f[9]}
    raise LinkError(f"{ns.name}: no {IFNAME} (is the testbed up?)")


def tx_bytes(ns: NetNS) -> int:
    """Bytes this namespace's end has put on the link (L2 frames, as the veth counts them)."""
    return counters(ns)["tx_bytes"]


def netem_available(ns: NetNS) -> bool:
    """Whether the kernel has the netem qdisc (tried on the namespace's loopback, then removed)."""
    proc = _run(ns, ["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], check=False)
    if proc.returncode != 0:
        return False
    _run(ns, ["tc", "qdisc", "del", "dev", "lo", "root"], check=False)
    return True


def tbf_args(rate_mbit: float, delay_ms: float) -> list[str]:
    """tbf parameters: burst of 4 ms at line rate (>= 128 KB, so GSO packets pass whole), and a
    queue of max(50 ms, 2 x delay) so a TCP flow filling a BDP does not overflow it."""
    rate_bps = rate_mbit * 1e6
    burst = max(int(rate_bps / 8 / 250), 128 * 1024)
    latency_ms = max(50.0, 2.0 * delay_ms)
    return ["rate", f"{rate_mbit:g}mbit", "burst", str(burst), "latency", f"{latency_ms:g}ms"]


def apply_shaping(sender: NetNS, cfg: LinkConfig, use_netem: bool) -> None:
    """Egress qdiscs on the sender's wan0 for one direction (replacing whatever was there)."""
    _run(sender, ["tc", "qdisc", "del", "dev", IFNAME, "root"], check=False)
    if use_netem and cfg.impaired:
        netem = ["netem", "delay", f"{cfg.delay_ms:g}ms"]
        if cfg.jitter_ms:
            netem.append(f"{cfg.jitter_ms:g}ms")
        if cfg.loss_pct:
            netem += ["loss", f"{cfg.loss_pct:g}%"]
        netem += ["limit", "100000"]
        _run(sender, ["tc", "qdisc", "add", "dev", IFNAME, "root", "handle", "1:", *netem])
        if cfg.shaped:
            _run(sender, ["tc", "qdisc", "add", "dev", IFNAME, "parent", "1:1", "handle", "10:", "tbf",
                          *tbf_args(cfg.rate_mbit or 0.0, 0.0)])
    elif cfg.shaped:
        _run(sender, ["tc", "qdisc", "add", "dev", IFNAME, "root", "handle", "1:", "tbf",
                      *tbf_args(cfg.rate_mbit or 0.0, cfg.delay_ms)])


def add_queue_rule(receiver: NetNS) -> None:
    """Send every packet arriving over the link to NFQUEUE 0. No --queue-bypass: fail closed."""
    rule = ["PREROUTING", "-i", IFNAME, "-j", "NFQUEUE", "--queue-num", str(NFQUEUE_NUM)]
    if _run(receiver, ["iptables", "-w", "-t", "raw", "-C", *rule], check=False).returncode == 0:
        return
    _run(receiver, ["iptables", "-w", "-t", "raw", "-A", *rule])


def remove_queue_rule(receiver: NetNS) -> None:
    rule = ["PREROUTING", "-i", IFNAME, "-j", "NFQUEUE", "--queue-num", str(NFQUEUE_NUM)]
    while _run(receiver, ["iptables", "-w", "-t", "raw", "-D", *rule], check=False).returncode == 0:
        pass


def queue_rules(ns: NetNS) -> list[str]:
    """The NFQUEUE rules of the namespace's raw table (as `iptables -S` prints them)."""
    out = _run(ns, ["iptables", "-w", "-t", "raw", "-S"], check=False).stdout
    return [line for line in out.splitlines() if "NFQUEUE" in line]
