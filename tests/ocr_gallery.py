"""A generated gallery for OCR: photo-like scenes with known text, and text-free landscapes.

Scenes are signs, receipts and screens drawn in Debian's fonts (fonts-dejavu-core,
fonts-liberation) at several sizes, turned (0/90/180/270° and tilts up to ±20°), seen in
perspective, over noisy backgrounds, and saved as JPEG at varied quality. Each scene records
the words it shows, so word recall can be measured. Nothing is committed: tests and
``bench/bench_ocr.py`` build it in a temporary folder, the same for a given seed.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_DIRS = (
    Path("/usr/share/fonts/truetype/dejavu"),
    Path("/usr/share/fonts/truetype/liberation"),
)
FONT_NAMES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansCondensed-Bold.ttf",
    "LiberationSans-Regular.ttf",
    "LiberationSans-Bold.ttf",
    "LiberationSerif-Regular.ttf",
    "LiberationMono-Regular.ttf",
    "LiberationSansNarrow-Bold.ttf",
)
SIGN_WORDS = (
    "STARBUCKS",
    "BAKERY",
    "PHARMACY",
    "PARKING",
    "HOTEL",
    "MUSEUM",
    "STATION",
    "GARDEN",
    "LIBRARY",
    "MARKET",
    "CINEMA",
    "BOOKSHOP",
    "HARBOUR",
    "BRIDGE",
    "CASTLE",
    "THEATRE",
    "FLOWERS",
    "BISTRO",
    "GALLERY",
    "SCHOOL",
)
ITEMS = (
    "Coffee",
    "Croissant",
    "Sandwich",
    "Water",
    "Orange juice",
    "Bagel",
    "Salad",
    "Muffin",
    "Cheese",
    "Bread",
    "Apples",
    "Tomatoes",
    "Chocolate",
    "Butter",
    "Yogurt",
    "Pasta",
)
SCREEN_LINES = (
    "Meeting starts at noon",
    "Battery charging",
    "Download complete",
    "Welcome back Maria",
    "Departure platform seven",
    "Weather sunny today",
    "Update available now",
    "Temperature twenty degrees",
    "Password changed",
    "Server online",
)


def fonts() -> list[Path]:
    """The gallery's fonts that are installed (empty: tests skip)."""
    found = []
    for name in FONT_NAMES:
        for folder in FONT_DIRS:
            if (folder / name).is_file():
                found.append(folder / name)
                break
    return found


@dataclass(frozen=True)
class Scene:
    path: Path
    kind: str  # sign, receipt, screen, landscape
    words: tuple[str, ...]  # every word shown, as drawn
    rotation: int  # degrees counter-clockwise
    text_scale: float | None = None


def background(rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    """A landscape: sky gradient, hills, blobs of foliage, sensor noise."""
    w, h = size
    y = np.linspace(0, 1, h)[:, None, None]
    sky_top = rng.uniform([60, 110, 170], [140, 170, 240])
    sky_low = rng.uniform([170, 190, 210], [230, 230, 250])
    arr = np.broadcast_to(sky_top * (1 - y) + sky_low * y, (h, w, 3)).copy()
    xs = np.arange(w)
    for k in range(3):
        base = h * rng.uniform(0.45, 0.75)
        ridge = base + h * 0.06 * np.sin(xs / w * rng.uniform(2, 9) + rng.uniform(0, 6))
        colour = rng.uniform([30, 70, 20], [110, 150, 80]) * (1 - 0.15 * k)
        mask = np.arange(h)[:, None] > ridge[None, :]
        arr[mask] = colour
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(5, 25))):
        cx, cy = rng.uniform(0, w), rng.uniform(h * 0.4, h)
        r = rng.uniform(w * 0.01, w * 0.06)
        colour = tuple(int(c) for c in rng.uniform([20, 50, 10], [90, 130, 60]))
        d.ellipse((cx - r, cy - r * 1.4, cx + r, cy + r), fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(radius=max(1.0, w / 1200)))
    noise = rng.normal(0, 6, (h, w, 3))
    return Image.fromarray(np.clip(np.asarray(img, np.float64) + noise, 0, 255).astype(np.uint8))


