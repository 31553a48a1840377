"""The spool in front of mlx.launch's output: writes never block while nothing reads, and
what was written reaches the reader in order once it reads (real pipes, real threads)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

from tests.support.fleet import fleet_env, unread
from trainer.launch import spool

LINE = b"step %6d/100000 | loss 2.7191 | 19.5k tok/s | peak 3.8 MiB | lr 4.45e-04 | 7 ms\n"


def write_in_time(fd: int, lines: int, seconds: float = 10.0) -> bool:
    """Whether `lines` progress lines were written to `fd` within `seconds`."""
    done = threading.Event()

    def write() -> None:
        for i in range(lines):
            os.write(fd, LINE % i)
        done.set()

    threading.Thread(target=write, daemon=True).start()
    return done.wait(seconds)


def delivered(s: spool.Spool, read_end: int, fd: int) -> bytes:
    """What reaches the reader, once it starts reading and the spool closes (`fd`, the
    spool's descriptor, is its last writer)."""
    got: list[bytes] = []

    def read() -> None:
        while data := os.read(read_end, 1 << 16):
            got.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    s.close()
    os.close(fd)
    reader.join(10)
    assert not reader.is_alive(), "the reader never saw the pipe's end"
    return b"".join(got)


def test_writes_go_on_while_nothing_reads_and_arrive_whole_once_read():
    read_end, fd = os.pipe()  # nobody reads it yet
    s = spool.Spool(fd)
    lines = 4000  # about 330 KB: five times what the pipe holds
    assert write_in_time(fd, lines)  # without the spool the writer blocks at about 800
    assert delivered(s, read_end, fd) == b"".join(LINE % i for i in range(lines))


def test_past_its_cap_the_oldest_output_goes_and_a_line_says_how_much():
    read_end, fd = os.pipe()
    s = spool.Spool(fd, cap=50_000)
    lines = 8000  # 640 KB
    assert write_in_time(fd, lines)
    deadline = time.monotonic() + 10
    while unread(fd) and time.monotonic() < deadline:  # the spool has taken its pipe in
        time.sleep(0.01)
    written = b"".join(LINE % i for i in range(lines))
    out = delivered(s, read_end, fd)
    # a note goes before the first chunk written after a drop: while the writer is slower
    # than the output comes (not yet blocked), there may be several
    parts = re.split(rb"\nfleet launch: ([0-9.]+) MiB of the run's output left out here: .*\n", out)
    segments, notes = parts[0::2], [float(mib) * (1 << 20) for mib in parts[1::2]]
    assert notes, out[-300:]
    # all that arrived is the output in order, with the gap each note says (to its 0.1 MiB)
    assert written.startswith(segments[0])
    end = len(segments[0])
    for note, segment in zip(notes, segments[1:], strict=True):
        at = written.find(segment, end)
        assert at >= end and abs((at - end) - note) <= 0.05 * (1 << 20)
        end = at + len(segment)
    assert end == len(written)  # to the last line
    # held while nothing read: what the target's pipe took, the chunk being written to it
    # when it blocked, what the spool kept (its cap, or one chunk where a chunk is larger),
    # and its last read if that was taken in only once the writer drained (one chunk)
    assert sum(map(len, segments)) <= (2 << 16) + 2 * max(50_000, 1 << 16) < len(written)


def test_a_gone_reader_costs_the_writer_nothing():
    read_end, fd = os.pipe()
    s = spool.Spool(fd)
    os.close(read_end)  # fleet launch killed: nobody will ever read
    assert write_in_time(fd, 2000)
    s.close()  # delivers into nothing, without an error
    os.close(fd)


def test_a_closed_output_becomes_dev_null_and_the_writer_runs_on():
    """`fleet launch >&-`: mlx.launch starts with no stdout (sys.stdout is None). The spool
    gives it /dev/null instead of failing, and the process writes and exits as usual."""
    code = (
        "import os, sys; from trainer.launch import spool; spool.install(); "
        "sys.stdout.buffer.write(b'x' * 200_000); sys.stdout.flush(); os.write(2, b'ran on')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.close(1),  # noqa: PLW1509 - the child's own stdout, nothing else
        env=fleet_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stderr == b"ran on"
