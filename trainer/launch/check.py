"""`fleet check`: what a fleet must agree on before the first update, and each problem by name.

    fleet check --hostfile hosts.json -- train --data D --local-batches 6,4,2 ...
    fleet check -n 3 -- train --data D ...

Per host, over ssh with verified host keys (BatchMode: never a prompt): the Python, mlx and
mlx-fleet versions against this machine's, the dataset's digest, free disk for a few
checkpoints and free memory against the run's expected peak. Then the group itself: the ranks
start under mlx.launch with the requested backend and must form a group of exactly the
hostfile's size within a timeout (a JACCL hostfile in the wrong rank order forms N groups of
one), and each ring link is timed with a short transfer, flagging one far below the others
(Wi-Fi addresses in a Thunderbolt hostfile).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from telemetry.units import gib_text

PROBE_MARK = "FLEET-CHECK "
SLOW_LINK = 1 / 3  # a link below this fraction of the median bandwidth is flagged
KEEP_CHECKPOINTS = 3  # free disk must hold this many checkpoints (and one being written)

# Runs on every host (ssh host PYTHON - DATA RUN), on the standard library and psutil only.
FACTS = r"""
import importlib.metadata as md, json, os, shutil, socket, sys
out = {"host": socket.gethostname(), "python": sys.version.split()[0]}
for dist in ("mlx", "mlx-fleet"):
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        out[dist] = None
data, run, cwd = sys.argv[1], sys.argv[2], sys.argv[3]
if os.path.isdir(cwd):  # where mlx.launch starts the ranks: relative paths resolve as theirs
    os.chdir(cwd)
if data:
    try:
        with open(os.path.join(data, "dataset.json")) as f:
            out["dataset"] = json.load(f).get("digest")
    except (OSError, ValueError) as e:
        out["dataset_error"] = f"{type(e).__name__}: {e}"
where = os.path.abspath(run)
while not os.path.isdir(where):
    where = os.path.dirname(where)
out["disk_free"] = shutil.disk_usage(where).free
try:  # what of a run the run folder holds (a new run refuses it)
    from telemetry.rundir import held
    out["run_held"] = held(run)
except ImportError:  # an mlx-fleet there from before rundir.held: its config.json tells
    out["run_held"] = ["config.json"] if os.path.isfile(os.path.join(run, "config.json")) else []
try:
    import psutil
    out["mem_available"] = psutil.virtual_memory().available
except ImportError:
    out["mem_available"] = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
