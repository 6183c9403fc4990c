"""The only module that imports Pillow: decode, orient, resize, crop, normalise.

Parity target: with ``resize_mode="shortest"`` this matches OpenAI CLIP's ``_transform(n_px)``
exactly: ``Resize(n_px, BICUBIC)`` of the shortest side with the long side
truncated (``int(n_px * long / short)``), ``CenterCrop(n_px)`` with round-half-to-even offsets,
RGB conversion *after* resize and crop (palette and 1-bit images are therefore resized NEAREST
by Pillow, RGBA is resized before alpha is dropped), ``/255`` and the CLIP mean/std, CHW.

Deliberate differences from the reference, each switchable or harmless to parity:

* EXIF orientation is applied first (``apply_exif=True``); no peer does this, so a photo taken
  in portrait is embedded upright. Malformed EXIF is ignored, never an error.
* 16-bit and 32-bit greyscale images (Pillow modes ``I;16*``, ``I``, ``F``) are scaled to
  8 bits before anything else. Pillow's own conversion clips them at 255, which turns every
  16-bit PNG white; the reference inherits that bug.
* Images whose header declares more than ``max_image_pixels`` are refused before decoding.

Beyond a 16:1 aspect ratio Pillow resamples only the box of the source that survives the crop
(the reference would build a 224 x 22,400,000 intermediate for a 1x100000 image). That is the
reference within 1 level on panoramas (4000x224, 20000x1000, 300x7000 photos), 7 on a 2x1000
sliver, and more only on pixel noise, where Pillow's box centres (float32) move the filter.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image, UnidentifiedImageError

from themis_clip.budget import PixelBudget
from themis_clip.errors import ImageDecodeError, ImageTooLargeError, InputError, ThemisClipError
from themis_clip.files import NotARegularFileError, open_regular
from themis_clip.inputspec import ImageSpec
from themis_clip.interface import ImageData
from themis_clip.preprocess.containers import (
    check_container,
    check_raw_data_fits,
    count_jpeg_scans,
    is_jxl,
    jxl_size,
    mapped,
    max_jpeg_scans,
)
from themis_clip.preprocess.deadline import DeadlineReader
from themis_clip.preprocess.depth import to_8bit
from themis_clip.preprocess.exif import prepare_pillow
from themis_clip.preprocess.raw import RAW_SUFFIXES, looks_raw, raw_support, read_raw
from themis_clip.vocabulary import (
    CLIP_MEAN,
    CLIP_STD,
    DEFAULT_DECODE_TIMEOUT_S,
    DEFAULT_MAX_IMAGE_PIXELS,
    DecodeMode,
    ResizeMode,
)

__all__ = [
    "ImagePreprocessor",
    "decode_image",
    "image_dimensions",
    "preprocess_image",
    "readable_formats",
    "same_pixels",
]

log = logging.getLogger(__name__)

# Above this aspect ratio the shortest-side resize is done on the cropped region only.
_MAX_INTERMEDIATE = 16
_HIGH_DEPTH_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I", "F"})
RESAMPLING = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


def decode_image(
    data: ImageData,
    *,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    apply_exif: bool = True,
    draft_min_side: int | None = None,
    format_hint: str | None = None,
    orientation: int | None = None,
    reserve: Callable[[int, int], None] | None = None,
    decode_timeout_s: float = DEFAULT_DECODE_TIMEOUT_S,
) -> Image.Image:
    """Open ``data`` as a Pillow image (first frame), oriented and in an 8-bit mode.

    With ``draft_min_side``, JPEGs are decoded at the smallest DCT scale (1/2, 1/4, 1/8) whose
    shorter side is still at least that many pixels: 3x faster on 12-megapixel photos.
    ``format_hint`` (a Pillow format name, e.g. ``"PNG"``) is tried first, and only a hint:
    data of another format still decodes. ``orientation`` (EXIF 1-8, declared by the caller)
    applies when ``apply_exif`` is on and the image carries no orientation of its own.
    ``reserve`` is called with the bytes the decode will hold at most (the frame and its
    full-size intermediates, after DCT scaling) and the frame's pixels, once the header is read
    and before any pixel memory is allocated: a :class:`~themis_clip.budget.Lease`'s
    ``take_bytes``, so that concurrent decodes share a budget. Containers are inspected before
    Pillow opens them (:mod:`.containers`), and the decode stops after ``decode_timeout_s``.

    Raises:
        ImageDecodeError: not an image, truncated or corrupt data, missing file.
        ImageTooLargeError: the header declares more than ``max_image_pixels`` pixels.
        InputError: an unsupported input type or array shape.
    """
    if isinstance(data, Image.Image):
        img = _checked_load(data, max_image_pixels)
    elif isinstance(data, np.ndarray):
        img = _checked_load(_from_array(data), max_image_pixels)
    elif isinstance(data, bytes | bytearray | memoryview):
        if len(data) == 0:
            raise ImageDecodeError("empty image data (0 bytes)")
        picture = _raw_picture(data, None, max_image_pixels, reserve)
        if picture is not None:
            return _decode_raw(
                picture,
                max_image_pixels,
                apply_exif,
                draft_min_side,
                orientation,
                reserve,
                decode_timeout_s,
            )
        deadline = time.monotonic() + decode_timeout_s
        check_container(data, None, max_image_pixels)
        fp = DeadlineReader(io.BytesIO(data), deadline, decode_timeout_s)
        img = _checked_load(
            _open(fp, "image bytes", format_hint),
            max_image_pixels,
            draft_min_side,
            reserve,
            data,
            orientation,
            apply_exif,
        )
    elif isinstance(data, str | os.PathLike):
        path = os.fspath(data)
        try:
            # The file is closed as soon as frame 0 is decoded: no descriptor outlives the call.
            with open_regular(path) as fh:
                deadline = time.monotonic() + decode_timeout_s
                size = os.fstat(fh.fileno()).st_size
                with mapped(fh, size) as raw:
                    suffix = os.path.splitext(path)[1]
                    picture = _raw_picture(raw, suffix, max_image_pixels, reserve)
                    if picture is not None:
                        return _decode_raw(
                            picture,
                            max_image_pixels,
                            apply_exif,
                            draft_min_side,
                            orientation,
                            reserve,
                            decode_timeout_s,
                        )
                    check_container(raw, None, max_image_pixels)
                    img = _checked_load(
                        _open(DeadlineReader(fh, deadline, decode_timeout_s), path, format_hint),
                        max_image_pixels,
                        draft_min_side,
                        reserve,
                        raw,
                        orientation,
                        apply_exif,
                    )
        except FileNotFoundError:
            raise ImageDecodeError(f"image file not found: {path}") from None
        except IsADirectoryError:
            raise ImageDecodeError(f"not a file but a directory: {path}") from None
        except PermissionError as exc:
            raise ImageDecodeError(f"cannot read {path}: {exc.strerror or exc}") from exc
        except NotARegularFileError as exc:
            raise ImageDecodeError(str(exc)) from None
    else:
        raise InputError(
            f"unsupported image input type {type(data).__name__}: pass bytes, a path, "
            "a PIL image or an HWC uint8 array"
        )
    if apply_exif:
        turn = _turn_of(img, orientation)
        if turn is not None:
            img = img.transpose(turn)
    if img.mode in _HIGH_DEPTH_MODES:
        img = _to_8bit(img)
    return img


def _decode_raw(
    picture: tuple[bytes | npt.NDArray[np.uint8], int],
    max_image_pixels: int,
    apply_exif: bool,
    draft_min_side: int | None,
    orientation: int | None,
    reserve: Callable[[int, int], None] | None,
    decode_timeout_s: float,
) -> Image.Image:
    """A RAW file's picture (:func:`_raw_picture`) decoded under the caller's options."""
    return decode_image(
        picture[0],
        max_image_pixels=max_image_pixels,
        apply_exif=apply_exif,
        draft_min_side=draft_min_side,
        orientation=orientation or picture[1],
        reserve=reserve,
        decode_timeout_s=decode_timeout_s,
    )


def _raw_picture(
    data: Any, suffix: str | None, max_image_pixels: int, reserve: Callable[[int, int], None] | None
) -> tuple[bytes | npt.NDArray[np.uint8], int] | None:
    """A camera RAW file's picture and the EXIF orientation that rights it: the embedded
    preview (JPEG bytes) or LibRaw's decode (upright already); None where ``data`` is no RAW."""
    head = bytes(memoryview(data).cast("B")[:16])
    if not looks_raw(head, suffix):
        return None
    if not raw_support():
        if suffix is not None and suffix.lower() in RAW_SUFFIXES:
            raise ImageDecodeError(
                "camera RAW files need rawpy: pip install 'themis-onnx-clip[photos]'"
            )
        return None
    found = read_raw(data, max_image_pixels=max_image_pixels, reserve=reserve)
    if found is None:
        return None
    if found.jpeg is not None:
        return found.jpeg, found.orientation
    assert found.rgb is not None
    return found.rgb, 1


