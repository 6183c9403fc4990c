"""SHA-256 of model files, in chunks so a multi-GB model never sits in memory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from themis_clip.errors import IntegrityError, ModelNotFoundError
from themis_clip.files import sha256_of

__all__ = ["HashFunction", "sha256_file", "verify_digest"]

#: A function returning the lowercase hex SHA-256 of a file (injectable, seed step 4).
HashFunction = Callable[[Path], str]


def sha256_file(path: Path) -> str:
    """Return the hex SHA-256 of ``path``, read in 1 MiB chunks."""
    try:
        return sha256_of(path)
    except FileNotFoundError as exc:
        raise ModelNotFoundError(f"model file not found: {path}") from exc


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
