"""A corpus of hostile and broken inputs, generated (shared by the reliability tests)."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import numpy as np
from PIL import Image

from tests.helpers import photo_like


def _save(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _bomb_png(w: int, h: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + _png_chunk(b"IEND", b"")
    )


def _corrupt_huffman(jpeg: bytes) -> bytes:
    i = jpeg.index(b"\xff\xc4")  # first DHT segment: scramble its code lengths and symbols
    data = bytearray(jpeg)
    rng = np.random.default_rng(1)
    for j in range(i + 5, i + 40):
        data[j] = int(rng.integers(0, 256))
    return bytes(data)


def _ycck(cmyk_jpeg: bytes) -> bytes:
    i = cmyk_jpeg.find(b"\xff\xeeAdobe")
    if i < 0:
        return cmyk_jpeg
    data = bytearray(cmyk_jpeg)
    data[i + 4 + 11] = 2  # Adobe APP14 transform byte: 2 = YCCK
    return bytes(data)


def image_corpus() -> dict[str, bytes]:
    rgb = Image.fromarray(photo_like(320, 240, 3))
    jpeg = _save(rgb, "JPEG", quality=90)
    png = _save(rgb, "PNG")
    frames = [Image.fromarray(photo_like(80, 60, s)) for s in (4, 5, 6)]

    def animated(fmt: str) -> bytes:
        buf = io.BytesIO()
        frames[0].save(buf, format=fmt, save_all=True, append_images=frames[1:])
        return buf.getvalue()

    palette = rgb.quantize(32)
    palette.info["transparency"] = 2
    arr16 = (photo_like(200, 150, 7)[:, :, 0].astype(np.uint16) * 257).astype(np.uint16)
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("inner.png", png)
    corpus = {
        "zero bytes": b"",
        "random bytes": np.random.default_rng(0).bytes(10_000),
        "truncated jpeg": jpeg[: len(jpeg) // 2],
        "truncated png": png[:120],
        "jpeg with corrupt huffman table": _corrupt_huffman(jpeg),
        "1x1": _save(Image.new("RGB", (1, 1), (200, 10, 10)), "PNG"),
        "1x100000": _save(Image.new("L", (1, 100_000), 128), "PNG"),
        "png declaring 100000x100000": _bomb_png(100_000, 100_000),
        "cmyk jpeg": _save(rgb.convert("CMYK"), "JPEG"),
        "ycck jpeg": _ycck(_save(rgb.convert("CMYK"), "JPEG")),
        "16-bit png": _save(Image.fromarray(arr16), "PNG"),
        "palette with transparency": _save(palette, "PNG"),
        "LA png": _save(rgb.convert("LA"), "PNG"),
        "RGBA png": _save(rgb.convert("RGBA"), "PNG"),
        "animated gif": animated("GIF"),
        "animated webp": animated("WEBP"),
        "multi-page tiff": animated("TIFF"),
        "malformed exif": _save(rgb, "JPEG", exif=b"Exif\x00\x00II*\x00\xff\xff\xff\x7f garbage"),
        "svg": b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>',
        "heic": b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 200,
        "pdf": b"%PDF-1.4\n1 0 obj<</Type/Catalog>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF",
        "png inside a zip": zipped.getvalue(),
    }
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        corpus[f"exif orientation {orientation}"] = _save(rgb, "JPEG", exif=exif.tobytes())
    return corpus


TEXT_CORPUS = {
    "empty": "",
    "whitespace only": " \t\n  ",
    "100k characters": "a photo of a cat " * 6000,
    "NUL and control characters": "a\x00b\x01c\x07d\x1b[31m",
    "invalid surrogates": "bad \ud800 and \udfff here",
    "emoji": "🐱🐶🚀 a cat and a dog 👍🏽",
    "right-to-left": "שלום עולם مرحبا بالعالم",
    "combining characters": "e\u0301 a\u0308 Z\u0351\u0354\u0355\u0359",
}
