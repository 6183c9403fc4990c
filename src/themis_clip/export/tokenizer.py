"""Build a CLIP-style byte-level BPE ``tokenizer.json`` (for tiny test and demo models).

Same pipeline as the Hugging Face CLIP tokenizer file: NFC, whitespace collapse, lower-case;
CLIP's split pattern, byte-level pre-tokenisation, ``</w>`` end-of-word suffix; the special
tokens ``<|startoftext|>`` and ``<|endoftext|>`` appended after the trained vocabulary (as in
CLIP, where they are the two highest ids).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from themis_clip.preprocess.text import EOT_TOKEN, SOT_TOKEN

__all__ = ["CLIP_SPLIT_PATTERN", "build_clip_tokenizer", "default_corpus"]

CLIP_SPLIT_PATTERN = (
    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d"""
    r"""|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
)

_COLOURS = [
    "red",
    "green",
    "blue",
    "yellow",
    "orange",
    "purple",
    "white",
    "black",
    "pink",
    "brown",
    "gray",
    "cyan",
]
_SHAPES = ["circle", "square", "triangle", "star", "cross", "ring", "diamond", "hexagon"]
_WORDS = [
    "a",
    "an",
    "the",
    "photo",
    "of",
    "picture",
    "image",
    "small",
    "large",
    "big",
    "tiny",
    "on",
    "in",
    "at",
    "left",
    "right",
    "top",
    "bottom",
    "center",
    "middle",
    "background",
    "with",
    "and",
    "dog",
    "cat",
    "car",
    "tree",
    "house",
    "person",
    "red",
    "circles",
    "squares",
]


def default_corpus() -> list[str]:
    """Template captions covering the demo vocabulary."""
    lines = []
    for colour in _COLOURS:
        for shape in _SHAPES:
            lines.append(f"a {colour} {shape}")
            lines.append(f"a photo of a small {colour} {shape} on the left")
            lines.append(f"a large {colour} {shape} at the top right of the picture")
    lines.append(" ".join(_WORDS))
    return lines


def _learn_merges(words: Counter[str], vocab_size: int, base: int) -> list[tuple[str, str]]:
    """Byte-pair merges by frequency, ties broken by the pair itself: deterministic."""
    splits = {w: [*w[:-1], w[-1] + "</w>"] for w in words}
    merges: list[tuple[str, str]] = []
    while base + len(merges) < vocab_size:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            symbols = splits[word]
            for pair in itertools.pairwise(symbols):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        for word, symbols in splits.items():
            i, out = 0, []
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            splits[word] = out
    return merges


def build_clip_tokenizer(
    path: Path, *, corpus: Iterable[str] | None = None, vocab_size: int = 600
) -> Tokenizer:
    """Learn a small CLIP-style BPE tokenizer on ``corpus`` and save it to ``path``.

    Deterministic: the same corpus gives the same file byte for byte. Like CLIP's vocabulary it
    holds every byte both inside a word and at its end (``x</w>``), so no input can fall out of
    the vocabulary; merges follow, then ``<|startoftext|>`` and ``<|endoftext|>``.
    """
    normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CLIP_SPLIT_PATTERN), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    words: Counter[str] = Counter()
    for line in corpus or default_corpus():
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)):
            words[word] += 1
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {}
    for token in [*alphabet, *(c + "</w>" for c in alphabet)]:
        vocab[token] = len(vocab)
    merges = _learn_merges(words, vocab_size, len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, end_of_word_suffix="</w>"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([SOT_TOKEN, EOT_TOKEN])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok
