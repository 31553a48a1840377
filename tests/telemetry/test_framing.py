"""Framing, typed decoding, signing and backoff: the telemetry layers below the server."""

from __future__ import annotations

import dataclasses
import random
import sys

import msgpack
import pytest

from bench import synthetic
from telemetry import auth, protocol, sysmem
from telemetry.backoff import Backoff
from telemetry.errors import ProtocolError
from telemetry.framing import Decoder, FramingError, encode
from telemetry.records import Command, Dropped, Event, Reply

KEY = bytes(range(32))


def messages():
    return [
        synthetic.hello(1, 3),
        synthetic.update(7, 1),
        Event("checkpoint", 0, 7, "saved", {"path": "ckpt/7", "verified": True}),
        Dropped(3, 10),
        Reply(4, True, {"step": 8}),
        Command(5, "rebalance", {"split": [3, 2]}, auth.new_nonce(), "00" * 32),
    ]


def test_round_trip_every_message_type():
    decoder = Decoder()
    sent = messages()
    decoded = [protocol.decode(obj) for obj in decoder.feed(b"".join(map(protocol.encode, sent)))]
    assert decoded == sent
    assert decoder.pending == 0


def test_partial_reads_byte_by_byte():
    parts = [protocol.encode(m) for m in messages()]
    ends, total = set(), 0
    for p in parts:
        total += len(p)
        ends.add(total)
    wire = b"".join(parts)
    decoder, done = Decoder(), 0
    for i in range(len(wire)):
        done += len(decoder.feed(wire[i : i + 1]))
        # A message comes out exactly when its last byte arrives; until then it is held.
        assert done == sum(1 for e in ends if e <= i + 1)
        assert decoder.pending == i + 1 - max((e for e in ends if e <= i + 1), default=0)
    assert done == len(parts)


def test_random_chunking_keeps_every_message():
    rng = random.Random(1)
    msgs = [synthetic.update(i) for i in range(200)]
    wire = b"".join(protocol.encode(m) for m in msgs)
    decoder, out, i = Decoder(), [], 0
    while i < len(wire):
        n = rng.randint(1, 3000)
        out.extend(decoder.feed(wire[i : i + n]))
        i += n
    assert [protocol.decode(o).step for o in out] == list(range(200))


def test_large_input_in_one_feed_is_sliced():
    msgs = [synthetic.update(i) for i in range(8000)]  # several MiB in one call
    wire = b"".join(protocol.encode(m) for m in msgs)
    assert len(wire) > protocol.MAX_MESSAGE_BYTES * 2
    assert len(Decoder().feed(wire)) == len(msgs)


@pytest.mark.parametrize(
    "header",
    [
        b"\xdb\xff\xff\xff\xf0",  # str32
        b"\xc6\xff\xff\xff\xf0",  # bin32
        b"\xdd\xff\xff\xff\xf0",  # array32
        b"\xdf\xff\xff\xff\xf0",  # map32
    ],
)
def test_oversized_declared_lengths_are_rejected(header):
    decoder = Decoder()
    with pytest.raises(FramingError):
        # Whatever the header claims, the decoder never buffers more than one message.
        for _ in range(40):
            decoder.feed(header + b"\x00" * (64 << 10))
            header = b""


def test_decoder_is_spent_after_an_error():
    decoder = Decoder()
    with pytest.raises(FramingError):
        decoder.feed(b"\xc1")  # never-used msgpack byte
    with pytest.raises(FramingError, match="already failed"):
        decoder.feed(protocol.encode(synthetic.update(1)))


@pytest.mark.parametrize(
    "data",
    [
        b"\x91" * 10_000 + b"\xc0",  # 10k nested arrays
        b"\xc7\x01\x05a",  # ext type 5
        b"\x81\x01\x02",  # int map key
        b"\xa2\xff\xfe",  # invalid utf-8
    ],
)
def test_refused_encodings(data):
    with pytest.raises(FramingError):
        Decoder().feed(data)


def test_encode_refuses_oversized_messages():
    with pytest.raises(FramingError):
        encode({"type": "event", "message": "x" * protocol.MAX_MESSAGE_BYTES})
    big = Event("sample", 0, 1, data={"text": "y" * (2 * protocol.MAX_MESSAGE_BYTES)})
    with pytest.raises(ProtocolError):
        protocol.encode(big)
    cut = protocol.decode(msgpack.unpackb(protocol.encode_event(big)))
    assert cut.kind == "sample" and "truncated" in cut.data


