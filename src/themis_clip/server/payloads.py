"""Request payload decoding and result checks shared by the routes."""

from __future__ import annotations

import base64
import binascii

from themis_clip.interface import EmbeddingResult
from themis_clip.server.errors import APIError, status_for_name

__all__ = ["decode_image_field", "raise_for", "vector"]


def decode_image_field(value: str) -> bytes:
    """Bytes from a data URL or bare base64; URLs are refused (the server never fetches)."""
    if value.startswith(("http://", "https://", "file:", "ftp://")):
        raise APIError(
            400,
            "URLNotAllowed",
            "image URLs are not fetched by this server; send a base64 data URL",
        )
    payload = value
    if value.startswith("data:"):
        header, sep, payload = value.partition(",")
        if not sep or ";base64" not in header:
            raise APIError(400, "BadDataURL", "image data URL must be 'data:<type>;base64,<data>'")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "BadBase64", "image is not valid base64") from None
    if not data:
        raise APIError(422, "ImageDecodeError", "empty image data (0 bytes)")
    return data


def raise_for(result: EmbeddingResult, what: str = "input") -> None:
    if not result.ok:
        status = status_for_name(result.error_type)
        raise APIError(status, result.error_type or "Error", f"{what}: {result.error}")


def vector(result: EmbeddingResult) -> list[float]:
    assert result.embedding is not None
    return [float(v) for v in result.embedding]
