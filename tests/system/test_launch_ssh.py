"""`fleet launch --hostfile` as on a fleet of Macs: mlx.launch starts each rank over the system's
ssh (a real sshd on a loopback address, two host aliases for it), the ranks meet over the ring
backend, and the split still never changes the math. A host that ssh refuses is named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry.arrowlog import read_events
from tests.support.fleet import ROOT, fleet_env, free_port
from tests.support.ranks import TINY, assert_same_weights, single, weights
from tests.support.sshd import sshd_missing
from trainer.checkpoint import catalog

MISSING = sshd_missing() or ("" if shutil.which("ssh") else "no ssh client (openssh-client)")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING) and not os.environ.get("CI"), reason=MISSING),
]


@pytest.fixture
def ssh_path(tmp_path, sshd) -> str:
    """A PATH whose `ssh` reads this test's config (OpenSSH takes ~ from the password
    database, not $HOME, so the user's own ~/.ssh is neither read nor written). The config
    reaches the test sshd as `mac-a` and `mac-b` (known host key; BatchMode: never a prompt)
    and as `stranger`, whose key is not known."""
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    common = (
        f"  HostName {sshd.address}\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        "  StrictHostKeyChecking yes\n"
    )
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host mac-a mac-b\n{common}  UserKnownHostsFile {sshd.known_hosts}\n"
        f"Host stranger\n{common}  UserKnownHostsFile {empty}\n"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {config} "$@"\n')
    wrapper.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def launch(
    ssh_path: str, hosts: list[str], data: Path, run: Path, split: str, *opts: str
) -> subprocess.CompletedProcess:
    hostfile = run.parent / f"{run.name}-hosts.json"
    hostfile.write_text(json.dumps([{"ssh": h, "ips": ["127.0.0.1"]} for h in hosts]))
    cmd = [
        *(sys.executable, "-m", "fleet.cli", "launch", "--hostfile", str(hostfile)),
        *("--backend", "ring", "--starting-port", str(free_port(len(hosts) + 1))),
        *("--stop-grace", "5", *opts, "--"),
        *("train", "--data", str(data), "--run-dir", str(run), "--local-batches", split),
        *(*TINY, "--updates", "2", "--checkpoint-every", "1"),
    ]
    env = {**fleet_env(), "PATH": ssh_path}
    env.pop("SSH_AUTH_SOCK", None)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_ranks_started_over_ssh_train_the_same_model(tmp_path, ssh_path, tiny_data):
    single(
        tiny_data,
        tmp_path / "whole",
        "--local-batch",
        "3",
        "--updates",
        "2",
        "--checkpoint-every",
        "1",
    )
    run = tmp_path / "two-hosts"
    out = launch(ssh_path, ["mac-a", "mac-b"], tiny_data, run, "2,1")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "fleet:" not in out.stdout + out.stderr  # the lifeline is never echoed back
    assert "/tmp/" not in out.stdout.split("run ", 1)[0]  # nor mlx.launch's pid file lines
    for step in (1, 2):
        assert_same_weights(weights(tmp_path / "whole", step), weights(run, step))


def test_a_host_ssh_refuses_is_named(tmp_path, ssh_path, tiny_data):
    # --no-check: what mlx.launch itself meets when ssh refuses (the check would stop first)
    run = tmp_path / "refused"
    out = launch(ssh_path, ["mac-a", "stranger"], tiny_data, run, "2,1", "--no-check")
    assert out.returncode == 1
    assert "rank 1 failed first (exited with code 255: ssh could not start it on stranger" in (
        out.stderr
    )
    assert "try `ssh stranger true`" in out.stderr
    assert "Traceback" not in out.stderr  # mlx.launch's own clean-up trace is left out


def test_a_host_lost_for_the_relaunch_is_left_out_with_the_same_global_batch(
    tmp_path, sshd, tiny_data
):
    """--restarts 1 --allow-shrink: rank 2 dies and its host cannot be reached for the
    relaunch; the run goes on over two hosts with the same global batch and ends with the
    weights of a run that never failed."""
    from tests.support.ranks import rank_pid, wait_for_checkpoint

    reach = (
        f"  HostName {sshd.address}\n  User {sshd.user}\n  IdentityFile {sshd.client_key}\n"
        f"  IdentitiesOnly yes\n  BatchMode yes\n  StrictHostKeyChecking yes\n"
        f"  UserKnownHostsFile {sshd.known_hosts}\n  ConnectTimeout 3\n"
    )
    config = tmp_path / "ssh_config"
    config.write_text(f"Host mac-a mac-b mac-c\n  Port {sshd.port}\n{reach}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {config} "$@"\n')
    (bin_dir / "ssh").chmod(0o755)
    both = ("--updates", "8", "--checkpoint-every", "2")
    single(tiny_data, tmp_path / "whole", "--local-batch", "6", *both)

    run = tmp_path / "shrunk"
    hostfile = tmp_path / "hosts.json"
    hosts = ["mac-a", "mac-b", "mac-c"]
    hostfile.write_text(json.dumps([{"ssh": h, "ips": ["127.0.0.1"]} for h in hosts]))
    env = {**fleet_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SSH_AUTH_SOCK", None)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "fleet.cli", "launch", "--hostfile", str(hostfile)),
            *("--backend", "ring", "--starting-port", str(free_port(4)), "--stop-grace", "10"),
            *("--restarts", "1", "--allow-shrink", "--restart-backoff", "1", "--"),
            *("train", "--data", str(tiny_data), "--run-dir", str(run)),
            *("--local-batches", "2,2,2", *TINY, *both),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        victim = rank_pid(run, 2)
        wait_for_checkpoint(run, 2, proc)
        # mac-c is gone for the relaunch: its port now leads nowhere
        nowhere = free_port()
        config.write_text(
            f"Host mac-a mac-b\n  Port {sshd.port}\n{reach}Host mac-c\n  Port {nowhere}\n{reach}"
        )
        os.kill(victim, 9)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "mac-c cannot be reached: going on with 2 rank(s)" in err
    path, _, _ = catalog.resolve(run, "latest")
    state = catalog.read_json(path, catalog.STATE)
    assert state["step"] == 8 and sum(state["split"]) == 6 and len(state["split"]) == 2
    assert_same_weights(weights(tmp_path / "whole", 8), weights(run, 8))


def test_the_fleet_check_stops_a_launch_before_any_rank_starts(tmp_path, ssh_path, tiny_data):
    out = launch(ssh_path, ["mac-a", "stranger"], tiny_data, tmp_path / "checked", "2,1")
    assert out.returncode == 2
    assert "stranger: ssh refused" in out.stderr and "try `ssh stranger true`" in out.stderr
    assert "the fleet check failed (--no-check to start anyway)" in out.stderr
    assert not (tmp_path / "checked").exists()  # nothing started, nothing written


def check(ssh_path: str, hostfile: Path, hosts: list[str], *args: str):
    """`fleet check --hostfile` over the test sshd's aliases."""
    hostfile.write_text(json.dumps([{"ssh": h, "ips": ["127.0.0.1"]} for h in hosts]))
    cmd = [
        *(sys.executable, "-m", "fleet.cli", "check", "--hostfile", str(hostfile)),
        *("--backend", "ring", "--starting-port", str(free_port(len(hosts) + 1)), *args),
    ]
    env = {**fleet_env(), "PATH": ssh_path}
    env.pop("SSH_AUTH_SOCK", None)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_fleet_check_passes_a_healthy_fleet_and_times_its_links(tmp_path, ssh_path, tiny_data):
    train = ("--", "train", "--data", str(tiny_data), "--run-dir", str(tmp_path / "r"), *TINY)
    out = check(ssh_path, tmp_path / "h.json", ["mac-a", "mac-b"], *train)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "no problems found" in out.stdout
    assert "GB/s" in out.stdout and "ring" in out.stdout  # the group formed and was timed


