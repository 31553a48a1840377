"""Console pieces without a terminal: hostfile, fleet, bars, links, inbox, replay, demo commands."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from console import demo, fmt, render
from console.connectors import LinkRefused
from console.feed import Inbox
from console.fleet import Fleet
from console.hostfile import (
    HostfileError,
    load_hostfile,
    local_targets,
    parse_hostfile,
    rank_targets,
)
from console.links import RankLink
from console.model import LinkPhase, LinkStatus
from console.series import Series
from console.snapshot import header, proposal, snapshot, straggler
from telemetry.errors import ConnectionLost
from telemetry.records import Dropped, Event, Reply
from tests.console_fakes import T0, GiB, hello, straggler_fleet, update

ROOT = Path(__file__).resolve().parent.parent

# --- hostfile ----------------------------------------------------------------------------------


def test_hostfile_ranks_in_order_and_ports(tmp_path):
    path = tmp_path / "hosts.json"
    path.write_text(
        json.dumps([{"ssh": "studio", "ips": ["10.0.0.1"]}, {"ssh": "mini"}, {"ssh": "studio"}])
    )
    targets = rank_targets(load_hostfile(path), port_base=48000)
    assert [(t.rank, t.host, t.port) for t in targets] == [
        (0, "studio", 48000),
        (1, "mini", 48001),
        (2, "studio", 48002),
    ]
    assert targets[0].ips == ("10.0.0.1",)


@pytest.mark.parametrize(
    "data, match",
    [
        ({"ssh": "a"}, "expected a JSON list"),
        ([], "empty"),
        (["a"], "entry 0.*expected an object"),
        ([{"ssh": "a"}, {"ips": []}], "entry 1.*non-empty host name"),
        ([{"ssh": "a b"}], "not a valid host name"),
        ([{"ssh": "-oProxyCommand=x"}], "not a valid host name"),
        ([{"ssh": "a", "ips": "10.0.0.1"}], "list of address strings"),
    ],
)
def test_hostfile_errors_say_where(data, match):
    with pytest.raises(HostfileError, match=match):
        parse_hostfile(data)


def test_hostfile_file_errors(tmp_path):
    with pytest.raises(HostfileError, match="no such hostfile"):
        load_hostfile(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"ssh": "a"},\n  oops]')
    with pytest.raises(HostfileError, match="line 2 column 3"):
        load_hostfile(bad)
    with pytest.raises(HostfileError, match="outside 1..65535"):
        local_targets(4, port_base=65534)
    with pytest.raises(HostfileError, match="at least 1"):
        local_targets(0)


# --- formatting and bars -----------------------------------------------------------------------


def test_fmt_figures_are_short():
    assert fmt.nbytes(16 * GiB) == "16G"
    assert fmt.nbytes(1.5 * GiB) == "1.5G"
    assert fmt.secs(0.532) == "532ms"
    assert fmt.secs(12.34) == "12.3s"
    assert fmt.duration(3725) == "1h02m"
    assert fmt.duration(65) == "1m05s"
    assert fmt.count(12345) == "12.3k"
    assert fmt.count(None) == "—"


def test_time_bar_shares_cells_by_time_and_scale():
    u = update(0, 1, batch=2, per_sample=0.1, slowest=0.4)  # compute 0.2, wait 0.2, other 0.02
    bar = render.time_bar(u, 20).plain
    assert len(bar) == 20
    assert abs(bar.count(render.COMPUTE) - bar.count(render.WAIT)) <= 1  # equal times
    assert bar.count(render.OTHER) >= 1
    # On a shared scale twice this update's length, the bar uses about half the width.
    half = render.time_bar(u, 20, scale_s=2 * u.update_s).plain
    assert len(half) == 20 and len(half.rstrip()) == 10


def test_mem_bar_marks_active_peak_cache_against_total():
    u = update(0, 1, batch=2)  # active 1.5G, peak 2G, cache 0.5G of 16G
    bar = render.mem_bar(u, 16 * GiB, 32).plain
    assert bar.count(render.ACTIVE) == 3 and bar.count(render.PEAK) == 1
    assert bar.count(render.CACHE) == 1 and len(bar) == 32
    assert render.mem_bar(None, 16 * GiB, 5).plain == "·····"


def test_spark_scales_into_eight_levels():
    assert render.spark([0, 1, 2, 3, 4, 5, 6, 7], 8) == render.SPARKS
    assert render.spark([1, 1], 4) == "  ▁▁"


def test_braille_plot_draws_a_connected_line_and_marks():
    rows, xr, yr = render.braille_plot([(0, 4.0), (10, 2.0)], [(10, 2.0)], 10, 3)
    assert xr == (0, 10) and yr == (2.0, 4.0)
    text = [r.plain for r in rows]
    assert all(len(t) == 10 for t in text)
    assert "●" in text[-1]  # the eval mark at the bottom right
    # Connected: every column up to the mark has a dot somewhere.
    for c in range(9):
        assert any(t[c] != " " for t in text), c


def test_link_text_states():
    assert "idle" in render.link_text(LinkStatus(0, LinkPhase.STALE), 0, paused=True).plain
    assert "stale" in render.link_text(LinkStatus(0, LinkPhase.STALE), 0).plain
    lost = LinkStatus(0, LinkPhase.LOST, "eof", retry_at=103.0)
    assert render.link_text(lost, 100.0).plain == "○ lost 3s"
    refused = LinkStatus(0, LinkPhase.REFUSED, "…", kind="host key changed")
    assert render.link_text(refused, 0).plain == "✗ KEY CHANGED"


# --- fleet -------------------------------------------------------------------------------------


def fed_fleet(**kw) -> Fleet:
    fleet = Fleet(local_targets(4), clock=lambda: T0)
    for r in range(4):
        fleet.set_link(LinkStatus(r, LinkPhase.LIVE))
    for rank, msg in straggler_fleet(**kw):
        fleet.apply(rank, msg)
    return fleet


def test_state_header_figures_and_straggler():
    fleet = fed_fleet()
    h = header(fleet)
    assert h.step == 20 and h.live == 4 and h.world == 4
    assert h.straggler == 3
    assert h.global_batch == 8
    assert h.total_updates == 1000
    assert h.status == "running"
    u = fleet.ranks[0].last
    assert h.tokens_per_s == pytest.approx(u.update_tokens / u.update_s)
    assert h.eta_s == pytest.approx((1000 - 20) * u.update_s)


def test_state_no_straggler_when_balanced():
    fleet = fed_fleet(split=(2, 2, 2, 2), slow=(1, 1, 1, 1))
    assert straggler(fleet) is None


def test_state_skips_history_resent_after_reconnect():
    fleet = fed_fleet()
    n = len(fleet.ranks[0].updates)
    loss_n = len(fleet.loss)
    fleet.apply(0, hello(0))
    for step in range(15, 21):  # the hub's backlog again
        fleet.apply(0, update(0, step))
    assert len(fleet.ranks[0].updates) == n
    assert len(fleet.loss) == loss_n
    ev = Event("checkpoint", 0, 10, data={"path": "p", "verified": True}, time=T0 + 5)
    fleet.apply(0, ev)
    fleet.apply(0, ev)
    assert sum("checkpoint p" in ln.text for ln in fleet.log_lines) == 1


def test_state_new_run_on_rank0_resets():
    fleet = fed_fleet()
    fleet.apply(0, hello(0, run_id="other"))
    assert fleet.run_id == "other"
    assert len(fleet.ranks[0].updates) == 0
    assert any("now serves run other" in ln.text for ln in fleet.log_lines)


def test_state_events_drive_pause_and_log():
    fleet = fed_fleet()
    fleet.apply(0, Event("paused", 0, 21, time=T0 + 1))
    assert header(fleet).status == "paused"
    fleet.apply(0, Event("resumed", 0, 21, time=T0 + 2))
    assert header(fleet).status == "running"
    fleet.apply(0, Event("eval", 0, 20, data={"val_loss": 3.5}, time=T0 + 3))
    assert header(fleet).val_loss == 3.5
    fleet.apply(0, Event("stopped", 0, 22, data={"checkpoint": "ck"}, time=T0 + 4))
    assert header(fleet).status == "stopped"
    fleet.apply(2, Dropped(5, 7))
    assert fleet.ranks[2].dropped == 7


def test_state_replies_name_the_command_and_outcome():
    fleet = fed_fleet()
    fleet.command_sent(3, "rebalance", {"split": [3, 2, 2, 1]})
    fleet.apply(0, Reply(3, True, result={"step": 42}))
    assert "rebalance to 3,2,2,1: applied at update 42" in fleet.log_lines[-1].text
    fleet.command_sent(4, "pause", {})
    fleet.apply(0, Reply(4, False, error="bad mac"))
    assert fleet.log_lines[-1].text.endswith("pause: refused: bad mac")
    assert fleet.log_lines[-1].level == "error"
    assert not fleet.pending


def test_state_link_changes_are_logged_once():
    fleet = fed_fleet()
    lost = LinkStatus(1, LinkPhase.LOST, "connection reset", retry_at=T0 + 1)
    fleet.set_link(lost)
    fleet.set_link(lost)
    assert sum("link lost" in ln.text for ln in fleet.log_lines) == 1
    fleet.set_link(LinkStatus(1, LinkPhase.LIVE))
    assert "rank 1 link back" in fleet.log_lines[-1].text
    assert fleet.live_count() == 4


def test_state_proposal_moves_work_off_the_straggler():
    fleet = fed_fleet(split=(2, 2, 2, 2), slow=(1, 1, 1, 3))
    prop, models, why = proposal(fleet)
    assert why == "" and prop is not None and len(models) == 4
    assert sum(prop.split) == 8
    assert prop.split[3] < 2
    assert prop.gain is not None and prop.gain > 0.3


def test_state_proposal_says_why_not():
    fleet = Fleet(local_targets(2))
    prop, _, why = proposal(fleet)
    assert prop is None and "not every rank" in why


def test_series_keeps_whole_run_at_bounded_size():
    s = Series(8)
    for i in range(100):
        s.add(i, float(i))
    assert len(s) <= 9
    pts = s.all()
    assert pts[0][0] < 10 and pts[-1][0] >= 96  # the start and the newest are both there
    assert s.last_y == 99.0


def test_snapshot_is_json_ready():
    snap = snapshot(fed_fleet())
    text = json.dumps(snap)
    assert json.loads(text)["ranks"][3]["straggler"] is True


# --- inbox and links ---------------------------------------------------------------------------


def test_inbox_notifies_once_per_batch():
    calls = []
    inbox = Inbox(notify=lambda: calls.append(1))
    for i in range(100):
        inbox.link_message(0, update(0, i + 1))
    assert calls == [1]
    assert len(inbox.drain()) == 100
    inbox.link_status(LinkStatus(0, LinkPhase.LIVE))
    assert calls == [1, 1]


class Recorder:
    def __init__(self):
        self.statuses: list[LinkStatus] = []
        self.messages = []
        self.changed = threading.Event()

    def link_status(self, s):
        self.statuses.append(s)
        self.changed.set()

    def link_message(self, rank, m):
        self.messages.append((rank, m))
        self.changed.set()

    def wait_for(self, pred, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            self.changed.wait(0.05)
            self.changed.clear()
        return pred()


class ScriptedConnector:
    """Each open() takes the next outcome: an exception to raise, or a list of messages."""

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.opens = 0

    def open(self, target, timeout):
        self.opens += 1
        out = self.outcomes.pop(0) if self.outcomes else LinkRefused("gone", "nothing listening")
        if isinstance(out, BaseException):
            raise out
        return out

    def describe(self, target):
        return f"fake:{target.port}"

    def close(self):
        pass


class ScriptedClient:
    def __init__(self, messages, key, timeout, peer=""):
        self.hello = messages[0]
        self.rest = list(messages[1:])
        self.key = key
        self.sent = []

    def recv(self, timeout=None):
        if self.rest:
            m = self.rest.pop(0)
            if isinstance(m, BaseException):
                raise m
            return m
        time.sleep(timeout or 0)
        return None

    def send_command(self, cmd, args):
        self.sent.append((cmd, args))
        return 7

    def close(self):
        pass


def make_link(outcomes, sink, **kw):
    from telemetry.backoff import Backoff

    return RankLink(
        local_targets(1)[0],
        ScriptedConnector(outcomes),
        sink,
        backoff=Backoff(0.01, 1.0, 0.01, 0.0),
        client_factory=ScriptedClient,
        recv_timeout=0.01,
        **kw,
    )


def run_link(link):
    t = threading.Thread(target=link.run, daemon=True)
    t.start()
    return t


def test_link_goes_live_then_lost_then_reconnects():
    sink = Recorder()
    session = [hello(0, world=1), update(0, 1), ConnectionLost("eof")]
    link = make_link(
        [
            LinkRefused("nothing listening on 127.0.0.1:47800", "nothing listening"),
            session,
            [hello(0, world=1), update(0, 2)],
        ],
        sink,
    )
    t = run_link(link)
    assert sink.wait_for(
        lambda: sum(isinstance(m, type(update(0, 1))) for _, m in sink.messages) == 2
    )
    link.stop()
    t.join(2)
    phases = [s.phase for s in sink.statuses]
    assert phases[:2] == [LinkPhase.CONNECTING, LinkPhase.REFUSED]
    assert LinkPhase.LIVE in phases and LinkPhase.LOST in phases
    lost = next(s for s in sink.statuses if s.phase is LinkPhase.LOST)
    assert "eof" in lost.detail and lost.retry_at is not None
    assert phases.index(LinkPhase.LOST) < len(phases) - 1


def test_link_refused_for_good_waits_without_retrying():
    sink = Recorder()
    link = make_link([LinkRefused("key changed", "host key changed", retry=False)], sink)
    t = run_link(link)
    assert sink.wait_for(lambda: any(s.phase is LinkPhase.REFUSED for s in sink.statuses))
    time.sleep(0.1)
    assert link.connector.opens == 1
    refused = next(s for s in sink.statuses if s.phase is LinkPhase.REFUSED)
    assert refused.retry_at is None and refused.kind == "host key changed"
    link.stop()
    t.join(2)
    assert not t.is_alive()


def test_link_refused_for_good_tries_again_when_asked():
    sink = Recorder()
    link = make_link(
        [LinkRefused("key changed", "host key changed", retry=False), [hello(0, world=1)]], sink
    )
    t = run_link(link)
    assert sink.wait_for(lambda: any(s.phase is LinkPhase.REFUSED for s in sink.statuses))
    link.retry_now()  # the operator pressed l
    assert sink.wait_for(lambda: link.phase is LinkPhase.LIVE)
    assert link.connector.opens == 2
    link.stop()
    t.join(2)


def test_feed_reconnects_only_the_links_that_are_down():
    from console.live import LiveFeed

    feed = LiveFeed(local_targets(2), ScriptedConnector([]))
    asked = []
    for link in feed.links:
        link.retry_now = functools.partial(asked.append, link.rank)
    feed.links[0].phase = LinkPhase.LIVE
    feed.links[1].phase = LinkPhase.REFUSED
    feed.reconnect()
    assert asked == [1]


def test_link_marks_stale_and_back_live():
    sink = Recorder()
    session = [hello(0, world=1), update(0, 1)]
    link = make_link([session], sink, stale_after=0.05)
    t = run_link(link)
    assert sink.wait_for(lambda: any(s.phase is LinkPhase.STALE for s in sink.statuses))
    link.stop()
    t.join(2)


def test_link_refuses_a_port_serving_another_rank():
    sink = Recorder()
    link = make_link([[hello(3, world=4)]], sink)
    t = run_link(link)
    assert sink.wait_for(lambda: any(s.kind == "wrong rank" for s in sink.statuses))
    link.stop()
    t.join(2)
    assert not any(isinstance(m, type(hello(0))) for _, m in sink.messages)


def test_link_send_command_needs_a_live_link():
    sink = Recorder()
    link = make_link([[hello(0, world=1)]], sink)
    with pytest.raises(ConnectionLost, match="connecting"):
        link.send_command("pause")
    link.key = b"k" * 32
    t = run_link(link)
    assert sink.wait_for(lambda: link.phase is LinkPhase.LIVE)
    assert link.send_command("pause") == 7
    link.stop()
    t.join(2)


def test_gather_knows_every_log_name_the_ranks_write():
    from console.gather import LOG_NAME
    from telemetry.arrowlog import event_stem, update_stem

    for rank in (0, 7, 12):
        for stem in (update_stem(rank), event_stem(rank)):
            for segment in ("", ".1", ".23"):
                m = LOG_NAME.match(f"{stem}{segment}.arrow")
                assert m is not None and int(m.group(1)) == rank
    for other in ("control.key", "config.json", "rank-1.arrow.part", ".rank-1.arrow.part"):
        assert LOG_NAME.match(other) is None


def test_feed_turns_commands_off_when_rank0_serves_another_run(tmp_path):
    from console.connectors import SSHConnector, TCPConnector
    from console.live import LiveFeed
    from telemetry.errors import AuthError
    from telemetry.records import run_id_of

    run = tmp_path / "runs" / "mine"
    local = LiveFeed(local_targets(1), TCPConnector(), run_dir=str(run))
    local.link_message(0, hello(0, world=1, run_id=run_id_of(run)))
    assert local.control_problem == ""
    # Same folder name, another folder (another run on this machine): the hash tells.
    local.link_message(0, hello(0, world=1, run_id=run_id_of(tmp_path / "mine")))
    assert "rank 0 serves run mine-" in local.control_problem
    with pytest.raises(AuthError, match="commands are off"):
        local.send("pause")
    assert local.links[0].key is None  # the key was never read for the wrong run

    # Over SSH only the folder's name can be checked (the hash is of the remote path).
    far = LiveFeed(local_targets(1), SSHConnector(None), run_dir="runs/mine/")
    far.link_message(0, hello(0, world=1, run_id="mine-0a1b2c"))
    assert far.control_problem == ""
    far.link_message(0, hello(0, world=1, run_id="other-0a1b2c"))
    assert "--run-dir runs/mine/ is run mine-" in far.control_problem


# --- replay ------------------------------------------------------------------------------------


def test_replay_plays_steps_and_finishes(tmp_path):
    from bench.synthetic import write_run
    from console.replay import ReplayError, ReplayFeed

    write_run(tmp_path, world_size=3, steps=30, rebalance_at=15, eval_every=10)
    feed = ReplayFeed(tmp_path)
    inbox = Inbox()
    feed.attach(inbox)
    fleet = Fleet(feed.targets)

    def pump():
        for rank, item in inbox.drain():
            fleet.set_link(item) if isinstance(item, LinkStatus) else fleet.apply(rank, item)

    feed.start()
    feed.step()
    pump()
    assert fleet.step() == 1 and not feed.playing
    feed.step()
    pump()
    assert fleet.step() == 2
    feed.finish()
    pump()
    assert fleet.step() == 30 and feed.done
    assert any("rebalanced" in ln.text for ln in fleet.log_lines)
    assert header(fleet).val_loss is not None
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ReplayError, match="no telemetry logs"):
        ReplayFeed(empty)
    with pytest.raises(ReplayError, match="no such run folder"):
        ReplayFeed(tmp_path / "missing")


def test_replay_once_json_cli(tmp_path):
    from bench.synthetic import write_run

    write_run(tmp_path, world_size=2, steps=12, slow_rank=1, eval_every=0, rebalance_at=None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet.cli",
            "console",
            "--replay",
            str(tmp_path),
            "--once",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    assert snap["step"] == 12 and len(snap["ranks"]) == 2


# --- demo commands -----------------------------------------------------------------------------


def test_demo_commands(tmp_path):
    assert demo.cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/mlx-fleet")
    assert demo.cache_dir({"HOME": "/h"}) == Path("/h/.cache/mlx-fleet")
    prep = demo.prepare_command(Path("/c"), python="py")
    assert prep[:3] == ["py", "-m", "fleet.cli"]
    assert prep[3:] == [
        "prepare",
        "--stdlib",
        "--max-files",
        "400",
        "--seq-len",
        "128",
        "--out",
        "/c/stdlib-128",
    ]
    launch = demo.launch_command(Path("/c/stdlib-128"), Path("runs/d"), python="py")
    assert launch[3:8] == ["launch", "-n", "4", "--", "train"]
    args = dict(zip(launch[8::2], launch[9::2], strict=False))
    assert args["--local-batches"] == "3,2,2,1"
    assert args["--simulate-slowdown"] == "2,1,1,1"
    assert args["--data"] == "/c/stdlib-128" and args["--run-dir"] == "runs/d"
    assert "--telemetry-port-base" not in launch
    moved = demo.launch_command(Path("d"), Path("r"), port_base=49000)
    assert moved[-2:] == ["--telemetry-port-base", "49000"]
    assert demo.console_args(Path("r"), 4, 49000) == [
        "--local",
        "-n",
        "4",
        "--run-dir",
        "r",
        "--port-base",
        "49000",
    ]
    with pytest.raises(ValueError, match="slowdown"):
        demo.launch_command(Path("d"), Path("r"), split=(1, 2), slowdown=(1,))


# --- boundaries --------------------------------------------------------------------------------


def test_console_never_imports_mlx_or_trainer():
    code = (
        "import sys, console.app, console.cli, console.demo, console.once, console.replay, "
        "console.ssh, bench.console\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'trainer'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_console_model_stays_headless():
    # The fleet model and its vocabulary load without Textual, SSH or the network code, so
    # views, --once and replay read link phases from the model, never from links.py.
    code = (
        "import sys, console.model, console.fleet, console.events, console.snapshot, "
        "console.series, console.feed, console.replay\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'paramiko') "
        "or m in ('console.links', 'console.live', 'console.connectors', 'console.ssh'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_balance_stays_pure():
    code = (
        "import sys, telemetry.balance\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mlx', 'numpy', 'textual', 'paramiko', 'console', 'trainer'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_console_cli_errors_are_one_line(tmp_path):
    def fleet(*args):
        return subprocess.run(
            [sys.executable, "-m", "fleet.cli", "console", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )

    out = fleet("--hostfile", str(tmp_path / "nope.json"))
    assert out.returncode == 2 and "no such hostfile" in out.stderr
    assert "Traceback" not in out.stderr
    out = fleet("--local")
    assert out.returncode == 2 and "-n N" in out.stderr
    out = fleet("--local", "-n", "2", "--replay", "x")
    assert out.returncode == 2 and "choose one" in out.stderr
    out = fleet("--replay", str(tmp_path))
    assert out.returncode == 2 and "no telemetry logs" in out.stderr


# --- ssh config resolution ---------------------------------------------------------------------


def test_ssh_config_is_honoured(tmp_path):
    from console.ssh import SSHConfigError, SSHOptions, _parse_hop, host_settings

    cfg = tmp_path / "config"
    cfg.write_text(
        "Host studio\n  HostName 10.0.0.5\n  User ml\n  Port 2222\n  IdentityFile ~/k1\n"
        "  IdentitiesOnly yes\n  ProxyJump bastion\n  StrictHostKeyChecking accept-new\n"
        f"  UserKnownHostsFile {tmp_path}/kh1 {tmp_path}/kh2\n"
        "Host *\n  User fallback\n"
    )
    s = host_settings("studio", SSHOptions(config_path=cfg))
    assert (s.hostname, s.port, s.user) == ("10.0.0.5", 2222, "ml")
    assert s.identity_files[0].endswith("/k1") and not s.identity_files[0].startswith("~")
    assert s.identities_only and s.proxy_jump == "bastion" and s.accept_new
    assert s.known_hosts == tmp_path / "kh1"
    other = host_settings(
        "mini", SSHOptions(config_path=cfg, known_hosts=tmp_path / "kh", user="me")
    )
    assert (other.hostname, other.port, other.user) == ("mini", 22, "me")
    assert other.known_hosts == tmp_path / "kh" and not other.accept_new
    assert _parse_hop("ml@jump:2200") == ("ml", "jump", 2200)
    assert _parse_hop("jump") == (None, "jump", None)
    assert _parse_hop("ssh://u@[::1]:22") == ("u", "::1", 22)
    with pytest.raises(SSHConfigError, match="does not exist"):
        SSHOptions(config_path=tmp_path / "missing").ssh_config()


# --- issue 14: the event log groups what every rank says alike -----------------------------------


def test_log_groups_what_every_rank_says_alike_and_keeps_what_differs():
    fleet = fed_fleet()
    before, version = len(fleet.log_lines), fleet.log_version
    for r in range(4):
        move = {"from": [3, 2, 2, 1], "to": [1, 3, 2, 2]}
        text = "split [3, 2, 2, 1] -> [1, 3, 2, 2]"
        fleet.apply(r, Event("rebalanced", r, 42, text, move, time=T0 + 50 + r * 0.01))
    assert len(fleet.log_lines) == before + 1
    line = fleet.log_lines[-1]
    assert line.ranks == (0, 1, 2, 3) and line.who == "all 4 ranks" and line.step == 42
    assert line.rev == 3 and fleet.log_version == version + 4
    from console.widgets.event_log import format_line

    assert format_line(line).plain.endswith("all 4 ranks @42 split [3, 2, 2, 1] -> [1, 3, 2, 2]")
    # Three ranks agree, one differs: one line for the three, one of its own.
    for r in range(4):
        val = 3.5 if r < 3 else 3.7
        fleet.apply(r, Event("eval", r, 50, f"val loss {val}", {"val_loss": val}, T0 + 60))
    assert [ln.who for ln in list(fleet.log_lines)[-2:]] == ["r0,1,2", "r3"]
    # The same event again (a reconnect's history) joins nothing and adds nothing.
    fleet.apply(1, Event("eval", 1, 50, "val loss 3.5", {"val_loss": 3.5}, T0 + 60))
    assert list(fleet.log_lines)[-2].ranks == (0, 1, 2)
    snap = snapshot(fleet)
    assert snap["events"][-2]["ranks"] == [0, 1, 2]


def test_log_says_a_retrying_links_refusal_once():
    fleet = Fleet(local_targets(3))
    for _ in range(5):  # connecting, refused, connecting, refused, ...
        for r in range(3):
            fleet.set_link(LinkStatus(r, LinkPhase.CONNECTING, f"127.0.0.1:{47800 + r}"))
            fleet.set_link(
                LinkStatus(
                    r,
                    LinkPhase.REFUSED,
                    f"nothing listening on 127.0.0.1:{47800 + r}",
                    "nothing listening",
                    retry_at=T0 + 1,
                )
            )
    assert len(fleet.log_lines) == 3
    assert fleet.nobody() and header(fleet).status == "no run"
    fleet.set_link(LinkStatus(0, LinkPhase.CONNECTING, "127.0.0.1:47800"))
    assert fleet.nobody()  # retrying is not an answer
    fleet.set_link(LinkStatus(0, LinkPhase.LIVE, "127.0.0.1:47800"))
    assert not fleet.nobody()


# --- issue 14: --once takes each rank's newest update ------------------------------------------


class HistoryFeed:
    """Ranks whose history (oldest first) arrives in slow chunks, as over a busy link."""

    def __init__(self, world: int, newest: int, backlog: int) -> None:
        self.targets = local_targets(world)
        self.newest, self.backlog = newest, backlog
        self.sink = None
        self._threads: list[threading.Thread] = []

    def attach(self, sink) -> None:
        self.sink = sink

    def _rank(self, r: int) -> None:
        self.sink.link_status(LinkStatus(r, LinkPhase.LIVE, "fake"))
        h = hello(r, world=len(self.targets))
        h.backlog = self.backlog
        self.sink.link_message(r, h)
        for step in range(self.newest - self.backlog + 1, self.newest + 1):
            self.sink.link_message(r, update(r, step))
            if step % 10 == 0:
                time.sleep(0.15)  # the rest of the history is still on its way

    def start_threads(self) -> None:
        for r in range(len(self.targets)):
            t = threading.Thread(target=self._rank, args=(r,), daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        for t in self._threads:
            t.join(5)


def test_once_waits_for_each_ranks_whole_history_and_says_how_old_its_newest_is():
    from console import once

    fleet = once.reach(HistoryFeed(4, newest=210, backlog=60), timeout=20, clock=lambda: T0 + 9e9)
    assert [v.last.step for v in fleet.ranks] == [210] * 4
    snap = snapshot(fleet, now=update(0, 210).time + 2.5)
    assert snap["step"] == 210 and [r["update_age_s"] for r in snap["ranks"]] == [2.5] * 4


def test_once_with_nothing_listening_is_one_line_with_advice():
    from console import once

    fleet = Fleet(local_targets(3, port_base=5000))
    for r in range(3):
        why = f"nothing listening on 127.0.0.1:{5000 + r}"
        fleet.set_link(LinkStatus(r, LinkPhase.REFUSED, why, "nothing listening", T0 + 1))
    lines = once.unreachable(fleet, "replay it with: fleet console --replay R")
    assert lines == [
        "nothing listening on 127.0.0.1:5000-5002: no run serves there; "
        "replay it with: fleet console --replay R"
    ]


# --- issue 14: a replay that is over shows how the run ended ------------------------------------


def test_replay_end_is_finished_stopped_failed_or_ended(tmp_path):
    from bench.synthetic import write_run
    from console.cli import nobody_advice, replayed, run_end
    from console.replay import ReplayFeed
    from console.snapshot import ending

    write_run(tmp_path, world_size=2, steps=12, slow_rank=1, eval_every=0, rebalance_at=None)
    fleet = replayed(ReplayFeed(tmp_path))
    assert fleet.ended() and all(v.phase is LinkPhase.ENDED for v in fleet.ranks)
    h = header(fleet)
    assert h.status == "ended" and h.ended.startswith("ended at update 12, ")
    fleet.total_updates = 12
    assert ending(fleet).how == "finished" and header(fleet).status == "finished"
    assert header(fleet).ended.startswith("finished at update 12/12, ")
    fleet.stopped = True
    assert ending(fleet).how == "stopped"
    fleet.failed = "loss is nan"
    assert ending(fleet).how == "failed"
    assert run_end(str(tmp_path)).step == 12
    advice = nobody_advice(str(tmp_path))
    assert f"console --replay {tmp_path}" in advice and "train --resume latest" in advice
    assert "no telemetry logs" in nobody_advice(str(tmp_path / "nope"))


# --- issue 14: hints print `fleet` as it can be typed ------------------------------------------


def test_fleet_command_is_what_can_be_typed(tmp_path, monkeypatch):
    from console.command import fleet_command, typed

    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("")
    script = venv / "fleet"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert fleet_command(str(venv / "python"), cwd=str(tmp_path)) == [".venv/bin/fleet"]
    elsewhere = tmp_path / "elsewhere"
    assert fleet_command(str(venv / "python"), cwd=str(elsewhere)) == [str(script)]
    monkeypatch.setenv("PATH", f"{venv}:/usr/bin")
    assert fleet_command(str(venv / "python"), cwd=str(tmp_path)) == ["fleet"]
    bare = tmp_path / "bare" / "python"
    assert fleet_command(str(bare)) == [str(bare), "-m", "fleet.cli"]
    assert typed(["console", "--replay", "r s"], str(bare)).endswith("console --replay 'r s'")
