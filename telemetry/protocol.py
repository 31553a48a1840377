"""The telemetry wire protocol, version 1: what travels on a rank's socket and how it is checked.

Transport
    Each rank serves TCP on ``127.0.0.1:(port_base + rank)`` (port_base 47800 by default; 0
    turns the socket off) and, when asked, a Unix socket ``RUN/telemetry/rank-N.sock``. Binding
    anything but loopback needs ``allow_remote=True`` and logs a warning; the intended way in
    from another machine is an SSH ``direct-tcpip`` channel to the loopback port. (In code,
    ``Hub(port=-1)`` binds any free port, for tests and benchmarks; read it from ``address``.)
    Any local user can connect and read the feed; only control is protected, by the key.
    Records are sent in batches at most every 0.1 s (``Hub(flush_interval=...)``): a record
    after a quiet spell goes at once, a fast run's records go several to a send. Replies
    to commands are never held back.

Framing
    Both directions are a plain stream of msgpack objects (msgpack >= 1.2.1, ``use_bin_type``,
    strings UTF-8), one object per message, no other framing. Every message is a map with a
    ``type`` key and string keys. Limits, per connection, enforced by one
    ``msgpack.Unpacker(max_buffer_size=MAX_MESSAGE_BYTES + FEED_SLICE)`` that is thrown away
    after its first error:

    - a message is at most ``MAX_MESSAGE_BYTES`` (1 MiB) encoded;
    - containers nest at most ``MAX_DEPTH`` (32) deep inside a message's fields;
    - msgpack ext types are not used: any but the timestamp closes the connection; a
      timestamp (which msgpack decodes itself) fails validation like any other wrong value;
    - a partial message may not sit unfinished for more than ``PARTIAL_TIMEOUT_S`` (30 s);
    - a connection that takes none of what it is sent for ``IDLE_TIMEOUT_S`` (60 s) is
      closed: it does not read;
    - a rank serves at most ``MAX_CLIENTS`` (64) connections, ``RESERVED_SLOTS`` (1) of them
      kept for control. When the rest are taken, a newcomer makes room by evicting the
      oldest idle reader that has not signed a command; failing that it takes a reserved
      slot and must sign a command within ``COMMAND_TIMEOUT_S`` (10 s); with the reserve
      taken too it evicts the oldest connection that has not signed. A connection that has
      sent a command with a good mac is never evicted; only a rank whose every slot holds
      one refuses a connection (closes it at once). Evicted and timed-out connections get
      an error ``reply`` with ``id`` 0 first, where it can be sent without waiting.

    Anything undecodable, oversized, too deep, not a map, without a known ``type``, or a type
    the receiver does not accept closes that connection only (a server first sends an error
    ``reply`` with ``id`` 0, best effort). Other connections and the run are not affected.

Server -> client (fields; ``?`` marks a field a newer peer may omit, which takes its default)
    ``hello``   first message on every connection. protocol (int, must equal ``VERSION``),
                run_id, rank, world_size, host, platform, chip, memory_total (bytes),
                local_batch, config_digest, backlog (number of ``update`` records that follow
                as history, oldest first), event_backlog? (number of ``event`` records that
                follow those, oldest first), challenge? (32 hex chars, fresh per connection:
                commands sent on this connection sign it).
    ``update``  one per optimizer update per rank; fields as ``telemetry.records.Update``
                (rank, step, tokens, update_tokens, local_tokens, loss, lr, grad_norm,
                local_batch, microsteps, compute_s, wait_s, transfer_s, optimizer_s,
                update_s, active_mem, peak_mem, cache_mem, sys_mem_used?, sys_mem_available?,
                swap_used?, mem_pressure? (0..1 or nil), tokens_per_s?, simulated?, time).
    ``event``   kind (one of ``records.EVENT_KINDS``), rank, step, message, data (map), time.
                ``data`` by kind: started {world_size, split, config_digest}; checkpoint
                {path, verified}; paused {}; resumed {}; rebalanced {from, to}; stopped
                {checkpoint}; eval {val_loss, val_tokens}; sample {prompt, text}; command
                {id, cmd, args, ok, error}; warning / error carry ``message``.
    ``dropped`` count (records this subscriber lost since the last notice), total (lost since
                it connected). Sent just before the first record after a loss. Records are
                lost only when this subscriber reads slower than the run produces: its own
                buffer (512 records) keeps the newest. The run never waits for a subscriber.
    ``reply``   id (the command's id; 0 for a protocol error), ok (bool), result (map; when
                applied, includes ``step``: the update boundary it took effect at), error (str,
                at most ``ERROR_TEXT_MAX`` characters: a longer text is cut, saying so). A
                result too large for the wire is replaced by {step?, truncated: why}.

Client -> server
    ``command`` id (int, chosen by the client, echoed in the reply), cmd (one of
                ``records.COMMANDS``), args (map), nonce (32 lowercase hex chars, 16 random
                bytes, never reused), mac (64 lowercase hex chars). Arguments by cmd:
                ``rebalance`` {split: [positive int per rank]}; ``autopilot`` {on: bool};
                the others take {}.
                Anything a client sends that is not a well-formed ``command`` is a protocol
                error (the connection is closed).

Control and its MAC
    Only rank 0 applies commands, and only if the run has a control key: 32 random bytes in
    ``RUN/control.key``, mode 0600, made at run start (``telemetry.auth``). Other ranks answer
    ``reply{ok: false, error: "control goes to rank 0 (port P)"}``.

    ``mac = hex(HMAC-SHA256(key, msgpack([MAC_DOMAIN, challenge, id, cmd, args, nonce])))``
    where ``MAC_DOMAIN`` is the string "mlx-fleet control v1", ``challenge`` is the one from
    this connection's ``hello``, and ``args`` is re-encoded with every map's keys sorted
    (recursively; lists keep their order; map keys must be strings). The server checks, in
    order, and answers a refused ``reply`` without touching the run for: not rank 0; no
    command queue; no key; no mac; a malformed nonce; a wrong mac; a nonce seen before; an
    unknown cmd; bad args; too many commands in flight on this connection (``MAX_INFLIGHT``).
    A nonce is remembered once its mac checks out (so strangers cannot flush the memory).
    A valid command is handed to the training loop, which applies it at the next update
    boundary; the reply is sent when it has been applied or refused there.

    Replay: a captured command only verifies on the connection whose challenge it signed, and
    the server remembers the last ``NONCE_MEMORY`` nonces it accepted in its lifetime, so a
    command can be replayed neither on another connection nor on its own. (The challenge
    replaces a timestamp: it bounds replay without trusting two machines' clocks to agree.)

Version
    ``VERSION`` changes when a message loses a field or a field changes meaning. Adding a
    field with a default does not change it: receivers ignore keys they do not know.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from telemetry.errors import ProtocolError

# The framing limits and `pack` live in the layer below; re-exported as part of the spec.
from telemetry.framing import FEED_SLICE as FEED_SLICE
from telemetry.framing import MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES
from telemetry.framing import pack as pack
from telemetry.records import (
    COMMANDS,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    Command,
    Event,
    Message,
    Reply,
)
from telemetry.split import shape_problem

VERSION = PROTOCOL_VERSION
DEFAULT_PORT_BASE = 47800
DEFAULT_BACKLOG = 256  # update records sent as history to a new subscriber
DEFAULT_EVENT_BACKLOG = 64  # event records sent as history after them
MAX_DEPTH = 32
MAX_CLIENTS = 64
MAX_INFLIGHT = 16  # commands of one connection waiting for the training loop
NONCE_MEMORY = 65536  # accepted nonces remembered (16 B each: about 3 MiB at most)
PARTIAL_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 60.0  # output untaken this long: the peer does not read
RESERVED_SLOTS = 1  # of MAX_CLIENTS, kept for a connection that signs a command
COMMAND_TIMEOUT_S = 10.0  # how long a connection in a reserved slot has to sign one
ERROR_TEXT_MAX = 500  # characters of a reply's error text; the rest is cut
NONCE_HEX = 32
MAC_HEX = 64
MAC_DOMAIN = "mlx-fleet control v1"

_HEX = frozenset("0123456789abcdef")


def as_map(message: Message) -> dict[str, Any]:
    """Like `message.to_msg()` without `dataclasses.asdict`'s deep copy: a rank encodes every
    update once per update on its server thread, and the copy was most of that cost."""
    out = {name: getattr(message, name) for name in _FIELD_NAMES[type(message)]}
    out["type"] = message.type
    return out


def encode(message: Message) -> bytes:
    """The wire bytes of one message; ProtocolError if it exceeds MAX_MESSAGE_BYTES."""
    data = pack(as_map(message))
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(
            f"{message.type} message is {len(data)} bytes; the limit is {MAX_MESSAGE_BYTES}"
        )
    return data


def encode_event(event: Event) -> bytes:
    """Like `encode`, but an event too large for the wire is sent with its payload cut short."""
    try:
        return encode(event)
    except ProtocolError as e:
        small = dataclasses.replace(event, message=event.message[:1000], data={"truncated": str(e)})
        return encode(small)


def encode_reply(reply: Reply) -> bytes:
    """Like `encode`, but bounded: the error text is cut to ERROR_TEXT_MAX characters, and a
    result too large for the wire is replaced, so every command gets its answer."""
    error = reply.error
    if len(error) > ERROR_TEXT_MAX:
        error = f"{error[: ERROR_TEXT_MAX - 40]}... ({len(error)} characters, cut)"
        reply = dataclasses.replace(reply, error=error)
    try:
        return encode(reply)
    except ProtocolError as e:
        result = {"truncated": str(e)}
        if isinstance(reply.result.get("step"), int):
            result["step"] = reply.result["step"]
        return encode(dataclasses.replace(reply, result=result))


def is_hex(value: Any, length: int) -> bool:
    """Whether `value` is a str of exactly `length` lowercase hex digits."""
    return isinstance(value, str) and len(value) == length and _HEX.issuperset(value)


_PLAIN = (str, int, float, bool, bytes, type(None))


def depth(obj: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of lists/maps in `obj`, counting stops just past `limit` (no recursion).

    A value that is not plain msgpack data (an ext type) counts as too deep: it is refused
    wherever depth is checked.
    """
    deepest = 0
    stack = [(obj, 0)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list | tuple):
            children = list(item)
        elif isinstance(item, _PLAIN):
            continue
        else:
            return limit + 1
        d += 1
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        stack.extend((c, d) for c in children)
    return deepest