def test_fleet_check_names_a_refused_host_and_other_versions(tmp_path, ssh_path, tiny_data):
    hostfile = tmp_path / "h.json"
    out = check(ssh_path, hostfile, ["mac-a", "stranger"], "--", "train", "--data", str(tiny_data))
    assert out.returncode == 1
    assert "problem: stranger: ssh refused" in out.stdout
    assert "problem: mac-a" not in out.stdout
    # another interpreter there: its versions differ from this machine's
    system = "/usr/bin/python3"
    if Path(system).exists() and os.path.realpath(system) != os.path.realpath(sys.executable):
        out = check(ssh_path, hostfile, ["mac-a"], "--python", system)
        assert out.returncode == 1
        assert "problem: mac-a: mlx not installed, this machine has" in out.stdout


def spawn_over_ssh(
    ssh_path,
    hosts,
    data,
    run,
    *opts,
    train: tuple[str, ...] = ("--checkpoint-every", "1", "--log-every", "1000"),
) -> subprocess.Popen:
    """`fleet launch --hostfile` of a run of 100,000 updates with launch options `opts` and
    `train`'s options, its output piped (stdout, stderr) and read by nobody yet."""
    hostfile = run.parent / f"{run.name}-hosts.json"
    hostfile.write_text(json.dumps([{"ssh": h, "ips": ["127.0.0.1"]} for h in hosts]))
    cmd = [
        *(sys.executable, "-m", "fleet.cli", "launch", "--hostfile", str(hostfile), "--no-check"),
        *("--backend", "ring", "--starting-port", str(free_port(len(hosts) + 1)), *opts, "--"),
        *("train", "--data", str(data), "--run-dir", str(run), "--local-batches", "2,2"),
        *(*TINY, "--updates", "100000", *train),
    ]
    env = {**fleet_env(), "PATH": ssh_path}
    env.pop("SSH_AUTH_SOCK", None)
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )


