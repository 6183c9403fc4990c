"""OCR with the real PP-OCRv4 models (the rapidocr-onnxruntime wheel's files) on generated
scenes: a sign is read, turned and tilted text is read, the gate skips a landscape, and the
lines agree with RapidOCR's own pipeline (the independent reference)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.hub_server import FakeHub
from tests.ocr_gallery import fonts, make_scene, words_found
from themis_clip.config import OCRConfig
from themis_clip.errors import ImageDecodeError, ModelFormatError
from themis_clip.interface import BackendType
from themis_clip.models.ocr import OCR_WHEEL, locate_ocr_models
from themis_clip.ocr import OCREngine, OCRResult

try:
    metadata.distribution(OCR_WHEEL)
except metadata.PackageNotFoundError:
    pytest.skip(f"{OCR_WHEEL} (the OCR models) is not installed", allow_module_level=True)
FONTS = fonts()
if not FONTS:
    pytest.skip("no gallery font (apt install fonts-dejavu-core)", allow_module_level=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[OCREngine]:
    e = OCREngine.load(OCRConfig(enabled=True), backend=BackendType.CPU)
    yield e
    e.close()


def sign(tmp_path: Path, word: str = "STARBUCKS", **kw: object) -> Path:
    path = tmp_path / f"sign-{word}-{abs(hash(tuple(kw.items())))}.jpg"
    make_scene(path, kind="sign", font=FONTS[0], seed=3, word=word, **kw)  # type: ignore[arg-type]
    return path


def test_the_gate_skips_a_landscape_and_lets_a_sign_through(
    engine: OCREngine, tmp_path: Path
) -> None:
    landscape = tmp_path / "landscape.jpg"
    make_scene(landscape, kind="landscape", font=FONTS[0], seed=11)
    assert engine.has_text(landscape) is False
    result = engine.read_text(landscape)
    assert result.gated and result.lines == ()
    assert engine.has_text(sign(tmp_path)) is True
    # A big JPEG is gated on a DCT-scaled decode; the result still has its upright size.
    big = tmp_path / "big.jpg"
    make_scene(big, kind="landscape", font=FONTS[0], seed=12, size=(3200, 2400))
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned a quarter: 2400 wide, 3200 high
    Image.open(big).save(big, format="JPEG", exif=exif)
    gated = engine.read_text(big)
    assert gated.gated and (gated.width, gated.height) == (2400, 3200)


@pytest.mark.slow
def test_starbucks_on_a_sign_is_read_with_its_box(engine: OCREngine, tmp_path: Path) -> None:
    result = engine.read_text(sign(tmp_path))
    assert not result.gated
    assert (result.width, result.height) == (1024, 768)
    [line] = [x for x in result.lines if "STARBUCKS" in x.text]
    assert line.confidence > 0.9
    xs, ys = [p[0] for p in line.box], [p[1] for p in line.box]
    assert 0 <= min(xs) < max(xs) <= 1024 and 0 <= min(ys) < max(ys) <= 768
    assert max(xs) - min(xs) > 3 * (max(ys) - min(ys))  # a horizontal line
    assert OCRResult.from_json(result.to_json()) == OCRResult.from_json(
        __import__("json").loads(__import__("json").dumps(result.to_json()))
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rotation", "tilt"), [(90, 0.0), (180, 0.0), (270, 0.0), (0, 20.0), (0, -20.0), (90, 15.0)]
)
def test_turned_and_tilted_text_is_read(
    engine: OCREngine, tmp_path: Path, rotation: int, tilt: float
) -> None:
    result = engine.read_text(sign(tmp_path, "PHARMACY", rotation=rotation, tilt=tilt))
    [line] = [x for x in result.lines if "PHARMACY" in x.text]
    # The box starts at the text's own top-left and runs along its baseline: its first edge
    # points the way the text reads.
    (x0, y0), (x1, y1) = line.box[0], line.box[1]
    reading = math.degrees(math.atan2(-(y1 - y0), x1 - x0))  # counter-clockwise, image y down
    turn = (reading - (rotation + tilt) + 180) % 360 - 180
    assert abs(turn) < 10, (reading, rotation, tilt)


def words(text: str) -> bool:
    """A line worth comparing: three letters or digits (specks of noise read as "." differ)."""
    return sum(c.isalnum() for c in text) >= 3


@pytest.mark.slow
def test_lines_agree_with_rapidocr(engine: OCREngine, tmp_path: Path) -> None:
    rapidocr = pytest.importorskip("rapidocr_onnxruntime", exc_type=ImportError)
    reference = rapidocr.RapidOCR()
    for i, (kind, rotation, tilt) in enumerate(
        [("receipt", 0, 0.0), ("screen", 0, 12.0), ("sign", 270, 0.0)]
    ):
        path = tmp_path / f"{kind}.jpg"
        make_scene(
            path, kind=kind, font=FONTS[i % len(FONTS)], seed=40 + i, rotation=rotation, tilt=tilt
        )
        ours = [x for x in engine.read_text(path).lines if words(x.text)]
        theirs = [x for x in reference(str(path))[0] if words(x[1])]
        assert sorted(x.text for x in ours) == sorted(t for _, t, _ in theirs)
        for line in ours:
            box = np.array(line.box)
            best = min(
                np.abs(np.sort(box, axis=0) - np.sort(np.array(b), axis=0)).max()
                for b, t, _ in theirs
                if t == line.text
            )
            size = min(np.linalg.norm(box[1] - box[0]), np.linalg.norm(box[3] - box[0]))
            assert best <= max(4.0, 0.15 * size), (line.text, best, size)


@pytest.mark.slow
def test_an_immich_style_folder_with_a_character_list_loads(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    wheel = locate_ocr_models()
    folder = tmp_path / "PP-OCR"
    (folder / "detection").mkdir(parents=True)
    (folder / "recognition").mkdir()
    shutil.copy(wheel.detection, folder / "detection" / "model.onnx")
    rec = onnx.load(str(wheel.recognition))
    [meta] = [p for p in rec.metadata_props if p.key == "character"]
    characters = meta.value
    del rec.metadata_props[:]
    onnx.save(rec, str(folder / "recognition" / "model.onnx"))
    with pytest.raises(ModelFormatError, match="no alphabet"):
        OCREngine.load(OCRConfig(models=str(folder)), backend=BackendType.CPU)
    (folder / "recognition" / "keys.txt").write_text(characters + "\n", encoding="utf-8")
    spec = locate_ocr_models(str(folder))
    assert spec.classifier is None and spec.characters == folder / "recognition" / "keys.txt"
    e = OCREngine.load(OCRConfig(models=str(folder)), backend=BackendType.CPU)
    try:
        found, total = words_found(("STARBUCKS",), e.read_text(sign(tmp_path)).text)
        assert (found, total) == (1, 1)
    finally:
        e.close()


def test_bad_input_is_a_named_error_and_a_tiny_picture_reads_empty(engine: OCREngine) -> None:
    with pytest.raises(ImageDecodeError):
        engine.read_text(b"not an image at all")
    for size in ((1, 1), (3, 2000)):
        tiny = engine.read_text(np.full((size[1], size[0], 3), 255, dtype=np.uint8))
        assert tiny.lines == () and (tiny.width, tiny.height) == size


READ_BY_NAME = """
import sys
from themis_clip.config import OCRConfig
from themis_clip.interface import BackendType
from themis_clip.ocr import OCREngine
engine = OCREngine.load(OCRConfig(models=sys.argv[1]), backend=BackendType.CPU)
print(engine.label, "|", engine.read_text(sys.argv[2]).text.replace(chr(10), " "))
"""


@pytest.mark.slow
def test_an_immich_ocr_repo_is_pulled_by_name_then_read_offline(tmp_path: Path) -> None:
    wheel = locate_ocr_models()
    assert wheel.classifier is not None
    repo = tmp_path / "repo"
    for rel, src in (
        ("detection/model.onnx", wheel.detection),
        ("recognition/model.onnx", wheel.recognition),
        ("textline_orientation/model.onnx", wheel.classifier),
    ):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, repo / rel)
    (repo / "detection" / "fp16").mkdir()
    (repo / "detection" / "fp16" / "model.onnx").write_bytes(b"not for us" * 100)
    picture = sign(tmp_path)
    name = "immich-app/PP-OCRv5_mobile"
    with FakeHub() as hub:
        hub.add(name, repo)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(
            HF_ENDPOINT=hub.url,
            HF_HUB_CACHE=str(tmp_path / "hf-cache"),
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_XET="1",
        )
        for offline in (False, True):
            done = subprocess.run(
                [sys.executable, "-c", READ_BY_NAME, name, str(picture)],
                capture_output=True,
                text=True,
                timeout=300,
                env=dict(env, HF_HUB_OFFLINE="1") if offline else env,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == f"{name} | STARBUCKS"
        fetched = {k.removeprefix(name + "/") for k in hub.downloads}
    assert fetched == {
        "detection/model.onnx",
        "recognition/model.onnx",
        "textline_orientation/model.onnx",
    }


@pytest.mark.parametrize("mode", ["RGBA", "LA"])
def test_black_text_on_a_transparent_png_is_read(engine: OCREngine, mode: str) -> None:
    """Transparent pixels are often stored black: read as RGB, black text vanishes into them."""
    import io

    from PIL import ImageDraw, ImageFont

    img = Image.new("RGBA", (900, 240), (0, 0, 0, 0))
    font = ImageFont.truetype(str(FONTS[0]), 90)
    ImageDraw.Draw(img).text((40, 60), "STARBUCKS", font=font, fill=(0, 0, 0, 255))
    out = io.BytesIO()
    img.convert(mode).save(out, format="PNG")
    assert any("STARBUCKS" in line.text for line in engine.read_text(out.getvalue()).lines)
