"""CLIP byte-level BPE ``tokenizer.json`` files: learned (tiny test and demo models) or
converted from OpenAI's ``bpe_simple_vocab_16e6.txt.gz`` (the vocabulary every OpenAI and
open_clip checkpoint uses, shipped inside the ``clip``/``open_clip`` packages).

Same pipeline as the Hugging Face CLIP tokenizer file: NFC, whitespace collapse, lower-case;
CLIP's split pattern, byte-level pre-tokenisation, ``</w>`` end-of-word suffix; the special
tokens ``<|startoftext|>`` and ``<|endoftext|>`` appended after the vocabulary (as in CLIP,
where they are the two highest ids).

The exporter's one home of ``tokenizers`` (the core's is :mod:`themis_clip.preprocess.text`):
the other export modules read tokenizer files through :func:`read_tokenizer`.
"""

from __future__ import annotations

import gzip
import itertools
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from themis_clip.errors import ExportError
from themis_clip.preprocess.text import EOT_TOKEN, SOT_TOKEN

__all__ = [
    "CLIP_SPLIT_PATTERN",
    "OPENAI_VOCAB_SIZE",
    "build_clip_tokenizer",
    "bytes_to_unicode",
    "default_corpus",
    "openai_bpe_tokenizer",
    "read_tokenizer",
]

#: Vocabulary size of OpenAI's CLIP tokenizer: 256 bytes twice, 48,894 merges, 2 specials.
OPENAI_VOCAB_SIZE = 49408

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


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's byte → printable character table, in OpenAI's order (ids depend on it)."""
    bs = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def openai_bpe_tokenizer(
    bpe_path: Path, out: Path | None = None, *, vocab_size: int = OPENAI_VOCAB_SIZE
) -> Tokenizer:
    """Convert OpenAI's ``bpe_simple_vocab_16e6.txt.gz`` (or its plain text) to a tokenizer.

    Ids are OpenAI's: the 256 byte symbols in :func:`bytes_to_unicode` order, the same with
    ``</w>``, then one token per merge (the file's first ``vocab_size - 514`` merges, as
    OpenAI's ``SimpleTokenizer`` slices them), then ``<|startoftext|>``, ``<|endoftext|>``.

    Raises:
        ValueError: the file is not a BPE merges list (one ``a b`` pair per line after a
            version header).
    """
    raw = bpe_path.read_bytes()
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        lines = raw.decode("utf-8").split("\n")[1:]
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ExportError(f"{bpe_path}: not a gzip or UTF-8 BPE merges file: {exc}") from exc
    merges: list[tuple[str, str]] = []
    for number, line in enumerate(lines[: vocab_size - 514], start=2):
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ExportError(f"{bpe_path}: line {number} is not a merge pair: {line[:60]!r}")
        merges.append((parts[0], parts[1]))
    if not merges:
        raise ExportError(f"{bpe_path}: no merges found")
    alphabet = list(bytes_to_unicode().values())
    tokens = [
        *alphabet,
        *(c + "</w>" for c in alphabet),
        *(a + b for a, b in merges),
        SOT_TOKEN,
        EOT_TOKEN,
    ]
    # As OpenAI's dict(zip(vocab, range(len(vocab)))): a repeated token keeps its last id, and
    # the special tokens keep their list positions (add_special_tokens reuses existing ids).
    vocab = {token: i for i, token in enumerate(tokens)}
    return _assemble(vocab, merges, out)


def build_clip_tokenizer(
    path: Path, *, corpus: Iterable[str] | None = None, vocab_size: int = 600
) -> Tokenizer:
    """Learn a small CLIP-style BPE tokenizer on ``corpus`` and save it to ``path``.

    Deterministic: the same corpus gives the same file byte for byte. Like CLIP's vocabulary it
    holds every byte both inside a word and at its end (``x</w>``), so no input can fall out of
    the vocabulary; merges follow, then ``<|startoftext|>`` and ``<|endoftext|>``.
    """
    normalizer = _normalizer()
    pre_tokenizer = _pre_tokenizer()
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
    return _assemble(vocab, merges, path)


def _normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CLIP_SPLIT_PATTERN), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )


def _assemble(vocab: dict[str, int], merges: list[tuple[str, str]], path: Path | None) -> Tokenizer:
    """A CLIP tokenizer over ``vocab``/``merges``; the special tokens get the next two ids."""
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, end_of_word_suffix="</w>"))
    tok.normalizer = _normalizer()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([SOT_TOKEN, EOT_TOKEN])
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(path))
    return tok


def read_tokenizer(path: Path) -> Tokenizer:
    """The ``tokenizer.json`` at ``path``.

    Raises:
        ExportError: the file is missing or not a tokenizer file.
    """
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for unreadable files
        raise ExportError(f"{path} is not a tokenizer.json: {exc}") from exc
