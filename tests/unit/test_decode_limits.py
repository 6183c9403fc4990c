"""The decoder's cost limits (issue 28 part 2 item 2): containers inspected before Pillow,
scans capped by work, integer depth conversion, bytes in the budget, a deadline that stops a
decode between reads."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers import encode, photo_like
from tests.hostile_decode import (
    ico_with_png,
    many_scan_jpeg,
    png_of_zero_rows,
    tiff_with_strips,
)
from themis_clip.budget import PixelBudget
from themis_clip.errors import ImageDecodeError, ImageTooLargeError
from themis_clip.models.spec import ImageSpec
from themis_clip.preprocess.containers import count_jpeg_scans, max_jpeg_scans
from themis_clip.preprocess.deadline import DeadlineReader
from themis_clip.preprocess.depth import to_8bit
from themis_clip.preprocess.image import ImagePreprocessor, decode_image, image_dimensions


def test_jpeg_scans_are_counted_and_capped_by_work(tmp_path: Path) -> None:
    hostile = many_scan_jpeg(side=256, repeats=400)
    assert count_jpeg_scans(hostile, 10_000) == 406
    assert max_jpeg_scans(256 * 256) == 256 and max_jpeg_scans(170_000_000) == 18
    with pytest.raises(ImageDecodeError, match="more than 256 scans"):
        decode_image(hostile)
    path = tmp_path / "scans.jpg"  # files are read through a memory map
    path.write_bytes(hostile)
    with pytest.raises(ImageDecodeError, match="scans"):
        decode_image(path)
    normal = encode(Image.fromarray(photo_like(256, 256)), "JPEG", progressive=True)
    assert decode_image(normal).size == (256, 256)


def test_icons_holding_oversized_pngs_are_refused_before_opening() -> None:
    bomb = png_of_zero_rows(5000, 5000, colour=2)
    with pytest.raises(ImageDecodeError, match="ICO entry 0 holds a 5000x5000 PNG"):
        decode_image(ico_with_png(bomb))
    with pytest.raises(ImageTooLargeError, match="max_image_pixels"):
        decode_image(ico_with_png(bomb), max_image_pixels=1_000_000)
    icon = encode(Image.fromarray(photo_like(64, 64)), "PNG")
    assert decode_image(ico_with_png(icon)).size == (64, 64)
    block = b"ic10" + struct.pack(">I", 8 + len(bomb)) + bomb
    icns = b"icns" + struct.pack(">I", 8 + len(block)) + block
    with pytest.raises(ImageDecodeError, match="ICNS block 'ic10' holds a 5000x5000 PNG"):
        decode_image(icns)


def test_tiff_strip_directories_are_bounded() -> None:
    with pytest.raises(ImageDecodeError, match="200000 strips"):
        decode_image(tiff_with_strips(200_000))
    with pytest.raises(ImageDecodeError, match="for an image of 16 rows"):
        decode_image(tiff_with_strips(5000))
    assert decode_image(tiff_with_strips(16)).size == (16, 16)


def test_16_bit_conversion_is_exactly_round_v_over_257() -> None:
    values = np.arange(65536, dtype=np.uint16).reshape(256, 256)
    out = to_8bit((256, 256), lambda y0, y1: values[y0:y1], "I;16", "PNG")
    np.testing.assert_array_equal(out, np.round(values / 257.0).astype(np.uint8))


def test_32_bit_tiff_is_scaled_by_its_declared_depth() -> None:
    grey = photo_like(64, 48, 1)[:, :, 0]
    wide = (grey.astype(np.int64) * ((1 << 31) - 1) // 255).astype(np.int32)
    img = decode_image(encode(Image.fromarray(wide, mode="I"), "TIFF"))
    assert img.mode == "L"
    assert int(np.abs(np.asarray(img, dtype=int) - grey).max()) <= 1


def test_the_budget_counts_bytes_of_the_frame_and_its_copies() -> None:
    budget = PixelBudget(10_000_000)
    pre = ImagePreprocessor(ImageSpec(image_size=32), budget=budget)
    pre(png_of_zero_rows(1000, 1000, depth=16))  # 2 bytes a pixel + its 8-bit copy
    assert budget.stats()["peak"] == 3 * 1000 * 1000 // 4
    budget = PixelBudget(10_000_000)
    pre = ImagePreprocessor(ImageSpec(image_size=32), budget=budget)
    pre(encode(Image.fromarray(photo_like(1000, 1000)), "PNG"), orientation=6)
    assert budget.stats()["peak"] == 2 * 1000 * 1000  # RGB frame and its righted copy
    # An image within the pixel limit whose copies exceed the budget takes all of it.
    budget = PixelBudget(1_000_000)
    pre = ImagePreprocessor(ImageSpec(image_size=32), budget=budget)
    pre(encode(Image.fromarray(photo_like(1000, 1000)), "PNG"), orientation=6)
    assert budget.stats()["peak"] == 1_000_000


def test_a_decode_stops_at_its_deadline_between_reads() -> None:
    data = encode(Image.fromarray(photo_like(1500, 1500)), "PNG")
    reader = DeadlineReader(io.BytesIO(data), float("inf"), 1.0)
    img = Image.open(reader)  # the header is read in time
    reader._deadline = float("-inf")  # then the time runs out, mid-decode
    with pytest.raises(ImageTooLargeError, match="decode_timeout_s"):
        img.load()
    with pytest.raises(ImageTooLargeError, match="decode_timeout_s"):
        decode_image(data, decode_timeout_s=0.0)


def _jxl_header(width: int, height: int) -> bytes:
    """A bare JPEG XL codestream whose SizeHeader declares ``width`` x ``height`` (no ratio,
    30-bit sides), followed by bytes no decoder accepts."""
    bits, pos = 0, 0
    for value, n in ((0, 1), (3, 2), (height - 1, 30), (0, 3), (3, 2), (width - 1, 30)):
        bits |= value << pos
        pos += n
    return b"\xff\x0a" + bits.to_bytes(9, "little") + b"\x00" * 64


def test_a_jpeg_xl_header_declaring_a_bomb_is_refused_before_decoding(tmp_path: Path) -> None:
    # The JXL plugin decodes every pixel inside Image.open(): a 28 KB file declaring
    # 20000x20000 cost 1.4 GB before the size check. Its header's size is read first now.
    from themis_clip.preprocess.containers import jxl_size
    from themis_clip.preprocess.exif import read_exif

    pytest.importorskip("pillow_jxl")
    bomb = _jxl_header(20000, 20000)
    assert jxl_size(bomb) == (20000, 20000)
    with pytest.raises(ImageTooLargeError, match="20000x20000"):
        decode_image(bomb)
    (tmp_path / "bomb.jxl").write_bytes(bomb)
    with pytest.raises(ImageTooLargeError, match="20000x20000"):
        decode_image(tmp_path / "bomb.jxl")
    assert read_exif(tmp_path / "bomb.jxl") == {"width": 20000, "height": 20000}
    assert image_dimensions(tmp_path / "bomb.jxl") == (20000, 20000)  # from the header
    # a refusal of a mapped file closes its map (a view left alive was a BufferError)
    (tmp_path / "bomb.ico").write_bytes(ico_with_png(png_of_zero_rows(5000, 5000, colour=2)))
    with pytest.raises(ImageDecodeError, match="5000x5000"):
        decode_image(tmp_path / "bomb.ico")


@pytest.mark.parametrize("container", [False, True])
def test_jpeg_xl_sizes_read_from_the_header_equal_pillows(container: bool) -> None:
    from themis_clip.preprocess.containers import jxl_size
    from themis_clip.preprocess.exif import prepare_pillow

    pytest.importorskip("pillow_jxl")
    prepare_pillow()
    exif = Image.Exif()
    exif[0x010F] = "Testcam"  # an Exif box: the file becomes a container
    for width, height in ((160, 120), (161, 77), (64, 64), (64, 128), (300, 169), (1, 1)):
        buf = io.BytesIO()
        image = Image.fromarray(photo_like(width, height, 1))
        image.save(buf, "JXL", **({"exif": exif.tobytes()} if container else {}))
        assert buf.getvalue()[:2] != b"\xff\x0a" or not container
        assert jxl_size(buf.getvalue()) == Image.open(buf).size == (width, height)
