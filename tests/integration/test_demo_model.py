"""The shipped demo model really works: retrieval and zero-shot accuracy on fresh scenes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from themis_clip import OnnxClipPlugin, PluginConfig, demo_model_path
from themis_clip.demo.scenes import COLOURS, POSITIONS, SHAPES, SIZES, Scene, render_scene

pytestmark = pytest.mark.slow

MANIFEST = json.loads((demo_model_path() / "manifest.json").read_text())
HELD_OUT = {tuple(p) for p in MANIFEST.get("demo", {}).get("held_out", [])}


@pytest.fixture(scope="module")
def plugin() -> OnnxClipPlugin:
    assert MANIFEST["name"] == "themis-demo-shapes"
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig.from_dict({"model": {"path": str(demo_model_path())}}))
    return p


def scenes(rng: np.random.Generator, n: int, *, held_out: bool) -> list[Scene]:
    out: list[Scene] = []
    while len(out) < n:
        colour, shape = str(rng.choice(list(COLOURS))), str(rng.choice(SHAPES))
        if ((colour, shape) in HELD_OUT) == held_out:
            out.append(
                Scene(
                    shape=shape,
                    colour=colour,
                    size=str(rng.choice(SIZES)),
                    position=str(rng.choice(POSITIONS)),
                    seed=int(rng.integers(2**31, 2**32)),
                )
            )
    return out


def embed_scenes(plugin: OnnxClipPlugin, items: list[Scene]) -> np.ndarray:
    # Rendered at 224 px like the gallery, then preprocessed by the model's own pipeline.
    results = plugin.generate_embedding_batch(
        [np.asarray(render_scene(s, size=224)) for s in items]
    )
    assert all(r.ok for r in results)
    return np.stack([r.embedding for r in results])  # type: ignore[misc]


def test_manifest_records_the_held_out_combinations() -> None:
    assert MANIFEST["name"] == "themis-demo-shapes"
    assert len(HELD_OUT) == 6
    assert {c for c, _ in HELD_OUT} <= set(COLOURS) and {s for _, s in HELD_OUT} <= set(SHAPES)


def test_text_to_image_top1_retrieval(plugin: OnnxClipPlugin) -> None:
    rng = np.random.default_rng(20261130)
    candidates = scenes(rng, 120, held_out=False)
    images = embed_scenes(plugin, candidates)
    combos = sorted({(s.colour, s.shape) for s in candidates})
    queries = [f"a {c} {s}" for c, s in combos]
    texts = np.stack([r.embedding for r in plugin.generate_text_embedding_batch(queries)])  # type: ignore[misc]
    top = np.argmax(texts @ images.T, axis=1)
    hits = [
        (candidates[i].colour, candidates[i].shape) == combo
        for i, combo in zip(top, combos, strict=True)
    ]
    accuracy = float(np.mean(hits))
    print(
        f"text->image top-1 over {len(candidates)} candidates, {len(queries)} queries: {accuracy:.3f}"
    )
    assert accuracy >= 0.9


def test_zero_shot_on_held_out_combinations(plugin: OnnxClipPlugin) -> None:
    rng = np.random.default_rng(7)
    items = scenes(rng, 60, held_out=True)
    images = embed_scenes(plugin, items)
    labels = [(c, s) for c in COLOURS for s in SHAPES]
    prompts = np.stack(
        [
            r.embedding
            for r in plugin.generate_text_embedding_batch([f"a {c} {s}" for c, s in labels])
        ]
    )  # type: ignore[misc]
    predicted = [labels[i] for i in np.argmax(images @ prompts.T, axis=1)]
    accuracy = float(
        np.mean([p == (s.colour, s.shape) for p, s in zip(predicted, items, strict=True)])
    )
    print(
        f"zero-shot accuracy on held-out combinations ({len(items)} images, {len(labels)} classes): {accuracy:.3f}"
    )
    assert accuracy >= 0.6


def _plain_shape(
    colour: str, shape: str, *, size: int, radius: float, cx: float, cy: float
) -> bytes:
    """An independent renderer: a filled shape in a named colour on off-white paper, as PNG.

    Deliberately not ``demo/scenes.py``: named colours (Pillow's CSS table), axis-aligned
    rectangles, upright triangles, a plain background, no noise.
    """
    import io

    from PIL import Image, ImageColor, ImageDraw

    img = Image.new("RGB", (size, size), (246, 244, 238))
    draw = ImageDraw.Draw(img)
    fill = ImageColor.getrgb(colour)
    box = [cx - radius, cy - radius, cx + radius, cy + radius]
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon(
            [(cx, cy - radius), (cx + radius, cy + radius), (cx - radius, cy + radius)], fill=fill
        )
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def test_plain_shapes_from_another_renderer(plugin: OnnxClipPlugin) -> None:
    colours = ("red", "green", "blue", "yellow")
    shapes = ("circle", "square", "triangle")
    rng = np.random.default_rng(99)
    colour_hits, shape_hits, both = [], [], []
    for _ in range(3):  # three independent galleries of 12 plain shapes each
        gallery = [(c, s) for c in colours for s in shapes]
        images = []
        for c, s in gallery:
            size = 224
            radius = float(rng.uniform(0.2, 0.32)) * size
            cx = float(rng.uniform(radius, size - radius))
            cy = float(rng.uniform(radius, size - radius))
            images.append(_plain_shape(c, s, size=size, radius=radius, cx=cx, cy=cy))
        results = plugin.generate_embedding_batch(images)
        assert all(r.ok for r in results)
        vectors = np.stack([r.embedding for r in results])  # type: ignore[misc]
        texts = plugin.generate_text_embedding_batch([f"a {c} {s}" for c, s in gallery])
        queries = np.stack([t.embedding for t in texts])  # type: ignore[misc]
        for q, i in enumerate(np.argmax(queries @ vectors.T, axis=1)):
            colour_hits.append(gallery[i][0] == gallery[q][0])
            shape_hits.append(gallery[i][1] == gallery[q][1])
            both.append(gallery[i] == gallery[q])
    print(
        f"plain shapes, text->image top-1 over {len(both)} queries: "
        f"colour {np.mean(colour_hits):.3f}, shape {np.mean(shape_hits):.3f}, both {np.mean(both):.3f}"
    )
    assert np.mean(colour_hits) >= 0.95
    assert np.mean(shape_hits) >= 0.95
    assert np.mean(both) >= 0.95
