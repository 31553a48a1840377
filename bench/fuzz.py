"""The fuzzer: malformed, truncated, oversized and wrongly signed inputs sent to a live hub.

`fleet bench telemetry --only fuzz --fuzz 10000` runs it; tests/test_telemetry_fuzz.py does the
same with Hypothesis on a modest example count.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import time
from pathlib import Path
from typing import Any

from bench import synthetic
from telemetry import auth, protocol
from telemetry.backoff import Backoff
from telemetry.client import TelemetryClient
from telemetry.control import CommandQueue
from telemetry.errors import TelemetryError
from telemetry.hub import ANY_PORT, Hub
from telemetry.records import COMMANDS, Update

_HEADERS = [
    b"\xdb\xff\xff\xff\xf0",
    b"\xc6\xff\xff\xff\xf0",
    b"\xdd\xff\xff\xff\xf0",
    b"\xdf\xff\xff\xff\xf0",
    b"\xda\xff\xff",
    b"\xc9\xff\xff\xff\xf0\x01",
]


def _random_obj(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randint(-(2**63), 2**64 - 1)
    if kind == 3:
        return rng.uniform(-1e308, 1e308)
    if kind == 4:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(20)))
    if kind == 5:
        return rng.randbytes(rng.randrange(20))
    if kind == 6:
        return rng.choice(["type", "command", "update", "hello", "split", "mac", "nonce"])
    if kind == 7:
        return [_random_obj(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {str(_random_obj(rng, 3)): _random_obj(rng, depth + 1) for _ in range(rng.randrange(5))}


def malformed(rng: random.Random, key: bytes, valid: list[bytes]) -> tuple[str, bytes]:
    """One malformed (or wrongly signed) input and its category."""
    kind = rng.choice(
        ["random", "truncated", "oversize", "nested", "object", "command", "flipped", "badmac"]
    )
    if kind == "random":
        data = rng.randbytes(rng.randrange(4096))
    elif kind == "truncated":
        m = rng.choice(valid)
        data = m[: rng.randrange(len(m))]
    elif kind == "oversize":
        pad = rng.choice([0, 100, 70_000, 70_000, 1_200_000]) if rng.random() < 0.2 else 64
        data = rng.choice(_HEADERS) + b"\x00" * pad
    elif kind == "nested":
        data = rng.choice([b"\x91", b"\x81\xa1k"]) * rng.randrange(1, 20_000) + b"\xc0"
    elif kind == "object":
        data = protocol.pack(_random_obj(rng))
    elif kind == "command":
        msg = {"type": "command"}
        for name in ("id", "cmd", "args", "nonce", "mac"):
            if rng.random() < 0.9:
                msg[name] = _random_obj(rng) if rng.random() < 0.5 else rng.choice(sorted(COMMANDS))
        data = protocol.pack(msg)
    elif kind == "flipped":
        m = bytearray(rng.choice(valid))
        for _ in range(rng.randrange(1, 4)):
            m[rng.randrange(len(m))] ^= 1 << rng.randrange(8)
        data = bytes(m)
    else:  # well-formed, signed with the right key for another connection: refused, kept open
        nonce = auth.new_nonce()
        cmd = rng.choice(sorted(COMMANDS))
        mac = auth.sign(key, 1, cmd, {}, nonce, "not-this-connection")
        data = protocol.pack(
            {"type": "command", "id": 1, "cmd": cmd, "args": {}, "nonce": nonce, "mac": mac}
        )
    return kind, data


def fuzz(run_dir: Path, n: int, seed: int = 0) -> dict[str, Any]:
    """Send `n` malformed inputs, each on its own connection, to a live rank-0 hub."""
    rng = random.Random(seed)
    key = auth.create_key(run_dir)
    queue = CommandQueue()
    errors: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: errors.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("telemetry").addHandler(handler)
    hub = Hub(run_dir=run_dir, hello=synthetic.hello(), port=ANY_PORT, commands=queue, key=key)
    hub.start()
    valid = [
        protocol.encode(synthetic.update(1)),
        protocol.encode(synthetic.hello()),
        protocol.pack({"type": "command", "id": 1, "cmd": "pause", "args": {}, "nonce": "0" * 32}),
    ]
    kinds: dict[str, int] = {}
    sent_bytes, checks, max_call_us, step = 0, 0, 0.0, 0
    t_start = time.perf_counter()
    try:
        for i in range(1, n + 1):
            kind, data = malformed(rng, key, valid)
            kinds[kind] = kinds.get(kind, 0) + 1
            sent_bytes += len(data)
            with socket.create_connection(hub.address, timeout=5) as bad:
                _feed(bad, data)
            step += 1
            t = time.perf_counter()
            hub.on_update(synthetic.update(step))
            max_call_us = max(max_call_us, (time.perf_counter() - t) * 1e6)
            if i % 200 == 0 or i == n:
                step += 1
                _serves(hub, step)
                checks += 1
        stats = hub.stats()
        reached_queue = queue.poll() is not None
        alive = hub.server is not None and hub.server._thread is not None
        alive = alive and hub.server._thread.is_alive()
    finally:
        hub.close()
        logging.getLogger("telemetry").removeHandler(handler)
    return {
        "inputs": n,
        "by_kind": kinds,
        "bytes_sent": sent_bytes,
        "seconds": time.perf_counter() - t_start,
        "closed_on_error": stats.get("closed_on_error", 0),
        "serving_checks_passed": checks,
        "max_on_update_us": max_call_us,
        "commands_reached_run": reached_queue,
        "server_errors_logged": len(errors),
        "ok": alive and not reached_queue and not errors,
    }


def _feed(sock: socket.socket, data: bytes) -> None:
    """Send `data`, then read until the server closes: so it has seen every byte (closing
    with unread data would reset the connection, and the server could lose the input)."""
    with contextlib.suppress(OSError):
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass


def _serves(hub: Hub, step: int) -> None:
    """A fresh client gets hello and the next update (retrying while slots free up)."""
    backoff = Backoff(initial=0.05, max=0.5)
    deadline = time.monotonic() + 15
    while True:
        try:
            with TelemetryClient.connect(*hub.address, timeout=5) as good:
                hub.on_update(synthetic.update(step))
                while time.monotonic() < deadline:
                    msg = good.recv(0.5)
                    if isinstance(msg, Update) and msg.step == step:
                        return
        except TelemetryError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("the server stopped serving well-behaved clients")
        time.sleep(backoff.next())
