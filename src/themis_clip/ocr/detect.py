"""DB text detection's post-processing in NumPy: probability map → text quadrilaterals.

Matches PaddleOCR's ``DBPostProcess`` (quad boxes): threshold the map, dilate 2×2, take each
connected region's minimum-area rectangle, keep it when the region's mean probability reaches
``box_threshold``, and grow it by ``area × unclip_ratio / perimeter`` on every side (what
pyclipper's round offset followed by a second minimum-area rectangle amounts to for a
rectangle). Regions are found by run-length labelling, so neither OpenCV nor pyclipper is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["DBSettings", "boxes_from_map", "label_runs", "min_area_rect", "reading_order"]

Quad = npt.NDArray[np.float32]


@dataclass(frozen=True, kw_only=True)
class DBSettings:
    """PaddleOCR's DB defaults (as RapidOCR and immich ship them)."""

    threshold: float = 0.3
    box_threshold: float = 0.5
    unclip_ratio: float = 1.6
    min_side: float = 3.0
    max_candidates: int = 1000


def label_runs(
    mask: npt.NDArray[np.bool_],
) -> tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]
]:
    """Horizontal runs of ``mask`` and their 8-connected region labels.

    Returns:
        ``(rows, starts, ends, labels)``: one entry per run, ``ends`` exclusive, ``labels``
        numbered 0..n_regions-1 in first-seen order.
    """
    h, w = mask.shape
    padded = np.zeros((h, w + 2), dtype=np.int8)
    padded[:, 1:-1] = mask
    edges = np.diff(padded, axis=1)
    rs, cs = np.nonzero(edges == 1)
    re, ce = np.nonzero(edges == -1)
    n = rs.size
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    rows, starts, ends = rs.astype(np.int64), cs.astype(np.int64), ce.astype(np.int64)
    del re
    stride = w + 2
    key_start = rows * stride + starts
    key_end = rows * stride + ends
    # Runs of row r overlapping run j of row r+1 (8-connected: s_i <= e_j and e_i >= s_j)
    # form one contiguous slice of the sorted runs.
    below = rows > 0
    j = np.flatnonzero(below)
    lo = np.searchsorted(key_end, (rows[j] - 1) * stride + starts[j], side="left")
    hi = np.searchsorted(key_start, (rows[j] - 1) * stride + ends[j], side="right")
    count = np.maximum(hi - lo, 0)
    a = np.repeat(j, count)
    offsets = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    b = np.repeat(lo, count) + offsets
    labels = np.arange(n, dtype=np.int64)
    while a.size:
        la, lb = labels[a], labels[b]
        low = np.minimum(la, lb)
        before = labels.copy()
        np.minimum.at(labels, a, low)
        np.minimum.at(labels, b, low)
        labels = labels[labels]
        if np.array_equal(labels, before):
            break
    _, dense = np.unique(labels, return_inverse=True)
    return rows, starts, ends, dense.astype(np.int64)


def min_area_rect(points: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], float, float]:
    """The minimum-area rectangle around ``points`` (n×2), by rotating calipers on the hull.

    Returns:
        ``(corners, long_side, short_side)``; corners 4×2 in no particular order.
    """
    hull = _convex_hull(points)
    if hull.shape[0] < 3:
        lo, hi = points.min(axis=0), points.max(axis=0)
        corners = np.array([[lo[0], lo[1]], [hi[0], lo[1]], [hi[0], hi[1]], [lo[0], hi[1]]])
        d = hi - lo
        return corners, float(d.max()), float(d.min())
    edges = np.roll(hull, -1, axis=0) - hull
    norms = np.linalg.norm(edges, axis=1)
    keep = norms > 0
    u = edges[keep] / norms[keep, None]
    v = np.stack([-u[:, 1], u[:, 0]], axis=1)
    pu, pv = hull @ u.T, hull @ v.T
    umin, umax, vmin, vmax = pu.min(0), pu.max(0), pv.min(0), pv.max(0)
    area = (umax - umin) * (vmax - vmin)
    k = int(np.argmin(area))
    uu, vv = u[k], v[k]
    corners = np.array(
        [
            uu * umin[k] + vv * vmin[k],
            uu * umax[k] + vv * vmin[k],
            uu * umax[k] + vv * vmax[k],
            uu * umin[k] + vv * vmax[k],
        ]
    )
    sides = (float(umax[k] - umin[k]), float(vmax[k] - vmin[k]))
    return corners, max(sides), min(sides)


