"""The lifeline from `fleet launch` to every rank: nothing of a run outlives its launcher.

`fleet launch` runs mlx.launch with a pipe as its standard input, and mlx.launch copies what
it reads there to every rank's standard input (a pipe on this machine, the ssh session's
terminal on another). Down that path, one line at a time:

    fleet:alive          about once a second, while fleet launch supervises the run
    fleet:stop SIGTERM   fleet launch was asked to stop: stop at the next update, checkpoint
    fleet:lost           fleet launch is gone (written by the tether inside mlx.launch)

Three ends, each a few lines:

- `Lifeline` (fleet launch): the pipe's write end and the thread that says "alive"; `stop`
  says stop. A line written before a rank exists waits in mlx.launch's queue for that rank,
  so a stop in the first second reaches ranks that appear after it.
- `tether()` (inside mlx.launch, before its own main): relays the lines, and when the pipe
  ends (fleet launch killed, even by SIGKILL) tells every rank `lost`, then ends whatever is
  still running `grace` seconds later. No parent-death signal: macOS has none. mlx.launch's
  one loop both relays the lines and writes the ranks' output, so the tether spools that
  output (spool.py): output that nobody reads must not silence the lifeline.
- `Watch` (each rank, `FLEET_LIFELINE` set): reads the lines on a thread; at every update
  boundary the controller asks it `code()`: a stop, a lost launcher (the line says so, the
  input ended, or nothing came for `timeout` seconds: an ssh connection that went silent),
  or nothing. The stop rides the control all-reduce like a signal's, so one rank's
  lifeline stops them all, with a checkpoint.

No mlx here: fleet launch imports this module, and so does the rank.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
import time

from trainer.launch import spool

ENV = "FLEET_LIFELINE"  # set for every rank by fleet launch: the timeout in seconds
GRACE_ENV = "FLEET_TETHER_GRACE"  # mlx.launch's: seconds the ranks get once fleet launch is gone
SIGNAL_ENV = "FLEET_TETHER_SIGNAL"  # mlx.launch's: "1" when its ranks read none (signal them)
PREFIX = b"fleet:"
ALIVE, STOP, LOST = b"fleet:alive", b"fleet:stop", b"fleet:lost"
PERIOD_S = 1.0  # fleet launch says "alive" this often
CALM_S = 0.05  # mlx.launch's loop for each rank waits this long when it has nothing to do
TIMEOUT_S = 15.0  # a rank that hears nothing for this long stops (fleet launch --lifeline-timeout)

# What a rank's stop request carries through the control all-reduce (an FP32, exact): a
# signal number (1-127) the rank itself received; 128 + the signal fleet launch received; or
# LOST_CODE, fleet launch is gone.
LAUNCHER_SIGNAL = 128
LOST_CODE = 256


def describe(code: int, rank: int | None) -> str:
    """The reason a stop request gives, as the `stopped` event and the report say it; `rank`
    the rank that asked, None where naming it would say nothing (every rank got it)."""
    if code == LOST_CODE:
        return "a lost lifeline to fleet launch" + (f" (rank {rank})" if rank is not None else "")
    if code > LAUNCHER_SIGNAL:
        return f"{signal_words(code - LAUNCHER_SIGNAL)} to fleet launch"
    return signal_words(code) + (f" on rank {rank}" if rank is not None else "")


def signal_words(signum: int) -> str:
    """A stopping signal as the person who sent it knows it (Ctrl-C, not SIGINT)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    return {
        "SIGINT": "Ctrl-C (SIGINT)",
        "SIGHUP": "SIGHUP (the terminal or SSH session closed)",
    }.get(name, name)


