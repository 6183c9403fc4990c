"""Model directories: our own layout (and later peers') resolved into one typed ``ModelSpec``."""

from __future__ import annotations

from themis_clip.models.hashing import HashFunction, sha256_file
from themis_clip.models.layout import MANIFEST_NAME, resolve_model
from themis_clip.models.spec import ImageSpec, ModelSpec

__all__ = [
    "MANIFEST_NAME",
    "HashFunction",
    "ImageSpec",
    "ModelSpec",
    "resolve_model",
    "sha256_file",
]
