"""Hostile images for the decoder's cost limits (issue 28 part 2 items 2 and 8), built by hand.

* :func:`many_scan_jpeg`: a progressive JPEG (Pillow ``progressive=True``, 6 scans for a grey
  image) whose last scan, an AC refinement, is repeated ``repeats`` times before EOI. libjpeg
  warns about the progression but decodes every scan over the whole image: 65 kB, 6.7 s.
* :func:`png16_bomb`: a 16-bit greyscale PNG of ``side``² zero rows, compressed by zlib as a
  stream of identical rows (321 kB for 13000²).
* :func:`ico_with_png`: an ICO whose one entry declares 256x256 and holds a PNG of any size.
* :func:`tiff_with_strips`: a 16x16 8-bit TIFF whose directory lists ``strips`` strips.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def many_scan_jpeg(side: int = 2048, repeats: int = 3000) -> bytes:
    img = Image.fromarray(np.full((side, side), 128, np.uint8), "L")
    buf = io.BytesIO()
    img.save(buf, "JPEG", progressive=True, quality=90)
    data = buf.getvalue()
    last, end = data.rindex(b"\xff\xda"), data.rindex(b"\xff\xd9")
    return data[:end] + data[last:end] * repeats + data[end:]


def png_of_zero_rows(width: int, height: int, *, depth: int = 8, colour: int = 0) -> bytes:
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    row = b"\0" * (1 + width * channels * depth // 8)
    z = zlib.compressobj(9)
    chunks = [z.compress(row) for _ in range(height)]
    idat = b"".join(chunks) + z.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


def png16_bomb(side: int = 13000) -> bytes:
    return png_of_zero_rows(side, side, depth=16)


def ico_with_png(png: bytes) -> bytes:
    header = struct.pack("<HHH", 0, 1, 1)
    entry = struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(png), 6 + 16)
    return header + entry + png


def tiff_with_strips(strips: int, side: int = 16) -> bytes:
    entries = [
        (256, 3, 1, side),
        (257, 3, 1, side),
        (258, 3, 1, 8),
        (259, 3, 1, 1),
        (262, 3, 1, 1),
        (273, 4, strips, None),  # StripOffsets
        (277, 3, 1, 1),
        (278, 3, 1, 1),
        (279, 4, strips, None),  # StripByteCounts
    ]
    ifd_at = 8
    ifd_size = 2 + 12 * len(entries) + 4
    pixels_at = ifd_at + ifd_size
    offsets_at = pixels_at + side * side
    counts_at = offsets_at + 4 * strips
    out = bytearray(b"II*\x00" + struct.pack("<I", ifd_at) + struct.pack("<H", len(entries)))
    for tag, kind, count, value in entries:
        if value is None:
            value = offsets_at if tag == 273 else counts_at
            out += struct.pack("<HHII", tag, kind, count, value)
        else:
            out += struct.pack("<HHIHH", tag, kind, count, value, 0)
    out += struct.pack("<I", 0)
    out += b"\x80" * (side * side)
    out += struct.pack(f"<{strips}I", *([pixels_at] * strips))
    out += struct.pack(f"<{strips}I", *([1] * strips))
    return bytes(out)
