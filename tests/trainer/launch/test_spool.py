"""The spool in front of mlx.launch's output: writes never block while nothing reads, and
what was written reaches the reader in order once it reads (real pipes, real threads)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from tests.support.fleet import fleet_env
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
    lines = 4000
    assert write_in_time(fd, lines)
    out = delivered(s, read_end, fd)
    note_at = out.index(b"\nfleet launch: ")
    note_end = out.index(b"\n", note_at + 1) + 1
    assert b"MiB of the run's output left out here" in out[note_at:note_end]
    kept = out[note_end:]
    # what is kept is the newest output, whole lines to the last one, within the cap (and
    # what the target's pipe held before the writer blocked)
    assert kept.endswith(LINE % (lines - 1))
    assert len(out[:note_at]) + len(kept) <= 50_000 + (1 << 16) + (1 << 16)
    assert len(out) < len(LINE) * lines / 2


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
