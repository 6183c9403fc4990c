"""The ``where`` filter language: Chroma/Mongo-style operators over item metadata.

One room (about 500 lines) on purpose: the parser and both dialects' compilers must agree
term by term, so they are read side by side.

A ``where`` is a JSON object. At its top level, ``{"$and": [w, ...]}``, ``{"$or": [w, ...]}``
and ``{"$not": w}`` combine filters; every other key is a dotted path into the metadata
(``"camera.make"``; each segment an object key) with either a value (``$eq``) or an object of
operators: ``$eq $ne $gt $gte $lt $lte $in $nin $exists $not`` and, on an object holding
``lat`` and ``lon``, ``$near: {"lat", "lon", "km"}`` (great-circle distance). Several keys in
one object must all hold.

Values: ``$eq $ne $in $nin`` take scalars (null, booleans, numbers, strings); ``$gt $gte
$lt $lte`` take numbers or ISO 8601 dates. A string that is an ISO 8601 date or date-time is
compared as an instant wherever it appears: an offset is honoured (``+02:00``, ``Z``), a time
without one is UTC, a date without a time is that day's start. ``$ne`` and ``$nin`` match
items that lack the path; every other operator needs it. 1 and 1.0 are one number, ``true``
is not 1.

:func:`parse_where` checks a filter against :data:`WHERE_LIMITS` into a small tree (raising
:class:`~themis_clip.errors.WhereError` naming the path); :func:`compile_sqlite` and
:func:`compile_postgres` turn the tree into a boolean SQL expression in which every path and
value is a bound parameter. The only paths written into SQL text are the constant ones that
the stores index (:data:`INDEXED_PATHS`), so those filters use the expression indexes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from themis_clip.errors import WhereError

__all__ = [
    "EARTH_KM",
    "INDEXED_PATHS",
    "WHERE_LIMITS",
    "And",
    "Compare",
    "Exists",
    "Near",
    "Not",
    "Or",
    "Where",
    "WhereLimits",
    "compile_postgres",
    "compile_sqlite",
    "parse_instant",
    "parse_where",
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


Where = Compare | Exists | Near | And | Or | Not

_COMPARE = {"$eq": "eq", "$ne": "ne", "$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}
_ORDER = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
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
    return when.astimezone(UTC)


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
            here = f"{at}.{key}"
            if key in ("$and", "$or"):
                if not isinstance(operand, list) or not operand:
                    raise WhereError(here, "expects a non-empty array of filters")
                subs = tuple(
                    self.where(w, f"{here}[{i}]", depth + 1) for i, w in enumerate(operand)
                )
                parts.append(And(parts=subs) if key == "$and" else Or(parts=subs))
            elif key == "$not":
                parts.append(Not(part=self.where(operand, here, depth + 1)))
            elif isinstance(key, str) and key.startswith("$"):
                raise WhereError(here, "unknown operator (top level: $and, $or, $not)")
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
            if '"' in s or "\\" in s:  # SQLite's JSON paths cannot quote them
                raise WhereError(at, 'path segments cannot hold " or \\')
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
            here = f"{at}.{op}"
            if op in _COMPARE:
                kind = _COMPARE[op]
                scalar = self.scalar(value, here)
                if kind in _ORDER and not _orderable(scalar):
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
                raise WhereError(f"{at}.{name}", f"expects a number, got {_kind(v)}")
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


def _box(near: Near) -> tuple[float, float, list[tuple[float, float]] | None]:
    """A latitude range and longitude ranges (None: every longitude) that hold the circle
    (the exact bounds of a spherical cap, widened by a hair for rounding)."""
    d = near.km / EARTH_KM
    dlat = math.degrees(d) + 1e-9
    lat_lo, lat_hi = near.lat - dlat, near.lat + dlat
    if lat_lo <= -90 or lat_hi >= 90:  # a pole is inside: every longitude
        return max(lat_lo, -90.0), min(lat_hi, 90.0), None
    ratio = math.sin(d) / math.cos(math.radians(near.lat))
    if ratio >= 1:
        return lat_lo, lat_hi, None
    dlon = math.degrees(math.asin(ratio)) + 1e-9
    lo, hi = near.lon - dlon, near.lon + dlon
    if lo < -180:
        return lat_lo, lat_hi, [(lo + 360, 180.0), (-180.0, hi)]
    if hi > 180:
        return lat_lo, lat_hi, [(lo, 180.0), (-180.0, hi - 360)]
    return lat_lo, lat_hi, [(lo, hi)]


class _Compiler:
    """Shared shape of both dialects; subclasses say how a path's value is read."""

    mark = "?"
    true, false = "1", "0"

    def __init__(self) -> None:
        self.params: list[Any] = []

    def bind(self, value: Any) -> str:
        self.params.append(value)
        return self.mark

    def sql(self, node: Where) -> str:
        if isinstance(node, And):
            return "(" + " AND ".join(self.sql(p) for p in node.parts) + ")"
        if isinstance(node, Or):
            return "(" + " OR ".join(self.sql(p) for p in node.parts) + ")"
        if isinstance(node, Not):  # NULL (no such value) is false everywhere else: here too
            return f"(NOT COALESCE({self.sql(node.part)}, {self.false}))"
        if isinstance(node, Exists):
            return self.exists(node.path) if node.present else f"(NOT {self.exists(node.path)})"
        if isinstance(node, Near):
            return self.near(node)
        if node.op in ("eq", "in"):
            return self.any_equal(node.path, node.values)
        if node.op in ("ne", "nin"):
            return f"(NOT COALESCE({self.any_equal(node.path, node.values)}, {self.false}))"
        (value,) = node.values
        if isinstance(value, str):
            instant = parse_instant(value)
            assert instant is not None  # the parser admits only dates here
            lhs, op = self.instant(node.path), _ORDER[node.op]
            return f"({lhs} {op} {self.when(instant)})"
        return f"({self.number(node.path)} {_ORDER[node.op]} {self.bind(value)})"

    def any_equal(self, path: Path, values: tuple[Scalar, ...]) -> str:
        if not values:
            return self.false
        return "(" + " OR ".join(self.equal(path, v) for v in values) + ")"

    least = "min"  # SQLite's two-argument min(); PostgreSQL's LEAST

    def near(self, near: Near) -> str:
        # Parameters bind in the order the text uses them: each expression is made in place.
        lat_p, lon_p = (*near.path, "lat"), (*near.path, "lon")
        lat_lo, lat_hi, lons = _box(near)
        terms = [f"{self.number(lat_p)} BETWEEN {self.bind(lat_lo)} AND {self.bind(lat_hi)}"]
        if lons is not None:
            ranges = [
                f"{self.number(lon_p)} BETWEEN {self.bind(lo)} AND {self.bind(hi)}"
                for lo, hi in lons
            ]
            terms.append("(" + " OR ".join(ranges) + ")")
        rlat, rlon = math.radians(near.lat), math.radians(near.lon)
        a = f"power(sin((radians({self.number(lat_p)}) - {self.bind(rlat)}) / 2), 2)"
        b = (
            f"{self.bind(math.cos(rlat))} * cos(radians({self.number(lat_p)})) * "
            f"power(sin((radians({self.number(lon_p)}) - {self.bind(rlon)}) / 2), 2)"
        )
        terms.append(
            f"2 * {EARTH_KM} * asin({self.least}(1.0, sqrt({a} + {b}))) <= {self.bind(near.km)}"
        )
        return "(" + " AND ".join(terms) + ")"

    # dialect parts
    def exists(self, path: Path) -> str:
        raise NotImplementedError

    def equal(self, path: Path, value: Scalar) -> str:
        raise NotImplementedError

    def number(self, path: Path) -> str:
        raise NotImplementedError

    def instant(self, path: Path) -> str:
        raise NotImplementedError

    def when(self, instant: datetime) -> str:
        raise NotImplementedError