print(json.dumps(out))
"""


@dataclass
class HostReport:
    """What one host said, and what is wrong with it."""

    name: str
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def host_facts(host: str | None, python: str, data: str, run_dir: str) -> dict[str, Any]:
    """FACTS from `host` over ssh (None: this machine); raises RuntimeError saying why not.

    Relative paths are resolved in this machine's working directory where the host has it,
    else in the login's home: where mlx.launch's script starts the ranks (`cd` when it can).
    """
    argv = [python, "-", data, run_dir, os.getcwd()]
    if host is not None:  # one quoted string: the remote shell would drop an empty argument
        remote = shlex.join(argv)
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host, remote]
    try:
        out = subprocess.run(argv, input=FACTS, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"could not run {argv[0]}: {e}") from None
    if out.returncode == 255 and host is not None:
        detail = out.stderr.strip().splitlines()[-1:] or ["no answer"]
        raise RuntimeError(
            f"ssh refused: {detail[0]} (unreachable, login refused or host key unknown; "
            f"try `ssh {host} true`)"
        )
    if out.returncode != 0:
        last = out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]
        raise RuntimeError(f"{python} failed there: {last[0]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def expected_bytes(cfg: Any, local_batch: int) -> tuple[int, int]:
    """(checkpoint bytes, peak bytes of one rank): estimates from the model's shapes.

    A checkpoint holds the weights and AdamW's two moments. The peak adds the FP32
    accumulators and gradients, and activations of about 34 x width bytes per token and
    layer (attention and MLP inputs kept for the backward pass) plus the FP32 logits.
    """
    from trainer.model.config import ModelConfig, padded_vocab

    seq = cfg.seq_len or 256
    mcfg = ModelConfig.from_sizes(
        depth=cfg.depth,
        width=cfg.width,
        heads=cfg.heads,
        vocab=cfg.vocab or padded_vocab(512 if cfg.synthetic else 256),
        seq_len=seq,
    )
    n = mcfg.num_params()
    weight = 2 if cfg.precision == "bf16" else 4
    ckpt = n * (weight + 2 * weight)
    tokens = local_batch * seq
    activations = tokens * (34 * mcfg.width * mcfg.depth + 8 * mcfg.vocab)
    return ckpt, ckpt + 8 * n + activations


def compare(
    reports: list[HostReport], here: dict[str, Any], need_disk: int, need_mem: list[int]
) -> list[str]:
    """Fill each report's problems: versions against this machine's, the dataset against
    the fleet's (dataset_reference), disk and memory against what the run needs; returns
    the problems of no one host (this machine's own dataset, a fleet with no majority)."""
    usual, general = dataset_reference(reports, here)
    for i, r in enumerate(reports):
        f = r.facts
        if not f:
            continue
        for key, label in (("python", "Python"), ("mlx", "mlx"), ("mlx-fleet", "mlx-fleet")):
            if f.get(key) != here.get(key):
                have = f.get(key) or "not installed"
                r.problems.append(f"{label} {have}, this machine has {here.get(key)}")
        if f.get("dataset_error"):
            r.problems.append(f"dataset missing or unreadable ({f['dataset_error']})")
        elif f.get("dataset") and usual and f["dataset"] != usual[0]:
            r.problems.append(
                f"dataset digest {str(f['dataset'])[:12]} differs from {usual[1]} "
                f"{str(usual[0])[:12]}"
            )
        if need_disk and f.get("disk_free", 0) < need_disk:
            r.problems.append(
                f"{gib_text(f['disk_free'])} free for checkpoints, needs about "
                f"{gib_text(need_disk)}"
            )
        if need_mem and f.get("mem_available", 0) < need_mem[i]:
            r.problems.append(
                f"{gib_text(f['mem_available'])} of memory free, the run expects a peak of about "
                f"{gib_text(need_mem[i])}"
            )

    return general


def dataset_reference(
    reports: list[HostReport], here: dict[str, Any]
) -> tuple[tuple[str, str] | None, list[str]]:
    """The dataset digest the fleet should have, and whose it is ("the majority's", "this
    machine's"), by majority over the hosts and this machine; a tie goes to this machine's
    digest when it is one of the tied, else nobody is blamed and the split is one problem.
    Also the problems of no one host."""
    digests = [(r.name, r.facts["dataset"]) for r in reports if r.facts.get("dataset")]
    mine = here.get("dataset")
    votes = Counter(d for _, d in digests)
    if mine:
        votes[mine] += 1
    if not votes:
        return None, []
    ranked = votes.most_common()
    top = [d for d, n in ranked if n == ranked[0][1]]
    if len(top) > 1 and mine not in top:  # a tie, and this machine is no tie-breaker
        split = ", ".join(f"{name} {d[:12]}" for name, d in digests)
        return None, [f"the hosts' datasets differ and no digest has a majority: {split}"]
    usual = mine if len(top) > 1 else top[0]
    if mine == usual:
        return (usual, "this machine's"), []
    general = []
    if mine:
        general.append(
            f"this machine: dataset digest {mine[:12]} differs from the majority's "
            f"{usual[:12]} (the run's checkpoints would name this machine's)"
        )
    return (usual, "the majority's"), general


def probe(mlx_argv: list[str], env: dict[str, str], world: int, timeout: float) -> dict:
    """Start the ranks under mlx.launch with `fleet check _probe`; what they reported."""
    try:
        out = subprocess.run(
            mlx_argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as e:
        _end_group(e)
        return {
            "error": f"the group did not form within {timeout:g} s (a host unreachable, a "
            f"port blocked, or a peer that never started)"
        }
    rows = [
        json.loads(line.split(PROBE_MARK, 1)[1])
        for line in out.stdout.splitlines()
        if PROBE_MARK in line
    ]
    if len(rows) < world:
        tail = "\n".join(out.stderr.strip().splitlines()[-3:])
        return {"error": f"{len(rows)} of {world} ranks reported{': ' + tail if tail else ''}"}
    return {"ranks": sorted(rows, key=lambda r: r["rank"])}


def _end_group(e: subprocess.TimeoutExpired) -> None:
    """subprocess.run killed mlx.launch; its ranks, in the same session, go with it."""
    import contextlib
    import signal

    pid = getattr(getattr(e, "process", None), "pid", None)
    if pid:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def links_problems(ranks: list[dict], world: int) -> tuple[list[str], list[str]]:
    """(problems, warnings): a group of the wrong size fails the check; a link far below the
    others is flagged (one busy moment on a shared machine can look the same)."""
    problems, warnings = [], []
    sizes = {r["size"] for r in ranks}
    if sizes != {world}:
        problems.append(
            f"the ranks formed group(s) of size {sorted(sizes)}, not one group of {world} "
            "(for JACCL: is the hostfile in rank order?)"
        )
    speeds = [r["in_link_Bps"] for r in ranks if r.get("in_link_Bps")]
    if len(speeds) > 1:
        median = sorted(speeds)[len(speeds) // 2]
        for r in ranks:
            bw = r.get("in_link_Bps")
            if bw and bw < SLOW_LINK * median:
                prev = (r["rank"] - 1) % world
                warnings.append(
                    f"link rank {prev} -> rank {r['rank']} runs at {bw / 1e9:.2f} GB/s, under a "
                    f"third of the others' {median / 1e9:.2f} GB/s (Wi-Fi instead of Thunderbolt?)"
                )
    return problems, warnings


def render(
    reports: list[HostReport], group: dict, problems: list[str], warnings: list[str] = ()
) -> str:
    """The table `fleet check` prints, then every problem on its own line."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    t = Table(title="fleet check")
    for col in ("host", "python", "mlx", "mlx-fleet", "dataset", "disk free", "memory free"):
        t.add_column(col)
    for r in reports:
        f = r.facts
        t.add_row(
            r.name,
            str(f.get("python", "-")),
            str(f.get("mlx", "-")),
            str(f.get("mlx-fleet", "-")),
            str(f.get("dataset") or ("missing" if "dataset_error" in f else "-"))[:12],
            gib_text(f["disk_free"]) if "disk_free" in f else "-",
            gib_text(f["mem_available"]) if "mem_available" in f else "-",
        )
    g = Table(title="group")
    for col in ("rank", "host", "group size", "backend", "all-reduce latency", "link in"):
        g.add_column(col)
    for row in group.get("ranks", []):
        bw = row.get("in_link_Bps")
        g.add_row(
            str(row["rank"]),
            row["host"],
            str(row["size"]),
            row["backend"],
            f"{row['latency_s'] * 1e3:.2f} ms",
            f"{bw / 1e9:.2f} GB/s" if bw else (row.get("note") or "-"),
        )
    buf = StringIO()
    console = Console(file=buf, width=120)
    console.print(t)
    if group:
        console.print(g)
    lines = [buf.getvalue().rstrip()]
    lines += [f"warning: {w}" for w in warnings]
    lines += [f"problem: {p}" for p in problems] or ["no problems found"]
    return "\n".join(lines)


def local_facts(data: str, run_dir: str) -> dict[str, Any]:
    """FACTS of this machine, with this interpreter."""
    return host_facts(None, sys.executable, data, run_dir)


def add_arguments(parser: Any) -> None:
    """`fleet check`'s flags: where the ranks run, as `fleet launch` takes them."""
    import argparse

    parser.description = (
        "Check a fleet before the first update: ssh and host keys, the same Python, mlx and "
        "mlx-fleet everywhere, the dataset's digest, free disk and memory, then the group "
        "itself and the speed of each link. Exits 1 naming each problem."
    )
    from trainer.launch.plan import rank_arguments

    rank_arguments(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds the group may take to form (default: %(default)s)",
    )
    parser.add_argument(
        "--bytes",
        type=int,
        default=16 << 20,
        help="bytes sent over each link to time it (default: %(default)s)",
    )
    parser.add_argument("--probe-rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--verbose", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- train ARGS: the run to check the fleet for"
    )


def run_check(
    args: Any, plan: Any, timeout: float = 60.0, nbytes: int = 16 << 20
) -> tuple[bool, str]:
    """Every check for `plan` (trainer.launch.plan.Plan), started the way `args` (fleet launch's
    or fleet check's) starts ranks; (no problems, the report to print)."""
    from dataclasses import replace

    from trainer.blas import preload_env
    from trainer.launch.plan import mlx_launch_argv

    cfg = plan.cfg
    data = cfg.data if cfg is not None and not cfg.synthetic else ""
    run_dir = cfg.run_dir if cfg is not None else "."
    here = local_facts(data, run_dir)  # this machine's dataset too: the fleet's reference
    split = plan.split() if cfg is not None else [0] * plan.world
    if plan.hosts:
        names, rank_hosts = [h["ssh"] for h in plan.hosts], list(range(plan.world))
    else:
        names, rank_hosts = ["this machine"], [0] * plan.world
    need_disk, need_mem = 0, [0] * len(names)
    if cfg is not None:
        for r, b in enumerate(split):
            ckpt, peak = expected_bytes(cfg, b)
            need_disk = (KEEP_CHECKPOINTS + 1) * ckpt
            need_mem[rank_hosts[r]] += peak
    reports = []
    for name in names:
        report = HostReport(name)
        try:
            host = None if not plan.hosts else name
            report.facts = host_facts(host, args.python, data, run_dir)
        except RuntimeError as e:
            report.problems.append(str(e))
        reports.append(report)
    general = compare(reports, here, need_disk, need_mem)
    if cfg is not None and not cfg.resume and not cfg.overwrite:
        from telemetry.rundir import refusal

        for r in reports:
            if r.facts.get("run_held"):
                r.problems.append(refusal(run_dir, r.facts["run_held"]))
    problems = [f"{r.name}: {p}" for r in reports for p in r.problems] + general
    group: dict = {}
    warnings: list[str] = []
    if not problems:  # a group over hosts that fail the checks above would only time out
        probe_plan = replace(plan, command=["check", "--probe-rank", str(nbytes)])
        group = probe(mlx_launch_argv(args, probe_plan), preload_env(), plan.world, timeout)
        if "error" in group:
            problems.append(f"group: {group['error']}")
        else:
            wrong, slow = links_problems(group["ranks"], plan.world)
            problems += [f"group: {p}" for p in wrong]
            warnings += [f"group: {w}" for w in slow]
    return not problems, render(reports, group, problems, warnings)


def main(args: Any) -> int:
    """`fleet check`."""
    from trainer.launch.plan import LaunchError, plan_launch

    if not args.command:
        args.command = ["--", "check"]  # no run given: check the hosts and the group only
    args.restarts = 0
    try:
        plan = plan_launch(args)
    except LaunchError as e:
        print(f"fleet check: error: {e}", file=sys.stderr)
        return 2
    ok, text = run_check(args, plan, args.timeout, args.bytes)
    print(text)
    return 0 if ok else 1
