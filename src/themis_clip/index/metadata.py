"""Item metadata: bounded, strict JSON on the way in; never a failed query on the way out.

An item's metadata is a JSON object that the index stores as text, returns with every hit and
filters on (SQLite's JSON functions). One unchecked value could poison every later query: a
``NaN`` is not JSON (SQLite's ``json_extract`` then fails on the row, and so does every filtered
search), a lone surrogate cannot be encoded as UTF-8 (every response holding the item fails).
So :func:`validate_metadata` admits only what every reader can read back, within
:data:`LIMITS`; :func:`decode_stored` reads a row without ever raising; :func:`repair` rewrites
what an older version let in (run once, by the store's migration).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from themis_clip.errors import MetadataError
from themis_clip.jsonio import loads

__all__ = [
    "LIMITS",
    "MetadataLimits",
    "comparable",
    "decode_stored",
    "encode",
    "repair",
    "validate_filters",
    "validate_metadata",
]

log = logging.getLogger(__name__)

_INT_MAX = 2**63 - 1  # SQLite's integers; larger ones would come back as floats


@dataclass(frozen=True)
class MetadataLimits:
    """What one item's metadata may hold (documented in the README's HTTP section)."""

    max_bytes: int = 16 * 1024  # the object as compact UTF-8 JSON
    max_depth: int = 8  # nesting of objects and arrays, the top object being 1
    max_values: int = 1024  # every key and value, all levels together
    max_key_chars: int = 256
    max_filter_keys: int = 32


LIMITS = MetadataLimits()


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        lone = ord(text[exc.start])
        raise MetadataError(
            f"{where}: not valid Unicode (the lone surrogate \\u{lone:04x} at character "
            f"{exc.start} cannot be stored)"
        ) from None


def _walk(value: Any, where: str, depth: int, count: list[int], limits: MetadataLimits) -> None:
    count[0] += 1
    if count[0] > limits.max_values:
        raise MetadataError(f"{where}: more than {limits.max_values} keys and values in all")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > _INT_MAX:
            raise MetadataError(f"{where}: integer {value} does not fit in 64 bits")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MetadataError(f"{where}: {value} is not a JSON number (NaN and Infinity are not)")
        return
    if isinstance(value, str):
        _check_text(value, where)
        return
    if isinstance(value, list | tuple):
        if depth >= limits.max_depth:
            raise MetadataError(f"{where}: nested deeper than {limits.max_depth} levels")
        for i, item in enumerate(value):
            _walk(item, f"{where}[{i}]", depth + 1, count, limits)
        return
    if isinstance(value, Mapping):
        if depth >= limits.max_depth:
            raise MetadataError(f"{where}: nested deeper than {limits.max_depth} levels")
        for key, item in value.items():
            _check_key(key, where, limits)
            count[0] += 1
            _walk(item, f"{where}.{key}", depth + 1, count, limits)
        return
    raise MetadataError(f"{where}: {type(value).__name__} is not a JSON value")


def _check_key(key: Any, where: str, limits: MetadataLimits) -> None:
    if not isinstance(key, str):
        raise MetadataError(f"{where}: keys must be strings, got {type(key).__name__}")
    _check_text(key, f"{where}: key {key[:40]!r}")
    if not key or len(key) > limits.max_key_chars:
        raise MetadataError(f"{where}: keys must have 1 to {limits.max_key_chars} characters")


def validate_metadata(
    value: Any, *, where: str = "metadata", limits: MetadataLimits = LIMITS
) -> dict[str, Any] | None:
    """``value`` if it is storable metadata (a bounded JSON object, or None).

    Raises:
        MetadataError: naming the offending path and the limit.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise MetadataError(f"{where}: must be a JSON object, got {type(value).__name__}")
    # Depth 1 is the object itself: its values start at depth 1, so max_depth levels in all.
    _walk(value, where, 0, [0], limits)
    size = len(encode(value).encode("utf-8"))
    if size > limits.max_bytes:
        raise MetadataError(f"{where}: {size} bytes as JSON, more than {limits.max_bytes}")
    return dict(value)


def validate_filters(filters: Any, *, limits: MetadataLimits = LIMITS) -> dict[str, Any]:
    """Search filters (``{key: value}``, each key equal to its JSON value).

    Raises:
        MetadataError: not an object, too many keys, a key or value that no metadata can hold.
    """
    if not isinstance(filters, Mapping):
        raise MetadataError(f"filters: must be a JSON object, got {type(filters).__name__}")
    if len(filters) > limits.max_filter_keys:
        raise MetadataError(
            f"filters: {len(filters)} keys, at most {limits.max_filter_keys} in one search"
        )
    for key, value in filters.items():
        _check_key(key, "filters", limits)
        _walk(value, f"filters.{key}", 1, [0], limits)
        if isinstance(value, Mapping) and any(str(k).startswith("$") for k in value):
            raise MetadataError(
                f"filters.{key}: filters are equality only (an object with an operator never "
                f'equals a value); use "where" for operators: {{"where": {{"{key}": ...}}}}'
            )
    return dict(filters)


def comparable(value: Any) -> tuple[str, Any]:
    """A metadata value as ``(kind, SQL value)`` for equality filters, one rule for every level:
    1 and 1.0 are one number (SQL compares them equal), ``true`` is not 1 (another kind), and
    arrays and objects compare as canonical JSON in which integral floats are integers."""
    if value is None:
        return "null", None
    if isinstance(value, bool):
        return "bool", int(value)
    if isinstance(value, int | float):
        return "number", value
    if isinstance(value, str):
        return "text", value
    kind = "object" if isinstance(value, Mapping) else "array"
    canonical = json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"))
    return kind, canonical


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) <= _INT_MAX:
        return int(value)
    if isinstance(value, Mapping):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def encode(value: Mapping[str, Any] | Any) -> str:
    """Canonical JSON text: sorted keys, no NaN (raises ValueError), UTF-8 kept as is."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)


def decode_stored(text: str | None, *, key: str = "?") -> dict[str, Any] | None:
    """A stored row's metadata; a row that is not valid, storable JSON reads as None (logged)."""
    if not text:
        return None
    try:
        value = loads(text)  # the package's one strict-JSON rule
        return validate_metadata(value, limits=_READ_LIMITS)
    except (ValueError, MetadataError, RecursionError) as exc:
        log.warning("item %r: unreadable metadata ignored (%s)", key, exc)
        return None


def repair(text: str | None) -> str | None:
    """What an older version stored, made storable: the text to keep (None: drop it).

    NaN and ±Infinity become null, lone surrogates U+FFFD; anything that still fails the
    limits, or is not JSON at all, is dropped.
    """
    if not text:
        return text
    try:
        value = json.loads(text)  # lenient on purpose: NaN is what this repairs
    except (ValueError, RecursionError):
        return None
    fixed = _sanitise(value)
    try:
        validate_metadata(fixed, limits=_READ_LIMITS)
    except MetadataError:
        return None
    return encode(fixed)


# Rows are read back under looser size limits than new writes get, so that tightening a limit
# never hides metadata stored before; what cannot be served at all is still refused.
_READ_LIMITS = MetadataLimits(max_bytes=1 << 20, max_values=1 << 16, max_depth=64)


def _sanitise(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):  # json.loads pairs valid surrogates: what is left is lone
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    if isinstance(value, list):
        return [_sanitise(v) for v in value]
    if isinstance(value, dict):
        return {_sanitise(k): _sanitise(v) for k, v in value.items()}
    return value