def test_ranks_over_ssh_stop_with_a_checkpoint_when_fleet_launch_is_killed(
    tmp_path, ssh_path, tiny_data
):
    from tests.support.ranks import last_update, wait_for_checkpoint, wait_until_gone

    run = tmp_path / "orphaned"
    proc = spawn_over_ssh(ssh_path, ["mac-a", "mac-b"], tiny_data, run, "--stop-grace", "60")
    try:
        wait_for_checkpoint(run, 2, proc)
        proc.kill()  # the lifeline reaches the ranks through mlx.launch and their ssh sessions
        proc.wait()
        left = wait_until_gone(run, timeout=60)
    finally:
        proc.kill()
        wait_until_gone(run, timeout=0)
    assert left == []
    path, _, _ = catalog.resolve(run, "latest")
    assert catalog.read_json(path, catalog.STATE)["step"] == last_update(run)


def test_a_rank_whose_ssh_connection_goes_silent_stops_with_a_checkpoint(
    tmp_path, ssh_path, tiny_data
):
    import psutil

    from tests.support.ranks import rank_pid, wait_for_checkpoint, wait_until_gone

    run = tmp_path / "silent"
    proc = spawn_over_ssh(ssh_path, ["mac-a", "mac-b"], tiny_data, run, "--lifeline-timeout", "3")
    client = None
    try:
        ranks = [psutil.Process(rank_pid(run, r)) for r in (0, 1)]
        wait_for_checkpoint(run, 2, proc)
        # rank 1's ssh client stops: its connection stays open but carries nothing (a cable
        # pulled, a Mac asleep), so no hangup ever comes; only the lifeline's silence tells
        kids = psutil.Process(proc.pid).children(recursive=True)
        client = next(p for p in kids if p.name() == "ssh" and "mac-b" in p.cmdline())
        client.suspend()
        # both ranks stop at the next boundary (the stop rides along); rank 0 is waited for as
        # well, since it logs its stop after rank 1 may have gone
        _, alive = psutil.wait_procs(ranks, timeout=60)
        assert not alive, f"ranks still running 60 s after the lifeline went silent: {alive}"
        latest, _, _ = catalog.resolve(run, "latest")
        step = catalog.read_json(latest, catalog.STATE)["step"]
    finally:
        if client is not None:
            client.resume()
        proc.kill()
        wait_until_gone(run, timeout=0)
    events = [e for e in read_events(run, 0) if e.kind == "stopped"]
    assert events and "a lost lifeline to fleet launch (rank 1)" in events[-1].message
    assert step == events[-1].step


def test_output_that_nobody_reads_does_not_stop_a_run_over_ssh(tmp_path, ssh_path, tiny_data):
    """As on one machine (tests/system/test_lifeline.py), over ssh: mlx.launch copies the
    ranks' output from their ssh sessions in the same loop that writes the lifeline into
    them, so a stdout that nobody reads must stop neither."""
    from tests.support.ranks import (
        LIFELINE_S,
        hold_output,
        newest_step,
        nothing_left,
        run_processes,
        sigterm,
        stop_cause,
    )

    run = tmp_path / "unread"
    opts = ("--lifeline-timeout", str(LIFELINE_S))
    proc = spawn_over_ssh(ssh_path, ["mac-a", "mac-b"], tiny_data, run, *opts, train=())
    with nothing_left(proc, run):
        hold_output(proc, 2 * LIFELINE_S)  # two lifeline timeouts with nothing read
        assert newest_step(run) == 0 and len(run_processes(run)) >= 2  # no rank has stopped
        out, _ = sigterm(proc)
    assert stop_cause(out, 100000) == "SIGTERM to fleet launch"


def test_relative_paths_are_checked_where_the_ranks_will_read_them(tmp_path, ssh_path, tiny_data):
    # the ranks start in the launch's working directory (mlx.launch's script cds there), so
    # `fleet check` must look there too, not in the ssh login's home (it refused this run)
    shutil.copytree(tiny_data, tmp_path / "data")
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([{"ssh": h, "ips": ["127.0.0.1"]} for h in ("mac-a", "mac-b")]))
    cmd = [
        *(sys.executable, "-m", "fleet.cli", "launch", "--hostfile", str(hostfile)),
        *("--backend", "ring", "--starting-port", str(free_port(3)), "--"),
        *("train", "--data", "data", "--run-dir", "run", "--local-batches", "2,1"),
        *(*TINY, "--updates", "1"),
    ]
    env = {**fleet_env(), "PATH": ssh_path}
    env.pop("SSH_AUTH_SOCK", None)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "dataset missing" not in out.stdout + out.stderr
    assert catalog.resolve(tmp_path / "run", "latest")[0].name == "step-000001"
