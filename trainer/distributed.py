"""MLX's distributed group as the loop sees it: bucketed sums, the barrier, command broadcast."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import reduce

import mlx.core as mx
from mlx.utils import tree_flatten

from telemetry.records import COMMANDS
from telemetry.units import GiB, MiB

# Gradients are all-reduced in buckets of this size, each evaluated on its own so that only one
# bucket's flat copy exists at a time: 32 MiB as nn.average_gradients for ring/JACCL/MPI (a
# Mac's memory is the run's limit), 1 GiB for NCCL. On two H200s over NVLink 541 MB of FP32
# gradients took 4.6 ms in 32 MiB buckets and 1.9 ms in one (benchmarks/allreduce.py).
BUCKET_BYTES = 32 * MiB
BUCKET_BYTES_BY_BACKEND = {"nccl": GiB}

# Commands travel between ranks as small integer vectors: [code, payload...]. Besides the
# operator's commands, "none" (most boundaries) and "keepalive" (while paused).
CODES = {"none": 0, **COMMANDS, "keepalive": max(COMMANDS.values()) + 1}
NAMES = {v: k for k, v in CODES.items()}


class PeerLost(RuntimeError):
    """A collective failed because another rank went away."""


class WrongGroup(RuntimeError):
    """The backend formed a group of another size than the launcher announced."""


def backend_from_env(env: Mapping[str, str] | None = None) -> str:
    """The backend mlx.launch started this rank for, read from the variables it sets.

    `init("any")` guesses, and on CUDA it tries NCCL first, so a ring rank on a CUDA host, or
    an NCCL rank where MPI is also installed, could join the wrong (or a one-rank) group.
    """
    env = os.environ if env is None else env
    if one_rank_launch(env):
        return "any"  # a group of one: nothing to join
    if env.get("FLEET_BACKEND"):
        return env["FLEET_BACKEND"]
    if "MLX_IBV_DEVICES" in env or "MLX_JACCL_COORDINATOR" in env:
        return "jaccl"
    if "NCCL_HOST_IP" in env and "MLX_WORLD_SIZE" in env:
        return "nccl"
    if "MLX_HOSTFILE" in env:
        return "ring"
    if any(k in env for k in MPI_SIZE_VARS):  # started by mpirun (Open MPI, MPICH)
        return "mpi"
    return "any"


MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def one_rank_launch(env: Mapping[str, str]) -> bool:
    """Whether mlx.launch started this rank alone (`-n 1`): it then names a hostfile that holds
    nothing, which the ring backend would fail to parse."""
    path = env.get("MLX_HOSTFILE")
    if not path or env.get("MLX_WORLD_SIZE", "1") != "1":
        return False
    try:
        return not open(path).read(64).strip()
    except OSError:
        return False


def expected_world(env: Mapping[str, str] | None = None) -> int | None:
    """The world size the launcher announced (mlx.launch, or mpirun), where it announces one."""
    env = os.environ if env is None else env
    for name in ("MLX_WORLD_SIZE", *MPI_SIZE_VARS):
        try:
            return int(env[name])
        except (KeyError, ValueError):
            continue
    return None


class Cluster:
    """The ranks of this run; every method is a no-op collective on a single rank."""

    def __init__(self, group: mx.distributed.Group | None = None) -> None:
        if group is None:
            self.backend = backend_from_env()
            if one_rank_launch(os.environ):
                os.environ.pop("MLX_HOSTFILE")  # so that no backend tries to read it
            group = mx.distributed.init(backend=self.backend)
            expected = expected_world()
            if expected is not None and group.size() != expected:
                hint = (
                    "MLX did not load libmpi: set MLX_MPI_LIBNAME, e.g. libmpi.so.40"
                    if self.backend == "mpi"
                    else "is this MLX built with that backend?"
                )
                raise WrongGroup(
                    f"launched as one of {expected} ranks, but the {self.backend} backend "
                    f"formed a group of {group.size()} ({hint})"
                )
        else:
            self.backend = "given"
        self.group = group
        self.rank, self.size = self.group.rank(), self.group.size()
        self.bucket_bytes = BUCKET_BYTES_BY_BACKEND.get(self.backend, BUCKET_BYTES)

    @classmethod
    def solo(cls) -> Cluster:
        """A cluster of this rank alone (every collective a no-op): the replicas of a run that
        is one tensor-parallel group."""
        c = cls.__new__(cls)
        c.backend, c.group, c.rank, c.size, c.bucket_bytes = "solo", None, 0, 1, BUCKET_BYTES
        return c

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def finish(self, code: int) -> int:
        """End this rank's part in the group; returns `code` unless it exits the process.

        MLX 0.32 finalizes MPI from a C++ static destructor that can run after the MPI
        wrapper it calls is gone, so mpirun at times reports a rank that "exited without
        calling finalize" after a run that succeeded. After a clean run, an MPI rank
        finalizes here itself and leaves without running those destructors.
        """
        if self.backend != "mpi" or self.size == 1 or code != 0:
            return code
        import ctypes

        try:  # MLX dlopened libmpi with RTLD_GLOBAL: its symbols are visible process-wide
            finalize = ctypes.CDLL(None).MPI_Finalize
        except (OSError, AttributeError):
            return code
        sys.stdout.flush()
        sys.stderr.flush()
        finalize()
        os._exit(code)

    def _sum(self, x: mx.array) -> mx.array:
        try:
            out = mx.distributed.all_sum(x, group=self.group)
            mx.eval(out)
        except RuntimeError as e:
            raise PeerLost(str(e)) from e
        return out

    def sum_gradients(
        self, grads: dict, scalars: mx.array, bucket_bytes: int = 0
    ) -> tuple[dict, mx.array]:
        """Sum FP32 gradient trees and a vector of scalars (loss sum, token count) over ranks.

        Unlike nn.average_gradients this sums (the optimizer divides by the global token
        count) and carries the scalars in the last bucket, so an update costs one round of
        all-reduces whatever the split. The sums replace the gradients in `grads` itself, a
        bucket at a time, so each bucket's own gradients go as its sums arrive: the update's
        live set never holds the gradients twice (4 bytes a parameter less).
        """
        if self.size == 1:
            return grads, scalars
        bucket_bytes = bucket_bytes or self.bucket_bytes
        flat = tree_flatten(grads)
        buckets, current, size = [], [], 0
        for i, (_, g) in enumerate(flat):
            current.append(i)
            size += g.nbytes
            if size >= bucket_bytes:
                buckets.append(current)
                current, size = [], 0
        buckets.append(current)  # the last bucket (possibly empty) also carries the scalars
        for n, bucket in enumerate(buckets):
            parts = [flat[i][1].reshape(-1) for i in bucket]
            if n == len(buckets) - 1:
                parts.append(scalars.astype(mx.float32).reshape(-1))
            summed = self._sum(mx.concatenate(parts))
            del parts
            sizes = [flat[i][1].size for i in bucket]
            offsets = reduce(lambda acc, s: acc + [acc[-1] + s], sizes, [0])
            pieces = mx.split(summed, offsets[1:]) if sizes else [summed]
            for j, i in enumerate(bucket):
                name, old = flat[i]
                flat[i] = (name, pieces[j].reshape(old.shape))
                _put(grads, name, flat[i][1])
            if n == len(buckets) - 1:
                scalars = pieces[-1]
        return grads, scalars

    def barrier(self) -> float:
        """A tiny all-reduce; the seconds it took are time spent waiting for the slowest rank."""
        t0 = time.perf_counter()
        if self.size > 1:
            self._sum(mx.zeros((1,), dtype=mx.float32))
        return time.perf_counter() - t0

    def all_sum_floats(self, values: list[float]) -> list[float]:
        if self.size == 1:
            return list(values)
        return self._sum(mx.array(values, dtype=mx.float32)).tolist()

    def broadcast_command(
        self, cmd: str, payload: list[int], figures: Sequence[float] = ()
    ) -> tuple[str, list[int], list[list[float]]]:
        """Rank 0's command reaches every rank at the same boundary (others pass "none"), and
        every rank's `figures` (the same count on every rank) reach every rank.

        The vector is [code, len, payload..., figures of each rank] at a fixed width, summed
        with zeros from every other rank: one tiny all-reduce, the same call on every rank.
        FP32 holds whole numbers exactly up to 2**24: send figures in units that fit.
        """
        k, head = len(figures), 3 + self.size  # code, length, up to one value per rank
        vec = [0.0] * (head + k * self.size)
        if self.is_root:
            vec[0], vec[1] = CODES[cmd], len(payload)
            vec[2 : 2 + len(payload)] = payload
        vec[head + k * self.rank : head + k * (self.rank + 1)] = figures
        if self.size > 1:
            vec = self._sum(mx.array(vec, dtype=mx.float32)).tolist()
        code, n = int(round(vec[0])), int(round(vec[1]))
        payload = [int(round(v)) for v in vec[2 : 2 + n]]
        every = [vec[head + k * r : head + k * (r + 1)] for r in range(self.size)]
        return NAMES.get(code, "none"), payload, every

    def gather_bytes(self, blob: bytes) -> list[bytes]:
        """Every rank's `blob` (all the same length), in rank order."""
        if self.size == 1:
            return [blob]
        mine = mx.array(list(blob), dtype=mx.uint8)
        try:
            everyone = mx.distributed.all_gather(mine, group=self.group)
            mx.eval(everyone)
        except RuntimeError as e:
            raise PeerLost(str(e)) from e
        rows = everyone.reshape(self.size, len(blob)).tolist()
        return [bytes(r) for r in rows]


