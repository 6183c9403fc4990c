"""Every format phones and cameras write: HEIC, AVIF, JPEG XL and camera RAW (a DNG built here
from sensor data), embedded like the PNG of the same picture, with their EXIF, paired with
their JPEG or Live video, through the library, the CLI and HTTP."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from themis_clip import ModelConfig, OnnxClipPlugin, PluginConfig, demo_model_path
from themis_clip.collection import Collection
from themis_clip.preprocess.exif import prepare_pillow, read_exif

EXE = str(Path(sys.executable).parent / "themis-clip")
RED = (210, 30, 40)


def scene() -> Image.Image:
    """A red disc on blue: a picture the demo model knows."""
    img = Image.new("RGB", (160, 120), (30, 60, 200))
    yy, xx = np.mgrid[:120, :160]
    mask = (xx - 80) ** 2 + (yy - 60) ** 2 < 40**2
    arr = np.asarray(img).copy()
    arr[mask] = RED
    return Image.fromarray(arr)


def exif(year: int) -> Image.Exif:
    out = Image.Exif()
    out[0x010F], out[0x0110] = "Testcam", "Phone 1"
    out.get_ifd(0x8769)[0x9003] = f"{year}:05:06 07:08:09"
    return out


def write_dng(path: Path) -> None:
    """A 64x48 RGGB sensor image of a red scene, as a DNG (LibRaw decodes it)."""
    write_dng_sized(path, 64, 48)


def write_dng_sized(path: Path, width: int, height: int) -> None:
    """A ``width`` x ``height`` RGGB sensor image of a red scene, as a DNG."""
    from pidng.core import RAW2DNG, DNGTags, Tag
    from pidng.defs import (
        CalibrationIlluminant,
        CFAPattern,
        DNGVersion,
        Orientation,
        PhotometricInterpretation,
    )

    bayer = np.zeros((height, width), dtype=np.uint16)
    bayer[0::2, 0::2], bayer[1::2, 1::2] = 3000, 300  # R, B
    bayer[0::2, 1::2] = bayer[1::2, 0::2] = 500  # G
    t = DNGTags()
    for tag, value in (
        (Tag.ImageWidth, width),
        (Tag.ImageLength, height),
        (Tag.TileWidth, width),
        (Tag.TileLength, height),
        (Tag.Orientation, Orientation.Horizontal),
        (Tag.PhotometricInterpretation, PhotometricInterpretation.Color_Filter_Array),
        (Tag.SamplesPerPixel, 1),
        (Tag.BitsPerSample, 16),
        (Tag.CFARepeatPatternDim, [2, 2]),
        (Tag.CFAPattern, CFAPattern.RGGB),
        (Tag.BlackLevel, 0),
        (Tag.WhiteLevel, 4095),
        (
            Tag.ColorMatrix1,
            [[1, 1], [0, 1], [0, 1], [0, 1], [1, 1], [0, 1], [0, 1], [0, 1], [1, 1]],
        ),
        (Tag.CalibrationIlluminant1, CalibrationIlluminant.D65),
        (Tag.AsShotNeutral, [[1, 1], [1, 1], [1, 1]]),
        (Tag.Make, "Testcam"),
        (Tag.Model, "RAW-1"),
        (Tag.DateTimeOriginal, "2019:03:04 05:06:07"),  # in the first directory, as DNGs do
        (Tag.DNGVersion, DNGVersion.V1_4),
        (Tag.DNGBackwardVersion, DNGVersion.V1_2),
    ):
        t.set(tag, value)
    converter = RAW2DNG()
    converter.options(t, path=str(path.parent) + "/", compress=False)
    converter.convert(bayer, filename=path.stem)


@pytest.fixture(scope="module")
def plugin() -> OnnxClipPlugin:
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig(model=ModelConfig(path=str(demo_model_path()))))
    return p


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF", "JXL"])
def test_modern_formats_decode_like_the_png_and_keep_their_exif(
    fmt: str, plugin: OnnxClipPlugin, tmp_path: Path
) -> None:
    prepare_pillow()
    path = tmp_path / f"photo.{fmt.lower()}"
    scene().save(path, format=fmt, quality=95, exif=exif(2021).tobytes())
    png = io.BytesIO()
    scene().save(png, "PNG")
    same = plugin.generate_embedding(png.getvalue())
    got = plugin.generate_embedding(str(path))
    assert got.ok, got.error
    assert float(np.dot(got.embedding, same.embedding)) > 0.99
    meta = read_exif(path)
    assert meta["taken"].startswith("2021-05-06T07:08:09"), meta
    assert meta["camera"] == {"make": "Testcam", "model": "Phone 1"} and meta["width"] == 160


def test_a_camera_raw_decodes_through_libraw_and_names_its_camera(
    plugin: OnnxClipPlugin, tmp_path: Path
) -> None:
    dng = tmp_path / "IMG_0001.dng"
    write_dng(dng)
    result = plugin.generate_embedding(str(dng))
    assert result.ok, result.error
    red = plugin.generate_embedding(np.full((24, 32, 3), RED, dtype=np.uint8))
    blue = plugin.generate_embedding(np.full((24, 32, 3), (30, 60, 200), dtype=np.uint8))
    assert np.dot(result.embedding, red.embedding) > np.dot(result.embedding, blue.embedding)
    assert plugin.generate_embedding(dng.read_bytes()).ok  # bytes too (HTTP uploads)
    meta = read_exif(dng)
    assert meta["camera"] == {"make": "Testcam", "model": "RAW-1"}
    # the date and the size were not read: Pillow cannot open a DNG's sensor directory
    assert meta["taken"] == "2019-03-04T05:06:07"
    assert (meta["width"], meta["height"]) == (64, 48)


def test_pairs_are_one_item_and_every_format_is_indexed(tmp_path: Path) -> None:
    prepare_pillow()
    photos = tmp_path / "photos"
    photos.mkdir()
    scene().save(photos / "IMG_0001.jpg", quality=90, exif=exif(2020).tobytes())
    write_dng(photos / "IMG_0001.dng")  # shot RAW+JPEG: one photo
    write_dng(photos / "IMG_0002.dng")  # RAW only
    scene().save(photos / "IMG_0003.heic", exif=exif(2022).tobytes())
    (photos / "IMG_0003.MOV").write_bytes(b"\x00\x00\x00\x14ftypqt  ")  # its Live video
    scene().save(photos / "IMG_0004.avif", exif=exif(2023).tobytes())
    scene().save(photos / "IMG_0005.jxl")
    config = PluginConfig(model=ModelConfig(path=str(demo_model_path())))
    with Collection.open(tmp_path / "i.db", config) as collection:
        report = collection.index_folder(photos)
        assert report.added == 5 and not report.failed, report
        assert report.merged == 2  # IMG_0001.dng beside its JPEG, IMG_0003.MOV beside its HEIC
        items = {
            Path(i.path or "").name: i.metadata or {}
            for i in collection.index.store.items_under(str(photos.resolve())).values()
        }
    assert set(items) == {
        "IMG_0001.jpg",
        "IMG_0002.dng",
        "IMG_0003.heic",
        "IMG_0004.avif",
        "IMG_0005.jxl",
    }
    assert items["IMG_0001.jpg"]["raw"] == "IMG_0001.dng"
    assert items["IMG_0003.heic"]["live_video"] == "IMG_0003.MOV"
    assert items["IMG_0003.heic"]["taken"].startswith("2022-")
    assert items["IMG_0002.dng"]["camera"]["model"] == "RAW-1"


def test_the_http_image_route_takes_heic_and_raw(tmp_path: Path) -> None:
    from tests.helpers import ServerProcess

    prepare_pillow()
    heic = io.BytesIO()
    scene().save(heic, format="HEIF")
    write_dng(tmp_path / "x.dng")
    import httpx

    with ServerProcess(["--no-warmup"]) as server:
        for body, kind in (
            (heic.getvalue(), "image/heic"),
            ((tmp_path / "x.dng").read_bytes(), "image/x-adobe-dng"),
        ):
            r = httpx.post(
                f"{server.base}/embed/image",
                content=body,
                headers={"Content-Type": kind},
                timeout=60,
            )
            assert r.status_code == 200, r.text


def test_without_rawpy_a_raw_file_names_the_extra(tmp_path: Path) -> None:
    dng = tmp_path / "x.dng"
    write_dng(dng)
    code = (
        "import sys; sys.modules['rawpy'] = None\n"
        "from themis_clip import OnnxClipPlugin, PluginConfig, ModelConfig, demo_model_path\n"
        "p = OnnxClipPlugin(); p.initialize(PluginConfig(model=ModelConfig(path=str(demo_model_path()))))\n"
        f"print(p.generate_embedding({str(dng)!r}).error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "themis-onnx-clip[photos]" in out.stdout, out.stdout + out.stderr


def test_a_damaged_jpeg_is_stood_in_for_by_its_raw(tmp_path: Path) -> None:
    # The JPEG of a RAW+JPEG pair hid the RAW: a damaged JPEG left the photo out entirely.
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "IMG_0001.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all")
    write_dng(photos / "IMG_0001.dng")
    config = PluginConfig(model=ModelConfig(path=str(demo_model_path())))
    with Collection.open(tmp_path / "i.db", config) as collection:
        report = collection.index_folder(photos)
        assert report.added == 1 and report.merged == 0, report
        assert [Path(p).name for p, _ in report.failed] == ["IMG_0001.jpg"]
        assert "its RAW IMG_0001.dng is indexed instead" in report.failed[0][1]
        again = collection.index_folder(photos)  # the next run keeps it, embeds nothing
        assert (again.added, again.unchanged, again.removed) == (0, 1, 0), again
        items = collection.index.store.items_under(str(photos.resolve()))
        assert [Path(i.path or "").name for i in items.values()] == ["IMG_0001.dng"]
        scene().save(photos / "IMG_0001.jpg", quality=90)  # repaired: the JPEG is the item
        fixed = collection.index_folder(photos)
        assert (fixed.added, fixed.removed, fixed.failed) == (1, 1, []), fixed


def test_every_raw_of_a_damaged_jpeg_stands_in_also_for_a_copy_of_its_bytes(
    tmp_path: Path,
) -> None:
    # A second RAW of the name was counted as merged and stored nowhere; a damaged JPEG with
    # the same bytes as another failed one lost its own RAWs (the copy skipped the stand-in).
    photos = tmp_path / "photos"
    photos.mkdir()
    garbage = b"\xff\xd8\xff\xe0 not a jpeg at all"
    for stem in ("IMG_0001", "IMG_0002"):
        (photos / f"{stem}.jpg").write_bytes(garbage)
        write_dng(photos / f"{stem}.dng")
    (photos / "IMG_0001.nef").write_bytes((photos / "IMG_0001.dng").read_bytes())
    config = PluginConfig(model=ModelConfig(path=str(demo_model_path())))
    with Collection.open(tmp_path / "i.db", config) as collection:
        report = collection.index_folder(photos)
        names = {
            Path(i.path or "").name
            for i in collection.index.store.items_under(str(photos.resolve())).values()
        }
        assert names == {"IMG_0001.dng", "IMG_0001.nef", "IMG_0002.dng"}, (names, report)
        failed = dict((Path(p).name, e) for p, e in report.failed)
        assert "its RAWs IMG_0001.dng, IMG_0001.nef are indexed instead" in failed["IMG_0001.jpg"]
        assert "its RAW IMG_0002.dng is indexed instead" in failed["IMG_0002.jpg"]
        assert report.merged == 0, report  # every RAW is an item of its own
        again = collection.index_folder(photos)
        assert "indexed instead" in dict(again.failed)[str(photos / "IMG_0002.jpg")]
