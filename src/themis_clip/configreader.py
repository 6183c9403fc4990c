"""The strict reader of the configuration's JSON: one object at a time, every key typed and
checked, unknown keys refused, every error a :class:`~themis_clip.errors.ConfigError` naming the
dotted key. :mod:`themis_clip.config` builds its dataclasses with it."""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from typing import Any, TypeVar

import themis_clip.jsonio as jsonio
from themis_clip.errors import ConfigError

__all__ = ["JSONReader"]

_T = TypeVar("_T")
_E = TypeVar("_E", bound=enum.Enum)


class JSONReader:
    """Reads one JSON object, tracking which keys were used so unknown ones can be reported."""

    def __init__(self, data: Any, prefix: str, base_dir: str | os.PathLike[str] | None) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"must be a JSON object, got {type(data).__name__}", key=prefix.rstrip(".") or None
            )
        self._data = data
        self._prefix = prefix
        self._base_dir = base_dir
        self._seen: set[str] = set()

    def _key(self, key: str) -> str:
        return self._prefix + key

    def raw(self, key: str) -> Any:
        self._seen.add(key)
        return self._data.get(key)

    def get(self, key: str, typ: type[_T], default: _T | None = None) -> Any:
        value = self.raw(key)
        if value is None:
            return default
        # bool is an int subclass: reject true/false where a number is expected, and vice versa.
        if not isinstance(value, typ) or (typ is not bool and isinstance(value, bool)):
            raise ConfigError(
                f"expected {typ.__name__}, got {type(value).__name__} {value!r}", key=self._key(key)
            )
        return value

    def positive_int(self, key: str) -> int | None:
        value: int | None = self.get(key, int)
        if value is not None and value < 1:
            raise ConfigError(f"must be a positive integer, got {value!r}", key=self._key(key))
        return value

    def number(self, key: str, default: float) -> float:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"expected a number, got {value!r}", key=self._key(key))
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"must be a finite number >= 0, got {value!r}", key=self._key(key))
        return float(value)

    def choice(self, key: str, enum_type: type[_E]) -> _E | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, str):
            try:
                return enum_type(value.lower())
            except ValueError:
                pass
        allowed = ", ".join(str(m.value) for m in enum_type)
        raise ConfigError(f"must be one of {allowed}; got {value!r}", key=self._key(key))

    def one_of(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.raw(key)
        if value is None:
            return default
        if value not in allowed:
            raise ConfigError(
                f"must be one of {', '.join(allowed)}; got {value!r}", key=self._key(key)
            )
        return str(value)

    def triple(self, key: str, *, positive: bool = False) -> tuple[float, float, float] | None:
        value = self.raw(key)
        if value is None:
            return None
        if (
            not isinstance(value, list | tuple)
            or len(value) != 3
            or not all(jsonio.is_number(v) for v in value)
            or not all(math.isfinite(v) for v in value)
            or (positive and not all(v > 0 for v in value))
        ):
            what = "three positive numbers" if positive else "three numbers"
            raise ConfigError(f"must be a list of {what}, got {value!r}", key=self._key(key))
        return (float(value[0]), float(value[1]), float(value[2]))

    def path(self, key: str, *, required: bool = False, name_ok: bool = False) -> str | None:
        value: str | None = self.get(key, str)
        if value is not None and not value.strip():  # said, not taken for null
            raise ConfigError("is an empty path (use null for none)", key=self._key(key))
        if value is None:
            if required:
                raise ConfigError("is required", key=self._key(key))
            return None
        expanded = os.path.expanduser(value)
        if self._base_dir is not None and not os.path.isabs(expanded):
            joined = os.path.join(self._base_dir, expanded)
            # model.path may name a Hub model (models/hub): an existing path wins.
            if name_ok and not os.path.exists(joined) and not value.startswith((".", "~")):
                return value
            expanded = joined
        return expanded

    def sha256(self, key: str) -> str | Mapping[str, str] | None:
        value = self.raw(key)
        if value is None:
            return None
        items = value.items() if isinstance(value, Mapping) else [("", value)]
        for name, digest in items:
            if not isinstance(digest, str) or not _is_hex_digest(digest):
                where = f"{self._key(key)}.{name}" if name else self._key(key)
                raise ConfigError(f"must be a 64-digit hex SHA-256, got {digest!r}", key=where)
        if isinstance(value, Mapping):
            return {str(k): str(v).lower() for k, v in value.items()}
        return str(value).lower()

    def section(self, key: str, *, required: bool = False) -> JSONReader:
        value = self.raw(key)
        if value is None:
            if required:
                raise ConfigError("is required", key=self._key(key))
            value = {}
        return JSONReader(value, self._key(key) + ".", self._base_dir)

    def finish(self) -> None:
        unknown = sorted(set(self._data) - self._seen)
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r}", key=self._key(str(unknown[0])))


def _is_hex_digest(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdefABCDEF" for c in value)
