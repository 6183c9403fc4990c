"""The pictures OCR reads: the gate's DCT-scaled decode keeps the true size, line crops."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from themis_clip.errors import ImageDecodeError
from themis_clip.preprocess.ocr import decode_for_ocr


def jpeg(path: Path, size: tuple[int, int], orientation: int | None = None) -> Path:
    img = Image.new("RGB", size, (200, 100, 50))
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    img.save(path, format="JPEG", exif=exif)
    return path


@pytest.mark.parametrize(("orientation", "upright"), [(None, (3000, 2000)), (6, (2000, 3000))])
def test_the_gate_decode_is_reduced_but_knows_the_upright_size(
    tmp_path: Path, orientation: int | None, upright: tuple[int, int]
) -> None:
    path = jpeg(tmp_path / "big.jpg", (3000, 2000), orientation)
    for data in (path, str(path), path.read_bytes()):
        picture = decode_for_ocr(data, draft_min_side=640)
        assert picture.reduced and picture.full_size == upright
        assert (
            min(picture.size) >= 640
            and picture.size[0] * upright[1] == picture.size[1] * upright[0]
        )
    full = decode_for_ocr(path)
    assert not full.reduced and full.size == full.full_size == upright


def test_small_and_non_jpeg_pictures_are_decoded_once_at_full_size(tmp_path: Path) -> None:
    small = decode_for_ocr(jpeg(tmp_path / "s.jpg", (1024, 768)), draft_min_side=640)
    assert not small.reduced and small.size == (1024, 768)
    buf = io.BytesIO()
    Image.new("RGB", (3000, 2000)).save(buf, format="PNG")
    png = decode_for_ocr(buf.getvalue(), draft_min_side=640)
    assert not png.reduced and png.size == (3000, 2000)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    with pytest.raises(ImageDecodeError):
        decode_for_ocr(fifo, draft_min_side=640)


def test_a_line_is_warped_upright_at_the_asked_height() -> None:
    arr = np.zeros((100, 200, 3), dtype=np.uint8)
    arr[40:60, 50:150] = 255  # a white bar: the "line"
    picture = decode_for_ocr(Image.fromarray(arr))
    quad = np.array([[50, 40], [150, 40], [150, 60], [50, 60]], dtype=np.float32)
    line = picture.line(quad, height=48, max_width=1000)
    assert line.shape == (48, 240, 3) and line.mean() > 250
    # The same bar seen from its bottom-right corner comes out turned half way, still white.
    turned = picture.line(np.roll(quad, 2, axis=0), height=48, max_width=100)
    assert turned.shape == (48, 100, 3) and turned.mean() > 250
