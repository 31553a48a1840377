"""Files written whole or not at all, and their digests: the one owner for every package.

It sits in `telemetry` because that is the bottom layer every other package may import; it
needs nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import stat
from pathlib import Path


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """sha256 of a file, read in chunks so memory stays flat."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class NotRegular(OSError):
    """A path that is a FIFO, a device, a socket or a folder where a file was expected."""


def read_regular(path: str | os.PathLike[str], limit: int = 64 << 20) -> bytes:
    """The bytes of a regular file, at most `limit`; NotRegular for anything else.

    Opened without blocking (a FIFO planted where a manifest should be would otherwise hang
    the reader until someone writes to it) and checked on the open descriptor, so a file
    swapped in between cannot slip past the check.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise OSError(f"{path} is larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file's data to the disk (a crash after this cannot lose it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the renames inside a folder durable (POSIX); platforms that refuse it are ignored."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes | str, mode: int = 0o644) -> None:
    """Replace `path` by `data` in one rename: readers see the old file or the new one, whole.

    The temporary sibling is created exclusively with `mode` already set (a key file is never
    readable by others, not even for a moment), fsynced, then renamed over the target.
    """
    path = Path(path)
    blob = data.encode() if isinstance(data, str) else data
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, mode)
    try:
        os.fchmod(fd, mode)  # in case a umask or ACL changed the mode at creation
        view = memoryview(blob)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def replace_dir(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Put the finished folder `tmp` at `path`, deleting the folder it replaces only after.

    Two renames (the old folder aside, then the new one in): `path` never holds a mix of the
    two, and is missing only between the renames. It fsyncs the parent, not the files inside:
    callers that need the contents durable fsync them first.
    """
    tmp, path = Path(tmp), Path(path)
    if path.exists():
        old = path.parent / f".{path.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(path)
    fsync_dir(path.parent)
