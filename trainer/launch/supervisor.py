"""One attempt under mlx.launch: its output passed through, the first rank that failed or
stalled named, and nothing of it left running."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

from trainer import heartbeat
from trainer.launch.proctree import ProcessTree

_FAILED = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")


class Supervisor:
    """Runs mlx.launch, passes its output through, names the rank that failed, and makes sure
    that nothing of the run outlives it.

    `hosts`: each rank's ssh name, for hostfile runs: an exit code of 255 there is ssh's own.
    `grace`: after a failure, the others normally notice the lost peer within a second and
    exit; ranks still running `grace` seconds later (waiting for a peer that never came up)
    are ended, with mlx.launch and everything under it. Ranks that the heartbeats in
    `run_dir` show stalled are ended at once: waiting for them is waiting forever.
    SIGINT, SIGTERM and SIGHUP to `fleet launch` ask every rank to stop at its next update
    (checkpoint, clean exit); after `grace` seconds, or a second signal, all is ended.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        hosts: list[str] | None = None,
        grace: float = 30.0,
        run_dir: str | Path | None = None,
    ) -> None:
        self.argv, self.env, self.hosts = argv, env, hosts or []
        self.grace, self.run_dir = grace, run_dir
        self.failures: list[tuple[int, str, int | None]] = []  # rank, how, exit code
        self.signalled: str | None = None
        self.deadline: float | None = None
        self.end_now = False
        self.stalled = ""  # what the heartbeats said of a rank that stopped, while it did

    def run(self) -> int:
        # Its own session: a terminal's Ctrl-C reaches fleet launch alone, which turns it into
        # one orderly stop instead of every process dying at its own moment.
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=None,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.tree = ProcessTree(self.proc.pid)
        reader = threading.Thread(target=self._relay, daemon=True)
        reader.start()
        signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {s: signal.getsignal(s) for s in signums}
        for s in signums:
            signal.signal(s, self._on_signal)
        try:
            ended, code = self._wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            left = self.tree.end()  # nothing of the run outlives it, ever
        reader.join(timeout=5)
        return self._verdict(code, ended, left)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signalled is not None:
            self.end_now = True
            print(f"fleet launch: {name} again: ending every rank now", file=sys.stderr, flush=True)
            return
        self.signalled = name
        n = self.tree.signal_ranks(signum)  # the same signal: a Ctrl-C is reported as one
        self.deadline = time.monotonic() + self.grace
        print(
            f"fleet launch: {name}: asked {n} rank process(es) to stop at the next update "
            f"(checkpoint); ending them in {self.grace:g} s (again to end now)",
            file=sys.stderr,
            flush=True,
        )

    def _wait(self) -> tuple[bool, int]:
        """(whether the ranks had to be ended, mlx.launch's exit code)."""
        while True:
            try:
                return False, self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            self.tree.refresh()
            if self.failures and self.deadline is None:
                self.deadline = time.monotonic() + self.grace
            if self.failures and not self.stalled:
                self.stalled = self._stalled()
                self.end_now = self.end_now or bool(self.stalled)
            if self.end_now or (self.deadline is not None and time.monotonic() > self.deadline):
                self.tree.end()
                return True, self.proc.wait()

    def _stalled(self) -> str:
        """What the heartbeats say about a rank that stopped, once a peer has failed."""
        if self.run_dir is None:
            return ""
        beats = heartbeat.read_all(self.run_dir)
        live = [b for r, b in beats.items() if r not in {f[0] for f in self.failures}]
        now = time.time()
        if live and all(now - b.beat > heartbeat.STALE_S for b in live):
            return heartbeat.culprit(beats, now)
        return ""

    def _relay(self) -> None:
        """Pass mlx.launch's stderr through, noting its "Node with rank N ..." lines; its own
        thread tracebacks (it cannot clean up a rank that never started) are left out."""
        assert self.proc.stderr is not None
        in_launcher_traceback = False
        for line in self.proc.stderr:
            if line.startswith("Exception in thread") and "(_thread_fn)" in line:
                in_launcher_traceback = True  # mlx.launch's own rank thread, not a rank's
            if in_launcher_traceback:
                # Frames and code are indented; the block ends with the exception's own line.
                if not line[:1].isspace() and not line.startswith(("Exception in", "Traceback")):
                    in_launcher_traceback = False
                continue
            m = _FAILED.search(line)
            if m:
                rank = int(m.group(1))
                code = int(m.group(2)) if m.group(2) else None
                how = f"exited with code {code}" if code is not None else "was killed"
                if code == 255 and rank < len(self.hosts) and self.hosts[rank]:
                    host = self.hosts[rank]
                    how += (
                        f": ssh could not start it on {host} (unreachable, login refused, or "
                        f"host key unknown; try `ssh {host} true`)"
                    )
                self.failures.append((rank, how, code))
            sys.stderr.write(line)
            sys.stderr.flush()

    def _verdict(self, code: int, ended: bool, left: int) -> int:
        say = partial(print, file=sys.stderr, flush=True)
        stalled = self.stalled
        if not stalled and self.run_dir is not None:
            stalled = heartbeat.culprit(heartbeat.read_all(self.run_dir))
        if self.signalled:
            how = "ranks that did not stop in time were ended" if ended else "the ranks stopped"
            say(f"fleet launch: stopped on {self.signalled}: {how}")
            return 128 + getattr(signal, self.signalled).value
        if self.failures:
            rank, how, rc = self.failures[0]
            others = sorted({r for r, _, _ in self.failures[1:] if r != rank})
            blamed = re.match(r"rank (\d+) ", stalled)
            if blamed and rc in (1, 3) and int(blamed.group(1)) != rank:
                # The first to exit was a healthy rank whose watchdog fired, or that lost
                # its peer: the heartbeats name the rank that really stopped.
                say(
                    f"fleet launch: {stalled}; rank {rank} exited first ({how}) waiting for "
                    f"it{f', then rank(s) {others}' if others else ''}"
                    + ("; the stalled rank was ended" if ended else "")
                )
                return 1
            tail = f"; then rank(s) {others} stopped too" if others else ""
            if ended:
                tail += f"; the rest were still running {self.grace:g} s later and were ended"
            say(f"fleet launch: rank {rank} failed first ({how}){tail}. Its messages are above.")
            return 1
        if code != 0:
            say(f"fleet launch: mlx.launch exited with code {code}")
            return code if code > 0 else 1
        if left:
            say(f"fleet launch: ended {left} process(es) of the run still running after it")
        return 0
