"""One writer per run folder per host: the lock is held by real processes, released by the
kernel when its holder dies (even by SIGKILL), and shared by the ranks of one run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.support.fleet import fleet_env
from trainer import lock

HOLDER = textwrap.dedent(
    """
    import sys, time
    from trainer import lock
    why = lock.claim(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    print(why or "held", flush=True)
    time.sleep(600)
    """
)


def holder(run, token: str, rank: int = 0) -> subprocess.Popen:
    """A process that claims the run folder for run `token` and keeps it."""
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run), token, str(rank)],
        stdout=subprocess.PIPE,
        text=True,
        env=fleet_env(),
    )
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_writer_is_refused_naming_the_owner(tmp_path):
    p = holder(tmp_path, "run-a")
    try:
        why = lock.claim(tmp_path, "run-b", 0)
        assert f"is in use by pid {p.pid} on {socket.gethostname()}" in why
        assert "another --run-dir" in why and "\n" not in why
        owner = lock.owner(tmp_path)
        assert owner is not None and owner.pid == p.pid
    finally:
        p.kill()
        p.wait()


def test_ranks_of_one_run_share_the_folder(tmp_path):
    p = holder(tmp_path, "run-a", rank=0)
    try:
        assert lock.claim(tmp_path, "run-a", 1) == ""  # rank 1 of the same run goes on
    finally:
        p.kill()
        p.wait()


def test_a_killed_owner_leaves_no_lock_behind(tmp_path):
    p = holder(tmp_path, "run-a")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert lock.owner(tmp_path) is None
    q = holder(tmp_path, "run-b")  # a new run takes the folder
    q.kill()
    q.wait()


def test_a_lock_that_is_not_a_regular_file_is_refused(tmp_path):
    os.mkfifo(tmp_path / "lock")
    assert "not a regular file" in lock.claim(tmp_path, "run-a", 0)
    (tmp_path / "lock").unlink()
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "lock").symlink_to(tmp_path / "elsewhere")  # never followed
    assert "cannot lock" in lock.claim(tmp_path, "run-a", 0)


def test_every_rank_refuses_when_one_is_refused(tmp_path):
    p = holder(tmp_path, "run-a")
    try:
        with pytest.raises(lock.RunInUse, match=f"pid {p.pid}"):
            lock.hold(tmp_path, 0, 1, lambda v: v)
        # a peer that got no refusal itself learns of its peer's through the all-reduce
        with pytest.raises(lock.RunInUse, match="another rank found"):
            lock.hold(tmp_path / "free", 1, 2, lambda v: [1.0] if len(v) == 1 else v)
    finally:
        p.kill()
        p.wait()


def test_fleet_launch_refuses_a_folder_in_use_before_starting_anything(tmp_path):
    from tests.support.fleet import run_fleet

    p = holder(tmp_path, "run-a")
    try:
        out = run_fleet(
            *("launch", "-n", "2", "--", "train", "--synthetic", "--run-dir", str(tmp_path)),
            check=False,
        )
    finally:
        p.kill()
        p.wait()
    assert out.returncode == 2
    assert f"fleet launch: error: run folder {tmp_path} is in use by pid {p.pid}" in out.stderr
