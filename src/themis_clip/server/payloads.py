"""Request payload decoding and result checks shared by the routes."""

from __future__ import annotations

import base64
import binascii

from themis_clip.interface import EmbeddingResult
from themis_clip.server.errors import APIError, retry_headers, status_for_name

__all__ = ["decode_image_field", "raise_for", "vector"]


_URL_SCHEMES = ("http://", "https://", "file:", "ftp://", "ftps://", "s3://", "gs://")
_WHITESPACE = str.maketrans("", "", " \t\r\n")


def decode_image_field(value: str) -> bytes:
    """Bytes from a data URL or bare base64; URLs are refused (the server never fetches).

    Schemes compare case-insensitively (``HTTP://`` is a URL too); a data URL must declare an
    image MIME type (or none); base64 may be wrapped in lines (MIME's 76-column form).
    """
    head = value[:16].lstrip().lower()
    if head.startswith(_URL_SCHEMES):
        raise APIError(
            400,
            "URLNotAllowed",
            "image URLs are not fetched by this server; send a base64 data URL",
        )
    payload = value
    if head.startswith("data:"):
        header, sep, payload = value.lstrip().partition(",")
        params = header[5:].lower().split(";")
        if not sep or "base64" not in params[1:]:
            raise APIError(400, "BadDataURL", "image data URL must be 'data:<type>;base64,<data>'")
        mime = params[0].strip()
        if mime and not (mime.startswith("image/") or mime == "application/octet-stream"):
            raise APIError(
                415,
                "UnsupportedMediaType",
                f"data URL declares {mime[:64]!r}, not an image type (image/*)",
            )
    try:
        data = base64.b64decode(payload.translate(_WHITESPACE), validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "BadBase64", "image is not valid base64") from None
    if not data:
        raise APIError(422, "ImageDecodeError", "empty image data (0 bytes)")
    return data


def raise_for(result: EmbeddingResult, what: str = "input") -> None:
    if not result.ok:
        status = status_for_name(result.error_type)
        raise APIError(
            status,
            result.error_type or "Error",
            f"{what}: {result.error}",
            headers=retry_headers(status),
        )


def vector(result: EmbeddingResult) -> list[float]:
    assert result.embedding is not None
    return [float(v) for v in result.embedding]
