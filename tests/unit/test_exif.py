"""EXIF at indexing (preprocess/exif.py), from JPEGs written here with Pillow."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import pytest
from PIL import Image

from themis_clip.preprocess.exif import read_exif


def photo(exif: Image.Exif | None = None, size: tuple[int, int] = (40, 30)) -> bytes:
    out = io.BytesIO()
    img = Image.new("RGB", size, (200, 120, 40))
    if exif is None:
        img.save(out, "JPEG")
    else:
        img.save(out, "JPEG", exif=exif)
    return out.getvalue()


def full_exif(*, offset: str | None = "+02:00", south_west: bool = False) -> Image.Exif:
    exif = Image.Exif()
    exif[0x010F] = "Canon"
    exif[0x0110] = "Canon EOS R5"
    exif[0x0112] = 6  # rotated 90°: width and height swap
    sub = exif.get_ifd(0x8769)
    sub[0x9003] = "2023:07:14 18:03:11"
    sub[0x0132] = "2024:01:01 00:00:00"
    if offset:
        sub[0x9011] = offset
    gps = exif.get_ifd(0x8825)
    gps[1] = "S" if south_west else "N"
    gps[2] = (Fraction(33), Fraction(51), Fraction(2448, 100))
    gps[3] = "W" if south_west else "E"
    gps[4] = (Fraction(151), Fraction(12), Fraction(5508, 100))
    gps[5] = b"\x01" if south_west else b"\x00"
    gps[6] = Fraction(5825, 100)
    return exif


def test_every_key_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.jpg"
    path.write_bytes(photo(full_exif()))
    got = read_exif(path)
    assert got == {
        "taken": "2023-07-14T18:03:11+02:00",
        "camera": {"make": "Canon", "model": "Canon EOS R5"},
        "gps": {
            "lat": pytest.approx(33.8568, abs=1e-6),
            "lon": pytest.approx(151.2153, abs=1e-6),
            "alt": 58.25,
        },
        "width": 30,
        "height": 40,
    }
    assert read_exif(path.read_bytes()) == got  # bytes as well as paths


def test_south_and_west_are_negative_and_no_offset_means_none() -> None:
    got = read_exif(photo(full_exif(offset=None, south_west=True)))
    assert got["taken"] == "2023-07-14T18:03:11"
    assert got["gps"]["lat"] == pytest.approx(-33.8568, abs=1e-6)
    assert got["gps"]["lon"] == pytest.approx(-151.2153, abs=1e-6)
    assert got["gps"]["alt"] == -58.25  # below sea level


def test_missing_tags_are_absent() -> None:
    assert read_exif(photo()) == {"width": 40, "height": 30}
    exif = Image.Exif()
    exif[0x0110] = "Pixel 8"
    assert read_exif(photo(exif)) == {"camera": {"model": "Pixel 8"}, "width": 40, "height": 30}
    bad_date = Image.Exif()
    bad_date.get_ifd(0x8769)[0x9003] = "0000:00:00 00:00:00"
    assert "taken" not in read_exif(photo(bad_date))


def test_corrupt_exif_never_raises(tmp_path: Path) -> None:
    data = bytearray(photo(full_exif()))
    start = data.find(b"Exif\x00\x00")
    assert start > 0
    for i in range(start + 14, start + 200):  # scramble the IFD entries
        data[i] = (data[i] * 7 + 13) % 256
    got = read_exif(bytes(data))
    assert isinstance(got, dict)
    assert read_exif(b"not an image") == {} and read_exif(tmp_path / "missing.jpg") == {}


def test_hostile_tags_are_cut_or_dropped_never_stored_as_given() -> None:
    """What a tryout found: a 60,000-character Make made the item's metadata too large and
    aborted the whole index run; a NUL joined junk to the make; impossible dates and offsets
    were stored as text that filters and the timeline then read differently."""

    def with_tags(stamp: str, offset: str | None, make: str) -> dict[str, object]:
        exif = Image.Exif()
        exif[0x010F] = make
        sub = exif.get_ifd(0x8769)
        sub[0x9003] = stamp
        if offset:
            sub[0x9011] = offset
        return read_exif(photo(exif))

    got = with_tags("2023:07:01 12:00:00", "+02:00", "M" * 60_000)
    assert "camera" not in got and got["taken"] == "2023-07-01T12:00:00+02:00"
    assert with_tags("2023:07:01 12:00:00", None, "Canon\x00junk")["camera"] == {"make": "Canon"}
    assert "taken" not in with_tags("2023:02:30 10:00:00", None, "x")  # no such day
    assert with_tags("2023:07:01 12:00:00", "+99:99", "x")["taken"] == "2023-07-01T12:00:00"
    # The instant must exist in UTC: otherwise the local time alone is kept.
    assert with_tags("9999:12:31 23:59:59", "-12:00", "x")["taken"] == "9999-12-31T23:59:59"
