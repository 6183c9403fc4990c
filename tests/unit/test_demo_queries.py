"""The demo's queries always have right answers in the gallery they are asked of (issue 26)."""

from __future__ import annotations

import numpy as np

from themis_clip.demo.queries import DemoQuery, demo_queries
from themis_clip.demo.scenes import Scene, random_scene


def test_every_query_has_a_right_answer_in_its_gallery() -> None:
    for seed in range(50):
        rng = np.random.default_rng(seed)
        gallery = [random_scene(rng) for _ in range(int(rng.integers(1, 80)))]
        queries = demo_queries(gallery)
        assert 1 <= len(queries) <= 4
        assert len({q.text for q in queries}) == len(queries)
        for q in queries:
            assert any(q.matches(s) for s in gallery), (seed, q.text)


def test_text_and_judging() -> None:
    scene = Scene(shape="square", colour="blue", size="small", position="left")
    q = DemoQuery(colour="blue", shape="square", position="left")
    assert q.text == "a blue square on the left" and q.matches(scene)
    assert DemoQuery(colour="blue", shape="square", size="large").text == "a large blue square"
    assert not DemoQuery(colour="blue", shape="square", size="large").matches(scene)
    assert not DemoQuery(colour="red", shape="square").matches(scene)
    assert DemoQuery(colour="red", shape="ring", position="center").text == (
        "a red ring in the center"
    )