def canonical(obj: Any) -> Any:
    """`obj` with every map's keys sorted (recursively), for a stable MAC; keys must be str."""
    if depth(obj) > MAX_DEPTH:
        raise ProtocolError(f"arguments nest deeper than {MAX_DEPTH}")
    return _canonical(obj)


def _canonical(obj: Any) -> Any:
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise ProtocolError("argument maps must have string keys")
        return {k: _canonical(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list | tuple):
        return [_canonical(v) for v in obj]
    return obj


def signed_bytes(challenge: str, id: int, cmd: str, args: dict[str, Any], nonce: str) -> bytes:
    """The exact bytes a command's MAC covers (see the module docstring)."""
    return pack([MAC_DOMAIN, challenge, id, cmd, canonical(args), nonce])


# --- typed decoding ---------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_CHECKS = {
    "int": _is_int,
    "float": _is_num,
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "float | None": lambda v: v is None or _is_num(v),
    "dict[str, Any]": lambda v: isinstance(v, dict) and depth(v) <= MAX_DEPTH,
}


def _schema(cls: type[Message]) -> list[tuple[str, Any, bool]]:
    out = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append((f.name, _CHECKS.get(str(f.type), lambda v: True), required))
    return out


_SCHEMAS = {name: _schema(cls) for name, cls in MESSAGE_TYPES.items()}
_FIELD_NAMES = {
    cls: tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    for cls in MESSAGE_TYPES.values()
}