def _turn_of(img: Image.Image, orientation: int | None) -> Image.Transpose | None:
    """The transpose that rights ``img`` (None: upright, or unreadable EXIF)."""
    try:
        own = img.getexif().get(_ORIENTATION)
        # ImageOps.exif_transpose copies even an upright image (a full-size copy of a
        # 169-megapixel bomb is 645 MB): transpose only when there is something to right.
        return _TRANSPOSE.get(own if own is not None else (orientation or 1))
    except Exception as exc:  # malformed EXIF must never fail an embedding
        log.debug("ignoring unreadable EXIF orientation: %s", exc)
        return None


#: bytes per pixel of a decoded frame, by Pillow mode (multi-band modes take 4)
_MODE_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16L": 2, "I;16B": 2, "I;16N": 2}
#: formats whose plugin decodes into memory first and then reads that as a "raw" tile
_DECODED_FIRST = frozenset({"AVIF", "WEBP", "HEIF", "JXL"})


def _checked_load(
    img: Image.Image,
    max_image_pixels: int,
    draft_min_side: int | None = None,
    reserve: Callable[[int, int], None] | None = None,
    raw: Any = None,
    orientation: int | None = None,
    apply_exif: bool = False,
) -> Image.Image:
    """Check the declared size and cost against the limits and the data, reserve, decode."""
    width, height = img.size
    if width < 1 or height < 1:
        raise ImageDecodeError(f"image has no pixels ({width}x{height})")
    if width * height > max_image_pixels:
        raise ImageTooLargeError(
            f"image is {width}x{height} = {width * height} pixels, above the limit of "
            f"{max_image_pixels} (max_image_pixels)"
        )
    if raw is not None and img.format == "JPEG":
        allowed = max_jpeg_scans(width * height)
        scans = count_jpeg_scans(raw, allowed)
        if scans > allowed:
            raise ImageDecodeError(
                f"JPEG has more than {allowed} scans for its {width}x{height} pixels; a "
                "progressive JPEG has about 10 (each scan is decoded over the whole image)"
            )
    short = min(width, height)
    if draft_min_side and img.format == "JPEG" and short >= 2 * draft_min_side:
        scale = draft_min_side / short
        img.draft(img.mode, (math.ceil(width * scale), math.ceil(height * scale)))
    if raw is not None and img.format not in _DECODED_FIRST:
        check_raw_data_fits(img.size, getattr(img, "tile", None) or (), len(raw))
    if reserve is not None:
        pixels = img.size[0] * img.size[1]
        frame = _MODE_BYTES.get(img.mode, 4)
        # Only EXIF already read with the header: Pillow's PNG getexif() decodes the whole
        # image to look for an eXIf chunk after the pixels, which is what the budget gates.
        if "exif" in img.info:
            turns = apply_exif and _turn_of(img, orientation) is not None
        else:
            turns = apply_exif and (orientation or 1) in _TRANSPOSE
        extra = frame if turns else 0  # the righted copy lives beside the frame
        if img.mode in _HIGH_DEPTH_MODES:
            extra += 1  # the 8-bit copy (converted strip by strip)
        reserve(pixels * (frame + extra), pixels)
    try:
        img.load()
    except ThemisClipError:
        raise  # the decode's deadline (DeadlineReader)
    except (OSError, ValueError, SyntaxError, EOFError, struct.error) as exc:
        raise ImageDecodeError(f"truncated or corrupt image data: {exc}") from exc
    except RuntimeError:  # a format plugin's decoder (JPEG XL: "Generic Error ...")
        raise ImageDecodeError(f"damaged {img.format or 'image'} data") from None
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(str(exc)) from None
    return img


