"""One attempt under mlx.launch: its output passed through, the first rank that failed or
stalled named, and nothing of it left running, even if fleet launch itself is killed."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from trainer import heartbeat
from trainer.launch import lifeline
from trainer.launch.proctree import ProcessTree

_FAILED = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")
# A rank's own account of why it ends ("fleet train: rank 1: error: ..."): the cause. A peer's
# "lost contact with a peer" and rank 0's alert about it are what the cause did to the others.
_RANK_LINE = re.compile(r"^fleet train: rank (\d+): (?!warning: |note: )(?:error: )?(.*)")
_CONSEQUENCE = re.compile(r"lost contact with a peer rank|^fleet train: alert: lost: ")
# A watchdog that fired names the rank it waited for: the heartbeats judge those (a stall).
_WAITED = re.compile(r"^fleet train: rank \d+: no progress for ")
# The ring backend's lines about a peer that went away: tens of them per rank, all the same.
_RING_NOISE = re.compile(
    r"^\[ring\] (?:Sending to|Receiving from|Socket \d+ was closed|Too many send/recv)"
)
# ...written a word at a time (one write per word) by several threads of each rank, and
# passed on by mlx.launch in the chunks it happens to read: a line can be a jumble of those
# words, or begin with some of them before a rank's own line.
_RING_WORDS = re.compile(
    r"(?:\[ring\]|Sending to socket|Receiving from socket|Socket|was closed by the peer|"
    r"failed with errno|made no progress|connection to a peer was lost|"
    r"Too many send/recv errors\. Failing pending "
    r"tasks\.\.\.|-?\d+|[ \t])+"
)
# ...or after mlx.launch's own warning marker, cut from its message (seen in CI)
_LAUNCH_MARK = re.compile(r"(?:\x1b\[33m)?\[WARN\] ?(?=\[ring\])")
_RING_WORD = re.compile(r"\[ring\]|socket|Socket|closed by the peer|errno|no progress|send/recv")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
HELD_LINES = 200  # consequences held back until the cause shows (lines; beyond: shown)


class Stops:
    """SIGINT, SIGTERM and SIGHUP to fleet launch, caught from its first moment (installed
    before anything starts, so none is lost); the supervisor in charge acts on them."""

    def __init__(self) -> None:
        self.signalled: str | None = None
        self.again = False  # a second signal: end everything now
        self.listener: Callable[[str], None] | None = None
        self._previous: dict = {}

    def install(self) -> Stops:
        for s in SIGNALS:
            self._previous[s] = signal.signal(s, self._on_signal)
        return self

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signalled is not None:
            self.again = True
            print(f"fleet launch: {name} again: ending every rank now", file=sys.stderr, flush=True)
            return
        self.signalled = name
        if self.listener is not None:
            self.listener(name)
        else:
            print(f"fleet launch: {name}: stopping (no rank is running)", file=sys.stderr)


class Supervisor:
    """Runs mlx.launch, passes its output through, names the rank that failed, and makes sure
    that nothing of the run outlives it.

    `hosts`: each rank's ssh name, for hostfile runs: an exit code of 255 there is ssh's own.
    `grace`: after a failure, the others normally notice the lost peer within a second and
    exit; ranks still running `grace` seconds later (waiting for a peer that never came up)
    are ended, with mlx.launch and everything under it. Ranks that the heartbeats in
    `run_dir` show stalled are ended at once: waiting for them is waiting forever.
    A signal to `fleet launch` (see Stops) asks every rank to stop at its next update
    (checkpoint, clean exit); after `grace` seconds, or a second signal, all is ended.
    `watched`: the ranks read the lifeline (trainer/launch/lifeline.py), so a stop reaches
    them down it, ranks not started yet included; otherwise they are signalled, every new
    one as it appears. Either way mlx.launch holds the lifeline: if fleet launch dies, the
    tether inside it stops the ranks and ends what is left.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        hosts: list[str] | None = None,
        grace: float = 30.0,
        run_dir: str | Path | None = None,
        stops: Stops | None = None,
        watched: bool = False,
    ) -> None:
        self.argv, self.env, self.hosts = argv, env, hosts or []
        self.grace, self.run_dir, self.watched = grace, run_dir, watched
        self.stops = stops or Stops()
        self.failures: list[tuple[int, str, int | None]] = []  # rank, how, exit code
        self.cause: tuple[int, str] | None = None  # the first rank that said why it failed
        self.lost_peer: set[int] = set()  # ranks that said they failed for losing a peer
        self.hidden = 0  # lines of consequential noise left out
        self.signalled: str | None = None
        self.deadline: float | None = None
        self.stalled = ""  # what the heartbeats said of a rank that stopped, while it did
        self._signalled_pids: set[int] = set()

    @property
    def end_now(self) -> bool:
        return self.stops.again

    def run(self) -> int:
        if self.stops.signalled:  # asked to stop before this attempt began: start nothing
            self.signalled = self.stops.signalled
            return self._verdict(0, False, 0)
        line = lifeline.Lifeline(alive=self.watched)
        tether = {lifeline.GRACE_ENV: f"{self.grace:g}"}
        if not self.watched:
            tether[lifeline.SIGNAL_ENV] = "1"  # nobody reads the lifeline: signal the ranks
        # Its own session: a terminal's Ctrl-C reaches fleet launch alone, which turns it into
        # one orderly stop instead of every process dying at its own moment.
        self.proc = subprocess.Popen(
            self.argv,
            env={**self.env, **tether},
            stdin=line.read_fd,
            stdout=None,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.line = line.start()
        self.tree = ProcessTree(self.proc.pid)
        reader = threading.Thread(target=self._relay, daemon=True)
        reader.start()
        self.stops.listener = self._on_stop
        if self.stops.signalled:  # it came while mlx.launch was starting
            self._on_stop(self.stops.signalled)
        try:
            ended, code = self._wait()
        finally:
            self.stops.listener = None
            left = self.tree.end()  # nothing of the run outlives it, ever
            line.close()
        reader.join(timeout=5)
        return self._verdict(code, ended, left)

    def _on_stop(self, name: str) -> None:
        if self.signalled is not None:
            return
        self.signalled = name
        self.deadline = time.monotonic() + self.grace
        if self.watched:
            self.line.stop(name)
            asked = "asked every rank"
        else:
            asked = f"asked {self._signal_new_ranks()} rank process(es)"
        print(
            f"fleet launch: {name}: {asked} to stop at the next update (checkpoint); "
            f"ending them in {self.grace:g} s (again to end now)",
            file=sys.stderr,
            flush=True,
        )

    def _signal_new_ranks(self) -> int:
        """SIGTERM to every rank process not signalled yet (ranks that appear after a stop
        are told too)."""
        n = 0
        for p in self.tree.ranks():
            if p.pid not in self._signalled_pids:
                with contextlib.suppress(Exception):
                    p.send_signal(signal.SIGTERM)
                    n += 1
                self._signalled_pids.add(p.pid)
        return n

    def _wait(self) -> tuple[bool, int]:
        """(whether the ranks had to be ended, mlx.launch's exit code)."""
        while True:
            try:
                return False, self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            self.tree.refresh()
            if self.signalled and not self.watched:
                self._signal_new_ranks()
            if self.failures and self.deadline is None:
                self.deadline = time.monotonic() + self.grace
            if self.failures and not self.stalled:
                self.stalled = self._stalled()
            if self.end_now or self.stalled or self._past_deadline():
                self.tree.end()
                return True, self.proc.wait()

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

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
        """Pass mlx.launch's stderr through, noting its "Node with rank N ..." lines and the
        first rank that said why it failed; the consequences on its peers (lost contact, the
        ring backend's repeated socket errors) and mlx.launch's own thread tracebacks (it
        cannot clean up a rank that never started) are left out and counted."""
        assert self.proc.stderr is not None
        in_launcher_traceback = False
        ring_heard = ring_shown = False  # any of the ring's words; the first whole line shown
        held: list[str] = []  # consequences seen before any cause: shown only if none comes
        for line in self.proc.stderr:
            if line.startswith("Exception in thread") and "(_thread_fn)" in line:
                in_launcher_traceback = True  # mlx.launch's own rank thread, not a rank's
            if in_launcher_traceback:
                # Frames and code are indented; the block ends with the exception's own line.
                if not line[:1].isspace() and not line.startswith(("Exception in", "Traceback")):
                    in_launcher_traceback = False
                continue
            noise, line = _ring_words(line)
            if noise or (ring_heard and line.strip().isdigit()):  # a word cut from its line
                ring_heard = True
                whole = not line.strip() and noise.count("[ring]") == 1
                if whole and _RING_NOISE.match(noise) and not ring_shown:
                    ring_shown = True  # the first whole one says what happened
                    line = noise + line
                else:
                    self.hidden += bool(noise)
                    if not line.strip() or line.strip().isdigit():
                        continue
            if _CONSEQUENCE.search(line):
                if m := _RANK_LINE.match(line):
                    self.lost_peer.add(int(m.group(1)))
                if self.cause is not None:  # what the cause did to the peers
                    self.hidden += 1
                    continue
                if len(held) < HELD_LINES:  # the cause may come a moment later: wait for it
                    held.append(line)
                    continue
            elif self.cause is None and (m := _RANK_LINE.match(line)) and not _WAITED.match(line):
                self.cause = (int(m.group(1)), m.group(2).strip())
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
        if self.cause is not None:
            self.hidden += len(held)
        else:  # no rank said why: the peers' account is all there is
            sys.stderr.writelines(held)
            sys.stderr.flush()

    def _verdict(self, code: int, ended: bool, left: int) -> int:
        say = partial(print, file=sys.stderr, flush=True)
        stalled = self.stalled
        if not stalled and self.run_dir is not None:
            stalled = heartbeat.culprit(heartbeat.read_all(self.run_dir))
        if self.hidden:
            say(f"fleet launch: {self.hidden} line(s) of the peers about the lost rank left out")
        if self.signalled:
            how = "ranks that did not stop in time were ended" if ended else "the ranks stopped"
            if not hasattr(self, "proc"):
                how = "no rank was started"
            say(f"fleet launch: stopped on {self.signalled}: {how}")
            return 128 + getattr(signal, self.signalled).value
        if self.failures:
            say(f"{self._failure_line(stalled, ended).rstrip('.')}. {self._resume_hint()}")
            return 1
        if code != 0:
            say(f"fleet launch: mlx.launch exited with code {code}")
            return code if code > 0 else 1
        if left:
            say(f"fleet launch: ended {left} process(es) of the run still running after it")
        return 0

    def first_failure(self) -> tuple[int, str, int | None]:
        """The failure the attempt is blamed on (rank, how, exit code): the first to end
        that did not say it lost a peer (a rank killed outright says nothing, and on a busy
        machine its peers' exits can reach mlx.launch before its own)."""
        return next((f for f in self.failures if f[0] not in self.lost_peer), self.failures[0])

    def _failure_line(self, stalled: str, ended: bool) -> str:
        rank, how, rc = self.first_failure()
        others = sorted({r for r, _, _ in self.failures if r != rank})
        if self.cause is not None:
            # A rank that said why it failed is the cause, whoever mlx.launch saw exit first;
            # its own line is repeated last, where the eye lands.
            cause_rank, text = self.cause
            failed = {r: h for r, h, _ in reversed(self.failures)}
            how = failed.get(cause_rank, "failed")
            return f"fleet launch: rank {cause_rank} failed first ({how}): {text}"
        blamed = re.match(r"rank (\d+) ", stalled)
        if blamed and rc in (1, 3) and int(blamed.group(1)) != rank:
            # The first to exit was a healthy rank whose watchdog fired, or that lost
            # its peer: the heartbeats name the rank that really stopped.
            return (
                f"fleet launch: {stalled}; rank {rank} exited first ({how}) waiting for "
                f"it{f', then rank(s) {others}' if others else ''}"
                + ("; the stalled rank was ended" if ended else "")
            )
        tail = f"; then rank(s) {others} stopped too" if others else ""
        if ended:
            tail += f"; the rest were still running {self.grace:g} s later and were ended"
        return f"fleet launch: rank {rank} failed first ({how}){tail}. Its messages are above"

    def _resume_hint(self) -> str:
        """Where to resume from, only when there is a verified checkpoint to resume."""
        if self.run_dir is None:
            return ""
        from trainer.checkpoint import catalog  # (imported here: fleet check needs none)

        path = catalog.newest_verified(self.run_dir)
        if path is None:
            return "Nothing was saved yet: start again once it is fixed."
        return f"Resume with --resume latest ({path.name}, verified)."


def _ring_words(line: str) -> tuple[str, str]:
    """(the ring backend's words that `line` begins with, the rest of it); ("", line) when
    it begins with none (digits or blanks alone are not the ring's). mlx.launch's warning
    marker glued in front of them counts with them: its message went elsewhere."""
    mark = _LAUNCH_MARK.match(line)
    m = _RING_WORDS.match(line, mark.end() if mark else 0)
    if m is None or not _RING_WORD.search(m.group()):
        return "", line  # digits or spaces alone: a line of its own
    return line[: m.end()], line[m.end() :]
