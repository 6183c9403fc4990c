"""Lexical search's pure parts for OCR text: trigrams, similarity, tolerant matching, the
matched lines, and the stable merge of rankings."""

from __future__ import annotations

import random

from themis_clip.index.lexical import (
    TOLERANCE,
    interleave,
    matched_lines,
    ocr_score,
    ocr_words,
    similarity,
    trigrams,
)


def test_trigrams_are_padded_like_pg_trgm() -> None:
    assert trigrams("Cat") == {"  c", " ca", "cat", "at "}
    assert trigrams("cat", padded=False) == {"cat"}
    assert trigrams("ab", padded=False) == set()


def test_similarity_tolerates_a_misread_letter_not_another_word() -> None:
    assert similarity("starbucks", "THE STARBUGKS CAFE") >= TOLERANCE
    assert similarity("starbucks", "5TARBUCKS") >= TOLERANCE
    assert similarity("starbucks", "BAKERY HOTEL") < TOLERANCE
    assert similarity("bucks", "STARBUCKS") < TOLERANCE  # a substring is matched exactly


def test_ocr_score_needs_every_word() -> None:
    assert ocr_words('"Hotel" (bucks), ＳＴＡＲ ÇA 12.50') == [
        "hotel",
        "bucks",
        "star",
        "ça",
        "12",
        "50",
    ]
    assert ocr_words("?! --") == []
    words = ocr_words("Bucks  COFFEE bucks")
    assert words == ["bucks", "coffee"]
    assert ocr_score(words, "STARBUCKS COFFEE") == 1.0
    assert ocr_score(words, "STARBUCKS TEA") == 0.0
    assert 0 < ocr_score(["starbucks"], "STARBUGKS") < 1
    assert ocr_score(["tea"], "TEE") == 0.0  # short words: substrings only
    assert ocr_score([], "anything") == 0.0


def test_matched_lines_name_the_lines_a_word_is_in() -> None:
    lines = [
        {"text": "STARBUCKS", "box": [[0, 0]] * 4, "confidence": 0.9},
        {"text": "OPEN DAILY", "box": [[1, 1]] * 4, "confidence": 0.8},
    ]
    assert matched_lines("bucks", lines) == [lines[0]]
    assert matched_lines("bucks daily", lines) == lines
    assert matched_lines("starbugks", lines) == [lines[0]]
    assert matched_lines("closed", lines) == []


def test_interleave_is_stable_under_truncation() -> None:
    rng = random.Random(0)
    for _ in range(200):
        a = rng.sample(range(30), rng.randint(0, 12))
        b = rng.sample(range(30), rng.randint(0, 12))
        whole = interleave([a, b])
        assert len(whole) == len(set(a) | set(b))
        for n in range(1, 14):
            assert interleave([a[:n], b[:n]])[:n] == whole[:n]