# --- fleet launch's end --------------------------------------------------------------------
class Lifeline:
    """The pipe to mlx.launch's standard input, and its keepalive thread."""

    def __init__(self, alive: bool = True) -> None:
        self.alive = alive  # ranks that read no lifeline are not sent "alive" (nobody reads it)
        self.read_fd, self.write_fd = os.pipe()
        os.set_inheritable(self.write_fd, False)  # only fleet launch holds it: its death is EOF
        os.set_blocking(self.write_fd, False)  # a full pipe (mlx.launch stopped) never blocks us
        self._stop_line: bytes | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-lifeline", daemon=True)

    def start(self) -> Lifeline:
        """Once mlx.launch holds the read end (it is closed here)."""
        os.close(self.read_fd)
        self._thread.start()
        return self

    def stop(self, signame: str) -> None:
        """Ask every rank to stop at its next update (safe in a signal handler)."""
        self._stop_line = STOP + b" " + signame.encode() + b"\n"
        self._send(self._stop_line)

    def close(self) -> None:
        self._done.set()
        with contextlib.suppress(OSError):
            os.close(self.write_fd)

    def _run(self) -> None:
        # Once a stop was asked, it is repeated instead of "alive": a rank that starts late
        # still reads it first thing, and a line a full pipe refused is sent again.
        while not self._done.wait(PERIOD_S):
            if self._stop_line or self.alive:
                self._send(self._stop_line or ALIVE + b"\n")

    def _send(self, line: bytes) -> None:
        with contextlib.suppress(OSError):  # full (sent again next second) or closed
            os.write(self.write_fd, line)  # one short write: atomic on a pipe


# --- the tether, inside mlx.launch ---------------------------------------------------------
def tether() -> None:
    """Run in mlx.launch's process before its main(): relay fleet launch's lines to mlx.launch
    (which copies them to every rank), and outlive fleet launch only long enough to stop
    the ranks. Standard input becomes a pipe of ours, so mlx.launch never reads an ended one
    (it would spin on it)."""
    spool.install()  # before anything is written: mlx.launch's output never blocks its loop
    upstream = os.dup(0)
    read_end, write_end = os.pipe()
    os.dup2(read_end, 0)
    os.close(read_end)
    try:
        grace = float(os.environ.get(GRACE_ENV, "30"))
    except ValueError:
        grace = 30.0
    signal_ranks = os.environ.get(SIGNAL_ENV) == "1"
    for name in (GRACE_ENV, SIGNAL_ENV):  # the ranks need neither
        os.environ.pop(name, None)
    with contextlib.suppress(Exception):  # mlx.launch's internals: best effort
        # (imported by name: this runs inside mlx.launch, which imports mlx anyway; fleet
        # launch itself never does)
        launch = importlib.import_module("mlx._distributed_utils.launch")
        _unecho(launch.RemoteProcess)
        _calm(launch)
    threading.Thread(
        target=_relay,
        args=(upstream, write_end, grace, signal_ranks),
        name="fleet-tether",
        daemon=True,
    ).start()


def _calm(launch) -> None:
    """mlx.launch's thread for each rank selects on the rank's output and, for writing, on its
    standard input, which is always writable: the loop never sleeps, and the launcher takes a
    core of the machine that also trains (benchmarks/RESULTS.md, issue 19). Wait on the output
    alone, up to CALM_S, then ask whether the input takes bytes: what fleet launch sends (a
    line a second) reaches the ranks within CALM_S, and their output as soon as it comes."""
    real = launch.select

    def select(rlist, wlist, xlist, timeout=None):
        if not wlist:
            return real(rlist, wlist, xlist, timeout)
        wait = CALM_S if timeout is None else min(timeout, CALM_S)
        ready, _, errors = real(rlist, [], xlist, wait)
        return ready, real([], wlist, [], 0)[1], errors

    launch.select = select


def _unecho(remote: type) -> None:
    """Leave out lifeline lines that a remote terminal echoed before the rank's script turned
    echo off (`ssh -tt`: lines that arrive during login are echoed back). mlx.launch takes a
    remote rank's first line of output for its pid file, so an echo there would also cost
    it the way to end that rank."""
    original = remote.preprocess_output

    def preprocess_output(self, data: str, is_stdout: bool = False) -> str:
        if is_stdout and getattr(self, "_pidfile", "") is None:
            lines = data.splitlines(keepends=True)
            while lines and lines[0].startswith(PREFIX.decode()):
                lines.pop(0)
            data = "".join(lines)
            if not data:
                return ""
        return original(self, data, is_stdout)

    remote.preprocess_output = preprocess_output


