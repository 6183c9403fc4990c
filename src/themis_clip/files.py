"""Files as every layer walks, hashes and locks them: one folder walker, one SHA-256, one
inter-process file lock (``filelock``; a leaf module)."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "COMPANION_KEYS",
    "IMAGE_SUFFIXES",
    "JUNK",
    "RAW_SUFFIXES",
    "NotARegularFileError",
    "companion_paths",
    "file_lock",
    "open_regular",
    "pair_companions",
    "resolves_outside",
    "sha256_of",
    "walk_images",
]

#: Camera RAW files (read through their embedded preview; the ``photos`` extra).
RAW_SUFFIXES = frozenset({".cr2", ".cr3", ".nef", ".arw", ".dng", ".raf", ".orf", ".rw2"})
#: Files the walker takes as images (HEIC, HEIF, JXL and RAW need the ``photos`` extra).
IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".avif"}
    | {".heic", ".heif", ".jxl"}
    | RAW_SUFFIXES
)
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


#: The metadata keys naming an item's companion files (in its folder).
COMPANION_KEYS = ("raw", "raws", "live_video")


def companion_paths(path: Path, metadata: Mapping[str, object]) -> list[Path]:
    """The files recorded beside the item at ``path`` (:func:`pair_companions`' keys)."""
    names: list[object] = []
    for key in COMPANION_KEYS:
        value = metadata.get(key)
        names += value if isinstance(value, list) else [value]
    return [
        path.parent / n for n in dict.fromkeys(names) if isinstance(n, str) and n and "/" not in n
    ]


def pair_companions(
    paths: Sequence[Path],
) -> tuple[list[Path], dict[Path, dict[str, str | list[str]]]]:
    """One photo, several files: a RAW beside a JPEG (or HEIC, ...) of the same name is one
    item, the other file embedded and the RAW named beside it (``raw``; where there are
    several, ``raw`` is the first by name and ``raws`` lists them all); an iPhone Live
    Photo's still beside its ``.MOV`` names the video (``live_video``). Returns the files to
    embed and, for each that has some, its companions."""
    groups: dict[tuple[Path, str], list[Path]] = {}
    for path in paths:
        groups.setdefault((path.parent, path.stem.lower()), []).append(path)
    kept: list[Path] = []
    extra: dict[Path, dict[str, str | list[str]]] = {}
    for group in groups.values():
        raws = [p for p in group if p.suffix.lower() in RAW_SUFFIXES]
        stills = [p for p in group if p.suffix.lower() not in RAW_SUFFIXES]
        if raws and stills:
            raws.sort(key=lambda p: p.name)
            for still in stills:
                extra[still] = {"raw": raws[0].name}
                if len(raws) > 1:
                    extra[still]["raws"] = [p.name for p in raws]
            group = stills
        kept += group
        for still in group:
            if still.suffix.lower() in _LIVE_STILLS:
                video = next((v for v in _videos(still) if v.is_file()), None)
                if video is not None:
                    extra.setdefault(still, {})["live_video"] = video.name
    return sorted(kept), extra


_LIVE_STILLS = frozenset({".heic", ".heif", ".jpg", ".jpeg"})


def _videos(still: Path) -> tuple[Path, ...]:
    return (still.with_suffix(".MOV"), still.with_suffix(".mov"))


def _skip(name: str, relative: Path, exclude: Sequence[str]) -> str | None:
    for pattern in JUNK:  # Windows and SMB names come in any case ($Recycle.Bin, @EADIR)
        if fnmatch.fnmatchcase(name.lower(), pattern.lower()):
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


def resolves_outside(path: Path, *roots: Path) -> Path | None:
    """Where ``path`` leads once links are resolved, if that is inside none of ``roots``.

    Returns None when it stays inside one; a loop of links counts as outside (``path`` itself).
    The check a reader makes before trusting a file a folder hands it: a link can lead anywhere.
    """
    try:
        target = path.resolve()
        bases = [r.resolve() for r in roots]
    except (OSError, RuntimeError):  # a loop of links
        return path
    return None if any(target.is_relative_to(b) for b in bases) else target


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
