"""Files read by path: only regular files, and never more than a stated size.

A FIFO given where a file is expected blocks its open (and its read) until a writer comes, which may be never;
a device such as ``/dev/zero`` reads without end; a huge file fills memory. Every file gatewayscope reads by a
path the user gave (config, secrets, plans, journals, snapshots, id lists) goes through :func:`read_bytes` or
:func:`read_text`, which open without blocking, refuse anything but a regular file and stop at a limit. The
refusals are :class:`UnreadableFileError`, an ``OSError`` whose ``strerror`` is the sentence, so the callers'
``cannot read X: {err.strerror}`` wording stays as it is.
"""

from __future__ import annotations

import errno
import os
import stat

MiB = 1024 * 1024

#: the largest config file (TOML), env file or secret read
MAX_CONFIG_BYTES = 16 * MiB
#: the largest plan file read (a plan of a million deletes is a few hundred MiB)
MAX_PLAN_BYTES = 1024 * MiB
#: the largest journal read (every attempt and outcome of every apply into it)
MAX_JOURNAL_BYTES = 2048 * MiB
#: the largest snapshot manifest, and the largest file of ids, read
MAX_MANIFEST_BYTES = 64 * MiB
MAX_IDS_BYTES = 1024 * MiB

#: what a file that is not a regular one is, by its type
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class UnreadableFileError(OSError):
    """A file refused before or while reading it: not a regular file, or larger than the limit."""


def _size_text(limit: int) -> str:
    return f"{limit // MiB} MiB" if limit >= MiB and limit % MiB == 0 else f"{limit} bytes"


def kind_of(mode: int) -> str | None:
    """What a file of ``mode`` is when it is neither a regular file nor a folder (None for those)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return None


def check_regular(path: str | os.PathLike[str]) -> None:
    """Raise :class:`UnreadableFileError` when ``path`` exists and is neither a regular file nor a folder
    (a FIFO, a device, a socket), for files a library opens itself (SQLite, parquet): a missing file or a folder
    is left to the caller's own wording."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    kind = kind_of(mode)
    if kind is not None:
        raise UnreadableFileError(errno.EINVAL, f"it is {kind}, not a regular file", str(path))


def read_bytes(path: str | os.PathLike[str], *, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    Opened without blocking (a FIFO's open does not wait for a writer), then refused unless a regular file:
    :class:`UnreadableFileError` for a FIFO, a device or a socket, and for a file over ``limit`` bytes (read
    stops there, whatever its size said). Other ``OSError`` (FileNotFoundError, IsADirectoryError,
    PermissionError) come as the open or read raises them.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        kind = kind_of(mode)
        if kind is not None:
            raise UnreadableFileError(errno.EINVAL, f"it is {kind}, not a regular file", str(path))
        too_large = UnreadableFileError(errno.EFBIG, f"it is larger than {_size_text(limit)}, the most read of "
                                                     "such a file", str(path))
        if os.fstat(fd).st_size > limit:
            raise too_large
        chunks: list[bytes] = []
        total = 0
        while True:  # bounded: at most limit + 1 bytes are read
            chunk = os.read(fd, min(MiB, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise too_large
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], *, limit: int, encoding: str = "utf-8") -> str:
    """:func:`read_bytes` decoded (``UnicodeDecodeError`` when it is not ``encoding``)."""
    return read_bytes(path, limit=limit).decode(encoding)
