"""DB post-processing and CTC decoding in NumPy, against brute-force references."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from themis_clip.ocr.detect import boxes_from_map, label_runs, min_area_rect, reading_order
from themis_clip.ocr.recognize import ctc_decode, load_alphabet


def flood_fill_regions(mask: np.ndarray) -> set[frozenset[tuple[int, int]]]:
    """8-connected regions by breadth-first search: the reference for label_runs."""
    seen = np.zeros_like(mask, dtype=bool)
    regions = set()
    h, w = mask.shape
    for y, x in zip(*np.nonzero(mask), strict=True):
        if seen[y, x]:
            continue
        region, queue = set(), deque([(int(y), int(x))])
        seen[y, x] = True
        while queue:
            cy, cx = queue.popleft()
            region.add((cy, cx))
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    ny, nx = cy + dy, cx + dx
                    if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                        seen[ny, nx] = True
                        queue.append((ny, nx))
        regions.add(frozenset(region))
    return regions


@pytest.mark.parametrize("seed", range(12))
def test_label_runs_finds_the_same_regions_as_a_flood_fill(seed: int) -> None:
    rng = np.random.default_rng(seed)
    mask = rng.random((40, 57)) < rng.uniform(0.2, 0.6)
    rows, starts, ends, labels = label_runs(mask)
    regions: dict[int, set[tuple[int, int]]] = {}
    for r, s, e, lab in zip(rows, starts, ends, labels, strict=True):
        regions.setdefault(int(lab), set()).update((int(r), x) for x in range(s, e))
    assert {frozenset(v) for v in regions.values()} == flood_fill_regions(mask)


def test_label_runs_of_an_empty_mask() -> None:
    rows, *_ = label_runs(np.zeros((5, 5), dtype=bool))
    assert rows.size == 0


@pytest.mark.parametrize("angle", [0.0, 12.0, -20.0, 37.0, 90.0])
def test_min_area_rect_matches_a_brute_force_over_angles(angle: float) -> None:
    rng = np.random.default_rng(int(angle) + 100)
    pts = rng.uniform(-1, 1, (200, 2)) * [60, 9]
    t = math.radians(angle)
    pts = pts @ np.array([[math.cos(t), math.sin(t)], [-math.sin(t), math.cos(t)]])
    _, long_side, short_side = min_area_rect(pts)
    best = min(
        (np.ptp(pts @ [math.cos(a), math.sin(a)]) * np.ptp(pts @ [-math.sin(a), math.cos(a)]))
        for a in np.radians(np.arange(0, 180, 0.05))
    )
    assert long_side * short_side == pytest.approx(best, rel=1e-3)
    assert long_side > 4 * short_side


def test_boxes_from_map_finds_a_tilted_line_grown_by_the_unclip_distance() -> None:
    prob = np.zeros((200, 300), dtype=np.float32)
    yy, xx = np.mgrid[0:200, 0:300]
    t = math.radians(20)
    u = (xx - 150) * math.cos(t) - (yy - 100) * math.sin(t)  # along the line
    v = (xx - 150) * math.sin(t) + (yy - 100) * math.cos(t)
    prob[(abs(u) < 80) & (abs(v) < 8)] = 0.9
    quads, scores = boxes_from_map(prob, (2.0, 2.0), (600, 400))
    assert len(quads) == 1 and scores[0] > 0.8
    q = quads[0] / 2.0
    top = q[1] - q[0]
    # A line rising to the right (image y grows downwards): its top edge points up-right.
    assert math.degrees(math.atan2(-top[1], top[0])) == pytest.approx(20, abs=2)
    width, height = np.linalg.norm(q[1] - q[0]), np.linalg.norm(q[3] - q[0])
    grow = 160 * 16 * 1.6 / (2 * (160 + 16))  # area × ratio / perimeter, DB's unclip
    assert width == pytest.approx(160 + 2 * grow, abs=3)
    assert height == pytest.approx(16 + 2 * grow, abs=3)


def test_boxes_from_map_drops_faint_regions() -> None:
    prob = np.zeros((100, 100), dtype=np.float32)
    prob[40:60, 10:90] = 0.35  # above the pixel threshold, below the box threshold
    assert boxes_from_map(prob, (1.0, 1.0), (100, 100)) == ([], [])


def test_reading_order_is_top_to_bottom_then_left_to_right() -> None:
    def quad(x: float, y: float) -> np.ndarray:
        return np.array([[x, y], [x + 10, y], [x + 10, y + 5], [x, y + 5]], np.float32)

    quads = [quad(50, 102), quad(0, 100), quad(0, 10), quad(60, 11)]
    assert reading_order(quads) == [2, 3, 1, 0]


def test_ctc_decode_merges_repeats_and_drops_blanks() -> None:
    alphabet = load_alphabet(["a", "b"])  # blank, a, b, space
    ids = [1, 1, 0, 1, 2, 2, 3, 0, 0]
    probs = np.full((1, len(ids), 4), 0.1, dtype=np.float32)
    for t, i in enumerate(ids):
        probs[0, t, i] = 0.7
    [(text, confidence)] = ctc_decode(probs, alphabet)
    assert text == "aab "
    assert confidence == pytest.approx(0.7)
    [(empty, zero)] = ctc_decode(np.eye(4, dtype=np.float32)[[0, 0]][None], alphabet)
    assert (empty, zero) == ("", 0.0)