def _convex_hull(points: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Andrew's monotone chain (the points are few: two per row of a region)."""
    pts = np.unique(points, axis=0)
    if pts.shape[0] < 3:
        return pts
    seq = [tuple(p) for p in pts.tolist()]

    def chain(ps: list[tuple[float, float]]) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []
        for p in ps:
            while len(out) >= 2:
                (ax, ay), (bx, by) = out[-2], out[-1]
                if (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax) > 0:
                    break
                out.pop()
            out.append(p)
        return out

    lower, upper = chain(seq), chain(seq[::-1])
    return np.array(lower[:-1] + upper[:-1], dtype=np.float64)


def order_quad(corners: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Corners as top-left, top-right, bottom-right, bottom-left (PaddleOCR's order)."""
    by_x = corners[np.argsort(corners[:, 0], kind="stable")]
    left, right = by_x[:2], by_x[2:]
    tl, bl = (left[0], left[1]) if left[0, 1] <= left[1, 1] else (left[1], left[0])
    tr, br = (right[0], right[1]) if right[0, 1] <= right[1, 1] else (right[1], right[0])
    return np.array([tl, tr, br, bl])


def boxes_from_map(
    prob: npt.NDArray[np.float32],
    scale: tuple[float, float],
    size: tuple[int, int],
    settings: DBSettings = DBSettings(),
) -> tuple[list[Quad], list[float]]:
    """Text quadrilaterals in a probability map, in the picture's pixels.

    Args:
        prob: the detector's H×W probability map.
        scale: ``(sx, sy)`` from map to picture pixels.
        size: the picture's ``(width, height)``; boxes are clipped to it.
        settings: thresholds.

    Returns:
        ``(quads, scores)``: float32 4×2 quads (TL, TR, BR, BL), the regions' mean probability.
    """
    mask = prob > settings.threshold
    dilated = mask.copy()
    dilated[1:, :] |= mask[:-1, :]
    dilated[:, 1:] |= mask[:, :-1]
    dilated[1:, 1:] |= mask[:-1, :-1]
    rows, starts, ends, labels = label_runs(dilated)
    if rows.size == 0:
        return [], []
    cum = np.zeros((prob.shape[0], prob.shape[1] + 1), dtype=np.float64)
    np.cumsum(prob, axis=1, out=cum[:, 1:])
    sums = cum[rows, ends] - cum[rows, starts]
    n = int(labels.max()) + 1
    mean = np.bincount(labels, sums, n) / np.maximum(np.bincount(labels, ends - starts, n), 1)
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(n + 1))
    sx, sy = scale
    width, height = size
    quads: list[Quad] = []
    scores: list[float] = []
    for region in range(min(n, settings.max_candidates)):
        if mean[region] < settings.box_threshold:
            continue
        idx = order[bounds[region] : bounds[region + 1]]
        pts = np.concatenate(
            [
                np.stack([starts[idx], rows[idx]], axis=1),
                np.stack([ends[idx] - 1, rows[idx]], axis=1),
            ]
        ).astype(np.float64)
        corners, long_side, short_side = min_area_rect(pts)
        if short_side < settings.min_side:
            continue
        grow = long_side * short_side * settings.unclip_ratio / (2 * (long_side + short_side))
        if short_side + 2 * grow < settings.min_side + 2:
            continue
        centre = corners.mean(axis=0)
        e1 = corners[1] - corners[0]
        e2 = corners[3] - corners[0]
        e1 = e1 / max(float(np.linalg.norm(e1)), 1e-9)
        e2 = e2 / max(float(np.linalg.norm(e2)), 1e-9)
        d = corners - centre
        # Each corner moves out by ``grow`` along both of the rectangle's axes.
        out = corners + grow * (np.sign(d @ e1)[:, None] * e1 + np.sign(d @ e2)[:, None] * e2)
        quad = order_quad(out) * np.array([sx, sy])
        quad[:, 0] = np.clip(quad[:, 0], 0, width - 1)
        quad[:, 1] = np.clip(quad[:, 1], 0, height - 1)
        quads.append(quad.astype(np.float32))
        scores.append(float(mean[region]))
    return quads, scores


def reading_order(quads: list[Quad], line_tolerance: float = 10.0) -> list[int]:
    """Indices of ``quads`` top to bottom, then left to right within a line (PaddleOCR's)."""
    if not quads:
        return []
    tops = np.array([q[0, 1] for q in quads])
    lefts = np.array([q[0, 0] for q in quads])
    by_y = np.argsort(tops, kind="stable")
    line = np.concatenate([[0], np.cumsum(np.diff(tops[by_y]) >= line_tolerance)])
    key = line * 1e7 + lefts[by_y]
    return [int(i) for i in by_y[np.argsort(key, kind="stable")]]
