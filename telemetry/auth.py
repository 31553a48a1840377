"""The per-run control key and the HMAC that proves a command came from someone who can read it."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from telemetry import rundir
from telemetry.errors import AuthError, ProtocolError
from telemetry.files import atomic_write
from telemetry.protocol import MAC_HEX, NONCE_HEX, is_hex, signed_bytes

KEY_FILE = rundir.CONTROL_KEY
KEY_BYTES = 32


def key_path(path_or_run_dir: str | os.PathLike[str]) -> Path:
    """The key file itself: `path` if it names a file, else `path/control.key`."""
    path = Path(path_or_run_dir)
    return path / KEY_FILE if path.is_dir() else path


def create_key(run_dir: str | os.PathLike[str]) -> bytes:
    """Make a fresh key in `run_dir/control.key` (mode 0600), replacing any old one, and return it.

    The file is written under a temporary name created 0600 with O_EXCL, then renamed into
    place, so the key is never readable by others, not even for a moment, nor half-written.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(KEY_BYTES)
    atomic_write(rundir.at(run_dir).control_key, key, mode=0o600)
    return key


def read_key(path_or_run_dir: str | os.PathLike[str]) -> bytes:
    """The key in a run folder (or a key file); AuthError if missing, malformed or too open."""
    path = key_path(path_or_run_dir)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise AuthError(
            f"no control key at {path} (is this a run folder? rank 0 makes the key when the "
            "run starts)"
        ) from None
    except OSError as e:
        raise AuthError(f"cannot read control key {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AuthError(f"control key {path} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise AuthError(
                f"permissions {mode:04o} for '{path}' are too open: the control key must be "
                f"readable by its owner only; refusing it (fix with: chmod 600 {path})"
            )
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        size = f"{len(data)} bytes" if len(data) < KEY_BYTES else f"over {KEY_BYTES} bytes"
        raise AuthError(
            f"control key {path} holds {size}, expected exactly {KEY_BYTES} (corrupt, or not a "
            "key file?)"
        )
    return data


def ensure_key(run_dir: str | os.PathLike[str]) -> bytes:
    """The run's key: the existing one when resuming a run (checked like `read_key`), else new."""
    if (path := rundir.at(run_dir).control_key).exists():
        return read_key(path)
    return create_key(run_dir)


def new_nonce() -> str:
    """A fresh nonce: 16 random bytes as 32 hex chars."""
    return secrets.token_hex(NONCE_HEX // 2)


def sign(
    key: bytes,
    id: int,
    cmd: str,
    args: dict[str, Any],
    nonce: str,
    challenge: str = "",
) -> str:
    """The hex HMAC-SHA256 of a command (see telemetry.protocol for the exact bytes covered)."""
    return hmac.new(key, signed_bytes(challenge, id, cmd, args, nonce), hashlib.sha256).hexdigest()


def verify(
    key: bytes,
    id: int,
    cmd: str,
    args: dict[str, Any],
    nonce: str,
    mac: str,
    challenge: str = "",
) -> bool:
    """Whether `mac` is the right MAC for this command, compared in constant time."""
    if not is_hex(mac, MAC_HEX):
        return False
    try:
        expected = sign(key, id, cmd, args, nonce, challenge)
    except ProtocolError:  # args that cannot be encoded canonically
        return False
    return hmac.compare_digest(expected, mac)