def decode(obj: Any, accept: frozenset[str] | set[str] | None = None) -> Message:
    """The typed message for a decoded msgpack object; ProtocolError if it is not a valid one.

    `accept` limits the message types this receiver takes. Unknown keys are ignored; a known
    field of the wrong type, or a required field missing, is an error.
    """
    if not isinstance(obj, dict):
        raise ProtocolError(f"a message must be a map, not {type(obj).__name__}")
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        raise ProtocolError(f"unknown message type {short(kind)}")
    if accept is not None and kind not in accept:
        raise ProtocolError(f"unexpected {kind!r} message")
    values = {}
    for name, check, required in _SCHEMAS[kind]:
        if name not in obj:
            if required:
                raise ProtocolError(f"{kind} message lacks field {name!r}")
            continue
        value = obj[name]
        if not check(value):
            raise ProtocolError(f"{kind}.{name} has a bad value: {short(value)}")
        values[name] = value
    return MESSAGE_TYPES[kind](**values)


def parse_command(obj: Any) -> Command:
    """A `command` message, strictly checked (a missing mac is allowed: it is refused later)."""
    msg = decode(obj, accept={"command"})
    assert isinstance(msg, Command)
    if not isinstance(obj.get("args", {}), dict):
        raise ProtocolError("command.args must be a map")
    return msg


def check_args(cmd: str, args: dict[str, Any]) -> str:
    """Why `cmd` with `args` is refused, or "" if it is well formed."""
    if cmd not in COMMANDS:
        return f"unknown command {short(cmd)}; known: {', '.join(sorted(COMMANDS))}"
    if cmd == "rebalance":
        shape = shape_problem(args.get("split"))
        if shape:
            return f"rebalance needs args.split: {shape}"
        extra = set(args) - {"split"}
    elif cmd == "autopilot":
        if not isinstance(args.get("on"), bool):
            return f"autopilot needs args.on: true or false, got {short(args.get('on'))}"
        extra = set(args) - {"on"}
    else:
        extra = set(args)
    if extra:
        return f"{cmd} takes no argument(s) {', '.join(sorted(map(short, extra)))}"
    return ""


def short(value: Any, limit: int = 60) -> str:
    """A bounded, non-recursive description of an untrusted value, for error messages."""
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        text = repr(value)
        return text if len(text) <= limit else text[: limit - 3] + "..."
    if (
        isinstance(value, list | tuple)
        and len(value) <= 16
        and all(isinstance(v, int | float | bool) or v is None for v in value)
    ):
        return short(str(list(value)), limit).strip("'")
    if isinstance(value, dict | list | tuple):
        return f"<{type(value).__name__} of {len(value)}>"
    return f"<{type(value).__name__}>"
