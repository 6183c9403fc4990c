"""EXIF metadata of a photo for the index: when, with what, where, and its upright size.

Keys (absent when the photo does not say; never guessed):

- ``taken``: ISO 8601 from ``DateTimeOriginal`` (in the EXIF directory, else the first one,
  where DNG and TIFF/EP files may keep it; ``DateTime`` is when the file was last written,
  not taken: not used), with ``OffsetTimeOriginal`` when present
  (``"2023-07-14T18:03:11+02:00"``), else without an offset;
- ``camera``: ``{"make", "model"}`` (either may be absent);
- ``gps``: ``{"lat", "lon"}`` in signed decimal degrees (south and west negative), with
  ``alt`` in metres (below sea level negative) when present;
- ``width``, ``height``: the pixel size after the EXIF orientation is applied (5-8 swap); for
  a camera RAW, the size LibRaw decodes its sensor to (read from its header).

Pillow reads only the header (no pixels are decoded). A file whose EXIF is corrupt gives what
could be read, and never an error (nor Pillow's warning on stderr): metadata is a bonus, not a
reason to skip a photo. Text tags end at their first NUL (EXIF's ASCII type is NUL-terminated)
and are dropped beyond :data:`MAX_TEXT` characters; a date that is not a real calendar date is
dropped, an offset that is not a real one (``+99:99``) leaves the time without an offset.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from themis_clip.files import RAW_SUFFIXES, open_regular
from themis_clip.preprocess.containers import is_jxl, jxl_size
from themis_clip.preprocess.raw import raw_size
from themis_clip.vocabulary import DEFAULT_MAX_IMAGE_PIXELS

__all__ = ["prepare_pillow", "read_exif"]

log = logging.getLogger(__name__)

_DATETIME_ORIGINAL = 0x9003
_OFFSET_TIME_ORIGINAL = 0x9011
_MAKE, _MODEL, _ORIENTATION = 0x010F, 0x0110, 0x0112
_EXIF_IFD, _GPS_IFD = 0x8769, 0x8825
_STAMP = re.compile(r"(\d{4}):(\d{2}):(\d{2})[ T](\d{2}):(\d{2}):(\d{2})")
_OFFSET = re.compile(r"[+-](\d{2}):(\d{2})")
#: The longest text tag kept (a camera's make or model); longer ones are not a real camera's.
MAX_TEXT = 200


def read_exif(source: str | Path | bytes) -> dict[str, Any]:
    """The metadata keys above for an image file (or its bytes); ``{}`` when it has none or
    cannot be read."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        fp = io.BytesIO(source) if isinstance(source, bytes) else open_regular(source)
    except OSError:
        return {}
    named_raw = not isinstance(source, bytes) and Path(source).suffix.lower() in RAW_SUFFIXES
    try:
        with fp:
            prepare_pillow()
            jxl = is_jxl(fp.read(12))
            fp.seek(0)
            declared = jxl_size(fp.read(_JXL_HEAD)) if jxl else None
            fp.seek(0)
            if declared is not None and declared[0] * declared[1] > DEFAULT_MAX_IMAGE_PIXELS:
                # Pillow's JPEG XL plugin decodes every pixel to open the file: not for this
                # size (the decoder refuses it too); the header's size is all we say
                return {"width": declared[0], "height": declared[1]}
            try:
                out = _open_and_read(Image, fp)
            except UnidentifiedImageError:
                fp.seek(0)
                out = _raw_exif(Image, fp.read(_RAW_HEAD))
                named_raw = True  # or a RAW by its content: LibRaw says
        if named_raw:  # Pillow sees a RAW's small first directory, or nothing: LibRaw's size
            size = raw_size(source)
            if size is not None:
                out["width"], out["height"] = size
        return out
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        log.debug("no EXIF read: %s", exc)
        return {}


# Camera RAWs shaped like TIFF (CR2, NEF, ARW, DNG; ORF and RW2 with a magic of their own):
# their EXIF is in the first megabytes, readable as a TIFF directory even where Pillow cannot
# open the picture.
_RAW_HEAD = 16 << 20
#: where a JPEG XL container's codestream starts, at the latest, for its size to be read
_JXL_HEAD = 1 << 20
_TIFF_LIKE = {b"II*\x00": b"II*\x00", b"MM\x00*": b"MM\x00*", b"IIRO": b"II*\x00"}
_TIFF_LIKE |= {b"IIRS": b"II*\x00", b"IIU\x00": b"II*\x00", b"MMOR": b"MM\x00*"}


def _raw_exif(image: Any, head: bytes) -> dict[str, Any]:
    magic = _TIFF_LIKE.get(head[:4])
    if magic is None:
        return {}
    exif = image.Exif()
    try:
        exif.load(magic + head[4:])
    except Exception as exc:  # a damaged directory is Pillow's many errors
        log.debug("unreadable RAW EXIF: %s", exc)
        return {}
    out: dict[str, Any] = {}
    _read(exif, out)
    return out


