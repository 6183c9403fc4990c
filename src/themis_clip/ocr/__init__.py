"""Reading the text in pictures: PP-OCR's detector, direction classifier and recogniser on
ONNX Runtime. :meth:`OCREngine.read_text` takes a picture to an :class:`OCRResult`."""

from __future__ import annotations

from themis_clip.ocr.engine import OCREngine
from themis_clip.ocr.results import OCRResult, TextLine

__all__ = ["OCREngine", "OCRResult", "TextLine"]
