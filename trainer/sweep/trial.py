"""A trial's process: a real `fleet launch` (or one-rank `fleet train`) run in its own
process group, its output in the sweep folder, stopped with a checkpoint by SIGTERM, and a
previous controller's orphan found and ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from trainer.checkpoint import catalog
from trainer.checkpoint.manifest import step_of


class TrialProcess:
    """One session of a trial: started, polled, asked to stop, ended."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.started = time.monotonic()
        with open(log, "a") as out:  # the child keeps its own descriptor
            out.write(f"\n$ {' '.join(argv)}\n")
            out.flush()
            # Its own session: a signal meant for the controller is not also the trial's,
            # and the whole tree (mlx.launch and the ranks) is one group to end.
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.asked_stop = 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def stop(self) -> None:
        """Ask the trial to stop at its next update, with a checkpoint (fleet launch and
        fleet train both do that on SIGTERM)."""
        if self.asked_stop or self.proc.poll() is not None:
            return
        self.asked_stop = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)

    def end_if_late(self, grace: float) -> None:
        """A trial asked to stop that is still running `grace` seconds later is ended."""
        if self.asked_stop and time.monotonic() - self.asked_stop > grace:
            kill_group(self.proc.pid)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def end_orphan(run_dir: Path, grace: float) -> bool:
    """End a trial left running by a controller that died (a SIGKILL does not reach its
    children): SIGTERM to the top process of the trial (fleet launch forwards it to every
    rank; each checkpoints), then SIGKILL to every process still there after `grace` seconds.
    Found by the run folder in its command line, not by a recorded pid: a kill between
    starting a trial and recording its pid must not leave two processes writing one run
    folder. Returns whether there was one."""
    procs = _naming(run_dir)
    if not procs:
        return False
    pids = {p.pid for p in procs}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.ppid() not in pids:  # the top one: fleet launch, or a one-rank fleet train
                p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _naming(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    for p in _naming(run_dir):
        with contextlib.suppress(psutil.Error):
            p.kill()
    return True


def _naming(run_dir: Path) -> list[psutil.Process]:
    """Live processes (not this one) with `run_dir` as an argument."""
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            if str(run_dir) in (proc.info["cmdline"] or []):
                out.append(proc)
    return out


def resume_point(run_dir: Path, final_step: int, evaluated: set[int]) -> Path | None:
    """The checkpoint a restarted trial resumes from, or None to start over.

    The newest verified checkpoint whose replicas agree, except past the budget's end while
    its evaluation (at `final_step`) is not in the log: the trainer evaluates before an update
    and never at the update it resumed from, so resuming at or past that point would lose the
    trial's metric (a kill can also lose the last second of the log, that event with it).
    Then an earlier checkpoint: its updates are redone exactly, and the evaluation with them.
    An intermediate evaluation lost that way only leaves the pruner one point fewer to judge.
    """
    for path in reversed(catalog.complete(run_dir)):
        step = step_of(path.name)
        if step is None or (final_step not in evaluated and step >= final_step):
            continue
        manifest = catalog.verified(path)
        if manifest is None or manifest.get("replicas_agree") is False:
            continue
        return path
    return None
