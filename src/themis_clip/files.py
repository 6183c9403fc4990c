"""Files as every layer walks and hashes them: one folder walker, one SHA-256 (a leaf module)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["IMAGE_SUFFIXES", "sha256_of", "walk_images"]

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


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks.

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