def _put(tree, path: str, value) -> None:
    """tree[a][b]...[z] = value for the path "a.b...z" of tree_flatten (list indices as digits)."""
    keys = path.split(".")
    for k in keys[:-1]:
        tree = tree[int(k)] if isinstance(tree, list) else tree[k]
    last = keys[-1]
    if isinstance(tree, list):
        tree[int(last)] = value
    else:
        tree[last] = value


MIN_BEAT_S = 0.05


class Watchdog:
    """Ends the process when the loop makes no progress for `timeout` seconds, and beats.

    A stopped peer (SIGSTOP, a machine deep in swap) leaves the others blocked inside an
    all-reduce forever; this thread is what turns that into an exit with a diagnosis. About
    once a second it also calls `beat(stage, since)` (trainer/heartbeat.py writes it down), so
    that peers and the launcher can tell which rank stopped; `diagnose()` names that rank
    when the watchdog fires.
    """

    def __init__(
        self,
        timeout: float,
        rank: int,
        on_expire: Callable[[str], None] | None = None,
        beat: Callable[[str, float], None] | None = None,
        diagnose: Callable[[], str] | None = None,
        world: int = 0,
    ) -> None:
        self.timeout, self.rank, self.world = timeout, rank, world
        self.stage, self.since, self.since_wall = "starting", time.monotonic(), time.time()
        self._stop = threading.Event()
        self._nudge = threading.Event()  # an update finished: beat at once (the restart says
        # which update a rank died after, and reads it from the beats)
        self._on_expire, self._beat, self._diagnose = on_expire, beat, diagnose
        self._thread = threading.Thread(target=self._run, name="fleet-watchdog", daemon=True)

    def start(self) -> Watchdog:
        if self.timeout > 0 or self._beat is not None:
            self._thread.start()
        return self

    def progress(self, stage: str) -> None:
        """Mark that the loop is alive and entering `stage`."""
        self.stage, self.since, self.since_wall = stage, time.monotonic(), time.time()
        if stage == "report":  # an update is done: its beat goes now, not up to 1 s later
            self._nudge.set()

    def stop(self) -> None:
        self._stop.set()
        self._nudge.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _suspect(self) -> str:
        if self.world == 1:  # no peer to wait for: this process itself is stuck
            return "this rank itself is stuck (a blocked file, a hung disk or device?)"
        return "a peer rank has probably stalled or died"

    def _run(self) -> None:
        period = min(1.0, self.timeout / 4) if self.timeout > 0 else 1.0
        while True:
            self._nudge.wait(period)
            if self._stop.is_set():
                return
            self._nudge.clear()
            if self._beat is not None:
                with contextlib.suppress(Exception):  # a full disk must not end the run here
                    self._beat(self.stage, self.since_wall)
            idle = time.monotonic() - self.since
            if self.timeout > 0 and idle > self.timeout:
                who = ""
                if self._diagnose is not None:
                    with contextlib.suppress(Exception):
                        who = self._diagnose()
                msg = (
                    f"fleet train: rank {self.rank}: no progress for {idle:.0f}s in stage "
                    f"'{self.stage}' (--collective-timeout {self.timeout:g}); "
                    + (f"{who}. " if who else f"{self._suspect()}. ")
                    + "Exiting."
                )
                print(msg, file=sys.stderr, flush=True)
                if self._on_expire is not None:
                    with contextlib.suppress(Exception):  # tell telemetry if it still can
                        self._on_expire(msg)
                os._exit(3)
            if self._stop.wait(MIN_BEAT_S):  # at most 20 beats a second, however fast it steps
                return
