"""Hypothesis throws malformed bytes at a live Hub; it must keep serving everyone else.

A modest example count keeps this fast; `fleet bench telemetry` runs 10,000+ inputs.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import synthetic
from telemetry import auth, protocol
from telemetry.client import TelemetryClient
from telemetry.control import CommandQueue
from telemetry.hub import ANY_PORT, Hub, ServerOptions
from telemetry.records import COMMANDS, Update

KEY = bytes(range(32))

_valid = [
    protocol.encode(synthetic.update(1)),
    protocol.encode(synthetic.hello()),
    protocol.pack(
        {
            "type": "command",
            "id": 1,
            "cmd": "rebalance",
            "args": {"split": [2, 2]},
            "nonce": "0" * 32,
            "mac": auth.sign(KEY, 1, "rebalance", {"split": [2, 2]}, "0" * 32, "stale"),
        }
    ),
]
_headers = [
    b"\xdb\xff\xff\xff\xf0",  # str32 of ~4 GiB
    b"\xc6\xff\xff\xff\xf0",  # bin32
    b"\xdd\xff\xff\xff\xf0",  # array32
    b"\xdf\xff\xff\xff\xf0",  # map32
    b"\xda\xff\xff",  # str16
    b"\xc9\xff\xff\xff\xf0\x01",  # ext32
]

_nests = [b"\x91", b"\x81\xa1k"]  # one-element array, one-entry map: n of them nested

plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


def _flip(data: bytes, at: int, bit: int) -> bytes:
    at %= len(data)
    return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1 :]


one_input = st.one_of(
    st.binary(max_size=4096),
    st.builds(lambda m, f: m[: int(len(m) * f)], st.sampled_from(_valid), st.floats(0, 0.999)),
    st.builds(
        lambda h, n: h + b"\x00" * n,
        st.sampled_from(_headers),
        st.sampled_from([0, 100, 70_000, 1_200_000]),
    ),
    st.builds(lambda n, b: b * n + b"\xc0", st.integers(1, 12_000), st.sampled_from(_nests)),
    plain.map(protocol.pack),
    st.fixed_dictionaries(
        {
            "type": st.just("command"),
            "id": plain,
            "cmd": st.sampled_from(sorted(COMMANDS)) | st.text(max_size=10),
            "args": plain,
            "nonce": st.text(max_size=40) | st.just("0" * 32),
            "mac": st.text(max_size=70) | st.just("a" * 64),
        }
    ).map(protocol.pack),
    st.builds(_flip, st.sampled_from(_valid), st.integers(0, 10_000), st.integers(0, 7)),
)
inputs = st.lists(one_input, min_size=1, max_size=3).map(b"".join)


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    errors = _Errors()
    logging.getLogger("telemetry").addHandler(errors)
    queue = CommandQueue()
    run = tmp_path_factory.mktemp("fuzz")
    hub = Hub(
        run_dir=run,
        hello=synthetic.hello(),
        port=ANY_PORT,
        commands=queue,
        key=KEY,
        options=ServerOptions(flush_interval=0),  # each record at once: the checks wait for one
    )
    hub.start()
    yield hub, queue, errors, itertools.count(1)
    hub.close()
    logging.getLogger("telemetry").removeHandler(errors)


def _still_serving(hub: Hub, step: int) -> None:
    with TelemetryClient.connect(*hub.address, timeout=10) as good:
        assert good.hello.rank == 0
        hub.on_update(synthetic.update(step))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            msg = good.recv(0.5)
            if isinstance(msg, Update) and msg.step == step:
                return
        raise AssertionError(f"a fresh client did not get update {step}")


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(payload=inputs)
def test_malformed_input_never_stops_the_server(live, payload):
    hub, queue, errors, steps = live
    bad = socket.create_connection(hub.address, timeout=5)
    try:
        with contextlib.suppress(OSError):  # the server may close on bad bytes, mid-send
            bad.sendall(payload)
        # While the bad connection is still open, others are served as usual.
        _still_serving(hub, next(steps))
        # Then the server must see every byte and close: read until it does.
        with contextlib.suppress(OSError):
            bad.shutdown(socket.SHUT_WR)
            while bad.recv(65536):
                pass
    finally:
        bad.close()
    assert queue.poll() is None  # nothing unsigned or mis-signed reached the run
    assert not errors.records, errors.records[0].getMessage()


def test_server_survived_the_fuzz(live):
    hub, _, errors, steps = live
    assert hub.server._thread is not None and hub.server._thread.is_alive()
    _still_serving(hub, next(steps))
    assert not errors.records
