from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from themis_clip.errors import ModelFormatError, TextInputError
from themis_clip.preprocess.text import CLIPTokenizer


@pytest.fixture(scope="module")
def tokenizer_path(tiny_model_dir: Path) -> Path:
    return tiny_model_dir / "tokenizer.json"


def test_sot_eot_and_ids(tokenizer_path: Path) -> None:
    tok = CLIPTokenizer(tokenizer_path)
    batch = tok.encode_batch(["a red circle", ""])
    assert batch.rows[0][0] == tok.sot_id and batch.rows[0][-1] == tok.eot_id
    assert len(batch.rows[0]) == 5  # SOT a red circle EOT
    assert batch.rows[1] == [tok.sot_id, tok.eot_id]  # empty text is valid, like OpenAI's
    assert batch.truncated == [False, False]


def test_cleaning_matches_openai_conventions(tokenizer_path: Path) -> None:
    tok = CLIPTokenizer(tokenizer_path)
    rows = tok.encode_batch(["A  RED\n\tcircle ", "a red circle", "a &amp;amp; b", "a & b"]).rows
    assert rows[0] == rows[1]
    assert rows[2] == rows[3]  # HTML unescaped twice


def test_truncation_keeps_eot_and_reports_it(tokenizer_path: Path) -> None:
    tok = CLIPTokenizer(tokenizer_path, context_length=10)
    batch = tok.encode_batch(["red " * 20, "red " * 8, "red " * 9])
    assert [len(r) for r in batch.rows] == [10, 10, 10]
    assert batch.rows[0][-1] == tok.eot_id
    assert batch.truncated == [True, False, True]


def test_very_long_text_is_cut_cheaply(tokenizer_path: Path) -> None:
    tok = CLIPTokenizer(tokenizer_path)
    batch = tok.encode_batch(["blue " * 100_000])
    assert len(batch.rows[0]) == 77 and batch.truncated == [True]
    # A long run of spaces collapses: still one short sequence, not truncated.
    batch = tok.encode_batch(["red" + " " * 200_000 + "circle"])
    assert len(batch.rows[0]) == 4 and batch.truncated == [False]


@pytest.mark.parametrize(
    "text",
    [
        "\x00\x01 nul and control",
        "bad \ud800 surrogate",
        "emoji 😀🎉",
        "מימין לשמאל",
        "e\u0301 combining",
        "   ",
    ],
)
def test_awkward_text_is_tokenised(tokenizer_path: Path, text: str) -> None:
    tok = CLIPTokenizer(tokenizer_path)
    (row,) = tok.encode_batch([text]).rows
    assert row[0] == tok.sot_id and row[-1] == tok.eot_id


def test_non_string_is_an_error(tokenizer_path: Path) -> None:
    with pytest.raises(TextInputError, match="text input 1 must be str, got bytes"):
        CLIPTokenizer(tokenizer_path).encode_batch(["ok", b"bytes"])  # type: ignore[list-item]


def test_pad_id_from_argument_config_file_or_zero(tokenizer_path: Path, tmp_path: Path) -> None:
    assert CLIPTokenizer(tokenizer_path).pad_id == 0
    assert CLIPTokenizer(tokenizer_path, pad_id=5).pad_id == 5
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_path.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<|endoftext|>"}))
    tok = CLIPTokenizer(tmp_path / "tokenizer.json")
    assert tok.pad_id == tok.eot_id
    ids, mask = tok.pad([[1, 2, 3], [4]], 5, np.dtype(np.int32))
    assert ids.dtype == np.int32 and ids.tolist() == [
        [1, 2, 3, tok.eot_id, tok.eot_id],
        [4] + [tok.eot_id] * 4,
    ]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]]


def test_bad_tokenizer_files(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match="cannot load tokenizer"):
        CLIPTokenizer(tmp_path / "t.json")
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE()).save(str(tmp_path / "plain.json"))
    with pytest.raises(ModelFormatError, match="lacks the CLIP tokens"):
        CLIPTokenizer(tmp_path / "plain.json")