_ORIENTATION = 0x0112
# EXIF orientation → the transpose that rights it (as ``ImageOps.exif_transpose``).
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def same_pixels(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two image files decode to the same pixels (upright, 8-bit RGB), under the
    default decode limits; an unreadable file is never the same."""
    try:
        first = decode_image(a).convert("RGB")
        second = decode_image(b).convert("RGB")
    except (InputError, OSError):
        return False
    return first.size == second.size and first.tobytes() == second.tobytes()


def image_dimensions(source: str | os.PathLike[str] | bytes) -> tuple[int, int] | None:
    """``(width, height)`` from an image's header, a file or encoded bytes (no pixels decoded);
    None if unreadable. The stored size, before any EXIF orientation is applied."""
    try:
        with io.BytesIO(source) if isinstance(source, bytes) else open_regular(source) as fp:
            if is_jxl(fp.read(12)):  # its plugin decodes every pixel to open it: not opened
                fp.seek(0)
                return jxl_size(fp.read(1 << 20))
            fp.seek(0)
            with _open(fp, "image" if isinstance(source, bytes) else str(source)) as img:
                width, height = img.size
    except (InputError, OSError):
        return None
    return int(width), int(height)


def describe_image(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An image file's metadata for an index (``index_folder``'s ``describe``): ``width`` and
    ``height`` from its header, absent when the header cannot be read."""
    size = image_dimensions(path)
    return {} if size is None else {"width": size[0], "height": size[1]}


def readable_formats() -> tuple[str, ...]:
    """Pillow format names this process can decode (``PluginInfo.supported_formats``)."""
    prepare_pillow()
    Image.init()
    return tuple(sorted(Image.OPEN))


def _open(fp: Any, what: str, format_hint: str | None = None) -> Image.Image:
    prepare_pillow()
    if format_hint:
        Image.init()
        if format_hint.upper() in Image.OPEN:
            try:
                return Image.open(fp, formats=[format_hint.upper()])
            except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError):
                fp.seek(0)  # only a hint: the data decides
    try:
        return Image.open(fp)
    except UnidentifiedImageError:
        raise ImageDecodeError(f"{what}: not a recognised image format") from None
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(
            f"{what}: image size is above the limit (decompression-bomb guard): {exc}"
        ) from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageDecodeError(f"{what}: truncated or corrupt image header: {exc}") from exc
    except RuntimeError:  # a format plugin's decoder
        raise ImageDecodeError(f"{what}: damaged image header") from None


