"""The pure parts of queries: arithmetic, rank fusion, FTS5 query text, cursors, the timeline."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from themis_clip import InputError
from themis_clip.index.lexical import RRF_K, fts5_query, fuse
from themis_clip.index.paging import (
    PAGE_WINDOW,
    Cursor,
    decode_cursor,
    encode_cursor,
    fingerprint,
    window,
)
from themis_clip.index.query import combine, layered, newest_first
from themis_clip.index.search import Hit


def test_combine_is_the_normalised_weighted_sum_of_normalised_parts() -> None:
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(8).astype(np.float32) * s for s in (1, 5, 0.1))
    got = combine([(a, 1.0), (b, 0.5), (c, -1.0)])
    n = lambda v: v / np.linalg.norm(v)  # noqa: E731
    assert got.dtype == np.float32 and np.allclose(got, n(n(a) + 0.5 * n(b) - n(c)), atol=1e-6)
    assert np.allclose(combine([(b, 3.0)]), n(b), atol=1e-6)  # one part: itself, scale-free
    for scale in (1e300, 1e-300):  # weights only scale the query: no overflow, no underflow
        huge = combine([(a, 1.0 * scale), (b, 0.5 * scale), (c, -1.0 * scale)])
        assert np.allclose(huge, got, atol=1e-6)


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([], "at least one"),
        ([(np.ones(4), 1.0), (np.ones(4), -1.0)], "cancel out"),
        ([(np.zeros(4), 1.0)], "zero"),
        ([(np.full(4, np.nan), 1.0)], "NaN"),
        ([(np.ones(4), 0.0)], "weight"),
        ([(np.ones(4), float("inf"))], "weight"),
        ([(np.ones(4), 1.0), (np.ones(3), 1.0)], "dimensions"),
    ],
)
def test_combine_refuses_what_has_no_direction(parts: list, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InputError, match=message):
        combine(parts)


def test_fuse_is_reciprocal_rank_fusion() -> None:
    fused = dict(fuse([["a", "b", "c"], ["c", "a"]]))
    assert fused["a"] == pytest.approx(1 / (RRF_K + 1) + 1 / (RRF_K + 2))
    assert fused["c"] == pytest.approx(1 / (RRF_K + 3) + 1 / (RRF_K + 1))
    assert [k for k, _ in fuse([["a", "b", "c"], ["c", "a"]])] == ["a", "c", "b"]
    assert [k for k, _ in fuse([["x", "y"], ["y", "x"]])] == ["x", "y"]  # tie: first seen


def test_fts5_query_quotes_every_word() -> None:
    assert fts5_query("IMG_4711") == '"IMG_4711"'
    assert fts5_query('red "boat" OR') == '"red" AND """boat""" AND "OR"'
    assert fts5_query("  -- * ") is None and fts5_query("") is None


def test_cursor_round_trip_and_refusals() -> None:
    q = fingerprint({"text": "a dog"})
    assert q == fingerprint({"text": "a dog"}) != fingerprint({"text": "a cat"})
    token = encode_cursor(Cursor(query=q, offset=24, key="photos/é.jpg"))
    assert decode_cursor(token, query=q) == Cursor(query=q, offset=24, key="photos/é.jpg")
    assert "=" not in token and "/" not in token and "+" not in token  # URL-safe, unpadded
    with pytest.raises(InputError, match="another query"):
        decode_cursor(token, query=fingerprint({"text": "a cat"}))
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    edited = raw[:12] + raw[12:].replace(b"24", b"99")
    for bad in (
        base64.urlsafe_b64encode(edited).decode(),  # the check no longer matches
        token[:-4],
        "",
        "!!!",
        "A" * 5000,
        base64.urlsafe_b64encode(b"x" * 12 + json.dumps([1, q, 3, "k"]).encode()).decode(),
    ):
        with pytest.raises(InputError, match="not a cursor"):
            decode_cursor(bad, query=q)


def test_window_rounds_up_to_whole_windows() -> None:
    assert window(1, most=10_000) == PAGE_WINDOW
    assert window(PAGE_WINDOW, most=10_000) == PAGE_WINDOW
    assert window(PAGE_WINDOW + 1, most=10_000) == 2 * PAGE_WINDOW
    assert window(9_999, most=10_000) == 10_000


def test_newest_first_reads_taken_then_mtime_then_file_time_then_insertion() -> None:
    rows = [
        (1, None, None, None),
        (2, "2024-05-01T12:00:00Z", None, None),
        (3, "2023:01:02 03:04:05", 1_800_000_000, None),  # EXIF form beats a newer mtime
        (4, None, 1_700_000_000_000, None),  # milliseconds
        (5, "garbage", None, 1_600_000_000 * 10**9),
        (6, True, "nope", None),
        (7, None, "1750000000", None),
    ]
    assert newest_first(rows) == [7, 2, 4, 3, 5, 6, 1]


def test_date_orders_keep_items_without_a_capture_time_last_both_ways() -> None:
    # A file time used to stand in for a missing capture time, so a screenshot from today led
    # `-taken` and trailed `taken`: undated items moved with the direction.
    from themis_clip.index.query import _browse_order

    rows = [
        (1, "2020-01-01T00:00:00", None, None),
        (2, None, "2030-01-01T00:00:00", None),  # no capture time, a new file time
        (3, "2022-01-01T00:00:00", None, None),
        (4, None, "2010-01-01T00:00:00", None),
    ]
    assert _browse_order(None, rows, "taken") == [1, 3, 2, 4]  # type: ignore[arg-type]
    assert _browse_order(None, rows, "-taken") == [3, 1, 2, 4]  # type: ignore[arg-type]
    assert _browse_order(None, rows, "newest") == [2, 3, 1, 4]  # type: ignore[arg-type]


def test_layered_pages_equal_one_query_however_cut() -> None:
    """A search that finds more good items the more it is asked for (a graph's widening
    beam): a page read off the layered ranking never depends on where earlier pages ended."""
    rng = np.random.default_rng(3)
    scores = rng.random(1000)
    found_at = rng.integers(1, 900, 1000)  # the smallest search that finds item i
    calls: list[int] = []

    def run(size: int) -> tuple[list[Hit], bool]:
        calls.append(size)
        order = [i for i in np.argsort(-scores) if i % 7]  # every 7th: filtered out
        pool = [i for i in order if found_at[i] <= size] + [
            i
            for i in order
            if found_at[i] > size  # what a small beam ranks too low
        ]
        hits = [Hit(key=f"k{i}", score=float(scores[i]), path=None, metadata={}) for i in pool]
        return hits[:size], len(pool) < size

    for cuts in ([330], [90, 60, 70, 110], [100, 100, 130], [1, 299, 30]):
        pages: list[str] = []
        for size in cuts:
            ranked = layered(run, len(pages) + size + 1, extra=0, most=10_000)
            pages += [h.key for h in ranked[len(pages) : len(pages) + size]]
        whole = [h.key for h in layered(run, 331, extra=0, most=10_000)]
        assert pages == whole[:330] and len(set(pages)) == 330
    calls.clear()
    everything = layered(run, 10**6, extra=0, most=10_000)  # to the end: every item once
    assert sorted(h.key for h in everything) == sorted(f"k{i}" for i in range(1000) if i % 7)
    assert calls == [100, 200, 400, 800, 1600]  # windows double: ~2n candidates for rank n
