"""The ``where`` filter language: Chroma/Mongo-style operators over item metadata.

A ``where`` is a JSON object. At its top level, ``{"$and": [w, ...]}``, ``{"$or": [w, ...]}``
and ``{"$not": w}`` combine filters, and ``{"$has_text": true}`` (or ``false``) asks for items
in which OCR read some text (or none, or that were never read); every other key is a dotted
path into the metadata (``"camera.make"``; each segment an object key) with either a value
(``$eq``) or an object of operators: ``$eq $ne $gt $gte $lt $lte $in $nin $exists $not``
and, on an object holding ``lat`` and ``lon``, ``$near: {"lat", "lon", "km"}`` (great-circle
distance). Several keys in one object must all hold.

Values: ``$eq $ne $in $nin`` take scalars (null, booleans, numbers, strings); ``$gt $gte
$lt $lte`` take numbers or ISO 8601 dates. A string that is an ISO 8601 date or date-time is
compared as an instant wherever it appears: an offset is honoured (``+02:00``, ``Z``), a time
without one is UTC, a date without a time is that day's start. ``$ne`` and ``$nin`` match
items that lack the path; every other operator needs it. 1 and 1.0 are one number, ``true``
is not 1.

:func:`parse_where` checks a filter against :data:`WHERE_LIMITS` into a small tree (raising
:class:`~themis_clip.errors.WhereError` naming the path); :mod:`.wheresql` compiles the tree
into a boolean SQL expression for either store, every path and value a bound parameter.

``filters`` (``{key: value}``: each top-level key equal to its JSON value, arrays and objects
compared whole) are sugar for ``where``: :func:`with_filters` turns them into :class:`Equals`
terms of the same tree, so the stores and searchers know one filter system.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from themis_clip.errors import WhereError
from themis_clip.index.metadata import validate_filters

__all__ = [
    "EARTH_KM",
    "INDEXED_PATHS",
    "ORDER_SQL",
    "WHERE_LIMITS",
    "And",
    "Compare",
    "Equals",
    "Exists",
    "HasText",
    "Near",
    "Not",
    "Or",
    "Where",
    "WhereLimits",
    "equals_keys",
    "parse_instant",
    "parse_where",
    "with_filters",
]

#: The mean Earth radius (IUGG), for great-circle distances.
EARTH_KM = 6371.0088
#: Paths with expression indexes in both stores (constant SQL text, never user text).
INDEXED_PATHS = (("taken",), ("gps", "lat"), ("gps", "lon"), ("camera", "make"))


@dataclass(frozen=True, kw_only=True)
class WhereLimits:
    max_nodes: int = 64  # operators and paths, all levels together
    max_depth: int = 8
    max_in: int = 256  # values in one $in / $nin
    max_segments: int = 8
    max_key_chars: int = 256


WHERE_LIMITS = WhereLimits()

Path = tuple[str, ...]
Scalar = None | bool | int | float | str


@dataclass(frozen=True, kw_only=True)
class Compare:
    """``path op value``: ``op`` one of eq, ne, gt, gte, lt, lte, in, nin."""

    path: Path
    op: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True, kw_only=True)
class Exists:
    path: Path
    present: bool


@dataclass(frozen=True, kw_only=True)
class HasText:
    """``$has_text``: whether OCR read some text in the item (not a metadata path)."""

    present: bool


@dataclass(frozen=True, kw_only=True)
class Near:
    path: Path
    lat: float
    lon: float
    km: float


@dataclass(frozen=True, kw_only=True)
class And:
    parts: tuple[Where, ...]


@dataclass(frozen=True, kw_only=True)
class Or:
    parts: tuple[Where, ...]


@dataclass(frozen=True, kw_only=True)
class Not:
    part: Where


@dataclass(frozen=True, kw_only=True)
class Equals:
    """A top-level metadata ``key`` equal to ``value`` as JSON (one ``filters`` term): 1 and
    1.0 are one number, ``true`` is not 1, arrays and objects are compared whole."""

    key: str
    value: Any


Where = Compare | Exists | HasText | Near | Equals | And | Or | Not

_COMPARE = {"$eq": "eq", "$ne": "ne", "$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}
ORDER_SQL = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_DATE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?(?:Z|[+-]\d{2}:\d{2})?)?"
)


def parse_instant(text: str) -> datetime | None:
    """An ISO 8601 date or date-time as an aware UTC instant (None: not one)."""
    if not _DATE.fullmatch(text):
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return when.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00: before year 1 in UTC
        return None


def _label(key: Any) -> str:
    """A key as it may appear in an error message: valid Unicode, at most 80 characters."""
    text = key if isinstance(key, str) else repr(key)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= 80 else f"{text[:77]}..."


class _Parser:
    def __init__(self, limits: WhereLimits) -> None:
        self.limits = limits
        self.nodes = 0

    def count(self, where: str) -> None:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise WhereError(where, f"more than {self.limits.max_nodes} operators and paths")

    def where(self, value: Any, at: str, depth: int) -> Where:
        if depth > self.limits.max_depth:
            raise WhereError(at, f"nested deeper than {self.limits.max_depth} levels")
        if not isinstance(value, Mapping):
            raise WhereError(at, f"must be a JSON object, got {_kind(value)}")
        parts: list[Where] = []
        for key, operand in value.items():
            self.count(at)
            here = f"{at}.{_label(key)}"
            if key in ("$and", "$or"):
                if not isinstance(operand, list) or not operand:
                    raise WhereError(here, "expects a non-empty array of filters")
                subs = tuple(
                    self.where(w, f"{here}[{i}]", depth + 1) for i, w in enumerate(operand)
                )
                parts.append(And(parts=subs) if key == "$and" else Or(parts=subs))
            elif key == "$not":
                parts.append(Not(part=self.where(operand, here, depth + 1)))
            elif key == "$has_text":
                if not isinstance(operand, bool):
                    raise WhereError(here, f"expects true or false, got {_kind(operand)}")
                parts.append(HasText(present=operand))
            elif isinstance(key, str) and key.startswith("$"):
                raise WhereError(here, "unknown operator (top level: $and, $or, $not, $has_text)")
            else:
                parts.append(self.field(self.path(key, here), operand, here, depth + 1))
        if not parts:
            raise WhereError(at, "an empty filter")
        return parts[0] if len(parts) == 1 else And(parts=tuple(parts))

    def path(self, key: Any, at: str) -> Path:
        if not isinstance(key, str) or not key:
            raise WhereError(at, "a path must be a non-empty string")
        segments = tuple(key.split("."))
        if len(segments) > self.limits.max_segments:
            raise WhereError(at, f"more than {self.limits.max_segments} path segments")
        for s in segments:
            if not s or len(s) > self.limits.max_key_chars:
                raise WhereError(at, f"path segments have 1 to {self.limits.max_key_chars} chars")
            if '"' in s or "\\" in s or "\x00" in s:  # SQLite's JSON paths cannot quote them
                raise WhereError(at, 'path segments cannot hold ", \\ or NUL')
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise WhereError(at, "not valid Unicode") from None
        return segments

    def field(self, path: Path, operand: Any, at: str, depth: int) -> Where:
        if not (isinstance(operand, Mapping) and any(str(k).startswith("$") for k in operand)):
            return Compare(path=path, op="eq", values=(self.scalar(operand, at),))
        if depth > self.limits.max_depth:
            raise WhereError(at, f"nested deeper than {self.limits.max_depth} levels")
        parts: list[Where] = []
        for op, value in operand.items():
            self.count(at)
            here = f"{at}.{_label(op)}"
            if op in _COMPARE:
                kind = _COMPARE[op]
                scalar = self.scalar(value, here)
                if kind in ORDER_SQL and not _orderable(scalar):
                    raise WhereError(here, f"expects a number or an ISO 8601 date, got {scalar!r}")
                parts.append(Compare(path=path, op=kind, values=(scalar,)))
            elif op in ("$in", "$nin"):
                if not isinstance(value, list):
                    raise WhereError(here, f"expects an array, got {_kind(value)}")
                if len(value) > self.limits.max_in:
                    raise WhereError(here, f"more than {self.limits.max_in} values")
                values = tuple(self.scalar(v, f"{here}[{i}]") for i, v in enumerate(value))
                parts.append(Compare(path=path, op=op[1:], values=values))
            elif op == "$exists":
                if not isinstance(value, bool):
                    raise WhereError(here, f"expects true or false, got {_kind(value)}")
                parts.append(Exists(path=path, present=value))
            elif op == "$not":
                if not isinstance(value, Mapping):
                    raise WhereError(here, f"expects an object of operators, got {_kind(value)}")
                parts.append(Not(part=self.field(path, value, here, depth + 1)))
            elif op == "$near":
                parts.append(self.near(path, value, here))
            else:
                raise WhereError(here, "unknown operator")
        return parts[0] if len(parts) == 1 else And(parts=tuple(parts))

    def scalar(self, value: Any, at: str) -> Scalar:
        if value is None or isinstance(value, bool | str):
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise WhereError(at, "not valid Unicode") from None
            return value
        if isinstance(value, int | float):
            if isinstance(value, float) and not math.isfinite(value):
                raise WhereError(at, "NaN and Infinity are not numbers")
            if isinstance(value, int) and abs(value) > 2**63 - 1:
                raise WhereError(at, "integer does not fit in 64 bits")
            return value
        raise WhereError(at, f"expects a null, boolean, number or string, got {_kind(value)}")

    def near(self, path: Path, value: Any, at: str) -> Near:
        if not isinstance(value, Mapping) or set(value) != {"lat", "lon", "km"}:
            raise WhereError(at, 'expects {"lat": deg, "lon": deg, "km": radius}')
        nums = {}
        for name, low, high in (("lat", -90, 90), ("lon", -180, 180), ("km", 0, math.inf)):
            v = value[name]
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise WhereError(f"{at}.{name}", f"expects a finite number, got {_kind(v)}")
            if not low <= v <= high or (name == "km" and v <= 0):
                raise WhereError(f"{at}.{name}", f"{v} is out of range")
            nums[name] = float(v)
        return Near(path=path, lat=nums["lat"], lon=nums["lon"], km=nums["km"])


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__ if value is not None else "null"


def _orderable(value: Scalar) -> bool:
    if isinstance(value, str):
        return parse_instant(value) is not None
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_where(value: Any, *, limits: WhereLimits = WHERE_LIMITS) -> Where:
    """Check ``value`` (a decoded JSON ``where``) into a tree.

    Raises:
        WhereError: an unknown operator, a wrong operand type, a bad date, a limit passed;
            the message names the path (``where.$or[1].taken.$gte``).
    """
    return _Parser(limits).where(value, "where", 1)


def with_filters(
    filters: Mapping[str, Any] | None, where: Mapping[str, Any] | Where | None = None
) -> Where | None:
    """``filters`` and ``where`` as one tree (None: no filter): every key of ``filters`` an
    :class:`Equals` term, all of them and ``where`` required.

    Raises:
        MetadataError: ``filters`` that no metadata can hold (:func:`.validate_filters`).
        WhereError: a bad ``where`` (:func:`parse_where`).
    """
    condition = parse_where(where) if isinstance(where, Mapping) else where
    parts: list[Where] = [
        Equals(key=k, value=v) for k, v in validate_filters(filters or {}).items()
    ]
    if condition is not None:
        parts.append(condition)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else And(parts=tuple(parts))


def equals_keys(where: Where | None) -> list[str]:
    """The keys of the :class:`Equals` terms in ``where`` (what a search checks the index
    has when it finds nothing: a filter on a key no item has is a mistake)."""
    if isinstance(where, Equals):
        return [where.key]
    if isinstance(where, And):
        return [k for part in where.parts for k in equals_keys(part)]
    return []
