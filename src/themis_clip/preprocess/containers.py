"""Looks inside image containers before Pillow does, so that their cost is known in advance.

Pillow decodes an ICO's frame inside ``Image.open()`` (before any size check can run), decodes
an ICNS's embedded PNG at whatever size that PNG declares, reads every strip offset of a TIFF's
first directory into Python integers at open, and lets libjpeg run every scan of a progressive
JPEG over the whole image. Each check here reads only headers and directories, from the raw
bytes, and raises :class:`ImageDecodeError` (or :class:`ImageTooLargeError`) naming the limit:

* ICO/CUR: every embedded PNG declares at most :data:`MAX_ICON_SIDE` per side (an ICO entry
  cannot declare more than 256) and at most ``max_image_pixels``;
* ICNS: the same for every embedded PNG;
* TIFF/BigTIFF: the first directory holds at most :data:`MAX_TIFF_ENTRIES` entries and at most
  :data:`MAX_TIFF_CHUNKS` strips or tiles, and no more strips than rows (times samples);
* JPEG: at most :func:`max_jpeg_scans` scans, fewer for larger images, so that scans × pixels
  (the work of a progressive decode) stays bounded;
* JPEG XL: the size its header declares is at most ``max_image_pixels`` (the Pillow plugin
  decodes the whole image inside ``Image.open()``: a 28 KB file declaring 20000x20000 cost
  1.4 GB before any size check could run).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import struct
from collections.abc import Iterator
from typing import Any

from themis_clip.errors import ImageDecodeError, ImageTooLargeError

__all__ = [
    "MAX_ICON_SIDE",
    "MAX_JPEG_SCANS",
    "MAX_TIFF_CHUNKS",
    "MAX_TIFF_ENTRIES",
    "check_container",
    "check_raw_data_fits",
    "count_jpeg_scans",
    "is_jxl",
    "jxl_size",
    "mapped",
    "max_jpeg_scans",
]

#: an icon's embedded image may be this many pixels a side (ICNS' largest, ic10, is 1024; ICO
#: entries declare at most 256; twice the largest leaves room for odd writers)
MAX_ICON_SIDE = 2048
#: a progressive JPEG from libjpeg has 10 scans; no encoder writes anywhere near this many
MAX_JPEG_SCANS = 256
#: scans × pixels a JPEG decode may cost: 256 scans of a 12-megapixel photo, fewer scans as the
#: image grows (16 at the least, more than any encoder's progressive script)
JPEG_SCAN_WORK = 256 * 12_000_000
#: strips or tiles in a TIFF's first directory (a 13000-row image in one-row strips has 13,000)
MAX_TIFF_CHUNKS = 1 << 17
MAX_TIFF_ENTRIES = 4096

_PNG = b"\x89PNG\r\n\x1a\n"


def check_container(data: Any, fmt: str | None, max_image_pixels: int) -> None:
    """Refuse ``data`` (the whole file) if its container declares unbounded work.

    ``fmt`` is Pillow's format name for it (``img.format``), or None to sniff the magic bytes.

    Raises:
        ImageDecodeError: a limit above is exceeded, or the directory is malformed.
        ImageTooLargeError: an embedded image declares more than ``max_image_pixels``.
    """
    # The views are released on the way out, a refusal's too: a mapped file closes only once
    # no view of it is left (a traceback keeps its frames' locals alive).
    with memoryview(data) as raw, raw.cast("B") as view:
        kind = fmt or _sniff(bytes(view[:8]))
        if kind in ("ICO", "CUR"):
            _check_ico(view, max_image_pixels)
        elif kind == "ICNS":
            _check_icns(view, max_image_pixels)
        elif kind == "TIFF":
            _check_tiff(view)
    if kind == "JXL":
        size = jxl_size(data)
        if size is not None and size[0] * size[1] > max_image_pixels:
            width, height = size
            raise ImageTooLargeError(
                f"JPEG XL image declares {width}x{height} = {width * height} pixels, above the "
                f"limit of {max_image_pixels} (max_image_pixels)"
            )


def _sniff(head: bytes) -> str | None:
    if head[:4] in (b"\x00\x00\x01\x00", b"\x00\x00\x02\x00"):
        return "ICO"
    if head[:4] == b"icns":
        return "ICNS"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "TIFF"
    if head[:2] == b"\xff\x0a" or head[:8] == _JXL_BOX[:8]:
        return "JXL"
    return None


_JXL_BOX = b"\x00\x00\x00\x0cJXL \x0d\x0a\x87\x0a"
#: SizeHeader's aspect ratios (code 1-7): width = height * num // den
_JXL_RATIOS = {1: (1, 1), 2: (12, 10), 3: (4, 3), 4: (3, 2), 5: (16, 9), 6: (5, 4), 7: (2, 1)}


def is_jxl(head: bytes) -> bool:
    """Whether a file's first 12 bytes are a JPEG XL codestream's or container's."""
    return head[:2] == b"\xff\x0a" or head[:12] == _JXL_BOX


