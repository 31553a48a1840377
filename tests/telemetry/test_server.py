"""The Hub's server on real loopback sockets: history, fan-out, slow subscribers, control."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import threading
import time

import pytest

from bench import synthetic
from fleet.cli import main as fleet_main
from telemetry import auth, protocol
from telemetry.client import TelemetryClient
from telemetry.control import CommandQueue, CommandResult
from telemetry.errors import (
    AuthError,
    CommandRefused,
    ConnectionLost,
    ProtocolError,
    TelemetryError,
)
from telemetry.framing import Decoder
from telemetry.hub import ANY_PORT, ConnectionLimits, Hub, ServerOptions, unix_socket_path
from telemetry.records import EVENT_KINDS, Dropped, Event, Reply, Update
from tests.support.fleet import ROOT

SERVER_OPTIONS = {f.name for f in dataclasses.fields(ServerOptions)}


@pytest.fixture
def make_hub(tmp_path):
    hubs: list[Hub] = []

    def make(rank: int = 0, world: int = 2, **kw) -> Hub:
        kw.setdefault("port", ANY_PORT)
        kw.setdefault("log", False)
        kw.setdefault("flush_interval", 0)  # each record at once: keeps the tests quick
        options = ServerOptions(**{k: kw.pop(k) for k in list(kw) if k in SERVER_OPTIONS})
        hub = Hub(run_dir=tmp_path, hello=synthetic.hello(rank, world), options=options, **kw)
        hub = hub.start()
        hubs.append(hub)
        return hub

    yield make
    for hub in hubs:
        hub.close()


def connect(hub: Hub, **kw) -> TelemetryClient:
    host, port = hub.address
    return TelemetryClient.connect(host, port, **kw)


def read_until(client: TelemetryClient, pred, timeout: float = 10.0) -> list:
    """Messages until one satisfies `pred` (included); fails the test after `timeout`."""
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = client.recv(0.2)
        if msg is not None:
            out.append(msg)
            if pred(msg):
                return out
    raise AssertionError(f"condition not met; got {len(out)} messages, last {out[-1:]}")


def last_step(n: int):
    return lambda m: isinstance(m, Update) and m.step == n


class RawPeer:
    """A hand-driven connection, for sending what a well-behaved client never would."""

    def __init__(self, hub: Hub) -> None:
        self.sock = socket.create_connection(hub.address, timeout=5)
        self.decoder = Decoder()
        self.inbox: list = []
        self.hello = self.next()

    def next(self):
        while not self.inbox:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionLost("eof")
            self.inbox.extend(self.decoder.feed(data))
        return self.inbox.pop(0)

    def reply(self) -> Reply:
        while True:
            obj = self.next()
            if obj.get("type") == "reply":
                return protocol.decode(obj)

    def command(self, cmd, args=None, *, wait=True, **kw) -> Reply | None:
        self.send(cmd, args, **kw)
        return self.reply() if wait else None

    def send(self, cmd, args=None, *, key=None, nonce=None, mac=None, challenge=None, cid=1):
        args = {} if args is None else args
        nonce = nonce or auth.new_nonce()
        if mac is None and key is not None:
            ch = self.hello["challenge"] if challenge is None else challenge
            mac = auth.sign(key, cid, cmd, args, nonce, ch)
        msg = {"type": "command", "id": cid, "cmd": cmd, "args": args, "nonce": nonce}
        if mac is not None:
            msg["mac"] = mac
        self.sock.sendall(protocol.pack(msg))

    def closed(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass
        except TimeoutError:
            return False
        except OSError:
            return True
        return True


# --- feed -------------------------------------------------------------------------------------


def test_late_subscriber_gets_hello_then_history_then_live(make_hub):
    hub = make_hub(backlog=50)
    first = connect(hub)
    hub.on_event(Event("started", 0, 0, data={"world_size": 2}))
    for step in range(1, 121):
        hub.on_update(synthetic.update(step))
    read_until(first, last_step(120))  # the server has handled them all

    late = connect(hub)
    assert late.hello.rank == 0 and late.hello.backlog == 50 and late.hello.event_backlog == 1
    history = [late.recv(5) for _ in range(51)]
    assert [m.step for m in history[:50]] == list(range(71, 121))  # the newest, oldest first
    assert isinstance(history[50], Event) and history[50].kind == "started"
    hub.on_update(synthetic.update(121))
    assert read_until(late, lambda m: isinstance(m, Update))[-1].step == 121


def test_many_subscribers_each_get_every_record(make_hub):
    hub = make_hub()
    clients = [connect(hub) for _ in range(12)]
    for step in range(1, 201):
        hub.on_update(synthetic.update(step))
    for c in clients:
        got = read_until(c, last_step(200))
        assert [m.step for m in got if isinstance(m, Update)] == list(range(1, 201))
    assert hub.stats()["subscribers"] == 12


def test_subscriber_that_never_reads_does_not_hold_back_the_run(make_hub):
    hub = make_hub(subscriber_buffer=64)
    # A tiny receive buffer so the kernel stops taking bytes for it early.
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(hub.address)
    stalled = TelemetryClient(raw)  # reads its hello, then nothing until the end
    reader = connect(hub)
    blob = "x" * 16_000
    n = 3000
    for step in range(1, n + 1):
        hub.on_update(synthetic.update(step))
        if step % 3 == 0:
            hub.on_event(Event("sample", 0, step, data={"text": blob}))
    # The reading client got everything through the last update: the server never waited.
    assert read_until(reader, last_step(n), timeout=60)[-1].step == n
    assert hub.stats()["dropped_for_subscribers"] > 0

    got = read_until(stalled, last_step(n), timeout=60)
    drops = [m for m in got if isinstance(m, Dropped)]
    assert drops and sum(d.count for d in drops) == drops[-1].total
    steps = [m.step for m in got if isinstance(m, Update)]
    assert steps == sorted(steps) and len(steps) < n  # lost its oldest, kept the newest
    assert len(steps) + sum(d.count for d in drops) <= n + n // 3


def test_batched_sending_keeps_order_and_every_record(make_hub):
    hub = make_hub(flush_interval=0.05)
    client = connect(hub)
    for step in range(1, 301):
        hub.on_update(synthetic.update(step))
        if step % 50 == 0:
            hub.on_event(Event("eval", 0, step, data={"val_loss": 1.0}))
    got = read_until(client, last_step(300))
    assert [m.step for m in got if isinstance(m, Update)] == list(range(1, 301))
    assert [m.step for m in got if isinstance(m, Event)] == [50, 100, 150, 200, 250]


def test_records_queued_at_close_still_go_out(make_hub):
    hub = make_hub(flush_interval=5.0)  # nothing would go out for seconds on its own
    client = connect(hub)
    hub.on_update(synthetic.update(1))  # sent at once: the first after a quiet spell
    hub.on_event(Event("stopped", 0, 2, data={"checkpoint": "ckpt-2"}))  # waits for a batch
    hub.close()
    got = []
    with pytest.raises(ConnectionLost):
        while True:
            msg = client.recv(5)
            assert msg is not None
            got.append(msg)
    assert [m.type for m in got] == ["update", "event"] and got[-1].kind == "stopped"


def test_set_hello_reaches_new_connections(make_hub):
    hub = make_hub()
    hub.set_hello(local_batch=9)
    assert connect(hub).hello.local_batch == 9
    with pytest.raises(TypeError):
        hub.set_hello(no_such_field=1)


def test_event_of_an_unknown_kind_is_refused_at_once(make_hub):
    hub = make_hub()
    with pytest.raises(ValueError, match="unknown event kind 'chekpoint'"):
        hub.on_event(Event("chekpoint", 0, 1))
    hub.on_event(Event("checkpoint", 0, 1, data={"path": "p", "verified": True}))


def test_every_kind_the_trainer_emits_is_known():
    trainer = ROOT / "trainer"
    kinds = set()
    for path in trainer.glob("*.py"):
        kinds |= set(re.findall(r'(?:\bEvent|\.event)\(\s*"(\w+)"', path.read_text()))
    assert kinds and kinds <= EVENT_KINDS, kinds - EVENT_KINDS


def test_unix_socket(make_hub, tmp_path):
    hub = make_hub(port=None, unix_socket=True)
    assert hub.address is None and hub.unix_path.exists()
    client = TelemetryClient.connect_unix(hub.unix_path)
    hub.on_update(synthetic.update(1))
    assert read_until(client, last_step(1))
    hub.close()
    assert not hub.unix_path.exists()


def test_unix_socket_served_by_a_live_rank_is_left_alone(make_hub, tmp_path):
    live = make_hub(port=None, unix_socket=True)
    second = Hub(run_dir=tmp_path, hello=synthetic.hello(), port=None, unix_socket=True, log=False)
    with pytest.raises(TelemetryError, match="served by a live process"):
        second.start()
    second.close()
    assert live.unix_path.exists()  # the failed start removed nothing of the live one's
    assert TelemetryClient.connect_unix(live.unix_path).hello.rank == 0


def test_stale_unix_socket_is_replaced(tmp_path):
    path = unix_socket_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # bound, never listening, then closed: what a killed rank leaves
    dead.close()
    hub = Hub(run_dir=tmp_path, hello=synthetic.hello(), port=None, unix_socket=True, log=False)
    with hub:
        assert TelemetryClient.connect_unix(hub.unix_path).hello.rank == 0


def test_unix_socket_path_too_long_is_a_clear_error(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    hub = Hub(run_dir=deep, hello=synthetic.hello(), port=None, unix_socket=True, log=False)
    with pytest.raises(TelemetryError, match="unix socket path .* bytes"):
        hub.start()


def test_port_taken_names_port_and_rank(make_hub, tmp_path):
    first = make_hub(rank=1)
    port = first.address[1]
    second = Hub(run_dir=tmp_path, hello=synthetic.hello(1, 2), port=port, log=False)
    with pytest.raises(TelemetryError, match=rf"rank 1: telemetry port {port} .*taken"):
        second.start()


def test_non_loopback_bind_needs_allow_remote(tmp_path):
    hub = Hub(
        run_dir=tmp_path,
        hello=synthetic.hello(),
        port=ANY_PORT,
        options=ServerOptions(bind="0.0.0.0"),
        log=False,
    )
    with pytest.raises(TelemetryError, match="allow_remote"):
        hub.start()


def test_log_only_hub_serves_nothing_and_never_raises(tmp_path):
    hub = Hub(run_dir=tmp_path, hello=synthetic.hello(), port=None).start()
    assert hub.address is None and hub.server is None
    hub.on_update(synthetic.update(1))
    hub.on_update("not a record")  # type: ignore[arg-type] - a trainer bug must not raise
    hub.close()
    assert (tmp_path / "telemetry" / "rank-0.arrow").exists()


def test_garbage_closes_only_that_connection(make_hub):
    hub = make_hub()
    good = connect(hub)
    bad = RawPeer(hub)
    bad.sock.sendall(b"\xc1 not msgpack")
    error = bad.reply()
    assert error.id == 0 and not error.ok and "protocol error" in error.error
    assert bad.closed()
    hub.on_update(synthetic.update(5))
    assert read_until(good, last_step(5))


@pytest.mark.parametrize(
    "payload",
    [
        protocol.pack([1, 2, 3]),  # not a map
        protocol.pack({"no": "type"}),
        protocol.pack(synthetic.update(1).to_msg()),  # a server message, sent by a client
        protocol.pack({"type": "command", "id": "1", "cmd": "pause", "args": {}, "nonce": "x"}),
    ],
)
def test_wrong_messages_close_the_connection(make_hub, payload):
    hub = make_hub()
    bad = RawPeer(hub)
    bad.sock.sendall(payload)
    assert not bad.reply().ok
    assert bad.closed()


# --- control ----------------------------------------------------------------------------------


@pytest.fixture
def control(make_hub, tmp_path):
    queue = CommandQueue()
    key = auth.create_key(tmp_path)
    hub = make_hub(commands=queue, key=key)
    return hub, queue, key


def resolve_next(queue: CommandQueue, result: CommandResult, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = queue.poll()
        if pending is not None:
            pending.resolve(result)
            return pending
        time.sleep(0.01)
    raise AssertionError("no command reached the queue")


def test_signed_command_is_answered_once_applied(control):
    hub, queue, key = control
    client = connect(hub, key=key)
    cid = client.send_command("rebalance", {"split": [3, 5]})
    assert client.recv(0.3) is None  # not applied yet: no reply
    pending = resolve_next(queue, CommandResult(ok=True, step=42, result={"split": [3, 5]}))
    assert (pending.cmd, pending.args) == ("rebalance", {"split": [3, 5]})
    reply = read_until(client, lambda m: isinstance(m, Reply))[-1]
    assert reply.id == cid and reply.ok and reply.result == {"split": [3, 5], "step": 42}


def test_command_waits_and_keeps_other_messages(control):
    hub, queue, key = control
    client = connect(hub, key=key)

    def trainer():
        for step in range(1, 6):
            hub.on_update(synthetic.update(step))
        time.sleep(0.1)
        resolve_next(queue, CommandResult(ok=False, step=5, error="already paused"))

    threading.Thread(target=trainer, daemon=True).start()
    reply = client.command("pause", timeout=10)
    assert not reply.ok and reply.error == "already paused"
    with pytest.raises(CommandRefused) as refused:
        threading.Thread(
            target=resolve_next, args=(queue, CommandResult(ok=False, error="no")), daemon=True
        ).start()
        client.command("pause", timeout=10, check=True)
    assert refused.value.reply.error == "no"
    got = read_until(client, last_step(5))
    assert [m.step for m in got if isinstance(m, Update)] == [1, 2, 3, 4, 5]


def test_refused_commands_never_reach_the_queue(control, tmp_path):
    hub, queue, key = control
    peer = RawPeer(hub)
    other_key = bytes(32)
    cases = {
        "unsigned": dict(cmd="pause"),
        "bad mac": dict(cmd="pause", mac="ab" * 32),
        "junk mac": dict(cmd="pause", mac="not hex at all"),
        "wrong key": dict(cmd="pause", key=other_key),
        "other connection": dict(cmd="pause", key=key, challenge="0" * 32),
        "bad nonce": dict(cmd="pause", key=key, nonce="short"),
        "unknown cmd": dict(cmd="format_disk", key=key),
        "no split": dict(cmd="rebalance", args={}, key=key),
        "zero split": dict(cmd="rebalance", args={"split": [2, 0]}, key=key),
        "text split": dict(cmd="rebalance", args={"split": "2,2"}, key=key),
        "extra arg": dict(cmd="pause", args={"now": 1}, key=key),
    }
    for name, kw in cases.items():
        reply = peer.command(**kw)
        assert not reply.ok and reply.error, name
    assert queue.poll() is None
    # The connection survived all of that, and a good command still works once.
    nonce = auth.new_nonce()
    peer.send("pause", key=key, nonce=nonce, cid=7)
    resolve_next(queue, CommandResult(ok=True, step=1))
    assert peer.reply().ok
    replay = peer.command("pause", key=key, nonce=nonce, cid=7)
    assert not replay.ok and "replay" in replay.error
    assert queue.poll() is None


def test_a_huge_split_gets_a_bounded_refusal(control, caplog):
    hub, queue, key = control
    client = connect(hub, key=key)
    split = [1] * 400_000
    cid = client.send_command("rebalance", {"split": split})
    # A trainer that quotes the whole split in its refusal: about 1.2 MB of text.
    resolve_next(queue, CommandResult(ok=False, error=f"cannot use split {split}"))
    reply = read_until(client, lambda m: isinstance(m, Reply), timeout=30)[-1]
    assert reply.id == cid and not reply.ok
    assert reply.error.startswith("cannot use split [1, 1, ")
    assert len(reply.error) <= protocol.ERROR_TEXT_MAX and "cut" in reply.error
    # An applied command whose result is too large for the wire still gets its answer.
    threading.Thread(
        target=resolve_next,
        args=(queue, CommandResult(ok=True, step=9, result={"log": "x" * (2 << 20)})),
        daemon=True,
    ).start()
    big = client.command("checkpoint", timeout=30)
    assert big.ok and big.result["step"] == 9 and "truncated" in big.result
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_replay_on_another_connection_fails(control):
    hub, queue, key = control
    first, second = RawPeer(hub), RawPeer(hub)
    nonce = auth.new_nonce()
    mac = auth.sign(key, 1, "stop", {}, nonce, first.hello["challenge"])
    reply = second.command("stop", nonce=nonce, mac=mac)
    assert not reply.ok and "signature" in reply.error
    assert queue.poll() is None


def test_other_ranks_send_control_to_rank_0(make_hub, tmp_path):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    key = auth.create_key(tmp_path)
    hub = make_hub(rank=1, port=port, commands=CommandQueue(), key=key)
    reply = connect(hub, key=key).command("pause", timeout=10)
    assert not reply.ok and reply.error == f"control goes to rank 0 (port {port - 1})"


def test_control_off_without_key_or_queue(make_hub):
    for kw in (dict(commands=CommandQueue()), dict(key=bytes(32))):
        hub = make_hub(**kw)
        reply = connect(hub, key=bytes(32)).command("pause", timeout=10)
        assert not reply.ok


def test_client_refuses_other_versions_and_non_ranks():
    for first in (
        {**synthetic.hello().to_msg(), "protocol": 99},
        synthetic.update(1).to_msg(),
        {"type": "hello"},
    ):
        a, b = socket.socketpair()
        a.sendall(protocol.pack(first))
        with pytest.raises(ProtocolError):
            TelemetryClient(b, timeout=2)
        a.close()
    with pytest.raises(AuthError):
        a, b = socket.socketpair()
        a.sendall(protocol.pack(synthetic.hello().to_msg()))
        TelemetryClient(b).send_command("pause")


# --- the key file -----------------------------------------------------------------------------


def test_key_file_is_private_and_checked(tmp_path):
    key = auth.create_key(tmp_path)
    path = tmp_path / auth.KEY_FILE
    assert len(key) == 32 and (path.stat().st_mode & 0o777) == 0o600
    assert auth.read_key(tmp_path) == key == auth.read_key(path) == auth.ensure_key(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [auth.KEY_FILE]  # no temporary left over
    os.chmod(path, 0o644)
    with pytest.raises(AuthError, match="0644.*too open"):
        auth.read_key(tmp_path)
    with pytest.raises(AuthError, match="too open"):
        auth.ensure_key(tmp_path)
    os.chmod(path, 0o600)
    path.write_bytes(b"short")
    with pytest.raises(AuthError, match="5 bytes"):
        auth.read_key(tmp_path)
    with pytest.raises(AuthError, match="no control key"):
        auth.read_key(tmp_path / "elsewhere")
    assert auth.create_key(tmp_path) != key  # a new run, a new key


# --- command line -----------------------------------------------------------------------------


def test_cli_send_applied_refused_and_errors(control, tmp_path, capsys):
    hub, queue, _ = control
    port = str(hub.address[1])
    results = iter([CommandResult(ok=True, step=3), CommandResult(ok=False, error="busy")])

    def trainer():
        for result in results:
            resolve_next(queue, result)

    threading.Thread(target=trainer, daemon=True).start()
    base = ["telemetry", "send", "--run-dir", str(tmp_path), "--port-base", port]
    assert fleet_main([*base, "rebalance", "3,5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["result"]["step"] == 3
    assert fleet_main([*base, "pause", "--json"]) == 1
    captured = capsys.readouterr()
    assert "busy" in captured.err and not json.loads(captured.out)["ok"]
    assert fleet_main([*base, "rebalance", "3,x"]) == 2
    assert fleet_main([*base[:3], str(tmp_path / "nope"), *base[4:], "pause"]) == 2
    assert "no control key" in capsys.readouterr().err


def test_cli_send_says_what_happened_in_words(control, tmp_path, capsys):
    """Issue 18, defect 7: `telemetry send` printed the raw reply JSON, and a bare
    `rebalance` answered "needs args.split". A sentence now (--json for the raw reply), and
    the usage before anything is sent."""
    hub, queue, _ = control
    results = iter(
        [
            CommandResult(ok=True, step=10, result={"split": [2, 2, 2]}),
            CommandResult(ok=True, step=12, result={"path": "RUN/checkpoints/step-000012"}),
            CommandResult(ok=True, step=13),
        ]
    )

    def trainer():
        for result in results:
            resolve_next(queue, result)

    threading.Thread(target=trainer, daemon=True).start()
    base = ["telemetry", "send", "--run-dir", str(tmp_path), "--port-base", str(hub.address[1])]
    assert fleet_main([*base, "rebalance", "2,2,2"]) == 0
    assert capsys.readouterr().out == "rebalance 2,2,2 applied at update 10\n"
    assert fleet_main([*base, "checkpoint"]) == 0
    assert capsys.readouterr().out == "checkpoint saved at update 12: RUN/checkpoints/step-000012\n"
    assert fleet_main([*base, "pause"]) == 0
    assert capsys.readouterr().out == "paused at update 13\n"
    assert fleet_main([*base, "rebalance"]) == 2
    err = capsys.readouterr().err
    assert "rebalance needs the new split" in err and "rebalance 2,2,2" in err
    assert "args.split" not in err and err.count("\n") == 1


def test_cli_on_a_run_that_is_not_running_points_to_report_and_replay(tmp_path, capsys):
    """Issue 18, defect 11: `telemetry tail` of a finished run said "Connection refused"."""
    from telemetry import auth, ports
    from tests.support.fleet import free_port

    auth.create_key(tmp_path)
    ports.record(tmp_path, ports.RecordedPorts(free_port(), 1))  # nothing serves there now
    assert fleet_main(["telemetry", "tail", "--run-dir", str(tmp_path), "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert "the run is not running" in err
    assert f"fleet report {tmp_path}" in err and f"fleet console --replay {tmp_path}" in err
    assert fleet_main(["telemetry", "send", "--run-dir", str(tmp_path), "pause"]) == 2
    assert "the run is not running" in capsys.readouterr().err


def test_cli_tail(make_hub, capsys):
    hub = make_hub()
    for step in range(1, 4):
        hub.on_update(synthetic.update(step))
    target = f"127.0.0.1:{hub.address[1]}"
    read_until(connect(hub), last_step(3))  # handled: now history for the tails
    assert fleet_main(["telemetry", "tail", target, "--count", "3", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [m["type"] for m in lines] == ["hello", "update", "update", "update"]
    assert fleet_main(["telemetry", "tail", target, "--count", "2"]) == 0
    human = capsys.readouterr().out.splitlines()
    # The newest 2 of the 3 in history (issue 14: it printed the oldest).
    assert human[0].startswith("hello: rank 0/2") and human[1].startswith("step 2 r0 loss")


def test_cli_tail_count_prints_the_newest_of_the_history(make_hub, capsys):
    hub = make_hub()
    for step in range(1, 11):
        hub.on_update(synthetic.update(step))
    read_until(connect(hub), last_step(10))
    target = f"127.0.0.1:{hub.address[1]}"
    assert fleet_main(["telemetry", "tail", target, "--count", "3", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [m["step"] for m in lines if m["type"] == "update"] == [8, 9, 10]


def test_cli_tail_count_waits_for_live_updates_past_a_short_history(make_hub, capsys):
    hub = make_hub()
    hub.on_update(synthetic.update(1))
    read_until(connect(hub), last_step(1))
    target = f"127.0.0.1:{hub.address[1]}"

    def later():
        time.sleep(0.5)
        hub.on_update(synthetic.update(2))

    threading.Thread(target=later, daemon=True).start()
    assert fleet_main(["telemetry", "tail", target, "--count", "2", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [m["step"] for m in lines if m["type"] == "update"] == [1, 2]


# --- ports: a free base when the default is taken, recorded for the readers --------------------


def test_ports_agree_on_a_base_free_on_every_rank():
    """Four ranks (threads) with a summing barrier, as the cluster's all-reduce would be."""
    from telemetry import ports

    world, start = 4, 47800
    taken = {start + 2, start + 100 + 3}  # rank 2's port of the first, rank 3's of the second
    barrier = threading.Barrier(world)
    box: list[float] = []
    lock = threading.Lock()

    def all_sum(values):
        with lock:
            box.append(values[0])
        barrier.wait()
        total = sum(box)
        barrier.wait()
        with lock:
            box.clear()
        barrier.wait()
        return [total]

    chosen = [None] * world

    def rank(r):
        chosen[r] = ports.agree_base(
            start, world, r, all_sum, free=lambda port, bind: port not in taken
        )

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert chosen == [start + 200] * world
    assert list(ports.candidates(start, 250))[:2] == [start, start + 300]  # ranges never overlap
    assert all(b < 49152 for b in ports.candidates(start, 64))  # below macOS's ephemeral range


