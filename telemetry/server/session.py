"""Control over a connection: the challenge its commands sign, the checks, and the hand-off.

`Session` is one connection's side (its challenge and its commands in flight); `CommandGate`
is the run's side (rank, key, the nonces seen, the queue to the training loop, the replies
coming back). Replies resolve on the training thread and are queued here for the loop
thread, which alone touches connections.
"""

from __future__ import annotations

import collections
import functools
import secrets
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from telemetry import auth, protocol
from telemetry.control import CommandQueue, CommandResult
from telemetry.errors import ProtocolError
from telemetry.records import Command, Reply
from telemetry.server.connection import Connection


class CommandGate:
    """Which commands reach the run, checked in the order protocol.py documents: first
    whether it proves the key (`unsigned`), then whether it may run (`refusal`)."""

    def __init__(
        self,
        *,
        rank: int,
        commands: CommandQueue | None,
        key: bytes | None,
        rank0_port: int | None,
        wake: Callable[[], None],
    ) -> None:
        self.rank = rank
        self.commands = commands
        self.key = key
        self.rank0_port = rank0_port
        self._wake = wake
        self._nonces: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._replies: collections.deque[tuple[Session, int, Future]] = collections.deque()

    def unsigned(self, cmd: Command, challenge: str) -> str:
        """Why this command does not prove the key on this connection, or "" if it does."""
        if self.rank != 0:
            where = f" (port {self.rank0_port})" if self.rank0_port else ""
            return f"control goes to rank 0{where}"
        if self.commands is None:
            return "this run takes no commands"
        if self.key is None:
            return "control is off: the run has no control key"
        if not cmd.mac:
            return "unsigned command: sign it with the run's key (RUN/control.key)"
        if not protocol.is_hex(cmd.nonce, protocol.NONCE_HEX):
            return f"bad nonce: expected {protocol.NONCE_HEX} lowercase hex digits"
        if not auth.verify(self.key, cmd.id, cmd.cmd, cmd.args, cmd.nonce, cmd.mac, challenge):
            return "bad signature: wrong key, or signed for another connection"
        return ""

    def refusal(self, cmd: Command, inflight: int) -> str:
        """Why a signed command is still refused, or "" (its nonce is remembered here)."""
        if cmd.nonce in self._nonces:
            return "replayed command: its nonce was used before"
        # Remembered only once the MAC is good, so strangers cannot flush the memory.
        self._nonces[cmd.nonce] = None
        if len(self._nonces) > protocol.NONCE_MEMORY:
            self._nonces.popitem(last=False)
        why = protocol.check_args(cmd.cmd, cmd.args)
        if why:
            return why
        if inflight >= protocol.MAX_INFLIGHT:
            return f"too many commands in flight on this connection (max {protocol.MAX_INFLIGHT})"
        return ""

    def submit(self, session: Session, cmd: Command) -> None:
        """Hand a checked command to the training loop; its reply comes back through `answer`."""
        assert self.commands is not None
        future = self.commands.submit(cmd.cmd, cmd.args)
        # Resolves on the training thread: queue the reply for the loop, don't wait for it.
        future.add_done_callback(functools.partial(self._resolved, session, cmd.id))

    def _resolved(self, session: Session, cmd_id: int, future: Future) -> None:
        # Any thread (usually the training thread): hand over and wake, nothing more.
        self._replies.append((session, cmd_id, future))
        self._wake()  # replies do not wait for the next batch

    def answer(self) -> None:
        """Queue the replies of commands the training loop has resolved (loop thread)."""
        while self._replies:
            session, cmd_id, future = self._replies.popleft()
            session.answered(cmd_id, future)


class Session:
    """One connection's control side: the challenge its commands sign, those in flight."""

    def __init__(self, conn: Connection, gate: CommandGate) -> None:
        self.conn = conn
        self.gate = gate
        self.challenge = secrets.token_hex(16)  # sent in this connection's hello
        self.inflight = 0

    def handle(self, obj: Any) -> None:
        """One decoded object from the client: a command, or a protocol error."""
        try:
            cmd = protocol.parse_command(obj)
        except ProtocolError as e:
            self.conn.fail(str(e))
            return
        why = self.gate.unsigned(cmd, self.challenge)
        if not why:
            self.conn.trust()  # a key holder: its slot is safe from newcomers
            why = self.gate.refusal(cmd, self.inflight)
        if why:
            self.reply(Reply(id=cmd.id, ok=False, error=why))
            return
        self.inflight += 1
        self.gate.submit(self, cmd)

    def reply(self, reply: Reply, flush: bool = True) -> None:
        self.conn.queue(protocol.encode_reply(reply))  # bounded: a refusal text may be huge
        if flush:
            self.conn.flush()

    def answered(self, cmd_id: int, future: Future) -> None:
        """A command of this session was resolved: reply, unless the client has gone."""
        self.inflight -= 1
        if not self.conn.closed:
            self.reply(reply_for(cmd_id, future), flush=False)  # the loop flushes them all


def reply_for(cmd_id: int, future: Future) -> Reply:
    """The reply for a resolved command future (a CommandResult, or an exception)."""
    if future.cancelled():
        return Reply(id=cmd_id, ok=False, error="cancelled")
    exc = future.exception()
    if exc is not None:
        return Reply(id=cmd_id, ok=False, error=f"failed: {exc}")
    res = future.result()
    if not isinstance(res, CommandResult):
        return Reply(id=cmd_id, ok=True, result={"value": res})
    result = dict(res.result)
    result["step"] = res.step
    return Reply(id=cmd_id, ok=res.ok, result=result, error=res.error)