def test_typed_decoding_checks_fields():
    good = synthetic.update(3).to_msg()
    assert protocol.decode({**good, "future_field": 1}).step == 3  # unknown keys ignored
    for field, value in [("step", "3"), ("loss", None), ("simulated", 1), ("step", True)]:
        with pytest.raises(ProtocolError, match=field):
            protocol.decode({**good, field: value})
    missing = dict(good)
    del missing["compute_s"]
    with pytest.raises(ProtocolError, match="compute_s"):
        protocol.decode(missing)
    with pytest.raises(ProtocolError):
        protocol.decode([good])
    with pytest.raises(ProtocolError, match="unknown message type"):
        protocol.decode({**good, "type": "bogus"})
    with pytest.raises(ProtocolError, match="unexpected"):
        protocol.decode(good, accept={"command"})
    deep: dict = {}
    node = deep
    for _ in range(protocol.MAX_DEPTH + 2):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(ProtocolError, match="data"):
        protocol.decode(Event("sample", 0, 0, data=deep).to_msg())
    # A msgpack timestamp decodes (msgpack handles ext -1 itself) but is no protocol value.
    stamp = Decoder().feed(b"\x81\xa1t\xd6\xff\x00\x00\x00\x01")[0]
    with pytest.raises(ProtocolError, match="data"):
        protocol.decode(Event("sample", 0, 0, data=stamp).to_msg())


def test_command_args_are_checked():
    assert protocol.check_args("rebalance", {"split": [1, 2]}) == ""
    assert protocol.check_args("pause", {}) == ""
    for cmd, args in [
        ("rebalance", {}),
        ("rebalance", {"split": []}),
        ("rebalance", {"split": [2, 0]}),
        ("rebalance", {"split": [2, 1.5]}),
        ("rebalance", {"split": [True]}),
        ("rebalance", {"split": [1], "extra": 1}),
        ("pause", {"now": True}),
        ("format_disk", {}),
    ]:
        assert protocol.check_args(cmd, args), (cmd, args)


def test_mac_covers_every_field_and_ignores_key_order():
    nonce = auth.new_nonce()
    mac = auth.sign(KEY, 1, "rebalance", {"split": [1, 2], "a": {"y": 1, "x": 2}}, nonce, "c1")
    same = auth.sign(KEY, 1, "rebalance", {"a": {"x": 2, "y": 1}, "split": [1, 2]}, nonce, "c1")
    assert mac == same and protocol.is_hex(mac, protocol.MAC_HEX)
    args = {"split": [1, 2], "a": {"y": 1, "x": 2}}
    assert auth.verify(KEY, 1, "rebalance", args, nonce, mac, "c1")
    changed = [
        (2, "rebalance", args, nonce, "c1", KEY),
        (1, "pause", args, nonce, "c1", KEY),
        (1, "rebalance", {**args, "split": [2, 1]}, nonce, "c1", KEY),
        (1, "rebalance", args, auth.new_nonce(), "c1", KEY),
        (1, "rebalance", args, nonce, "c2", KEY),
        (1, "rebalance", args, nonce, "c1", bytes(32)),
    ]
    for cid, cmd, a, n, ch, k in changed:
        assert not auth.verify(k, cid, cmd, a, n, mac, ch)
    for junk in ["", "zz" * 32, mac.upper(), mac[:-1], "é" * 64, mac + "0"]:
        assert not auth.verify(KEY, 1, "rebalance", args, nonce, junk, "c1")


def test_unsignable_args_do_not_verify():
    nonce = auth.new_nonce()
    deep: list = []
    node = deep
    for _ in range(100):
        node.append([])
        node = node[0]
    assert not auth.verify(KEY, 1, "pause", {"x": deep}, nonce, "0" * 64)
    assert not auth.verify(KEY, 1, "pause", {"x": {1: 2}}, nonce, "0" * 64)


def test_backoff_grows_caps_jitters_and_resets():
    b = Backoff(initial=0.5, factor=2, max=4, jitter=0.1, rng=random.Random(0))
    delays = [b.next() for _ in range(8)]
    bases = [0.5, 1, 2, 4, 4, 4, 4, 4]
    for d, base in zip(delays, bases, strict=True):
        assert base * 0.9 <= d <= base * 1.1
    assert len(set(delays)) == len(delays)  # jittered, not lockstep
    b.reset()
    assert 0.45 <= b.next() <= 0.55
    flat = Backoff(initial=1, factor=2, max=1e6, jitter=0)
    for _ in range(2000):  # a long outage must not overflow
        last = flat.next()
    assert last == 1e6
    with pytest.raises(ValueError):
        Backoff(initial=0)


def test_sysmem_sample_is_sane_and_cached():
    fresh = sysmem.sample(max_age=0)
    assert fresh.available > 0 and fresh.used > 0 and fresh.swap_used >= 0
    assert fresh.pressure is None or 0.0 <= fresh.pressure <= 1.0
    if sys.platform != "darwin":
        assert fresh.pressure is None
    assert sysmem.sample(max_age=60) is sysmem.sample(max_age=60)  # cached between updates
    assert sysmem.sample(max_age=0) is not fresh
    record = dataclasses.replace(synthetic.update(1), **fresh.update_fields())  # names match
    assert record.sys_mem_used == fresh.used and record.mem_pressure == fresh.pressure