def jxl_size(data: Any) -> tuple[int, int] | None:
    """``(width, height)`` a JPEG XL file declares in its codestream's SizeHeader (a bare
    codestream, or the ``jxlc`` / first ``jxlp`` box of the container); None if not found."""
    with memoryview(data) as raw, raw.cast("B") as view:
        start = _jxl_codestream(view)
        code = bytes(view[start : start + 18]) if start is not None else b""
    if code[:2] != b"\xff\x0a":
        return None
    bits = int.from_bytes(code[2:], "little")  # the SizeHeader takes at most 9 bytes
    pos = 0

    def take(n: int) -> int:
        nonlocal pos
        value = (bits >> pos) & ((1 << n) - 1)
        pos += n
        return value

    def side(div8: bool) -> int:
        if div8:
            return 8 * (1 + take(5))
        return 1 + take((9, 13, 18, 30)[take(2)])

    div8 = bool(take(1))
    height = side(div8)
    ratio = take(3)
    if ratio:
        num, den = _JXL_RATIOS[ratio]
        width = height * num // den
    else:
        width = side(div8)
    return width, height


def _jxl_codestream(view: memoryview) -> int | None:
    """Where the codestream starts in a JPEG XL file (None: no codestream box found)."""
    if bytes(view[:2]) == b"\xff\x0a":
        return 0
    if bytes(view[:12]) != _JXL_BOX:
        return None
    pos = 0
    for _ in range(MAX_TIFF_ENTRIES):
        if pos + 8 > len(view):
            return None
        size, kind = struct.unpack(">I4s", bytes(view[pos : pos + 8]))
        start = pos + 8
        if size == 1:
            if pos + 16 > len(view):
                return None
            (size,) = struct.unpack(">Q", bytes(view[pos + 8 : pos + 16]))
            start = pos + 16
        if kind == b"jxlc":
            return start
        if kind == b"jxlp":
            return start + 4  # after its 4-byte sequence number
        if size < 8:  # 0: the last box, to the end; below 8: malformed
            return None
        pos += int(size)
    return None


def _embedded_png_size(view: memoryview, offset: int) -> tuple[int, int] | None:
    if bytes(view[offset : offset + 8]) != _PNG or len(view) < offset + 24:
        return None
    width, height = struct.unpack(">II", view[offset + 16 : offset + 24])
    return int(width), int(height)


def _check_embedded(view: memoryview, offset: int, what: str, max_image_pixels: int) -> None:
    size = _embedded_png_size(view, offset)
    if size is None:  # BMP/DIB icon data: Pillow reads its size from the 256-bounded entry
        return
    width, height = size
    if width * height > max_image_pixels:
        raise ImageTooLargeError(
            f"{what} holds a {width}x{height} PNG = {width * height} pixels, above the limit "
            f"of {max_image_pixels} (max_image_pixels)"
        )
    if max(width, height) > MAX_ICON_SIDE:
        raise ImageDecodeError(
            f"{what} holds a {width}x{height} PNG; an icon's images are at most "
            f"{MAX_ICON_SIDE} pixels a side"
        )


def _check_ico(view: memoryview, max_image_pixels: int) -> None:
    if len(view) < 6:
        return  # Pillow refuses it as truncated
    (count,) = struct.unpack("<H", view[4:6])
    for i in range(count):
        entry = 6 + 16 * i
        if len(view) < entry + 16:
            raise ImageDecodeError(f"truncated ICO directory: {count} entries declared")
        (offset,) = struct.unpack("<I", view[entry + 12 : entry + 16])
        _check_embedded(view, int(offset), f"ICO entry {i}", max_image_pixels)


def _check_icns(view: memoryview, max_image_pixels: int) -> None:
    pos, end = 8, len(view)
    blocks = 0
    while pos + 8 <= end:
        (length,) = struct.unpack(">I", view[pos + 4 : pos + 8])
        if length < 8:
            raise ImageDecodeError(f"malformed ICNS block at byte {pos} (length {length})")
        kind = bytes(view[pos : pos + 4]).decode("latin-1")
        _check_embedded(view, pos + 8, f"ICNS block {kind!r}", max_image_pixels)
        pos += int(length)
        blocks += 1
        if blocks > MAX_TIFF_ENTRIES:
            raise ImageDecodeError(f"ICNS file has more than {MAX_TIFF_ENTRIES} blocks")