def test_a_free_range_lies_below_the_ephemeral_ports_and_skips_a_taken_port(monkeypatch):
    from telemetry import ports

    low, high = ports.FREE_RANGE
    assert high <= 32768  # an outgoing connection's port never comes from here (Linux, macOS)
    with socket.socket() as taken:
        base = ports.free_loopback_base(3)
        assert low <= base < high - 3
        taken.bind(("127.0.0.1", base + 1))
        picks = iter([base, base + 10])
        monkeypatch.setattr(ports.random, "randrange", lambda *_: next(picks))
        assert ports.free_loopback_base(3) == base + 10  # base's range holds a taken port


def test_ports_record_round_trip_and_errors(tmp_path):
    from telemetry import arrowlog, ports

    assert ports.ports_path(tmp_path).parent == arrowlog.log_dir(tmp_path)
    assert ports.read(tmp_path) is None
    ports.record(tmp_path, ports.RecordedPorts(47900, 4, host="h", run_id="r-1"))
    got = ports.read(tmp_path)
    assert got == ports.RecordedPorts(47900, 4, "127.0.0.1", "h", "r-1") and got.port(3) == 47903
    ports.ports_path(tmp_path).write_text('{"base": "x", "world_size": 2}')
    with pytest.raises(ValueError, match="base must be a port number"):
        ports.read(tmp_path)
    ports.forget(tmp_path)
    assert ports.read(tmp_path) is None
    assert ports.keep(tmp_path, ports.RecordedPorts(48000, 2)) == ports.ports_path(tmp_path)
    assert ports.read(tmp_path).base == 48000
    assert ports.keep(tmp_path, None) is None and ports.read(tmp_path) is None  # socket off


