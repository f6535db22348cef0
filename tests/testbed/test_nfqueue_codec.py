"""The NFQUEUE netlink codec, against byte layouts from the kernel's uapi headers (no root)."""

from __future__ import annotations

import struct

from sglang_pdd.lab.testbed import nfqueue as nfq


def test_verdict_batch_layout():
    msg = nfq.verdict_batch(queue_num=7, last_id=0x01020304, accept=True)
    length, mtype, flags, _seq, pid = struct.unpack_from("=IHHII", msg)
    assert length == len(msg) == 16 + 4 + 12
    assert mtype == (3 << 8) | 3  # NFNL_SUBSYS_QUEUE, NFQNL_MSG_VERDICT_BATCH
    assert flags == nfq.NLM_F_REQUEST and pid == 0
    assert msg[16:20] == bytes([0, 0, 0, 7])  # AF_UNSPEC, NFNETLINK_V0, queue 7 big-endian
    assert struct.unpack_from("=HH", msg, 20) == (12, nfq.NFQA_VERDICT_HDR)
    assert msg[24:32] == struct.pack("!II", nfq.NF_ACCEPT, 0x01020304)


def test_single_drop_verdict():
    msg = nfq.verdict(0, 42, accept=False)
    assert struct.unpack_from("=H", msg, 4)[0] == (3 << 8) | 1
    assert msg[24:32] == struct.pack("!II", nfq.NF_DROP, 42)


def test_config_asks_meta_copy_gso_and_no_fail_open():
    msg = nfq.config_meta_gso(0, maxlen=1000, seq=9)
    _, mtype, flags, seq, _ = struct.unpack_from("=IHHII", msg)
    assert mtype == (3 << 8) | 2 and flags & nfq.NLM_F_ACK and seq == 9
    attrs = nfq.decode_attrs(msg[20:])
    assert attrs[nfq.NFQA_CFG_PARAMS][4] == nfq.NFQNL_COPY_META
    assert struct.unpack("!I", attrs[nfq.NFQA_CFG_QUEUE_MAXLEN])[0] == 1000
    flags_set = struct.unpack("!I", attrs[nfq.NFQA_CFG_FLAGS])[0]
    assert flags_set == nfq.NFQA_CFG_F_GSO  # F_FAIL_OPEN (1 << 0) absent: the link fails closed
    assert struct.unpack("!I", attrs[nfq.NFQA_CFG_MASK])[0] == nfq.NFQA_CFG_F_GSO


def test_bind_command():
    attrs = nfq.decode_attrs(nfq.config_bind(3)[20:])
    assert attrs[nfq.NFQA_CFG_CMD][0] == nfq.NFQNL_CFG_CMD_BIND


def _packet_message(pid: int) -> bytes:
    body = struct.pack("=BBH", 2, 0, 0)
    body += nfq.encode_attr(nfq.NFQA_PACKET_HDR, struct.pack("!IHB", pid, 0x0800, 0))
    body += nfq.encode_attr(5, struct.pack("!I", 2))  # an interface index attribute, ignored
    return struct.pack("=IHHII", 16 + len(body), 3 << 8, 0, 0, 0) + body


def test_packet_ids_are_read_from_queued_packet_messages():
    data = _packet_message(11) + _packet_message(12)
    msgs = list(nfq.split_messages(data))
    assert [nfq.packet_id(m) for m in msgs] == [11, 12]


def test_error_and_ack_messages():
    err = struct.pack("=IHHII", 36, nfq.NLMSG_ERROR, 0, 5, 0) + struct.pack("=i", -16) + bytes(16)
    ack = struct.pack("=IHHII", 36, nfq.NLMSG_ERROR, 0, 6, 0) + struct.pack("=i", 0) + bytes(16)
    m_err, m_ack = nfq.split_messages(err + ack)
    assert nfq.error_code(m_err) == 16 and m_err.seq == 5  # EBUSY
    assert nfq.error_code(m_ack) == 0
    assert nfq.packet_id(m_err) is None


def test_attributes_are_padded_to_four_bytes():
    a = nfq.encode_attr(1, b"abcde")
    assert len(a) == 12 and nfq.decode_attrs(a + nfq.encode_attr(2, b"x")) == {1: b"abcde", 2: b"x"}


def test_per_packet_mode_clears_the_gso_flag_under_its_mask():
    attrs = nfq.decode_attrs(nfq.config_meta_gso(0, maxlen=10, gso=False)[20:])
    assert struct.unpack("!I", attrs[nfq.NFQA_CFG_MASK])[0] == nfq.NFQA_CFG_F_GSO
    assert struct.unpack("!I", attrs[nfq.NFQA_CFG_FLAGS])[0] == 0
