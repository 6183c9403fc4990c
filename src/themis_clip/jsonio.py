"""Strict JSON for every file this package reads (configs, manifests, peers' side files).

``json`` accepts ``NaN``, ``Infinity`` and duplicate keys, which no JSON standard does; here they
are errors, so one rule holds for all readers. :func:`is_number` is the one test for a JSON
number (``true`` is not one). (Request bodies are the server's: ``server/bodies.py``.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["is_number", "loads", "read"]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def loads(text: str | bytes) -> Any:
    """``json.loads`` without NaN/Infinity and without duplicate keys.

    Raises:
        ValueError: not valid (strict) JSON.
    """
    return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)


def read(path: Path) -> Any:
    """The strict JSON document in the file ``path``.

    Raises:
        OSError: the file cannot be read.
        ValueError: not valid (strict) JSON; the message names the file.
    """
    data = path.read_bytes()
    try:
        return loads(data)
    except ValueError as exc:  # json.JSONDecodeError and ours; UnicodeDecodeError too
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc


def is_number(value: Any) -> bool:
    """A finite JSON number: an int or float, not a bool, not NaN or infinite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