def test_cli_send_and_tail_find_the_recorded_port(control, tmp_path, capsys):
    from telemetry import ports

    hub, queue, _ = control
    hub.on_update(synthetic.update(1))
    ports.record(tmp_path, ports.RecordedPorts(hub.address[1], 1))
    threading.Thread(
        target=resolve_next, args=(queue, CommandResult(ok=True, step=1)), daemon=True
    ).start()
    assert fleet_main(["telemetry", "send", "--run-dir", str(tmp_path), "pause", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]
    tail = ["telemetry", "tail", "--run-dir", str(tmp_path), "--count", "1", "--json"]
    assert fleet_main(tail) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["type"] == "hello" and lines[1]["step"] == 1
    assert fleet_main(["telemetry", "tail"]) == 1
    assert "--run-dir" in capsys.readouterr().err


def test_cli_tail_unreachable(capsys):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    assert fleet_main(["telemetry", "tail", f"127.0.0.1:{port}", "--timeout", "2"]) == 1
    assert f"cannot reach telemetry at 127.0.0.1:{port}" in capsys.readouterr().err


# --- slots and timeouts -----------------------------------------------------------------------


def wait_for(pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def stalled_socket(hub: Hub) -> socket.socket:
    """A connection that never reads, with a tiny receive buffer so the server notices soon."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(hub.address)
    return sock


def stall(hub: Hub) -> int:
    """Publish large events until a connection stops taking its output; the last step sent."""
    blob = "x" * 16_000
    for step in range(1, 2001):
        hub.on_event(Event("sample", 0, step, data={"text": blob}))
        if step % 50 == 0:
            time.sleep(0.02)
            if hub.stats()["stalled_subscribers"]:
                return step
    raise AssertionError(f"no stall: {hub.stats()}")


def eof(sock: socket.socket, timeout: float = 5.0) -> bool:
    """Whether the server closed `sock` (read what is left; a reset counts as closed)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def test_idle_connections_never_lock_out_a_signed_command(make_hub, tmp_path):
    queue, key = CommandQueue(), auth.create_key(tmp_path)
    hub = make_hub(commands=queue, key=key)  # the real limits: 64 slots, 1 reserved
    idle = [socket.create_connection(hub.address) for _ in range(protocol.MAX_CLIENTS)]
    wait_for(lambda: hub.stats()["subscribers"] == protocol.MAX_CLIENTS)
    try:
        client = connect(hub, key=key)  # the 65th: it used to be closed at once
        threading.Thread(
            target=resolve_next, args=(queue, CommandResult(ok=True, step=4)), daemon=True
        ).start()
        assert client.command("pause", timeout=10).ok
        stats = hub.stats()
        assert stats["evicted_clients"] == 1 and stats["refused_clients"] == 0
        assert eof(idle[0])  # the oldest made room
        assert not eof(idle[1], timeout=0.2)
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_that_never_reads_times_out(make_hub):
    hub = make_hub(limits=ConnectionLimits(idle_timeout=0.5))
    quiet = stalled_socket(hub)
    stall(hub)
    wait_for(lambda: hub.stats()["timed_out_clients"] == 1, timeout=5)
    assert eof(quiet)
    hub.on_update(synthetic.update(7))
    assert read_until(connect(hub), last_step(7))  # serving the others as before
    quiet.close()


def test_the_oldest_idle_reader_is_evicted_first(make_hub):
    limits = ConnectionLimits(max_clients=3, reserved=1, idle_timeout=30, command_timeout=0.5)
    hub = make_hub(limits=limits)
    reader = connect(hub)  # the oldest, but it reads
    steps: list[int] = []

    def read() -> None:
        for msg in reader:
            if isinstance(msg, Update | Event):
                steps.append(msg.step)

    threading.Thread(target=read, daemon=True).start()
    quiet = stalled_socket(hub)
    last = stall(hub)
    wait_for(lambda: last in steps)  # the reader has caught up: only `quiet` is stalled
    wait_for(lambda: hub.stats()["stalled_subscribers"] == 1)
    newcomer = connect(hub)  # every reader slot is taken: the idle one makes room
    assert hub.stats()["evicted_clients"] == 1 and eof(quiet)
    time.sleep(1.0)  # past command_timeout: the newcomer took a reader slot, not a reserved one
    hub.on_update(synthetic.update(5000))
    assert read_until(newcomer, last_step(5000))
    wait_for(lambda: 5000 in steps)
    reader.close()
    quiet.close()


def test_a_reserved_slot_is_kept_for_a_signed_command(make_hub, tmp_path):
    key = auth.create_key(tmp_path)
    limits = ConnectionLimits(max_clients=2, reserved=1, idle_timeout=30, command_timeout=0.5)
    hub = make_hub(commands=CommandQueue(), key=key, limits=limits)
    reader = RawPeer(hub)
    squatter = RawPeer(hub)  # the reserved slot, and it signs nothing
    error = squatter.reply()
    assert error.id == 0 and "no signed command came within 0.5 s" in error.error
    assert squatter.closed()
    wait_for(lambda: hub.stats()["subscribers"] == 1)

    holder = RawPeer(hub)  # the reserved slot again: a key holder, who signs at once
    # A good MAC makes it trusted, even for a command the run refuses (bad args).
    assert "takes no argument" in holder.command("pause", {"now": 1}, key=key).error
    time.sleep(1.0)  # past command_timeout: still there
    assert "takes no argument" in holder.command("pause", {"now": 2}, key=key, cid=2).error

    second = RawPeer(hub)  # full: the oldest that has not signed (the reader) makes room
    assert reader.closed() and hub.stats()["evicted_clients"] == 1
    second.command("pause", {"now": 3}, key=key)
    refused = socket.create_connection(hub.address)  # every slot holds a key holder
    assert refused.recv(100) == b"" and hub.stats()["refused_clients"] == 1
    refused.close()
