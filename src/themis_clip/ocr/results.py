"""What OCR returns: text lines with their boxes and confidences, and its JSON form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from themis_clip.errors import InputError

__all__ = ["OCRResult", "TextLine"]

Point = tuple[float, float]


@dataclass(frozen=True, kw_only=True)
class TextLine:
    """One line of text read in a picture.

    Attributes:
        text: what it says.
        box: 4 ``(x, y)`` points in the picture's pixels (upright, EXIF applied), clockwise
            from the top-left corner of the text as read (so a line read upside down starts
            at its bottom-right as the picture shows it).
        confidence: the recogniser's mean character probability, 0-1.
    """

    text: str
    box: tuple[Point, Point, Point, Point]
    confidence: float

    def to_json(self) -> dict[str, Any]:
        """``{"text", "box": [[x, y] × 4], "confidence"}``, coordinates rounded to 0.1 px."""
        return {
            "text": self.text,
            "box": [[round(x, 1), round(y, 1)] for x, y in self.box],
            "confidence": round(self.confidence, 4),
        }

    @classmethod
    def from_json(cls, data: Any) -> TextLine:
        """The inverse of :meth:`to_json`.

        Raises:
            InputError: not that shape.
        """
        try:
            box = tuple((float(p[0]), float(p[1])) for p in data["box"])
            text, confidence = data["text"], float(data["confidence"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise InputError(f"not an OCR text line: {exc!r}") from None
        if len(box) != 4 or not isinstance(text, str):
            raise InputError("an OCR text line has a text and a box of 4 points")
        return cls(text=text, box=box, confidence=confidence)


@dataclass(frozen=True, kw_only=True)
class OCRResult:
    """The text of one picture.

    Attributes:
        lines: in reading order (top to bottom, then left to right).
        width: height: the picture's size in pixels (the boxes' frame).
        gated: True when the gate saw no text and detection was skipped (``lines`` is empty).
    """

    lines: tuple[TextLine, ...]
    width: int
    height: int
    gated: bool = False

    @property
    def text(self) -> str:
        """All lines, one per row: what a lexical index stores."""
        return "\n".join(line.text for line in self.lines)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data (what a store keeps beside the item); :meth:`from_json` reads it."""
        return {
            "width": self.width,
            "height": self.height,
            "gated": self.gated,
            "lines": [line.to_json() for line in self.lines],
        }

    @classmethod
    def from_json(cls, data: Any) -> OCRResult:
        """The inverse of :meth:`to_json`.

        Raises:
            InputError: not that shape.
        """
        try:
            lines = tuple(TextLine.from_json(x) for x in data["lines"])
            width, height, gated = int(data["width"]), int(data["height"]), data["gated"]
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"not an OCR result: {exc!r}") from None
        return cls(lines=lines, width=width, height=height, gated=bool(gated))