class _SQLite(_Compiler):
    """Over ``items.metadata`` (JSON text) with SQLite's JSON functions."""

    def json_path(self, path: Path) -> str:
        if path in INDEXED_PATHS:  # constant text: the expression indexes match it
            return "'$." + ".".join(path) + "'"
        return self.bind("$" + "".join(f'."{s}"' for s in path))

    # Every SQLite leaf first checks json_valid: one row of malformed JSON (written by hand or
    # by another tool) must match nothing, not fail the query or the index's upkeep.
    def exists(self, path: Path) -> str:
        return f"({_VALID} AND json_type(metadata, {self.json_path(path)}) IS NOT NULL)"

    def equal(self, path: Path, value: Scalar) -> str:
        if isinstance(value, str) and (instant := parse_instant(value)) is not None:
            return f"({self.instant(path)} = {self.when(instant)})"
        if value is None:
            return f"({_VALID} AND json_type(metadata, {self.json_path(path)}) = 'null')"
        if isinstance(value, bool):
            kind = "true" if value else "false"
            return f"({_VALID} AND json_type(metadata, {self.json_path(path)}) = '{kind}')"
        if isinstance(value, str):
            text = sqlite_text(self.json_path(path), self.json_path(path))
            return f"({text} = {self.bind(value)})"
        return f"({self.number(path)} = {self.bind(value)})"

    def number(self, path: Path) -> str:
        return sqlite_number(self.json_path(path), self.json_path(path))

    def instant(self, path: Path) -> str:
        return sqlite_instant(self.json_path(path), self.json_path(path), self.json_path(path))

    def when(self, instant: datetime) -> str:
        return f"julianday({self.bind(instant.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3])})"


