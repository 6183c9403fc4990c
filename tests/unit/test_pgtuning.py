"""pgvector's tuner without a server: the choice over a sweep and the probes' construction."""

from __future__ import annotations

import numpy as np

from tests.fakes import unit_rows
from themis_clip.index.searchers.pgtuning import choose, probe_queries


def point(ef: int, recall: float) -> dict[str, float]:
    return {"expansion_search": ef, "recall_at_10": recall}


def test_the_choice_is_the_cheapest_setting_reaching_the_target_or_else_the_best() -> None:
    sweep = [point(40, 0.95), point(50, 0.981), point(64, 0.99)]
    assert choose(sweep, 0.98)["expansion_search"] == 50
    assert choose(sweep, 0.95)["expansion_search"] == 40  # reaching it exactly counts
    assert choose(sweep, 0.999)["expansion_search"] == 64  # none reaches: the best recall
    flat = [point(40, 0.9), point(50, 0.97), point(64, 0.97)]
    assert choose(flat, 0.99)["expansion_search"] == 50  # the cheapest among equals


def test_a_probe_is_its_member_moved_by_its_gap_in_a_random_orthogonal_direction() -> None:
    rng = np.random.default_rng(0)
    members = unit_rows(rng.standard_normal((200, 64)))
    gaps = rng.uniform(0.2, 1.2, 200).astype(np.float32)
    probes = probe_queries(members, gaps, np.random.default_rng(1))
    assert np.allclose(np.linalg.norm(probes, axis=1), 1.0, atol=1e-5)
    # (m + g u) / sqrt(1 + g^2) with u orthogonal to m: cosine 1 / sqrt(1 + g^2) to its member
    cosines = np.sum(probes * members, axis=1)
    np.testing.assert_allclose(cosines, 1 / np.sqrt(1 + gaps**2), atol=1e-5)
    again = probe_queries(members, gaps, np.random.default_rng(2))
    assert np.max(np.sum(probes * again, axis=1)) < 0.999  # another direction each time
    still = probe_queries(members, np.zeros(200, np.float32), rng)
    np.testing.assert_allclose(still, members, atol=1e-6)  # a duplicate's gap is 0: itself


def test_with_a_margin_the_choice_needs_the_target_less_one_standard_error() -> None:
    sweep = [
        {"expansion_search": 40, "recall_at_10": 0.981, "recall_se": 0.003},
        {"expansion_search": 50, "recall_at_10": 0.986, "recall_se": 0.002},
    ]
    assert choose(sweep, 0.98)["expansion_search"] == 40
    assert choose(sweep, 0.98, margin=True)["expansion_search"] == 50  # 0.978 < 0.98 <= 0.984
