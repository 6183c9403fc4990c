"""SHA-256 of model files, in chunks so a multi-GB model never sits in memory."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from themis_clip.errors import IntegrityError, ModelNotFoundError

__all__ = ["HashFunction", "sha256_file", "verify_digest"]

#: A function returning the lowercase hex SHA-256 of a file (injectable, seed step 4).
HashFunction = Callable[[Path], str]

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Return the hex SHA-256 of ``path``, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    except FileNotFoundError as exc:
        raise ModelNotFoundError(f"model file not found: {path}") from exc
    return digest.hexdigest()


def verify_digest(path: Path, expected: str, hash_fn: HashFunction = sha256_file) -> str:
    """Hash ``path`` and compare with ``expected``; return the digest.

    Raises:
        IntegrityError: the digests differ.
        ModelNotFoundError: the file does not exist.
    """
    actual = hash_fn(path).lower()
    if actual != expected.lower():
        raise IntegrityError(
            f"SHA-256 mismatch for {path}: expected {expected.lower()}, got {actual}"
        )
    return actual
