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


def output_nobody_reads() -> tuple[int, int]:
    """(the read end nobody reads yet, a descriptor that writes to the pipe)."""
    read_end, write_end = os.pipe()
    return read_end, write_end


def write_in_time(fd: int, lines: int, seconds: float = 10.0) -> bool:
    """Whether `lines` progress lines were written to `fd` within `seconds`."""
    done = threading.Event()

    def write() -> None:
        for i in range(lines):
            os.write(fd, LINE % i)
        done.set()

    threading.Thread(target=write, daemon=True).start()
    return done.wait(seconds)


def read_all(fd: int) -> bytes:
    got = []
    while data := os.read(fd, 1 << 16):
        got.append(data)
    return b"".join(got)


def test_writes_go_on_while_nothing_reads_and_arrive_whole_once_read():
    read_end, fd = output_nobody_reads()
    s = spool.Spool(fd)
    lines = 4000  # about 330 KB: five times what the pipe holds
    assert write_in_time(fd, lines)  # without the spool the writer blocks at about 800
    received = []
    reader = threading.Thread(target=lambda: received.append(read_all(read_end)))
    reader.start()
    s.close()
    os.close(fd)  # the last writer to the reader's pipe
    reader.join(10)
    assert received and received[0] == b"".join(LINE % i for i in range(lines))


def test_past_its_cap_the_oldest_output_goes_and_a_line_says_how_much():
    read_end, fd = output_nobody_reads()
    s = spool.Spool(fd, cap=50_000)
    lines = 4000
    assert write_in_time(fd, lines)
    received = []
    reader = threading.Thread(target=lambda: received.append(read_all(read_end)))
    reader.start()
    s.close()
    os.close(fd)
    reader.join(10)
    out = received[0]
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
    read_end, fd = output_nobody_reads()
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