def _relay(upstream: int, downstream: int, grace: float, signal_ranks: bool) -> None:
    while True:
        try:
            data = os.read(upstream, 4096)
        except OSError:
            data = b""
        if not data:
            break
        with contextlib.suppress(OSError):
            os.write(downstream, data)
    # fleet launch is gone: nobody reads our stderr any more, nobody supervises the ranks.
    with contextlib.suppress(OSError):
        # it was the spool's pipe on to fleet launch: what the spool holds goes nowhere now
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    with contextlib.suppress(OSError):
        os.write(downstream, LOST + b"\n")  # mlx.launch copies it to every rank
    from trainer.launch.proctree import ProcessTree

    tree, deadline = ProcessTree(os.getpid()), time.monotonic() + grace
    if signal_ranks:
        tree.signal_ranks(signal.SIGTERM)
    while time.monotonic() < deadline:  # mlx.launch exits by itself once its ranks have
        time.sleep(0.5)
        tree.refresh()
    tree.end(exclude=os.getpid())
    os._exit(1)


# --- a rank's end --------------------------------------------------------------------------
class Watch:
    """A rank's reader of the lifeline; `code()` says whether to stop now, and why."""

    def __init__(self, timeout: float = TIMEOUT_S, fd: int = 0) -> None:
        self.timeout, self.fd = timeout, fd
        self.heard = time.monotonic()
        self.parent = os.getppid()  # mlx.launch here, sshd's session on another host
        self.stop_code = 0
        self.ended = False
        self._thread = threading.Thread(target=self._read, name="fleet-lifeline", daemon=True)

    @classmethod
    def from_env(cls) -> Watch | None:
        """The rank's watch when fleet launch started it (FLEET_LIFELINE), else None."""
        raw = os.environ.get(ENV)
        if not raw:
            return None
        try:
            timeout = float(raw)
        except ValueError:
            timeout = TIMEOUT_S
        return cls(timeout if timeout > 0 else TIMEOUT_S).start()

    def start(self) -> Watch:
        self._thread.start()
        return self

    def code(self) -> int:
        """0, or what to ask every rank for: fleet launch's stop, or LOST_CODE."""
        if self.stop_code:
            return self.stop_code
        if self.ended or os.getppid() != self.parent:
            return LOST_CODE
        if time.monotonic() - self.heard > self.timeout:
            return LOST_CODE
        return 0

    def why(self) -> str:
        """The lost lifeline in words (for the rank's own line)."""
        if self.stop_code:
            return describe(self.stop_code, 0)
        if self.ended:
            return "its input from mlx.launch ended"
        if os.getppid() != self.parent:
            return "the process that started it is gone"
        return f"no word from fleet launch for {time.monotonic() - self.heard:.0f} s"

    def _read(self) -> None:
        pending = b""
        while True:
            try:
                data = os.read(self.fd, 4096)
            except OSError:  # a terminal whose ssh session hung up says EIO
                data = b""
            if not data:
                self.ended = True
                return
            pending += data
            *lines, pending = pending.split(b"\n")
            pending = pending[-256:]  # anything else (an echo) is never allowed to grow
            for line in lines:
                self._heard(line.strip())

    def _heard(self, line: bytes) -> None:
        if not line.startswith(PREFIX):
            return  # not ours (an echo of typed input)
        self.heard = time.monotonic()
        if line.startswith(STOP) and not self.stop_code:
            name = line[len(STOP) :].strip().decode(errors="replace")
            signum = getattr(signal, name, None) if name.startswith("SIG") else None
            self.stop_code = LAUNCHER_SIGNAL + int(signum or signal.SIGTERM)
        elif line.startswith(LOST):
            self.ended = True


def say_lost(watch: Watch, rank: int) -> None:
    """One line on stderr when this rank asks for a stop because its lifeline is gone."""
    print(
        f"fleet train: rank {rank}: note: {watch.why()}: stopping at this update, with a "
        "checkpoint",
        file=sys.stderr,
        flush=True,
    )
