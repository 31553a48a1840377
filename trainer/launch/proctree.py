"""The processes a launch started, remembered as they appear, so that none outlives the run.

mlx.launch starts each rank under a shell (or an ssh client); when a rank's parent dies first
the rank is re-parented to init and a plain "children of mlx.launch" no longer finds it. This
keeps every descendant it has ever seen (pid and start time, so a recycled pid is never hit)
and can signal or end them all, even after mlx.launch itself has gone.
"""

from __future__ import annotations

import contextlib
import signal

import psutil


class ProcessTree:
    """mlx.launch's process and everything under it, as seen so far."""

    def __init__(self, pid: int) -> None:
        self.root = pid
        self._seen: dict[int, psutil.Process] = {}
        self.refresh()

    def refresh(self) -> None:
        """Remember the descendants that exist now (call it often: about twice a second)."""
        try:
            root = psutil.Process(self.root)
            found = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for p in found:
            self._seen.setdefault(p.pid, p)

    def alive(self) -> list[psutil.Process]:
        """The remembered processes still running (psutil checks the start time too)."""
        out = []
        for p in self._seen.values():
            with contextlib.suppress(psutil.Error):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    def ranks(self) -> list[psutil.Process]:
        """Ranks running on this machine (`python -m fleet.cli ...` under mlx.launch), else
        the ssh clients that carry the remote ones."""
        local, ssh = [], []
        for p in self.alive():
            with contextlib.suppress(psutil.Error):
                cmd = p.cmdline()
                if p.pid != self.root and "fleet.cli" in cmd:
                    local.append(p)
                elif cmd[:1] and cmd[0].rsplit("/", 1)[-1] == "ssh":
                    ssh.append(p)
        return local or ssh

    def signal_ranks(self, signum: int = signal.SIGTERM) -> int:
        """Send `signum` to every rank; returns how many were signalled."""
        n = 0
        for p in self.ranks():
            with contextlib.suppress(psutil.Error):
                p.send_signal(signum)
                n += 1
        return n

    def end(self, timeout: float = 3.0, exclude: int | None = None) -> int:
        """Terminate everything remembered (but `exclude`, a pid), then kill what is left (a
        stopped process ignores SIGTERM until continued, but not SIGKILL); returns how many
        were ended."""
        family = [p for p in self.alive() if p.pid != exclude]
        for p in family:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, left = psutil.wait_procs(family, timeout=timeout)
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(left, timeout=timeout)
        return len(family)
