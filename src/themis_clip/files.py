"""Files as every layer walks and hashes them: one folder walker, one SHA-256 (a leaf module)."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "IMAGE_SUFFIXES",
    "JUNK",
    "NotARegularFileError",
    "open_regular",
    "sha256_of",
    "walk_images",
]

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"})
_CHUNK = 1 << 20


#: What NAS boxes, operating systems and phones leave beside photos: never photos, skipped by
#: default (Synology thumbnails, recycle bins and snapshots; macOS AppleDouble and Finder files;
#: Windows thumbnail caches and bins; Android trash). Hidden folders are skipped too.
JUNK = (
    "@eaDir",
    "#recycle",
    "#snapshot",
    "$RECYCLE.BIN",
    "System Volume Information",
    ".thumbnails",
    ".DS_Store",
    "Thumbs.db",
    "._*",
    ".trashed-*",
)


def walk_images(
    folder: Path,
    *,
    exclude: Sequence[str] = (),
    skipped: Counter[str] | None = None,
) -> list[Path]:
    """Image files under ``folder``, sorted, recursive.

    Skipped: hidden folders, :data:`JUNK`, and what matches a glob of ``exclude`` (against the
    name or the path relative to ``folder``); each skip is counted in ``skipped`` under its
    reason. A symlink is followed only where it leads inside ``folder`` (a link loop or a
    link out of it is a skip, never a hang or a walk of the whole disk).
    """
    root = folder.resolve()
    counts: Counter[str] = Counter() if skipped is None else skipped
    seen = {_identity(root)}
    out = []
    for here, dirs, files in os.walk(folder, followlinks=True):
        base = Path(here)
        kept = []
        # real folders first: a link to one of them is then the repeat, not the folder
        for name in sorted(dirs, key=lambda d: ((base / d).is_symlink(), d)):
            path = base / name
            reason = _skip(name, path.relative_to(folder), exclude) or (
                "hidden folder" if name.startswith(".") else _walked(path, root, seen)
            )
            if reason:
                counts[reason] += 1
            else:
                kept.append(name)
        dirs[:] = kept
        for name in files:
            path = base / name
            if path.suffix.lower() not in IMAGE_SUFFIXES and not name.startswith("._"):
                continue
            reason = _skip(name, path.relative_to(folder), exclude)
            if reason is None and path.is_symlink() and not _inside(path, root):
                reason = "link out of the folder"
            if reason:
                counts[reason] += 1
            else:
                out.append(path)
    return sorted(out)


def _skip(name: str, relative: Path, exclude: Sequence[str]) -> str | None:
    for pattern in JUNK:
        if fnmatch.fnmatchcase(name, pattern):
            return pattern
    for pattern in exclude:
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(relative.as_posix(), pattern):
            return f"--exclude {pattern}"
    return None


def _identity(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_dev, info.st_ino


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a loop of links, a dangling one
        return False


def _walked(path: Path, root: Path, seen: set[tuple[int, int]]) -> str | None:
    """Why a folder is not walked into: a link leading out of ``root``, or a folder walked
    already (a link loop, or a second way to one); None to walk it (and remember it)."""
    if path.is_symlink() and not _inside(path, root):
        return "link out of the folder"
    try:
        identity = _identity(path)
    except OSError:
        return "link out of the folder"
    if identity in seen:
        return "folder linked twice"
    seen.add(identity)
    return None


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
