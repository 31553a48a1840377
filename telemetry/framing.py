"""Bytes to msgpack objects and back, for one connection: the bottom layer of the protocol.

It imports no other layer (only the exception hierarchy); the size limits live here, and
`telemetry.protocol` re-exports them with the rest of the wire specification.
"""

from __future__ import annotations

from typing import Any

import msgpack

from telemetry.errors import ProtocolError

MAX_MESSAGE_BYTES = 1 << 20
FEED_SLICE = 64 << 10  # bytes fed to an Unpacker at a time; its buffer holds one message + this
START_BUFFER = 4 << 10  # an Unpacker's first buffer: a signed command is a few hundred bytes


def pack(obj: Any) -> bytes:
    """msgpack bytes of `obj`; values msgpack does not know (a Path, a numpy scalar) go as str."""
    return msgpack.packb(obj, use_bin_type=True, default=_as_str)


def _as_str(obj: Any) -> Any:
    item = getattr(obj, "item", None)  # numpy / mlx scalars
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    return str(obj)


class FramingError(ProtocolError):
    """The byte stream is not valid msgpack within the limits; the connection must close."""


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not part of the protocol")


class Decoder:
    """Feeds received bytes to one `msgpack.Unpacker` and returns the whole objects decoded.

    After its first error the decoder is spent (an Unpacker's state after an error is not
    trustworthy): every later `feed` raises, and the connection should be closed.
    """

    def __init__(self, max_message: int = MAX_MESSAGE_BYTES, start: int = START_BUFFER) -> None:
        self._unpacker = msgpack.Unpacker(
            max_buffer_size=max_message + FEED_SLICE,
            # The buffer it allocates up front (msgpack's default: 1 MiB, whatever comes):
            # small, grown by need up to the limit. A stranger's connection costs this.
            read_size=min(start, max_message + FEED_SLICE),
            max_str_len=max_message,
            max_bin_len=max_message,
            max_array_len=max_message,
            max_map_len=max_message // 2,
            raw=False,
            strict_map_key=True,
            ext_hook=_refuse_ext,
        )
        self._fed = 0
        self._end = 0  # stream offset just past the last whole object
        self.error: str | None = None

    @property
    def pending(self) -> int:
        """Bytes of an unfinished message held, waiting for the rest."""
        return self._fed - self._end

    def feed(self, data: bytes) -> list[Any]:
        """The objects completed by `data` (possibly none); FramingError on bad input."""
        if self.error is not None:
            raise FramingError(f"decoder already failed ({self.error}); open a new connection")
        out: list[Any] = []
        view = memoryview(data)
        try:
            # Small slices keep the Unpacker's buffer at one message + one slice, whatever
            # `data` holds; a message that alone outgrows it raises BufferFull.
            for start in range(0, len(view), FEED_SLICE):
                piece = view[start : start + FEED_SLICE]
                self._unpacker.feed(piece)
                self._fed += len(piece)
                for obj in self._unpacker:
                    # tell() also counts bytes of a half-parsed object; right after a
                    # yield it is exactly the end of that object.
                    self._end = self._unpacker.tell()
                    out.append(obj)
        except msgpack.BufferFull:
            self.error = f"message larger than {MAX_MESSAGE_BYTES} bytes"
        except Exception as e:  # any decode failure ends this connection alone
            self.error = _describe(e)
        if self.error is not None:
            raise FramingError(self.error)
        return out


def _describe(e: Exception) -> str:
    kind = type(e).__name__
    if isinstance(e, msgpack.exceptions.StackError):
        return "message nests too deeply"
    if isinstance(e, RecursionError):
        return "message nests too deeply"
    text = str(e)
    return f"undecodable msgpack ({kind}{': ' + text[:120] if text else ''})"


def encode(obj: Any) -> bytes:
    """msgpack bytes of one object (a message map); FramingError if it exceeds the limit."""
    data = pack(obj)
    if len(data) > MAX_MESSAGE_BYTES:
        raise FramingError(f"message is {len(data)} bytes; the limit is {MAX_MESSAGE_BYTES}")
    return data
