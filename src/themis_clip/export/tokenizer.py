"""Build a CLIP-style byte-level BPE ``tokenizer.json`` (for tiny test and demo models).

Same pipeline as the Hugging Face CLIP tokenizer file: NFC, whitespace collapse, lower-case;
CLIP's split pattern, byte-level pre-tokenisation, ``</w>`` end-of-word suffix; the special
tokens ``<|startoftext|>`` and ``<|endoftext|>`` appended after the trained vocabulary (as in
CLIP, where they are the two highest ids).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

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


def build_clip_tokenizer(
    path: Path, *, corpus: Iterable[str] | None = None, vocab_size: int = 600
) -> Tokenizer:
    """Train a small CLIP-style BPE tokenizer on ``corpus`` and save it to ``path``."""
    tok = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CLIP_SPLIT_PATTERN), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        end_of_word_suffix="</w>",
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus or default_corpus()), trainer)
    # Like CLIP's vocabulary, hold every byte both inside a word and at its end ("x</w>"),
    # so that no input can ever fall out of the vocabulary.
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    for char in pre_tokenizers.ByteLevel.alphabet():
        for token in (char, char + "</w>"):
            if token not in vocab:
                vocab[token] = len(vocab)
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([SOT_TOKEN, EOT_TOKEN])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok
