"""The OCR engine: gate, detect, turn, read; PaddleOCR's models through our runtime seam.

One call, :meth:`OCREngine.read_text`, takes a picture to its text lines. Its sessions come from
:mod:`themis_clip.runtime` like the CLIP towers' (same providers, session settings, run
timeouts), so OCR runs wherever embedding does, and its decode honours the same pixel limits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.budget import PixelBudget
from themis_clip.config import OCRConfig
from themis_clip.errors import BackendUnavailableError, ModelFormatError
from themis_clip.interface import BackendType, ImageData
from themis_clip.models.ocr import OCRModelSpec, locate_ocr_models
from themis_clip.ocr.detect import DBSettings, boxes_from_map, reading_order
from themis_clip.ocr.recognize import ctc_decode, line_batch, load_alphabet
from themis_clip.ocr.results import OCRResult, TextLine
from themis_clip.preprocess.ocr import OCRPicture, decode_for_ocr, squeeze_width
from themis_clip.runtime import (
    ORTSession,
    SessionSettings,
    available_providers,
    create_session,
    plan_providers,
)
from themis_clip.vocabulary import DEFAULT_MAX_IMAGE_PIXELS

__all__ = ["OCREngine", "detector_size"]

log = logging.getLogger(__name__)

_LINE_HEIGHT = 48  # the PP-OCR recognisers' and classifier's input height
_CLS_WIDTH = 192
_MIN_REC_WIDTH = 320
_MAX_LINE_RATIO = 40  # wider lines are squeezed (a 48 px line up to 1920 px)
_BATCH = 8
_CLS_FLIP_P = 0.9  # PaddleOCR's cls_thresh


def detector_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """The detector's input size for a picture: shorter side ``short_side`` (a panorama's
    longer side at most 4× that; a small picture enlarged at most 2×), multiples of 32."""
    ratio = min(short_side / min(width, height), 4 * short_side / max(width, height), 2.0)
    return (
        max(32, round(width * ratio / 32) * 32),
        max(32, round(height * ratio / 32) * 32),
    )


@dataclass(frozen=True, kw_only=True)
class _Counts:
    images: int = 0
    gated: int = 0
    lines: int = 0
    total_ms: float = 0.0


class OCREngine:
    """PP-OCR text reading on ONNX Runtime.

    Build it with :meth:`load`; it is thread-safe (ONNX Runtime sessions run concurrently).

    Args:
        detector: recognizer: classifier: the three sessions (no classifier: lines are read
            as found, upside-down ones included).
        alphabet: the recogniser's characters.
        config: thresholds and sizes.
        label: the model set's name.
        max_image_pixels: decode limit. budget: the decoded-pixel budget shared with the plugin.
    """

    def __init__(
        self,
        *,
        detector: ORTSession,
        recognizer: ORTSession,
        classifier: ORTSession | None,
        alphabet: Sequence[str],
        config: OCRConfig,
        label: str,
        max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
        budget: PixelBudget | None = None,
    ) -> None:
        self._det, self._rec, self._cls = detector, recognizer, classifier
        self._alphabet = load_alphabet(alphabet)
        self.config = config
        self.label = label
        self._max_pixels = max_image_pixels
        self._budget = budget
        self._db = DBSettings(box_threshold=config.box_threshold)
        self._lock = threading.Lock()
        self._counts = _Counts()
        width = recognizer.outputs[0].fixed_dim(2)
        if width is not None and width != len(self._alphabet):
            raise ModelFormatError(
                f"OCR recogniser {recognizer.name} has {width} classes but its alphabet "
                f"{len(self._alphabet)} (blank + {len(alphabet)} characters + space)"
            )

    @classmethod
    def load(
        cls,
        config: OCRConfig,
        *,
        backend: BackendType = BackendType.AUTO,
        settings: SessionSettings | None = None,
        available: Sequence[str] | None = None,
        max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
        budget: PixelBudget | None = None,
        allow_download: bool = True,
    ) -> OCREngine:
        """Locate ``config.models`` (None: the installed wheel's; a Hub repo id is pulled
        unless not ``allow_download``) and open its sessions.

        Raises:
            ModelNotFoundError: no models there (or a Hub name not pulled when downloads are
                not allowed).
            ModelFormatError: ONNX Runtime cannot load a model, or the recogniser has no
                alphabet.
            BackendUnavailableError: the requested backend's provider is not usable.
        """
        settings = settings or SessionSettings()
        spec = locate_ocr_models(config.models, allow_download=allow_download)
        plans = plan_providers(
            backend,
            available if available is not None else available_providers(),
            settings=settings,
        )
        failures: list[str] = []
        for plan in plans:
            try:
                det = create_session(spec.detection, plan, settings, name="OCR detection")
            except BackendUnavailableError as exc:
                failures.append(str(exc))
                continue
            opened = [det]
            try:
                rec = create_session(spec.recognition, plan, settings, name="OCR recognition")
                opened.append(rec)
                clf = None
                if spec.classifier is not None:
                    clf = create_session(
                        spec.classifier, plan, settings, name="OCR direction classifier"
                    )
                    opened.append(clf)
                engine = cls(
                    detector=det,
                    recognizer=rec,
                    classifier=clf,
                    alphabet=_alphabet(spec, rec),
                    config=config,
                    label=spec.label,
                    max_image_pixels=max_image_pixels,
                    budget=budget,
                )
            except BaseException:
                for session in opened:
                    session.close()
                raise
            log.info("OCR models %s loaded on %s", spec.label, det.providers[0])
            return engine
        raise BackendUnavailableError("; ".join(failures) or "no execution provider usable")

    # -- the one entry point -------------------------------------------------------------------

    def read_text(self, image: ImageData) -> OCRResult:
        """The text lines in ``image`` (bytes, a path, a PIL image or an HWC uint8 array).

        Raises:
            ImageDecodeError, ImageTooLargeError, InputError: the picture cannot be read.
            InferenceError: a session failed or ran past its timeout.
        """
        start = time.perf_counter()
        lease = self._budget.lease() if self._budget is not None else None
        reserve = lease.take_bytes if lease is not None else None
        gate = self.config.gate
        try:
            picture = decode_for_ocr(
                image,
                max_image_pixels=self._max_pixels,
                reserve=reserve,
                draft_min_side=self.config.gate_side if gate else None,
            )
            if gate and not self._gate(picture):
                width, height = picture.full_size
                result = OCRResult(lines=(), width=width, height=height, gated=True)
            else:
                if picture.reduced:
                    picture = decode_for_ocr(
                        image, max_image_pixels=self._max_pixels, reserve=reserve
                    )
                result = self._read(picture)
        finally:
            if lease is not None:
                lease.release()
        ms = (time.perf_counter() - start) * 1000
        with self._lock:
            c = self._counts
            self._counts = _Counts(
                images=c.images + 1,
                gated=c.gated + result.gated,
                lines=c.lines + len(result.lines),
                total_ms=c.total_ms + ms,
            )
        return result

    def has_text(self, image: ImageData) -> bool:
        """The gate alone: whether ``image`` may hold text (what :meth:`read_text` skips on)."""
        picture = decode_for_ocr(
            image, max_image_pixels=self._max_pixels, draft_min_side=self.config.gate_side
        )
        return self._gate(picture)

    def stats(self) -> dict[str, Any]:
        """Pictures read, how many the gate skipped, lines found, mean time per picture."""
        c = self._counts
        return {
            "models": self.label,
            "provider": self._det.providers[0],
            "images": c.images,
            "gated": c.gated,
            "lines": c.lines,
            "avg_latency_ms": c.total_ms / c.images if c.images else 0.0,
        }

    def close(self) -> None:
        """Close the sessions (runs in flight stop)."""
        for s in (self._det, self._rec, self._cls):
            if s is not None:
                s.close()

    # -- steps -----------------------------------------------------------------------------------

    def _probability_map(self, picture: OCRPicture, short_side: int) -> Any:
        w, h = detector_size(*picture.size, short_side)
        rgb = picture.resized(w, h)
        x = (rgb[:, :, ::-1].transpose(2, 0, 1)[None].astype(np.float32) / 127.5) - 1.0
        out = self._det.run(None, {self._det.inputs[0].name: x})[0]
        return out[0, 0], (picture.size[0] / w, picture.size[1] / h)

    def _gate(self, picture: OCRPicture) -> bool:
        prob, scale = self._probability_map(picture, self.config.gate_side)
        quads, _ = boxes_from_map(prob, scale, picture.size, self._db)
        return bool(quads)

    def _read(self, picture: OCRPicture) -> OCRResult:
        width, height = picture.size
        prob, scale = self._probability_map(picture, self.config.detection_side)
        quads, _ = boxes_from_map(prob, scale, (width, height), self._db)
        quads = [_upright(quads[i]) for i in reading_order(quads)]
        if not quads:
            return OCRResult(lines=(), width=width, height=height)
        crops = [
            picture.line(q, height=_LINE_HEIGHT, max_width=_LINE_HEIGHT * _MAX_LINE_RATIO)
            for q in quads
        ]
        if self._cls is not None:
            for i in self._upside_down(crops):
                crops[i] = np.ascontiguousarray(crops[i][::-1, ::-1])
                quads[i] = np.roll(quads[i], 2, axis=0)
        lines = []
        for quad, (text, confidence) in zip(quads, self._recognize(crops), strict=True):
            text = text.strip()
            if text and confidence >= self.config.min_confidence:
                box = tuple((float(x), float(y)) for x, y in quad)
                lines.append(TextLine(text=text, box=box, confidence=confidence))  # type: ignore[arg-type]
        return OCRResult(lines=tuple(lines), width=width, height=height)

    def _upside_down(self, crops: list[npt.NDArray[np.uint8]]) -> list[int]:
        assert self._cls is not None
        small = squeeze_width(crops, _CLS_WIDTH)
        flips: list[int] = []
        for lo in range(0, len(small), _BATCH):
            batch = line_batch(small[lo : lo + _BATCH], _CLS_WIDTH)
            probs = self._cls.run(None, {self._cls.inputs[0].name: batch})[0]
            for k, p in enumerate(probs):
                if int(np.argmax(p)) == 1 and float(p[1]) > _CLS_FLIP_P:
                    flips.append(lo + k)
        return flips

    def _recognize(self, crops: list[npt.NDArray[np.uint8]]) -> list[tuple[str, float]]:
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1])
        out: list[tuple[str, float]] = [("", 0.0)] * len(crops)
        for lo in range(0, len(order), _BATCH):
            idx = order[lo : lo + _BATCH]
            width = max(_MIN_REC_WIDTH, max(crops[i].shape[1] for i in idx))
            batch = line_batch([crops[i] for i in idx], width)
            probs = self._rec.run(None, {self._rec.inputs[0].name: batch})[0]
            for i, decoded in zip(idx, ctc_decode(probs, self._alphabet), strict=True):
                out[i] = decoded
        return out


def _upright(quad: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``quad`` starting at the corner that makes the line wider than tall: a box at least 1.5
    times taller than wide is read turned a quarter counter-clockwise (PaddleOCR's rule; the
    classifier then sets right the lines this leaves upside down)."""
    width = np.linalg.norm(quad[1] - quad[0])
    height = np.linalg.norm(quad[3] - quad[0])
    return np.roll(quad, -1, axis=0) if height >= 1.5 * width else quad


def _alphabet(spec: OCRModelSpec, recognizer: ORTSession) -> list[str]:
    """The recogniser's characters: its own metadata, else the folder's character list."""
    meta = recognizer.session.get_modelmeta().custom_metadata_map
    if "character" in meta:
        return list(meta["character"].splitlines())
    if spec.characters is None:
        raise ModelFormatError(
            f"OCR recogniser {spec.recognition} carries no alphabet in its metadata and its "
            "folder has no character list (one *.txt, one character a line)"
        )
    return [c.rstrip("\r") for c in spec.characters.read_text(encoding="utf-8").split("\n") if c]
