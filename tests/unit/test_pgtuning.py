"""pgvector's tuner without a server: the choice over a sweep, and probe queries as far from
the stored vectors as fresh queries are (the geometry its calibration rests on)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fakes import unit_rows
from themis_clip.index.searchers.pgtuning import SUMMED, choose, probe_queries


def point(ef: int, recall: float) -> dict[str, float]:
    return {"expansion_search": ef, "recall_at_10": recall}


def test_the_choice_is_the_cheapest_setting_reaching_the_target_or_else_the_best() -> None:
    sweep = [point(40, 0.95), point(50, 0.981), point(64, 0.99)]
    assert choose(sweep, 0.98)["expansion_search"] == 50
    assert choose(sweep, 0.95)["expansion_search"] == 40  # reaching it exactly counts
    assert choose(sweep, 0.999)["expansion_search"] == 64  # none reaches: the best recall
    flat = [point(40, 0.9), point(50, 0.97), point(64, 0.97)]
    assert choose(flat, 0.99)["expansion_search"] == 50  # the cheapest among equals


@pytest.mark.parametrize("noise", [0.02, 0.03, 0.05])
def test_probes_are_as_far_from_the_stored_vectors_as_fresh_queries_at_any_noise_level(
    noise: float,
) -> None:
    rng = np.random.default_rng(0)
    dim = 256
    basis = np.linalg.qr(rng.standard_normal((dim, 16)))[0]
    centres = rng.standard_normal((50, 16))

    def draw(n: int) -> np.ndarray:
        inner = centres[rng.integers(0, 50, n)] + 0.6 * rng.standard_normal((n, 16))
        x = unit_rows(inner @ basis.T)
        return unit_rows(x + noise * rng.standard_normal((n, dim)))

    data, fresh = draw(8_000), draw(300)
    members = np.arange(300)
    scores = data[members] @ data.T
    scores[np.arange(300), members] = -np.inf
    nearest = np.argsort(-scores, axis=1)[:, : SUMMED - 1]
    probes = probe_queries(data[members], data[nearest], rng)
    assert np.allclose(np.linalg.norm(probes, axis=1), 1.0, atol=1e-5)

    def tenth(queries: np.ndarray) -> float:  # median distance to the 10th nearest stored
        s = np.sort(queries @ data.T, axis=1)[:, -10]
        return float(np.median(np.sqrt(2 - 2 * s)))

    # Within 4% of fresh queries' at every noise level; a member moved by its neighbour
    # distance alone (the construction before) is 10-20% farther and the gap grows with noise.
    assert tenth(probes) == pytest.approx(tenth(fresh), rel=0.04)
    moved = (
        data[members]
        + unit_rows(rng.standard_normal((300, dim)))
        * np.sqrt(2 - 2 * np.max(scores, axis=1))[:, None]
    )
    assert tenth(unit_rows(moved)) > 1.08 * tenth(fresh)