def _from_array(arr: npt.NDArray[Any]) -> Image.Image:
    if arr.dtype != np.uint8:
        raise InputError(f"image array must be uint8, got {arr.dtype}")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim == 2:
        return Image.fromarray(np.ascontiguousarray(arr), mode="L")
    if arr.ndim == 3 and arr.shape[2] in (3, 4):
        return Image.fromarray(
            np.ascontiguousarray(arr), mode="RGB" if arr.shape[2] == 3 else "RGBA"
        )
    raise InputError(f"image array must be HxW, HxWx1, HxWx3 or HxWx4; got shape {arr.shape}")


def _to_8bit(img: Image.Image) -> Image.Image:
    """16- and 32-bit greyscale to 8 bits (:func:`.depth.to_8bit`, strip by strip)."""
    width, height = img.size

    def strip(y0: int, y1: int) -> npt.NDArray[Any]:
        return np.asarray(img.crop((0, y0, width, y1)))

    tags = getattr(img, "tag_v2", None) if img.format == "TIFF" else None
    out = to_8bit(
        (width, height),
        strip,
        img.mode,
        img.format,
        bits=tags.get(258) if tags is not None else None,
        sample_format=tags.get(339) if tags is not None else None,
    )
    return Image.fromarray(out, mode="L")


_NO_LEASE = contextlib.nullcontext()

