"""The ``where`` language in SQL: the tree :func:`~themis_clip.index.where.parse_where` makes,
compiled to a boolean expression for SQLite's JSON functions or PostgreSQL's ``jsonb``.

Every path and value is a bound parameter. The only paths written into SQL text are the
constant ones the stores index (:data:`~themis_clip.index.where.INDEXED_PATHS`), as the very
expressions the stores' schemas index (``sqlite_instant``, ``pg_number``...), so those filters
use the expression indexes. Both dialects share one compiler (:class:`_Compiler`) and differ
only in how a path's value is read, so they agree term by term.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from themis_clip.index.metadata import comparable, encode
from themis_clip.index.where import (
    EARTH_KM,
    INDEXED_PATHS,
    ORDER_SQL,
    And,
    Equals,
    Exists,
    HasText,
    Near,
    Not,
    Or,
    Path,
    Scalar,
    Where,
    parse_instant,
)

__all__ = [
    "compile_postgres",
    "compile_sqlite",
    "jsonb_text",
    "pg_instant",
    "pg_number",
    "sqlite_instant",
    "sqlite_number",
    "sqlite_text",
]


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
        if isinstance(node, HasText):
            has = f"(id IN (SELECT id FROM {self.ocr_table} WHERE text <> ''))"  # noqa: S608
            return has if node.present else f"(NOT {has})"
        if isinstance(node, Near):
            return self.near(node)
        if isinstance(node, Equals):
            return self.json_equal(node)
        if node.op in ("eq", "in"):
            return self.any_equal(node.path, node.values)
        if node.op in ("ne", "nin"):
            return f"(NOT COALESCE({self.any_equal(node.path, node.values)}, {self.false}))"
        (value,) = node.values
        if isinstance(value, str):
            instant = parse_instant(value)
            assert instant is not None  # the parser admits only dates here
            lhs, op = self.instant(node.path), ORDER_SQL[node.op]
            return f"({lhs} {op} {self.when(instant)})"
        return f"({self.number(node.path)} {ORDER_SQL[node.op]} {self.bind(value)})"

    def any_equal(self, path: Path, values: tuple[Scalar, ...]) -> str:
        if not values:
            return self.false
        return "(" + " OR ".join(self.equal(path, v) for v in values) + ")"

    least = "min"  # SQLite's two-argument min(); PostgreSQL's LEAST
    ocr_table = "ocr"  # what OCR read, one row per item read (:mod:`.stores`)

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
    def json_equal(self, node: Equals) -> str:
        raise NotImplementedError

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

    def json_equal(self, node: Equals) -> str:
        # The fields table's index answers it (:mod:`.stores.sqlite.schema`); a row whose
        # metadata could not be read back has no fields and matches nothing.
        self.params += [node.key, *comparable(node.value)]
        return "(id IN (SELECT id FROM fields WHERE key = ? AND kind = ? AND value IS ?))"

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
        # isoformat keeps the year's four digits (strftime's %Y drops them before year 1000).
        text = instant.replace(tzinfo=None).isoformat(" ", "milliseconds")
        return f"julianday({self.bind(text)})"


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
    ocr_table = "themis_ocr"

    def value(self, path: Path) -> str:
        if path in INDEXED_PATHS:
            return "(doc" + "".join(f" -> '{s}'" for s in path) + ")"
        return "(doc" + "".join(f" -> {self.bind(s)}::text" for s in path) + ")"

    def json_equal(self, node: Equals) -> str:
        # ``doc`` contains the pair (the GIN index finds candidates) and the value is equal as
        # JSON (containment alone would let [1, 2] match [1]).
        text = jsonb_text(encode(node.value)) or "null"
        pair = self.bind(json.dumps({node.key: json.loads(text)}))
        return f"(doc @> {pair}::jsonb AND doc -> {self.bind(node.key)} = {self.bind(text)}::jsonb)"

    def exists(self, path: Path) -> str:
        return f"({self.value(path)} IS NOT NULL)"

    def equal(self, path: Path, value: Scalar) -> str:
        if isinstance(value, str) and (instant := parse_instant(value)) is not None:
            return f"({self.instant(path)} = {self.when(instant)})"
        text = jsonb_text(json.dumps(value, ensure_ascii=False))
        return f"({self.value(path)} = {self.bind(text)}::jsonb)"

    def number(self, path: Path) -> str:
        return pg_number(self.value(path), self.value(path))

    def instant(self, path: Path) -> str:
        return pg_instant(self.value(path), self.value(path))

    def when(self, instant: datetime) -> str:
        # Exact, and counted from the epoch in whole days, seconds and microseconds: a float
        # timestamp rounds, and its integer part truncates toward 1970 before it.
        since = instant - _EPOCH
        whole = since.days * 86_400 + since.seconds
        epoch = Decimal(whole) + Decimal(since.microseconds) / 10**6
        return f"{self.bind(epoch)}::numeric"

    def bind(self, value: Any) -> str:
        mark = super().bind(value)
        return f"{mark}::float8" if isinstance(value, float) else mark


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A JSON \u0000 escape: preceded by an even number of backslashes (an odd one is a literal).
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def jsonb_text(text: str | None) -> str | None:
    """The ``jsonb`` twin of stored metadata text (U+0000, which jsonb refuses, as U+FFFD)."""
    if text is None:
        return None
    return _NUL_ESCAPE.sub(r"\1\\ufffd", text)


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
