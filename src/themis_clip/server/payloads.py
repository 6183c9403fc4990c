"""Request payload decoding and result checks shared by the routes."""

from __future__ import annotations

import asyncio
import base64
import binascii

from themis_clip.interface import EmbeddingResult
from themis_clip.server.errors import APIError, retry_headers, status_for_name

__all__ = [
    "check_filters",
    "check_key",
    "check_text",
    "decode_image_field",
    "decode_image_fields",
    "raise_for",
    "vector",
]


_URL_SCHEMES = ("http://", "https://", "file:", "ftp://", "ftps://", "s3://", "gs://")
_WHITESPACE = str.maketrans("", "", " \t\r\n")
#: fields at least this long in all are decoded in a worker thread (decode_image_fields)
_OFF_LOOP_CHARS = 1 << 16


def decode_image_field(value: str) -> bytes:
    """Bytes from a data URL or bare base64; URLs are refused (the server never fetches).

    Schemes compare case-insensitively (``HTTP://`` is a URL too); a data URL must declare an
    image MIME type (or none); base64 may be wrapped in lines (MIME's 76-column form), and
    padding may only end it.
    """
    head = value[:16].lstrip().lower()
    if head.startswith(_URL_SCHEMES):
        raise APIError(
            400,
            "URLNotAllowed",
            "image URLs are not fetched by this server; send a base64 data URL",
        )
    start = 0
    if head.startswith("data:"):
        comma = value.find(",")  # the header is short: no copy of the payload
        header = value[:comma].lstrip() if comma >= 0 else ""
        params = header[5:].lower().split(";")
        if comma < 0 or "base64" not in params[1:]:
            raise APIError(400, "BadDataURL", "image data URL must be 'data:<type>;base64,<data>'")
        mime = params[0].strip()
        if mime and not (mime.startswith("image/") or mime == "application/octet-stream"):
            raise APIError(
                415,
                "UnsupportedMediaType",
                f"data URL declares {mime[:64]!r}, not an image type (image/*)",
            )
        start = comma + 1
    payload = value[start:]
    if any(c in payload for c in " \t\r\n"):  # a scan per character is fast; translate is not
        payload = payload.translate(_WHITESPACE)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "BadBase64", "image is not valid base64") from None
    if not data:
        raise APIError(422, "ImageDecodeError", "empty image data (0 bytes)")
    return data


async def decode_image_fields(values: list[str]) -> list[bytes]:
    """:func:`decode_image_field` of each value; large ones in a worker thread."""
    if sum(len(v) for v in values) < _OFF_LOOP_CHARS:
        return [decode_image_field(v) for v in values]
    return await asyncio.to_thread(lambda: [decode_image_field(v) for v in values])


#: an item id's picture routes: an id ending so would be read as another item's picture
_PICTURE_SUFFIXES = ("/thumbnail", "/preview")


def check_text(value: str, where: str) -> None:
    """422 for a string that cannot be encoded (a lone surrogate, from a ``\\udXXX`` escape):
    it would fail later, as a 500, when the answer echoes it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(
            422,
            "ValidationError",
            f"{where}: not valid Unicode (a lone surrogate at character {exc.start})",
        ) from None


def check_key(value: str, where: str, *, new: bool = False) -> None:
    """422 for an item id no store can hold or no route can read back: NUL (PostgreSQL's text
    cannot hold it), other control characters (a newline never matches the item routes), a
    lone surrogate; with ``new`` (an id being added), an id ending in ``/thumbnail`` or
    ``/preview``, which the picture routes would read as another item's."""
    check_text(value, where)
    bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        kind = "NUL" if bad == "\0" else f"control character U+{ord(bad):04X}"
        raise APIError(422, "ValidationError", f"{where}: an id may not contain {kind}")
    if new and value.endswith(_PICTURE_SUFFIXES):
        raise APIError(
            422,
            "ValidationError",
            f"{where}: an id may not end in '/thumbnail' or '/preview' "
            "(those paths read an item's pictures)",
        )


def check_filters(filters: dict[str, object] | None) -> None:
    """422 for NUL in a filter key or string value (both stores; PostgreSQL cannot hold it)."""
    for key, value in (filters or {}).items():
        for what, text in (("key", key), ("value", value)):
            if isinstance(text, str) and "\0" in text:
                raise APIError(
                    422, "ValidationError", f"filters: a {what} may not contain NUL ({key!r})"
                )


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
