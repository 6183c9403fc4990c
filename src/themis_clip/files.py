"""Files as every layer walks, hashes and locks them: one folder walker, one SHA-256, one
inter-process file lock (``filelock``; a leaf module)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "IMAGE_SUFFIXES",
    "NotARegularFileError",
    "file_lock",
    "open_regular",
    "sha256_of",
    "walk_images",
]

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"})
_CHUNK = 1 << 20


def walk_images(folder: Path) -> list[Path]:
    """Image files under ``folder``, sorted: recursive, hidden folders skipped, symlinked
    folders not followed (a link loop cannot hang a walk)."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [Path(root) / f for f in files if Path(f).suffix.lower() in IMAGE_SUFFIXES]
    return sorted(out)


class NotARegularFileError(OSError):
    """A path (after its links) that is a FIFO, a device or a socket, not a file: opening or
    reading one may wait for ever (a FIFO with no writer) or never end (``/dev/zero``)."""


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``open(path, "rb")`` for regular files only: a FIFO is opened without waiting for a
    writer, then refused with the others.

    Raises:
        NotARegularFileError: ``path`` is a FIFO, a device or a socket.
        OSError: it cannot be opened (missing, a directory, no permission).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory", os.fspath(path))
        if not stat.S_ISREG(mode):
            raise NotARegularFileError(f"not a regular file ({_kind(mode)}): {os.fspath(path)}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def file_lock(path: Path, *, timeout_s: float = -1) -> Iterator[None]:
    """Hold the inter-process lock ``path`` (created, with its folder) for the block.

    Args:
        timeout_s: how long to wait for another holder; -1 waits for ever, 0 not at all.

    Raises:
        TimeoutError: another process (or thread) still held it after ``timeout_s``.
    """
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path, timeout=timeout_s):
        yield


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks.

    Raises:
        NotARegularFileError: ``path`` is a FIFO, a device or a socket.
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with open_regular(path) as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