@functools.cache
def prepare_pillow() -> None:
    """Once: register the photo formats Pillow lacks where installed (the ``photos`` extra:
    HEIC/HEIF by ``pillow-heif``, JPEG XL by ``pillow-jxl-plugin``; Pillow reads AVIF itself),
    and silence Pillow's warnings on damaged metadata ("Corrupt EXIF data", "Truncated File
    Read", ...), which reached stderr at every such photo while the refusal or the dropped keys
    say it already (its own UserWarnings from its parsers only; ``catch_warnings`` is not
    thread-safe; decompression-bomb warnings are not UserWarnings)."""
    for module in (r"PIL\.TiffImagePlugin", r"PIL\.Image", r"PIL\.JpegImagePlugin"):
        warnings.filterwarnings("ignore", category=UserWarning, module=module)
    with contextlib.suppress(ImportError):
        import pillow_heif

        pillow_heif.register_heif_opener()
    with contextlib.suppress(ImportError):
        import pillow_jxl  # noqa: F401 -- registers the JXL plugin with Pillow


def _open_and_read(image: Any, fp: Any) -> dict[str, Any]:
    with image.open(fp) as img:
        out: dict[str, Any] = {}
        width, height = img.size
        try:
            exif = img.getexif()
        except Exception as exc:  # a corrupt EXIF block is Pillow's many errors
            log.debug("unreadable EXIF: %s", exc)
            exif = None
        if exif is not None:
            _read(exif, out)
            if exif.get(_ORIENTATION) in (5, 6, 7, 8):
                width, height = height, width
        out["width"], out["height"] = int(width), int(height)
        return out


def _read(exif: Any, out: dict[str, Any]) -> None:
    for name, reader in (("taken", _taken), ("camera", _camera), ("gps", _gps)):
        try:
            value = reader(exif)
        except Exception as exc:  # one bad tag spoils only its own key
            log.debug("EXIF %s unreadable: %s", name, exc)
            value = None
        if value:
            out[name] = value


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    value = value.split("\x00", 1)[0].strip()  # "Canon\0junk" is "Canon"
    if len(value) > MAX_TEXT:
        return None
    return value.encode("utf-8", "replace").decode("utf-8") or None


def _taken(exif: Any) -> str | None:
    ifd = exif.get_ifd(_EXIF_IFD)
    if _DATETIME_ORIGINAL not in ifd:
        ifd = exif  # DNG and TIFF/EP may keep it in the first directory
    stamp = _text(ifd.get(_DATETIME_ORIGINAL))
    match = _STAMP.fullmatch(stamp or "")
    if match is None:
        return None
    y, mo, d, h, mi, s = match.groups()
    if not ("01" <= mo <= "12" and "01" <= d <= "31" and h <= "23" and mi <= "59" and s <= "60"):
        return None
    taken = f"{y}-{mo}-{d}T{h}:{mi}:{s}"
    try:
        datetime.fromisoformat(taken)  # 2023-02-30 is no date
    except ValueError:
        return None
    offset = _text(ifd.get(_OFFSET_TIME_ORIGINAL))
    shape = _OFFSET.fullmatch(offset or "")
    if offset is None or shape is None or int(shape[1]) > 14 or int(shape[2]) > 59:
        return taken  # no offset, or not a real one (+99:99): the local time alone
    try:  # the instant must exist: 9999-12-31T23:59:59-12:00 is after year 9999 in UTC
        datetime.fromisoformat(taken + offset).astimezone(UTC)
    except (ValueError, OverflowError):
        return taken
    return taken + offset


def _camera(exif: Any) -> dict[str, str] | None:
    camera = {
        k: v for k, v in (("make", _text(exif.get(_MAKE))), ("model", _text(exif.get(_MODEL)))) if v
    }
    return camera or None


def _gps(exif: Any) -> dict[str, float] | None:
    gps = exif.get_ifd(_GPS_IFD)
    if not gps:
        return None
    lat = _degrees(gps.get(2), _text(gps.get(1)), "NS")
    lon = _degrees(gps.get(4), _text(gps.get(3)), "EW")
    if lat is None or lon is None or not (-90 <= lat <= 90 and -180 <= lon <= 180):
        return None
    out = {"lat": lat, "lon": lon}
    alt = gps.get(6)
    if alt is not None:
        metres = float(alt)
        if math.isfinite(metres):
            below = gps.get(5)
            below = below[0] if isinstance(below, bytes) and below else below
            out["alt"] = round(-metres if below == 1 else metres, 3)
    return out


def _degrees(dms: Any, ref: str | None, refs: str) -> float | None:
    if dms is None or ref is None or ref[:1].upper() not in refs:
        return None
    d, m, s = (float(x) for x in dms)
    value = d + m / 60 + s / 3600
    if not math.isfinite(value):
        return None
    return round(-value if ref[:1].upper() == refs[1] else value, 7)