_STRIP_TAGS = {273: "strips", 279: "strips", 324: "tiles", 325: "tiles"}


def _check_tiff(view: memoryview) -> None:
    if len(view) < 16:
        return
    order = "<" if bytes(view[:2]) == b"II" else ">"
    (magic,) = struct.unpack(order + "H", view[2:4])
    big = magic == 43
    if big:
        (ifd,) = struct.unpack(order + "Q", view[8:16])
        count_fmt, entry_size, count_size = "Q", 20, 8
    else:
        (ifd,) = struct.unpack(order + "I", view[4:8])
        count_fmt, entry_size, count_size = "H", 12, 2
    ifd = int(ifd)
    if ifd + count_size > len(view):
        return  # Pillow refuses it as truncated
    (entries,) = struct.unpack(order + count_fmt, view[ifd : ifd + count_size])
    if entries > MAX_TIFF_ENTRIES:
        raise ImageDecodeError(
            f"TIFF directory declares {entries} entries; at most {MAX_TIFF_ENTRIES} are read"
        )
    values: dict[int, int] = {}
    chunks = 0
    for i in range(int(entries)):
        at = ifd + count_size + i * entry_size
        if at + entry_size > len(view):
            break
        tag, kind = struct.unpack(order + "HH", view[at : at + 4])
        field = 8 if big else 4
        (n,) = struct.unpack(order + ("Q" if big else "I"), view[at + 4 : at + 4 + field])
        if tag in _STRIP_TAGS:
            chunks = max(chunks, int(n))
        elif tag in (257, 277) and n == 1 and kind in (3, 4):  # ImageLength, SamplesPerPixel
            fmt = order + ("H" if kind == 3 else "I")
            raw = view[at + 4 + field : at + 4 + field + struct.calcsize(fmt)]
            values[int(tag)] = int(struct.unpack(fmt, raw)[0])
    if chunks > MAX_TIFF_CHUNKS:
        raise ImageDecodeError(
            f"TIFF declares {chunks} strips or tiles; at most {MAX_TIFF_CHUNKS} are read"
        )
    rows, samples = values.get(257), values.get(277, 1)
    if rows is not None and chunks > max(1, rows) * max(1, samples) and chunks > 4096:
        raise ImageDecodeError(
            f"TIFF declares {chunks} strips or tiles for an image of {rows} rows"
        )


def count_jpeg_scans(data: Any, stop_after: int) -> int:
    """Start-of-scan markers in a JPEG, counting no further than ``stop_after``.

    Entropy-coded data stuffs every 0xFF byte with a 0x00, so ``FF DA`` occurs only as a
    marker (an EXIF thumbnail's scans count too: a few, never hundreds).
    """
    raw = data if isinstance(data, bytes | bytearray | mmap.mmap) else bytes(data)
    found, pos = 0, 0
    while found <= stop_after:
        pos = raw.find(b"\xff\xda", pos)
        if pos < 0:
            break
        found += 1
        pos += 2
    return found


def max_jpeg_scans(pixels: int) -> int:
    """Scans allowed for a JPEG of ``pixels`` (see :data:`JPEG_SCAN_WORK`)."""
    return max(16, min(MAX_JPEG_SCANS, JPEG_SCAN_WORK // max(1, pixels)))


def check_raw_data_fits(size: tuple[int, int], tiles: Any, nbytes: int) -> None:
    """Refuse uncompressed data (BMP, PPM, raw TIFF...) shorter than its header declares.

    Pillow allocates the whole image before reading it: a 54-byte BMP header claiming 13000²
    pixels would cost 160 MB before failing as truncated. Uncompressed pixels need at least one
    bit each, so a raw tile with fewer bytes than that cannot be complete.
    """
    for tile in tiles:
        if tile[0] != "raw":
            continue
        x0, y0, x1, y1 = tile[1]
        needed = int(tile[2]) + math.ceil((x1 - x0) * (y1 - y0) / 8)
        if needed > nbytes:
            raise ImageDecodeError(
                f"truncated image data: the header declares {size[0]}x{size[1]} "
                f"uncompressed pixels (at least {needed} bytes) but the data has {nbytes}"
            )


@contextlib.contextmanager
def mapped(fh: Any, size: int) -> Iterator[Any]:
    """The file's bytes, memory-mapped (read only), for the container checks."""
    if size == 0:
        yield b""
        return
    try:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # not mappable (a pipe, a special file): read it
        yield fh.read()
        fh.seek(0)
        return
    try:
        yield mapped
    finally:
        mapped.close()