#: fast mode, every format: shrink by a whole factor with a box filter first while the remaining
#: resample still shrinks at least this much (Pillow's ``reducing_gap``; 3 is its "indistinguishable
#: from a full resample in most cases" setting). JPEGs get DCT scaling instead (``draft``).
FAST_REDUCING_GAP = 3.0


def _resize_crop(
    img: Image.Image, spec: ImageSpec, reducing_gap: float | None = None
) -> Image.Image:
    size = spec.image_size
    width, height = img.size
    bicubic = RESAMPLING[spec.interpolation]
    if spec.resize_mode is ResizeMode.SQUASH:
        img = img.resize((size, size), bicubic, reducing_gap=reducing_gap)
    elif spec.resize_mode is ResizeMode.LONGEST:
        scale = size / max(width, height)
        new = (max(1, round(width * scale)), max(1, round(height * scale)))
        resized = img.resize(new, bicubic, reducing_gap=reducing_gap)
        if resized.mode != "RGB":
            resized = resized.convert("RGB")
        canvas = Image.new("RGB", (size, size), spec.fill)
        canvas.paste(resized, ((size - new[0]) // 2, (size - new[1]) // 2))
        return canvas
    else:
        if width <= height:
            new_w, new_h = size, int(size * height / width)
        else:
            new_w, new_h = int(size * width / height), size
        top = round((new_h - size) / 2.0)  # round-half-to-even, like torchvision
        left = round((new_w - size) / 2.0)
        if new_w * new_h <= _MAX_INTERMEDIATE * size * size:
            img = img.resize((new_w, new_h), bicubic, reducing_gap=reducing_gap)
            if (left, top, new_w, new_h) != (0, 0, size, size):
                img = img.crop((left, top, left + size, top + size))
        else:
            # Extreme aspect ratio (1x100000 would resize to 224x22,400,000 first): resample
            # only the source box that survives the crop.
            sx, sy = width / new_w, height / new_h
            box = (left * sx, top * sy, (left + size) * sx, (top + size) * sy)
            img = img.resize((size, size), bicubic, box=box)
    if img.mode != "RGB":  # convert() copies even when already RGB (~40 ms at 12 MP)
        img = img.convert("RGB")
    return img


@dataclass(frozen=True)
class ImagePreprocessor:
    """Preprocessing for one model: decode → orient → resize/crop → normalise into CHW float32."""

    spec: ImageSpec
    apply_exif: bool = True
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    decode_mode: DecodeMode | str = DecodeMode.EXACT
    #: shared by every decode of the service (None: unbounded, the library default)
    budget: PixelBudget | None = field(default=None, compare=False)
    #: one decode stops (ImageTooLargeError) after this long
    decode_timeout_s: float = DEFAULT_DECODE_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.decode_mode not in tuple(DecodeMode):
            raise ValueError(
                f"decode_mode must be 'exact', 'fast' or 'draft', got {self.decode_mode!r}"
            )
        object.__setattr__(self, "decode_mode", DecodeMode(self.decode_mode))
        if self.spec.interpolation not in RESAMPLING:
            raise ValueError(
                f"unsupported interpolation {self.spec.interpolation!r}; "
                f"supported: {', '.join(RESAMPLING)}"
            )
        std = np.asarray(self.spec.std, dtype=np.float64)
        mean = np.asarray(self.spec.mean, dtype=np.float64)
        object.__setattr__(
            self, "_scale", (1.0 / (255.0 * std)).astype(np.float32).reshape(3, 1, 1)
        )
        object.__setattr__(self, "_bias", (-mean / std).astype(np.float32).reshape(3, 1, 1))

    @property
    def shape(self) -> tuple[int, int, int]:
        return (3, self.spec.image_size, self.spec.image_size)

    def __call__(
        self,
        data: ImageData,
        out: npt.NDArray[np.float32] | None = None,
        *,
        format_hint: str | None = None,
        orientation: int | None = None,
    ) -> npt.NDArray[np.float32]:
        """Preprocess one image, writing into ``out`` (shape ``(3, S, S)``) when given.

        ``format_hint`` and ``orientation`` come from a caller's ``ImageMetadata``
        (see :func:`decode_image`).

        Returns:
            float32 array of shape ``(3, S, S)``: the exact tensor the image tower receives.
        """
        fast = self.decode_mode is not DecodeMode.EXACT
        # fast: JPEG DCT scaling to no less than twice the model input before the resize;
        # draft (opt-in, rclip's rule): to no less than the input itself
        draft = self.spec.image_size * (2 if self.decode_mode is DecodeMode.FAST else 1)
        lease = self.budget.lease() if self.budget is not None else None
        with lease or _NO_LEASE:
            img = decode_image(
                data,
                max_image_pixels=self.max_image_pixels,
                apply_exif=self.apply_exif,
                draft_min_side=draft if fast else None,
                format_hint=format_hint,
                orientation=orientation,
                reserve=lease.take_bytes if lease is not None else None,
                decode_timeout_s=self.decode_timeout_s,
            )
            rgb = _resize_crop(img, self.spec, FAST_REDUCING_GAP if fast else None)
            del img  # the full-size image goes before its pixels return to the budget
        if out is None:
            out = np.empty(self.shape, dtype=np.float32)
        hwc = np.asarray(rgb, dtype=np.uint8)
        np.multiply(hwc.transpose(2, 0, 1), self._scale, out=out)  # type: ignore[attr-defined]
        out += self._bias  # type: ignore[attr-defined]
        return out


def preprocess_image(
    data: ImageData,
    *,
    image_size: int = 224,
    mean: tuple[float, float, float] = CLIP_MEAN,
    std: tuple[float, float, float] = CLIP_STD,
    resize_mode: str | ResizeMode = ResizeMode.SHORTEST,
    apply_exif: bool = True,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    decode_mode: str = "exact",
) -> npt.NDArray[np.float32]:
    """Return the tensor a CLIP image tower receives for ``data``.

    Args:
        data: bytes, a path, a PIL image or an HWC uint8 array.
        image_size: the model's input side ``S``.
        mean, std: per-channel normalisation (CLIP's by default).
        resize_mode: ``"shortest"`` (OpenAI CLIP), ``"squash"`` or ``"longest"``.
        apply_exif: rotate/flip by the EXIF orientation first.
        max_image_pixels: refuse images whose header declares more pixels.
        decode_mode: ``"exact"`` (the reference's full decode), ``"fast"`` (JPEG DCT scaling
            to no less than twice ``image_size`` before the resize; the plugin's default) or
            ``"draft"`` (opt-in: DCT scaling to no less than ``image_size``, other vectors).

    Returns:
        float32 array of shape ``(3, image_size, image_size)``.

    Raises:
        ImageDecodeError, ImageTooLargeError, InputError: see :func:`decode_image`.
        ValueError: an unknown ``resize_mode``.
    """
    spec = ImageSpec(image_size=image_size, mean=mean, std=std, resize_mode=ResizeMode(resize_mode))
    return ImagePreprocessor(
        spec, apply_exif=apply_exif, max_image_pixels=max_image_pixels, decode_mode=decode_mode
    )(data)
