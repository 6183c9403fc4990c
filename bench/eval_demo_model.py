"""Demo model accuracy beyond the tests: plain shapes from an independent renderer (120 queries)
and zero-shot on held-out combinations (300 images), for fp32 and int8.

Run: .venv/bin/python bench/eval_demo_model.py
"""

import sys

import numpy as np

sys.path.insert(0, ".")
from tests.integration.test_demo_model import _plain_shape, embed_scenes, scenes
from themis_clip import OnnxClipPlugin, PluginConfig, demo_model_path
from themis_clip.demo.scenes import COLOURS, SHAPES

for variant in [None, "int8"]:
    p = OnnxClipPlugin()
    assert p.initialize(
        PluginConfig.from_dict({"model": {"path": str(demo_model_path()), "variant": variant}})
    )
    rng = np.random.default_rng(99)
    hits = []
    colours = ("red", "green", "blue", "yellow")
    shapes = ("circle", "square", "triangle")
    for _ in range(10):
        gallery = [(c, s) for c in colours for s in shapes]
        imgs = []
        for c, s in gallery:
            r = float(rng.uniform(0.15, 0.35)) * 224
            cx = float(rng.uniform(r, 224 - r))
            cy = float(rng.uniform(r, 224 - r))
            imgs.append(_plain_shape(c, s, size=224, radius=r, cx=cx, cy=cy))
        v = np.stack([x.embedding for x in p.generate_embedding_batch(imgs)])
        q = np.stack(
            [
                x.embedding
                for x in p.generate_text_embedding_batch([f"a {c} {s}" for c, s in gallery])
            ]
        )
        hits += [gallery[i] == gallery[k] for k, i in enumerate(np.argmax(q @ v.T, 1))]
    items = scenes(np.random.default_rng(7), 300, held_out=True)
    im = embed_scenes(p, items)
    labels = [(c, s) for c in COLOURS for s in SHAPES]
    pr = np.stack(
        [r.embedding for r in p.generate_text_embedding_batch([f"a {c} {s}" for c, s in labels])]
    )
    pred = [labels[i] for i in np.argmax(im @ pr.T, 1)]
    print(
        variant or "fp32",
        f"plain 120 queries: {np.mean(hits):.3f}",
        f"held-out 300: {np.mean([a == (s.colour, s.shape) for a, s in zip(pred, items, strict=True)]):.3f} colour {np.mean([a[0] == s.colour for a, s in zip(pred, items, strict=True)]):.3f} shape {np.mean([a[1] == s.shape for a, s in zip(pred, items, strict=True)]):.3f}",
    )
