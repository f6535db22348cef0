"""Netlink codec and socket for the netfilter queue (NFQUEUE), in pure stdlib.

Only what the delay daemon needs: bind a queue, ask for packet metadata only (COPY_META) with GSO
packets kept whole (F_GSO), read queued-packet messages, and answer with single verdicts (drop) or
verdict batches (accept every queued packet up to an id). Field layouts follow
`include/uapi/linux/netfilter/nfnetlink_queue.h`; nfqueue attribute payloads are big-endian,
netlink headers are host-endian.

Deliberately absent: NFQA_CFG_F_FAIL_OPEN. Without it the kernel drops packets when the queue is
full or nobody listens, which is what makes the emulated link fail closed.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFNETLINK_V0 = 0

NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 0x2
NLMSG_DONE = 0x3

NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3

NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2

NFQNL_COPY_META = 1

NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQA_CFG_F_GSO = 1 << 2

NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2

NF_DROP = 0
NF_ACCEPT = 1

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NFGENMSG = struct.Struct("=BBH")  # family, version, res_id (big-endian value, packed by hand)
_NLATTR = struct.Struct("=HH")  # len, type


class NfqueueError(OSError):
    """The kernel refused a queue configuration request."""


def _align4(n: int) -> int:
    return (n + 3) & ~3


def encode_attr(attr_type: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = _NLATTR.size + len(payload)
    return _NLATTR.pack(length, attr_type) + payload + b"\0" * (_align4(length) - length)


def decode_attrs(data: bytes) -> dict[int, bytes]:
    """Attributes of a message body as {type: payload} (the nested/byte-order flags masked off)."""
    attrs: dict[int, bytes] = {}
    off = 0
    while off + _NLATTR.size <= len(data):
        length, attr_type = _NLATTR.unpack_from(data, off)
        if length < _NLATTR.size:
            break
        attrs[attr_type & 0x3FFF] = data[off + _NLATTR.size : off + length]
        off += _align4(length)
    return attrs


def encode_message(msg_type: int, queue_num: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    """An nfnetlink queue message: nlmsghdr + nfgenmsg(AF_UNSPEC, v0, queue) + attributes."""
    body = _NFGENMSG.pack(socket.AF_UNSPEC, NFNETLINK_V0, socket.htons(queue_num)) + attrs
    full_type = (NFNL_SUBSYS_QUEUE << 8) | msg_type
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), full_type, flags, seq, 0) + body


def config_bind(queue_num: int, seq: int = 0) -> bytes:
    cmd = struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET)
    return encode_message(NFQNL_MSG_CONFIG, queue_num, encode_attr(NFQA_CFG_CMD, cmd), NLM_F_REQUEST | NLM_F_ACK, seq)


def config_unbind(queue_num: int, seq: int = 0) -> bytes:
    cmd = struct.pack("!BBH", NFQNL_CFG_CMD_UNBIND, 0, socket.AF_INET)
    return encode_message(NFQNL_MSG_CONFIG, queue_num, encode_attr(NFQA_CFG_CMD, cmd), NLM_F_REQUEST | NLM_F_ACK, seq)


def config_meta_gso(queue_num: int, maxlen: int, seq: int = 0, gso: bool = True) -> bytes:
    """Copy metadata only, queue up to `maxlen` packets, keep GSO packets whole (or, with
    `gso=False`, have the kernel cut them into wire-size packets before queueing)."""
    attrs = (
        encode_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0xFFFF, NFQNL_COPY_META))
        + encode_attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))
        + encode_attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO))
        + encode_attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO if gso else 0))
    )
    return encode_message(NFQNL_MSG_CONFIG, queue_num, attrs, NLM_F_REQUEST | NLM_F_ACK, seq)


def verdict(queue_num: int, packet_id: int, accept: bool) -> bytes:
    """A verdict on one packet."""
    hdr = struct.pack("!II", NF_ACCEPT if accept else NF_DROP, packet_id)
    return encode_message(NFQNL_MSG_VERDICT, queue_num, encode_attr(NFQA_VERDICT_HDR, hdr))


def verdict_batch(queue_num: int, last_id: int, accept: bool = True) -> bytes:
    """One verdict on every packet still queued whose id is <= `last_id`."""
    hdr = struct.pack("!II", NF_ACCEPT if accept else NF_DROP, last_id)
    return encode_message(NFQNL_MSG_VERDICT_BATCH, queue_num, encode_attr(NFQA_VERDICT_HDR, hdr))


@dataclass(frozen=True)
class NetlinkMessage:
    msg_type: int  # full nlmsg type (subsystem << 8 | message)
    flags: int
    seq: int
    body: bytes  # after nlmsghdr


def split_messages(data: bytes) -> Iterator[NetlinkMessage]:
    """The netlink messages of one datagram."""
    off = 0
    while off + _NLMSGHDR.size <= len(data):
        length, msg_type, flags, seq, _pid = _NLMSGHDR.unpack_from(data, off)
        if length < _NLMSGHDR.size:
            break
        yield NetlinkMessage(msg_type, flags, seq, data[off + _NLMSGHDR.size : off + length])
        off += _align4(length)


def packet_id(msg: NetlinkMessage) -> int | None:
    """The packet id of a queued-packet message, None for any other message."""
    if msg.msg_type != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
        return None
    hdr = decode_attrs(msg.body[_NFGENMSG.size :]).get(NFQA_PACKET_HDR)
    if hdr is None or len(hdr) < 4:
        return None
    return struct.unpack_from("!I", hdr)[0]


def error_code(msg: NetlinkMessage) -> int | None:
    """The errno of an NLMSG_ERROR message (0 is an ACK), None for any other message."""
    if msg.msg_type != NLMSG_ERROR:
        return None
    return -struct.unpack_from("=i", msg.body)[0]


class QueueSocket:
    """A netlink socket bound to one NFQUEUE number in the calling process's network namespace."""

    RECV_BUF = 64 * 1024

    def __init__(self, queue_num: int, maxlen: int = 65536, rcvbuf: int = 64 << 20, gso: bool = True) -> None:
        self.queue_num = queue_num
        self._seq = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)  # SO_RCVBUFFORCE (root)
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind((0, 0))
        self._request(config_bind(queue_num, self._next_seq()))
        self._request(config_meta_gso(queue_num, maxlen, self._next_seq(), gso))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _request(self, msg: bytes) -> None:
        """Send a config request and wait for its ACK (packets arriving meanwhile stay queued)."""
        seq = _NLMSGHDR.unpack_from(msg)[3]
        self.sock.sendto(msg, (0, 0))
        while True:
            for reply in split_messages(self.sock.recv(self.RECV_BUF)):
                code = error_code(reply)
                if code is not None and reply.seq == seq:
                    if code:
                        raise NfqueueError(code, f"nfqueue {self.queue_num} config: {os.strerror(code)}")
                    return

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv_packet_ids(self, max_reads: int = 4096) -> list[int]:
        """Queued-packet ids readable now (at most `max_reads` datagrams), without blocking."""
        ids: list[int] = []
        for _ in range(max_reads):
            try:
                data = self.sock.recv(self.RECV_BUF, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return ids
            except OSError as e:
                if e.errno == errno.ENOBUFS:  # the kernel dropped packets it could not hand us
                    logger.warning("nfqueue %d: receive buffer overrun, packets dropped", self.queue_num)
                    continue
                raise
            for msg in split_messages(data):
                pid = packet_id(msg)
                if pid is not None:
                    ids.append(pid)
                elif (code := error_code(msg)):
                    logger.warning("nfqueue %d: kernel error %s", self.queue_num, os.strerror(code))
        return ids

    def accept_upto(self, last_id: int) -> None:
        self.sock.sendto(verdict_batch(self.queue_num, last_id, accept=True), (0, 0))

    def drop(self, pid: int) -> None:
        self.sock.sendto(verdict(self.queue_num, pid, accept=False), (0, 0))

    def close(self) -> None:
        """Unbind (the kernel drops whatever is still queued) and close."""
        try:
            self.sock.sendto(config_unbind(self.queue_num), (0, 0))
        except OSError:
            pass
        self.sock.close()
