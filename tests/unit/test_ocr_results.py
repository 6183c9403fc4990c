"""OCR results' JSON form, and how OCR model folders are located."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from themis_clip.errors import InputError, ModelNotFoundError
from themis_clip.models.ocr import locate_ocr_models
from themis_clip.ocr.results import OCRResult, TextLine


def test_a_result_survives_json() -> None:
    line = TextLine(
        text="STARBUCKS",
        box=((10.0, 20.0), (110.0, 20.0), (110.0, 40.0), (10.0, 40.0)),
        confidence=0.98765,
    )
    result = OCRResult(lines=(line, line), width=640, height=480)
    data = json.loads(json.dumps(result.to_json()))
    assert data["lines"][0] == {
        "text": "STARBUCKS",
        "box": [[10.0, 20.0], [110.0, 20.0], [110.0, 40.0], [10.0, 40.0]],
        "confidence": 0.9877,
    }
    back = OCRResult.from_json(data)
    assert back.text == "STARBUCKS\nSTARBUCKS"
    assert back.lines[0].box == line.box and back.width == 640 and not back.gated


@pytest.mark.parametrize(
    "data",
    [
        None,
        {"width": 1, "height": 1, "gated": False},
        {"width": 1, "height": 1, "gated": False, "lines": [{"text": "a", "box": [[0, 0]]}]},
        {
            "width": 1,
            "height": 1,
            "gated": False,
            "lines": [{"text": 5, "box": [[0, 0]] * 4, "confidence": 1}],
        },
    ],
)
def test_malformed_json_is_an_input_error(data: object) -> None:
    with pytest.raises(InputError):
        OCRResult.from_json(data)


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_an_immich_layout_is_located(tmp_path: Path) -> None:
    det = touch(tmp_path / "detection" / "model.onnx")
    rec = touch(tmp_path / "recognition" / "model.onnx")
    keys = touch(tmp_path / "recognition" / "dict.txt")
    spec = locate_ocr_models(str(tmp_path))
    assert (spec.detection, spec.recognition, spec.classifier, spec.characters) == (
        det,
        rec,
        None,
        keys,
    )
    cls = touch(tmp_path / "textline_orientation" / "model.onnx")
    assert locate_ocr_models(str(tmp_path)).classifier == cls


def test_a_rapidocr_layout_is_located(tmp_path: Path) -> None:
    for name in (
        "ch_PP-OCRv4_det_infer.onnx",
        "ch_PP-OCRv4_rec_infer.onnx",
        "ch_ppocr_mobile_v2.0_cls_infer.onnx",
    ):
        touch(tmp_path / name)
    spec = locate_ocr_models(str(tmp_path))
    assert spec.detection.name.startswith("ch_PP-OCRv4_det")
    assert spec.classifier is not None and spec.characters is None


def test_missing_or_ambiguous_models_are_named(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="path not found"):
        locate_ocr_models(str(tmp_path / "nowhere"))
    touch(tmp_path / "a_det.onnx")
    with pytest.raises(ModelNotFoundError, match="no recognition model"):
        locate_ocr_models(str(tmp_path))
    touch(tmp_path / "a_rec.onnx")
    touch(tmp_path / "b_rec.onnx")
    with pytest.raises(ModelNotFoundError, match=r"2 \(a_rec.onnx, b_rec.onnx\) recognition"):
        locate_ocr_models(str(tmp_path))


def test_a_damaged_model_is_a_named_format_error(tmp_path: Path) -> None:
    from themis_clip.config import OCRConfig
    from themis_clip.errors import ModelFormatError
    from themis_clip.interface import BackendType
    from themis_clip.ocr import OCREngine

    for name in ("x_det.onnx", "x_rec.onnx"):
        (tmp_path / name).write_bytes(b"not a model")
    with pytest.raises(ModelFormatError, match="OCR detection"):
        OCREngine.load(OCRConfig(models=str(tmp_path)), backend=BackendType.CPU)
