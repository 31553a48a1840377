"""Strangers' connections to a rank's telemetry port: opened, misused and closed by the
thousand (tests/system/test_connection_churn.py, benchmarks/connection_churn.py)."""

from __future__ import annotations

import os
import socket
import threading

KINDS = ("close", "read", "garbage", "partial")


def one(port: int, kind: str, n: int) -> None:
    """One stranger's connection of `kind` (one of KINDS)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            if kind == "read":
                s.settimeout(0.1)
                got = 0
                while got < 200_000:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    got += len(chunk)
            elif kind == "garbage":
                s.sendall(os.urandom(2048 + n % 4096))
            elif kind == "partial":
                # a str32 header announcing 900 KB, then a little of it: the server must
                # hold it until the partial timeout or the close
                s.sendall(b"\xdb" + (900_000).to_bytes(4, "big") + b"x" * 60_000)
    except OSError:
        pass


def churn(
    port: int, total: int, concurrency: int = 32, start: int = 0, kinds: tuple = KINDS
) -> None:
    """`total` connections, `concurrency` at a time, their kinds taken in turn."""
    counter = iter(range(start, start + total))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                n = next(counter, None)
            if n is None:
                return
            one(port, kinds[n % len(kinds)], n)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
