"""Paging a search: opaque cursors that continue one query exactly.

The choice: a cursor carries the query's identity (a hash of what was asked: parts, weights,
mode, filters, model), the number of results already given (``offset``) and the last one
given (its key). The next page re-reads the query's canonical ranking and skips to just after
that item (at ``offset`` when the index has not changed; after the last key where an insert or
removal moved it). Where a search's results depend on how many are asked for (a graph's beam
widens with it; rank fusion scores by the lists' lengths), the canonical ranking is built in
windows that double from :data:`PAGE_WINDOW` (:func:`~themis_clip.index.query.layered`), so
pages concatenated equal one query with the summed ``k`` (in order, no repeats) however the
pages were cut; exact search, lexical search and browsing are one search's prefix already.
Ties are broken by key, so the order is total.

A cursor is base64url JSON with a BLAKE2b check: one edited, truncated or made up gives a
clear :class:`~themis_clip.errors.InputError`, and one sent with another query is refused.
It is not a secret (nothing it could reach is hidden from the query itself).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from themis_clip.errors import InputError

__all__ = ["PAGE_WINDOW", "Cursor", "decode_cursor", "encode_cursor", "fingerprint", "window"]

#: The first window of a paged search; later windows double it.
PAGE_WINDOW = 100
_VERSION = 1
_CHECK_BYTES = 12
_MAX_CURSOR_CHARS = 4096


@dataclass(frozen=True, kw_only=True)
class Cursor:
    """Where a paged query continues: after ``offset`` results, the last of them ``key``."""

    query: str
    offset: int
    key: str


def fingerprint(spec: Mapping[str, Any]) -> str:
    """The identity of a query: a hash of its canonical JSON (``spec`` must be JSON-able)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def window(needed: int, *, most: int) -> int:
    """How many results to search for when ``needed`` are: a multiple of :data:`PAGE_WINDOW`
    (at most ``most``)."""
    return min(most, -(-needed // PAGE_WINDOW) * PAGE_WINDOW)


def _check(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=_CHECK_BYTES, person=b"themis-cursor").digest()


def encode_cursor(cursor: Cursor) -> str:
    payload = json.dumps(
        [_VERSION, cursor.query, cursor.offset, cursor.key], separators=(",", ":")
    ).encode()
    return base64.urlsafe_b64encode(_check(payload) + payload).decode().rstrip("=")


def decode_cursor(token: str, *, query: str) -> Cursor:
    """The cursor ``token`` names, checked against the query it is sent with.

    Raises:
        InputError: the token is not a cursor this server made, or belongs to another query.
    """
    bad = InputError(
        "cursor: not a cursor from this search (send back the 'next' value unchanged, with "
        "the same query)"
    )
    if not isinstance(token, str) or not 0 < len(token) <= _MAX_CURSOR_CHARS:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise bad from None
    check, payload = raw[:_CHECK_BYTES], raw[_CHECK_BYTES:]
    if len(check) != _CHECK_BYTES or check != _check(payload):
        raise bad
    try:
        fields: Sequence[Any] = json.loads(payload)
        version, owner, offset, key = fields
    except (ValueError, TypeError):
        raise bad from None
    valid = (
        version == _VERSION
        and isinstance(owner, str)
        and isinstance(offset, int)
        and not isinstance(offset, bool)
        and offset > 0
        and isinstance(key, str)
    )
    if not valid:
        raise bad
    if owner != query:
        raise InputError(
            "cursor: it continues another query; send it with the query that returned it "
            "(the same parts, weights, mode and filters)"
        )
    return Cursor(query=owner, offset=offset, key=key)
