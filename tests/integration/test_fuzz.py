"""Fuzzing the image and text entry points (hypothesis).

CI runs a bounded number of examples; a long run:
    THEMIS_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/integration/test_fuzz.py -p no:cacheprovider
Any input that ever crashed becomes an ``@example`` here (regression test).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.helpers import photo_like
from themis_clip import OnnxClipPlugin, PluginConfig

# Thousands of examples per test: slow by nature (CI runs them; `-m "not slow"` skips them).
pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("THEMIS_FUZZ_EXAMPLES", "3000"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=5000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _seed(fmt: str) -> bytes:
    buf = io.BytesIO()
    img = Image.fromarray(photo_like(48, 40, 11))
    img.save(buf, format=fmt, **({"quality": 85} if fmt == "JPEG" else {}))
    return buf.getvalue()


SEEDS = [_seed(f) for f in ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP")]


@st.composite
def mutated_images(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 12))):
        pos = draw(st.integers(0, len(data) - 1))
        data[pos] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    if draw(st.booleans()):
        pos = draw(st.integers(0, len(data)))
        data[pos:pos] = draw(st.binary(max_size=64))
    return bytes(data)


@pytest.fixture(scope="module")
def plugin(tiny_model_dir: Path) -> Iterator[OnnxClipPlugin]:
    p = OnnxClipPlugin()
    assert p.initialize(
        PluginConfig.from_dict(
            {"model": {"path": str(tiny_model_dir)}, "preprocess": {"max_image_pixels": 4_000_000}}
        )
    )
    yield p
    # Teardown: after every fuzz test of the module, whatever their order or selection.
    assert p.health_check() and p.generate_embedding(SEEDS[0]).ok


def check(plugin: OnnxClipPlugin, data: bytes) -> None:
    result = plugin.generate_embedding(data)
    if result.ok:
        assert result.embedding is not None and np.isfinite(result.embedding).all()
        assert abs(float(np.linalg.norm(result.embedding)) - 1) < 1e-4
    else:
        assert result.error and result.error_type


@FUZZ
@given(data=mutated_images())
@example(data=SEEDS[1][:300])
def test_mutated_images(plugin: OnnxClipPlugin, data: bytes) -> None:
    check(plugin, data)


@FUZZ
@given(data=st.binary(max_size=2048))
def test_arbitrary_bytes(plugin: OnnxClipPlugin, data: bytes) -> None:
    check(plugin, data)


@FUZZ
@given(text=st.text(max_size=400))
@example(text="\ud800")
@example(text="\x00" * 300)
def test_arbitrary_text(plugin: OnnxClipPlugin, text: str) -> None:
    result = plugin.generate_text_embedding(text)
    assert result.ok and result.embedding is not None and np.isfinite(result.embedding).all()