_VALID = "json_valid(metadata)"


def sqlite_instant(p1: str, p2: str, p3: str) -> str:
    """The Julian day of a date string at a path (NULL: not one); also the index expression."""
    return (
        f"julianday(CASE WHEN {_VALID} AND json_type(metadata, {p1}) = 'text' AND "
        f"json_extract(metadata, {p2}) GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]*' "
        f"THEN json_extract(metadata, {p3}) END)"
    )


def sqlite_number(p1: str, p2: str) -> str:
    """A number at a path (NULL: not one); also the index expression for ``gps``."""
    return (
        f"(CASE WHEN {_VALID} AND json_type(metadata, {p1}) IN ('integer', 'real') "
        f"THEN json_extract(metadata, {p2}) END)"
    )


def sqlite_text(p1: str, p2: str) -> str:
    """A string at a path (NULL: not one); also the index expression for ``camera.make``."""
    return (
        f"(CASE WHEN {_VALID} AND json_type(metadata, {p1}) = 'text' "
        f"THEN json_extract(metadata, {p2}) END)"
    )


class _Postgres(_Compiler):
    """Over ``themis_items.doc`` (jsonb) with psycopg's ``%s`` parameters."""

    mark = "%s"
    true, false = "true", "false"
    least = "LEAST"

    def value(self, path: Path) -> str:
        if path in INDEXED_PATHS:
            return "(doc" + "".join(f" -> '{s}'" for s in path) + ")"
        return "(doc" + "".join(f" -> {self.bind(s)}::text" for s in path) + ")"

    def exists(self, path: Path) -> str:
        return f"({self.value(path)} IS NOT NULL)"

    def equal(self, path: Path, value: Scalar) -> str:
        if isinstance(value, str) and (instant := parse_instant(value)) is not None:
            return f"({self.instant(path)} = {self.when(instant)})"
        import json

        text = json.dumps(value, ensure_ascii=False).replace("\\u0000", "\\ufffd")
        return f"({self.value(path)} = {self.bind(text)}::jsonb)"

    def number(self, path: Path) -> str:
        return pg_number(self.value(path), self.value(path))

    def instant(self, path: Path) -> str:
        return pg_instant(self.value(path), self.value(path))

    def when(self, instant: datetime) -> str:
        epoch = Decimal(int(instant.timestamp())) + Decimal(instant.microsecond) / 10**6
        return f"{self.bind(epoch)}::numeric"

    def bind(self, value: Any) -> str:
        mark = super().bind(value)
        return f"{mark}::float8" if isinstance(value, float) else mark


def pg_instant(v1: str, v2: str) -> str:
    """A jsonb date string as epoch seconds (NULL: not one); also the index expression."""
    return f"themis_instant(CASE WHEN jsonb_typeof({v1}) = 'string' THEN {v2} #>> '{{}}' END)"


def pg_number(v1: str, v2: str) -> str:
    """A jsonb number as float8 (NULL: not a number); also the index expression."""
    return f"(CASE WHEN jsonb_typeof({v1}) = 'number' THEN ({v2})::float8 END)"


def compile_sqlite(where: Where) -> tuple[str, list[Any]]:
    """A boolean SQLite expression over ``metadata`` and its parameters (``?``)."""
    c = _SQLite()
    return c.sql(where), c.params


def compile_postgres(where: Where) -> tuple[str, list[Any]]:
    """A boolean PostgreSQL expression over ``doc`` and its parameters (``%s``)."""
    c = _Postgres()
    return c.sql(where), c.params
