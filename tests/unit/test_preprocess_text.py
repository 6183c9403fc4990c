from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import HOSTILE_TEXT, PATHOLOGICAL_SPLIT, hostile_tokenizer_model
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


@pytest.mark.parametrize(
    ("pattern", "needle"),
    [
        (PATHOLOGICAL_SPLIT, "backtracks without bound"),  # used to be a failure per request
        ("(unclosed", "unmatched parenthesis"),
    ],
    ids=["backtracking", "invalid"],
)
def test_a_tokenizer_whose_regex_fails_on_plain_text_is_refused_at_load(
    tiny_model_dir: Path, tmp_path: Path, pattern: str, needle: str
) -> None:
    model = hostile_tokenizer_model(tiny_model_dir, tmp_path / "m", pattern=pattern)
    with pytest.raises(ModelFormatError, match=needle) as caught:
        CLIPTokenizer(model / "tokenizer.json")
    assert str(model / "tokenizer.json") in str(caught.value)


def test_a_tokenizer_panic_fails_only_its_own_text(tiny_model_dir: Path, tmp_path: Path) -> None:
    # onig's retry limit is a Rust panic, which pyo3 raises as a BaseException: it used to
    # escape every `except Exception` and fail the whole batch.
    model = hostile_tokenizer_model(tiny_model_dir, tmp_path / "m")
    tok = CLIPTokenizer(model / "tokenizer.json")
    batch = tok.encode_batch(["a red circle", HOSTILE_TEXT, "blue"])
    assert batch.error(0) is None and batch.error(2) is None
    assert isinstance(batch.error(1), TextInputError)
    assert "tokenizer failed" in str(batch.error(1)) and "retry-limit" in str(batch.error(1))
    assert batch.rows[0] == tok.encode_batch(["a red circle"]).rows[0]
    assert batch.rows[2] == tok.encode_batch(["blue"]).rows[0]
    with pytest.raises(TextInputError, match="tokenizer failed"):
        batch.raise_first()
    assert tok.encode_batch(["fine"]).errors == []  # nothing to report
