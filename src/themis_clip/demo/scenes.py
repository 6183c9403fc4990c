"""Generated scenes: one coloured shape of a given size and position on a textured background.

Draws with Pillow (``ImageDraw``); this is image *synthesis* for demos and training, kept apart
from the preprocessing seam in ``preprocess/image.py``.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

__all__ = [
    "COLOURS",
    "POSITIONS",
    "SHAPES",
    "SIZES",
    "Scene",
    "random_scene",
    "render_scene",
    "write_gallery",
]

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (40, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (240, 220, 40),
    "orange": (245, 140, 20),
    "purple": (140, 50, 180),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle", "star", "cross", "ring")
SIZES = ("small", "large")
POSITIONS = ("left", "center", "right")


@dataclass(frozen=True, kw_only=True)
class Scene:
    shape: str
    colour: str
    size: str = "large"
    position: str = "center"
    seed: int = 0

    @property
    def caption(self) -> str:
        pos = "in the center" if self.position == "center" else f"on the {self.position}"
        return f"a {self.size} {self.colour} {self.shape} {pos}"

    @property
    def slug(self) -> str:
        return f"{self.colour}-{self.shape}-{self.size}-{self.position}-{self.seed}"


def _polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    if shape == "triangle":
        return [
            (cx + r * math.cos(a), cy + r * math.sin(a))
            for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)
        ]
    if shape == "star":
        pts = []
        for k in range(10):
            rr = r if k % 2 == 0 else r * 0.45
            a = -math.pi / 2 + k * math.pi / 5
            pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
        return pts
    if shape == "cross":
        w = r * 0.35
        return [
            (cx - w, cy - r),
            (cx + w, cy - r),
            (cx + w, cy - w),
            (cx + r, cy - w),
            (cx + r, cy + w),
            (cx + w, cy + w),
            (cx + w, cy + r),
            (cx - w, cy + r),
            (cx - w, cy + w),
            (cx - r, cy + w),
            (cx - r, cy - w),
            (cx - w, cy - w),
        ]
    raise ValueError(f"not a polygon shape: {shape}")


def render_scene(scene: Scene, *, size: int = 224, varied: bool = False) -> Image.Image:
    """Draw ``scene`` as an RGB image of ``size``×``size`` pixels (deterministic per seed).

    ``varied`` randomises the rendering (background kind, fill and outline, antialiasing,
    rotation, colour jitter, JPEG artefacts) so that a model trained on it recognises shapes
    drawn by other programs, not only by this one.
    """
    if scene.shape not in SHAPES or scene.colour not in COLOURS:
        raise ValueError(f"unknown shape or colour: {scene.shape!r}, {scene.colour!r}")
    rng = np.random.default_rng(scene.seed)
    if not varied:
        return _draw(scene, size, rng, _noisy_background(rng, size), jitter=15)
    scale = int(rng.choice([1, 1, 2, 3]))  # 1: aliased edges; 2, 3: supersampled
    bg = _background(rng, size * scale, light_ok=scene.colour != "white")
    img = _draw(scene, size * scale, rng, bg, jitter=45, varied=True)
    if scale > 1:
        img = img.resize((size, size), Image.Resampling.LANCZOS)
    if rng.random() < 0.5:
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=int(rng.integers(35, 96)))
        buf.seek(0)
        img = Image.open(buf).convert("RGB")
    return img


def _noisy_background(rng: np.random.Generator, size: int) -> Image.Image:
    # A muted random gradient plus noise, never close to a shape colour's purity.
    base = rng.integers(90, 170, size=3)
    tilt = rng.integers(-40, 40, size=3)
    ramp = np.linspace(0, 1, size)[None, :, None] * tilt[None, None, :]
    noise = rng.normal(0, 12, (size, size, 3))
    bg = np.clip(base[None, None, :] + ramp + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(bg, "RGB").filter(ImageFilter.GaussianBlur(1))


def _background(rng: np.random.Generator, size: int, *, light_ok: bool) -> Image.Image:
    kind = rng.choice(["noisy", "light", "light", "plain", "stripes", "speckle"])
    if kind == "noisy" or (kind == "light" and not light_ok):
        return _noisy_background(rng, size)
    if kind == "light":  # paper: off-white or light grey, sometimes faintly tinted
        v = rng.integers(200, 256)
        rgb = np.clip(v + rng.integers(-12, 13, size=3), 0, 255)
        return Image.new("RGB", (size, size), tuple(int(c) for c in rgb))
    if kind == "plain":
        rgb = rng.integers(60, 200, size=3)
        return Image.new("RGB", (size, size), tuple(int(c) for c in rgb))
    if kind == "stripes":
        a, b = rng.integers(120, 230, size=3), rng.integers(120, 230, size=3)
        period = int(rng.integers(6, 24)) * max(1, size // 224)
        yy, xx = np.mgrid[0:size, 0:size]
        phase = (xx + yy * rng.choice([0, 1])) // period % 2
        bg = np.where(phase[..., None] == 0, a, b).astype(np.uint8)
        return Image.fromarray(bg, "RGB")
    base = rng.integers(150, 240, size=3)
    noise = rng.normal(0, rng.uniform(5, 25), (size, size, 1))
    bg = np.clip(base[None, None, :] + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(bg, "RGB")


def _draw(
    scene: Scene,
    size: int,
    rng: np.random.Generator,
    img: Image.Image,
    *,
    jitter: int,
    varied: bool = False,
) -> Image.Image:
    draw = ImageDraw.Draw(img)
    if varied:
        frac = rng.uniform(0.07, 0.15) if scene.size == "small" else rng.uniform(0.2, 0.36)
        dx, dy = rng.uniform(-0.07, 0.07), rng.uniform(-0.25, 0.25)
    else:
        frac = rng.uniform(0.09, 0.13) if scene.size == "small" else rng.uniform(0.22, 0.3)
        dx, dy = rng.uniform(-0.04, 0.04), rng.uniform(-0.2, 0.2)
    r = frac * size
    cx = ({"left": 0.25, "center": 0.5, "right": 0.75}[scene.position] + dx) * size
    cy = (0.5 + dy) * size
    colour = tuple(
        int(np.clip(c + rng.integers(-jitter, jitter + 1), 0, 255)) for c in COLOURS[scene.colour]
    )
    outline = None
    width = 0
    if varied and scene.shape != "ring" and rng.random() < 0.3:
        shade = rng.uniform(0.2, 0.6)
        outline = tuple(int(c * shade) for c in colour)
        width = max(1, int(r * rng.uniform(0.03, 0.1)))
    spin = rng.uniform(-0.3, 0.3) if varied else 0.0
    if scene.shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour, outline=outline, width=width)
    elif scene.shape == "ring":
        thick = rng.uniform(0.15, 0.35) if varied else 0.3
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=colour, width=max(2, int(r * thick)))
    elif scene.shape == "square":
        a = rng.uniform(0, math.pi / 2)
        if varied and rng.random() < 0.5:
            a = math.pi / 4 + spin  # axis-aligned, give or take a small rotation
        pts = [
            (cx + r * math.cos(a + k * math.pi / 2), cy + r * math.sin(a + k * math.pi / 2))
            for k in range(4)
        ]
        draw.polygon(pts, fill=colour, outline=outline, width=width)
    else:
        pts = _polygon(scene.shape, cx, cy, r)
        if spin:
            c, s = math.cos(spin), math.sin(spin)
            pts = [
                (cx + (x - cx) * c - (y - cy) * s, cy + (x - cx) * s + (y - cy) * c) for x, y in pts
            ]
        draw.polygon(pts, fill=colour, outline=outline, width=width)
    return img


def random_scene(
    rng: np.random.Generator,
    *,
    shapes: tuple[str, ...] = SHAPES,
    colours: tuple[str, ...] | None = None,
) -> Scene:
    cols = colours or tuple(COLOURS)
    return Scene(
        shape=str(rng.choice(shapes)),
        colour=str(rng.choice(cols)),
        size=str(rng.choice(SIZES)),
        position=str(rng.choice(POSITIONS)),
        seed=int(rng.integers(0, 2**31)),
    )


def write_gallery(
    folder: Path, count: int, *, seed: int = 0, size: int = 224
) -> list[tuple[Path, Scene]]:
    """Render ``count`` random scenes as JPEG files into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        scene = random_scene(rng)
        path = folder / f"{i:03d}-{scene.slug}.jpg"
        if not path.exists():
            render_scene(scene, size=size).save(path, quality=92)
        out.append((path, scene))
    return out
