"""What both stores hold and check alike: the item dataclasses, a row's vector and metadata
made storable, a stored row read back, and a folder prefix as a ``LIKE`` pattern."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.errors import SearchIndexError
from themis_clip.index.lexical import fold
from themis_clip.index.metadata import decode_stored, encode, validate_metadata

__all__ = [
    "COLUMNS",
    "ItemRow",
    "StoredItem",
    "checked",
    "like_under",
    "ocr_row",
    "stored_item",
]

#: The columns :func:`stored_item` reads, in its order.
COLUMNS = "id, key, path, size, mtime_ns, sha256, metadata"


@dataclass(frozen=True, kw_only=True)
class ItemRow:
    """One item to store."""

    key: str
    vector: npt.NDArray[np.float32]
    path: str | None = None
    size: int | None = None
    mtime_ns: int | None = None
    sha256: str | None = None
    metadata: Mapping[str, Any] | None = None
    thumbnail: bytes | None = None


@dataclass(frozen=True, kw_only=True)
class StoredItem:
    id: int
    key: str
    path: str | None
    size: int | None
    mtime_ns: int | None
    sha256: str | None
    metadata: dict[str, Any] | None


def checked(row: ItemRow, dim: int) -> tuple[npt.NDArray[np.float32], str | None]:
    """``row``'s vector (little-endian float32) and metadata (canonical JSON), or the error
    naming what is wrong with them: nothing of a batch is written when one row is bad."""
    vec = np.ascontiguousarray(row.vector, dtype="<f4")
    if vec.shape != (dim,):
        raise SearchIndexError(f"item {row.key!r}: vector shape {vec.shape}, index dimension {dim}")
    if not np.all(np.isfinite(vec)):
        raise SearchIndexError(f"item {row.key!r}: the vector has NaN or infinite values")
    meta = validate_metadata(row.metadata, where=f"item {row.key!r}: metadata")
    return vec, encode(meta) if meta is not None else None


def like_under(prefix: str) -> str:
    """A ``LIKE ... ESCAPE '\\'`` pattern for the paths under the folder ``prefix``."""
    escaped = prefix.rstrip("/").replace("\\", "\\\\").replace("%", r"\%").replace("_", r"\_")
    return escaped + "/%"


def stored_item(row: Sequence[Any]) -> StoredItem:
    """A row of :data:`COLUMNS` as a :class:`StoredItem` (metadata read without raising)."""
    return StoredItem(
        id=int(row[0]),
        key=row[1],
        path=row[2],
        size=row[3],
        mtime_ns=row[4],
        sha256=row[5],
        metadata=decode_stored(row[6], key=row[1]),
    )


def ocr_row(data: Mapping[str, Any], *, key: str) -> tuple[str, str]:
    """An OCR reading (``{"width", "height", "gated", "lines": [{"text", "box",
    "confidence"}]}``) as ``(text, JSON)``: its lines' texts one per row, :func:`fold`-ed for
    search, and the reading as
    stored; or the error naming the item whose reading is not that shape."""
    try:
        lines = data["lines"]
        texts = [line["text"] for line in lines]
        boxes_ok = all(len(line["box"]) == 4 for line in lines)
    except (KeyError, TypeError) as exc:
        raise SearchIndexError(f"item {key!r}: not an OCR reading ({exc!r})") from None
    if not boxes_ok or not all(isinstance(t, str) for t in texts):
        raise SearchIndexError(f"item {key!r}: OCR lines need a text and a box of 4 points")
    text = fold("\n".join(texts))  # searched folded (lexical.fold); the lines keep the reading
    return text, json.dumps(data, ensure_ascii=False, separators=(",", ":"))