def _sign(
    rng: np.random.Generator, font: Path, scale: float, word: str | None = None
) -> tuple[Image.Image, list[str]]:
    word = word or str(rng.choice(SIGN_WORDS))
    f = ImageFont.truetype(str(font), int(70 * scale))
    box = f.getbbox(word)
    pad = int(24 * scale)
    tw, th = box[2] - box[0], box[3] - box[1]
    bg = tuple(int(c) for c in rng.uniform(0, 120, 3))
    fg = tuple(int(c) for c in rng.uniform(200, 255, 3))
    layer = Image.new("RGBA", (tw + 2 * pad, th + 2 * pad), (*bg, 255))
    ImageDraw.Draw(layer).text((pad - box[0], pad - box[1]), word, font=f, fill=(*fg, 255))
    return layer, [word]


def _receipt(rng: np.random.Generator, font: Path, scale: float) -> tuple[Image.Image, list[str]]:
    f = ImageFont.truetype(str(font), int(28 * scale))
    chosen = [str(x) for x in rng.choice(ITEMS, size=int(rng.integers(3, 6)), replace=False)]
    lines = [*(f"{item}  {rng.uniform(1, 20):.2f}" for item in chosen), "TOTAL"]
    line_h = int(40 * scale)
    width = int(max(f.getlength(s) for s in lines) + 60 * scale)
    layer = Image.new("RGBA", (width, line_h * len(lines) + int(50 * scale)), (245, 243, 235, 255))
    d = ImageDraw.Draw(layer)
    for i, s in enumerate(lines):
        d.text((int(30 * scale), int(25 * scale) + i * line_h), s, font=f, fill=(30, 30, 30, 255))
    return layer, [w for s in lines for w in s.split()]


def _screen(rng: np.random.Generator, font: Path, scale: float) -> tuple[Image.Image, list[str]]:
    f = ImageFont.truetype(str(font), int(36 * scale))
    chosen = [str(x) for x in rng.choice(SCREEN_LINES, size=2, replace=False)]
    line_h = int(52 * scale)
    width = int(max(f.getlength(s) for s in chosen) + 80 * scale)
    layer = Image.new("RGBA", (width, line_h * 2 + int(60 * scale)), (20, 24, 40, 255))
    d = ImageDraw.Draw(layer)
    fg = tuple(int(c) for c in rng.uniform(180, 255, 3))
    for i, s in enumerate(chosen):
        d.text((int(40 * scale), int(30 * scale) + i * line_h), s, font=f, fill=(*fg, 255))
    return layer, [w for s in chosen for w in s.split()]


def _perspective(layer: Image.Image, rng: np.random.Generator, amount: float) -> Image.Image:
    """``layer`` seen slightly from the side (each corner moved up to ``amount`` of its size)."""
    w, h = layer.size
    src = np.array([[0, 0], [w, 0], [w, h], [0, h]], dtype=np.float64)
    dst = src + rng.uniform(-amount, amount, (4, 2)) * [w, h]
    dst -= dst.min(axis=0)
    out_w, out_h = (int(v) + 1 for v in dst.max(axis=0))
    # Coefficients map output pixels back to the layer's (PIL's PERSPECTIVE convention).
    a = []
    for (x, y), (u, v) in zip(dst, src, strict=True):
        a.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        a.append([0, 0, 0, x, y, 1, -v * x, -v * y])
    coeffs = np.linalg.solve(np.array(a), src.ravel())
    return layer.transform(
        (out_w, out_h), Image.Transform.PERSPECTIVE, tuple(coeffs), Image.Resampling.BICUBIC
    )


def make_scene(
    path: Path,
    *,
    kind: str,
    font: Path,
    seed: int,
    size: tuple[int, int] = (1024, 768),
    rotation: int = 0,
    tilt: float = 0.0,
    quality: int = 85,
    word: str | None = None,
    text_scale: float | None = None,
) -> Scene:
    """One scene of ``kind`` (sign, receipt, screen, landscape) saved as a JPEG at ``path``
    (a sign shows ``word`` when given; ``text_scale`` sizes the text, 1.0: a 70 px sign word
    or 28 px receipt line on a 1024-pixel-wide picture)."""
    rng = np.random.default_rng(seed)
    img = background(rng, size)
    words: list[str] = []
    if kind != "landscape":
        scale = size[0] / 1024 * (text_scale or float(rng.uniform(0.8, 1.3)))
        if kind == "sign":
            layer, words = _sign(rng, font, scale, word)
        else:
            layer, words = {"receipt": _receipt, "screen": _screen}[kind](rng, font, scale)
        layer = _perspective(layer, rng, 0.06)
        turn = rotation + tilt
        if turn:
            layer = layer.rotate(turn, expand=True, resample=Image.Resampling.BICUBIC)
        fit = min(1.0, 0.9 * size[0] / layer.width, 0.9 * size[1] / layer.height)
        if fit < 1.0:
            layer = layer.resize((int(layer.width * fit), int(layer.height * fit)))
        x = int(rng.uniform(0, size[0] - layer.width))
        y = int(rng.uniform(0, size[1] - layer.height))
        img.paste(layer, (x, y), layer)
    img.save(path, format="JPEG", quality=quality)
    return Scene(path=path, kind=kind, words=tuple(words), rotation=rotation, text_scale=text_scale)


def build_gallery(folder: Path, *, count: int = 48, seed: int = 0) -> list[Scene]:
    """``count`` scenes with text (kinds, fonts, turns and JPEG qualities in rotation) and
    ``count // 3`` text-free landscapes, written to ``folder``. Text sizes run from 0.45
    (13 px receipt lines, 32 px sign words) to 1.3."""
    available = fonts()
    if not available:
        raise FileNotFoundError("no gallery font installed (fonts-dejavu-core, fonts-liberation)")
    folder.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(seed)
    scenes = []
    kinds = ("sign", "receipt", "screen")
    rotations = (0, 0, 0, 90, 180, 270)
    for i in range(count):
        kind = kinds[i % 3]
        tilt = rnd.uniform(-20, 20) if i % 2 else 0.0
        scenes.append(
            make_scene(
                folder / f"{kind}-{i:03d}.jpg",
                kind=kind,
                font=available[i % len(available)],
                seed=seed * 1000 + i,
                rotation=rotations[(i // 3) % len(rotations)],
                tilt=tilt,
                quality=rnd.choice((60, 75, 90)),
                text_scale=(0.45, 0.7, 1.0, 1.3)[(i // 2) % 4],
            )
        )
    for i in range(count // 3):
        scenes.append(
            make_scene(
                folder / f"landscape-{i:03d}.jpg",
                kind="landscape",
                font=available[0],
                seed=seed * 1000 + 500 + i,
            )
        )
    return scenes


def words_found(
    expected: tuple[str, ...], text: str, *, min_letters: int = 4, substring: bool = False
) -> tuple[int, int]:
    """``(found, total)`` over the expected words of at least ``min_letters`` letters: read as
    a word of their own, or (``substring``) anywhere in the text, as a trigram search finds
    them ("Maria" in "backMaria")."""
    read = {w.lower() for w in _tokens(text)}
    wanted = [w.lower() for w in expected if sum(c.isalpha() for c in w) >= min_letters]
    if substring:
        return sum(w in text.lower() for w in wanted), len(wanted)
    return sum(w in read for w in wanted), len(wanted)


def _tokens(text: str) -> list[str]:
    """Runs of letters (OCR may drop the space before a price: "Salad7.77" holds "Salad")."""
    return re.findall(r"[^\W\d_]+", text)
