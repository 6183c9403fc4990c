r"""The core's only module that imports ``tokenizers``: CLIP tokenisation from the model's own
files (the exporter's one home of ``tokenizers`` is ``export/tokenizer.py``).

Conventions (OpenAI CLIP's tokenizer): every sequence is ``<|startoftext|> tokens <|endoftext|>``,
padded to the batch length with the model's pad id (OpenAI pads with 0; HF and immich files
often with the EOT id). Text is cleaned exactly as OpenAI's ``simple_tokenizer.py`` does
(``basic_clean``: ``ftfy.fix_text``, then HTML unescaped twice, stripped; ``whitespace_clean``:
the ``regex`` module's ``\s+`` collapsed to one space; then lower-cased), so token ids equal
OpenAI's for any string. Over-long text is truncated so that EOT stays last, and
:class:`TokenBatch` reports which inputs were cut.

A tokenizer whose regex fails on plain text (runs of one character class ended by another, the
classic catastrophic-backtracking trigger) is refused at load as a
:class:`~themis_clip.errors.ModelFormatError`. A text it still fails on (a regex that exhausts
onig's retry limit panics in Rust, which pyo3 raises as a ``BaseException``) fails alone, as a
:class:`~themis_clip.errors.TextInputError` in :attr:`TokenBatch.errors`: the other texts of
its batch, other callers' among them, are still encoded.
"""

from __future__ import annotations

import html
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import themis_clip.jsonio as jsonio
from themis_clip.errors import ModelFormatError, TextInputError
from themis_clip.inputspec import TextSpec
from themis_clip.vocabulary import Padding, SpecialTokens, TextCleaning

__all__ = [
    "EOT_TOKEN",
    "SOT_TOKEN",
    "CLIPTokenizer",
    "HFTokenizer",
    "TokenBatch",
    "canonicalize",
    "check_language",
    "make_tokenizer",
    "openai_clean",
    "pad_id_from_config",
    "pad_rows",
]

SOT_TOKEN = "<|startoftext|>"
EOT_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class TokenBatch:
    """Token ids of a batch, unpadded.

    Attributes:
        rows: per input, ``[SOT, ..., EOT]``, each at most ``context_length`` long (empty where
            the input failed).
        truncated: per input, True when text was cut to fit the context.
        errors: per input, why the tokenizer could not encode it (None: encoded); empty when
            every input was encoded.
    """

    rows: list[list[int]]
    truncated: list[bool]
    errors: list[TextInputError | None] = field(default_factory=list)

    def error(self, i: int) -> TextInputError | None:
        """Why input ``i`` could not be encoded (None: it was)."""
        return self.errors[i] if self.errors else None

    def raise_first(self) -> None:
        """Raise the first input's error, if any failed (callers that need every row)."""
        for error in self.errors:
            if error is not None:
                raise error


class CLIPTokenizer:
    """CLIP tokenisation over a Hugging Face ``tokenizer.json``.

    Args:
        path: the model's ``tokenizer.json``.
        context_length: maximum sequence length, SOT and EOT included.
        pad_id: id for padding; None reads ``tokenizer_config.json`` beside the file, else 0.

    Raises:
        ModelFormatError: the file cannot be read or lacks the CLIP special tokens.
    """

    def __init__(self, path: Path, *, context_length: int = 77, pad_id: int | None = None) -> None:
        self._tokenizer = _load(path, context_length, minimum=3)  # SOT, one token, EOT
        sot = self._tokenizer.token_to_id(SOT_TOKEN)
        eot = self._tokenizer.token_to_id(EOT_TOKEN)
        if sot is None or eot is None:
            raise ModelFormatError(f"{path} lacks the CLIP tokens {SOT_TOKEN} and {EOT_TOKEN}")
        self.sot_id: int = sot
        self.eot_id: int = eot
        self.context_length = context_length
        if pad_id is None:
            pad_id = pad_id_from_config(path.parent / "tokenizer_config.json", self._tokenizer)
        self.pad_id: int = pad_id
        # Characters beyond this cannot contribute tokens inside the context (a token spans
        # at least one character); text longer than this is cut before tokenising.
        self._char_limit = 64 * context_length

    #: CLIP pads a batch to its longest row (the tower pools at EOT, attention is causal)
    pad_to_context = False

    def probe_row(self) -> list[int]:
        """The shortest valid sequence (warmup and validation runs)."""
        return [self.sot_id, self.eot_id]

    def encode_batch(self, texts: Sequence[str], language: str | None = None) -> TokenBatch:
        """Tokenise ``texts`` (``language`` is accepted and unused: CLIP takes no prefix).

        Raises:
            TextInputError: an input is not a ``str``; a language code is malformed.
        """
        if language is not None:
            check_language(language)
        cleaned: list[str] = []
        cut: list[bool] = []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TextInputError(f"text input {i} must be str, got {type(text).__name__}")
            c = _clean(text)
            cut.append(len(c) > self._char_limit)
            cleaned.append(c[: self._char_limit])
        body_max = self.context_length - 2
        encodings = _encode_batch(self._tokenizer, cleaned, add_special_tokens=False)
        rows: list[list[int]] = []
        truncated: list[bool] = []
        for i, enc in enumerate(encodings):
            if cut[i] and isinstance(enc, _Encoded) and len(enc.ids) <= body_max:
                # pathological: re-tokenise the whole text
                enc = _encode_batch(self._tokenizer, [_clean(texts[i])], add_special_tokens=False)[
                    0
                ]
            if not isinstance(enc, _Encoded):
                rows.append([])
                truncated.append(False)
                continue
            truncated.append(len(enc.ids) > body_max)
            rows.append([self.sot_id, *enc.ids[:body_max], self.eot_id])
        return TokenBatch(rows=rows, truncated=truncated, errors=_errors(encodings))

    def pad(
        self, rows: Sequence[Sequence[int]], length: int, dtype: np.dtype[Any]
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """Pad ``rows`` to ``length``; return ``(ids, attention_mask)`` of shape ``(n, length)``."""
        return pad_rows(rows, length, self.pad_id, dtype)


class HFTokenizer:
    """Any ``tokenizer.json`` that adds its own special tokens (SentencePiece/Unigram, WordPiece,
    BPE with a post-processor): SigLIP, SigLIP 2, XLM-R, NLLB, Chinese-CLIP's BERT.

    Text is cleaned by the model's rule (``TextSpec.clean``), prefixed with a language code where
    the model takes one, encoded with the tokenizer's own special tokens and truncated to the
    context by the tokenizer (its post-processor's tokens are kept, as Hugging Face does).

    Raises:
        ModelFormatError: the file cannot be read, or adds no special tokens although the model
            declares that its tokenizer does.
    """

    def __init__(
        self, path: Path, spec: TextSpec, *, context_length: int, pad_id: int | None = None
    ) -> None:
        self._tokenizer = _load(path, context_length, minimum=2)

        def encode(text: str, add_special_tokens: bool) -> list[int]:
            e = _encode_one(self._tokenizer, text, add_special_tokens=add_special_tokens)
            if isinstance(e, TextInputError):
                raise ModelFormatError(f"{path} cannot encode plain text: {e}")
            return e.ids

        plain, special = encode("a b", False), encode("a b", True)
        self._probe = encode("a", True)
        if plain == special:
            raise ModelFormatError(
                f"{path} adds no special tokens, but the model declares that its tokenizer does "
                "(special_tokens: tokenizer; e.g. SigLIP's EOS, BERT's [CLS]/[SEP]): this "
                "tokenizer.json does not fit the model's family"
            )
        self.spec = spec
        self.context_length = context_length
        self.pad_to_context = spec.padding is Padding.MAX_LENGTH
        if pad_id is None:
            pad_id = pad_id_from_config(path.parent / "tokenizer_config.json", self._tokenizer)
        self.pad_id: int = pad_id
        self._char_limit = 64 * context_length
        self._clean = _CLEANERS[spec.clean]

    def probe_row(self) -> list[int]:
        """A short valid sequence (warmup and validation runs)."""
        return list(self._probe)

    def prefix_for(self, language: str | None) -> str:
        """The text glued in front of every input (a Flores-200 code), or ``""``."""
        if self.spec.language_prefix is None:
            if language is not None:
                check_language(language)
            return ""
        code = language or self.spec.default_language
        if code is None:
            raise TextInputError(
                "this model needs a language code (Flores-200, e.g. 'eng_Latn', 'deu_Latn', "
                "'zho_Hans'): pass language=... (the model declares no default)"
            )
        check_language(code)
        return code

    def encode_batch(self, texts: Sequence[str], language: str | None = None) -> TokenBatch:
        """Tokenise ``texts`` (each prefixed with ``language`` where the model takes one).

        Raises:
            TextInputError: an input is not a ``str``; a language code is needed or malformed.
        """
        prefix = self.prefix_for(language)
        cleaned: list[str] = []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TextInputError(f"text input {i} must be str, got {type(text).__name__}")
            cleaned.append(prefix + self._clean(text)[: self._char_limit])
        self._tokenizer.enable_truncation(self.context_length)
        try:
            encodings = _encode_batch(self._tokenizer, cleaned, add_special_tokens=True)
        finally:
            self._tokenizer.no_truncation()
        rows = [list(e.ids) if isinstance(e, _Encoded) else [] for e in encodings]
        truncated = [isinstance(e, _Encoded) and bool(e.overflowing) for e in encodings]
        return TokenBatch(rows=rows, truncated=truncated, errors=_errors(encodings))

    def pad(
        self, rows: Sequence[Sequence[int]], length: int, dtype: np.dtype[Any]
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """Pad ``rows`` to ``length``; return ``(ids, attention_mask)`` of shape ``(n, length)``."""
        return pad_rows(rows, length, self.pad_id, dtype)


@dataclass(frozen=True)
class _Encoded:
    """What this module reads of a ``tokenizers.Encoding``."""

    ids: list[int]
    overflowing: bool


def _failed(exc: BaseException) -> bool:
    """An error of the tokenizer itself: a Python exception, or a panic in its Rust code
    (pyo3's ``PanicException`` derives from ``BaseException``, so that plain ``except
    Exception`` misses it)."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


def _encode_batch(
    tokenizer: Any, texts: list[str], *, add_special_tokens: bool
) -> list[_Encoded | TextInputError]:
    """Each text's encoding, or why the tokenizer failed on that text alone."""
    try:
        encodings = tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
    except BaseException as exc:
        if not _failed(exc):
            raise
        return [_encode_one(tokenizer, t, add_special_tokens=add_special_tokens) for t in texts]
    return [_Encoded(list(e.ids), bool(e.overflowing)) for e in encodings]


def _encode_one(
    tokenizer: Any, text: str, *, add_special_tokens: bool
) -> _Encoded | TextInputError:
    try:
        e = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    except BaseException as exc:
        if not _failed(exc):
            raise
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        return TextInputError(f"the model's tokenizer failed on this text ({reason})")
    return _Encoded(list(e.ids), bool(e.overflowing))


def _errors(encodings: list[_Encoded | TextInputError]) -> list[TextInputError | None]:
    if all(isinstance(e, _Encoded) for e in encodings):
        return []
    return [e if isinstance(e, TextInputError) else None for e in encodings]


def _load(path: Path, context_length: int, *, minimum: int) -> Any:
    """A ``tokenizers.Tokenizer`` from ``path``, with no padding or truncation of its own."""
    from tokenizers import Tokenizer

    if context_length < minimum:
        raise ModelFormatError(f"context_length must be >= {minimum}, got {context_length}")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except BaseException as exc:  # tokenizers raises a bare Exception subclass, or panics
        if not _failed(exc):
            raise
        raise ModelFormatError(f"cannot load tokenizer {path}: {exc}") from exc
    tokenizer.no_padding()
    tokenizer.no_truncation()
    _refuse_backtracking(tokenizer, path)
    return tokenizer


#: Runs of one kind of character ended by another: the texts on which a backtracking
#: pre-tokenizer regex blows up (``(\w+\s?)+$`` on ``aaaa…!``), each short and cheap to encode.
_PROBES = tuple(a * 40 + b for a in "a1 !é中" for b in "a1 !é中" if a != b)


def _refuse_backtracking(tokenizer: Any, path: Path) -> None:
    """Refuse, at load, a tokenizer that fails on plain text: a hostile or broken regex would
    otherwise fail requests one by one, each after burning a core to the engine's limit.

    Raises:
        ModelFormatError: naming the file, a text it fails on and why.
    """
    for text in _PROBES:
        e = _encode_one(tokenizer, text, add_special_tokens=False)
        if isinstance(e, TextInputError):
            raise ModelFormatError(
                f"{path}: the tokenizer fails on plain text ({text[0]!r} 40 times, then "
                f"{text[-1]!r}): {e}; its pre-tokenizer regex backtracks without bound, and a "
                "tokenizer must encode any text"
            )


def pad_rows(
    rows: Sequence[Sequence[int]], length: int, pad_id: int, dtype: np.dtype[Any]
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """``rows`` padded with ``pad_id`` to ``length``: ``(ids, attention_mask)``, ``(n, length)``."""
    ids = np.full((len(rows), length), pad_id, dtype=dtype)
    mask = np.zeros((len(rows), length), dtype=dtype)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def make_tokenizer(
    path: Path, spec: TextSpec, *, context_length: int, pad_id: int | None
) -> CLIPTokenizer | HFTokenizer:
    """The tokenizer a model's text description asks for (CLIP's exact path, or the generic)."""
    if spec.special_tokens is SpecialTokens.CLIP and spec.language_prefix is None:
        if spec.clean is not TextCleaning.OPENAI:
            raise ModelFormatError(
                f"{path}: CLIP tokenisation cleans text as OpenAI does; clean {spec.clean!r} "
                "needs special_tokens: tokenizer"
            )
        return CLIPTokenizer(path, context_length=context_length, pad_id=pad_id)
    return HFTokenizer(path, spec, context_length=context_length, pad_id=pad_id)


def _basic_clean(text: str) -> str:
    import ftfy

    return html.unescape(html.unescape(ftfy.fix_text(text))).strip()


def _whitespace_clean(text: str) -> str:
    return " ".join(text.split()).strip()


def canonicalize(text: str) -> str:
    """open_clip's ``"canonicalize"`` cleaning (SigLIP): ``canonicalize_text(basic_clean(t))``:
    ftfy and HTML unescaping, ``_`` to space, ASCII punctuation removed, lower-cased,
    whitespace collapsed."""
    text = _basic_clean(text).replace("_", " ").translate(_NO_PUNCTUATION).lower()
    return _utf8(_whitespace_clean(text))


def _lower(text: str) -> str:
    """open_clip's ``"lower"``: ``whitespace_clean(basic_clean(t)).lower()``."""
    return _utf8(_whitespace_clean(_basic_clean(text)).lower())


def _whitespace(text: str) -> str:
    """open_clip's ``"whitespace"``: ``whitespace_clean(basic_clean(t))``."""
    return _utf8(_whitespace_clean(_basic_clean(text)))


def _none(text: str) -> str:
    return _utf8(text)


def _utf8(text: str) -> str:
    # a lone surrogate cannot reach the tokenizer (UTF-8 cannot carry it)
    return text.encode("utf-8", "replace").decode("utf-8")


def openai_clean(text: str) -> str:
    r"""OpenAI CLIP's ``whitespace_clean(basic_clean(text)).lower()``, to the letter.

    ftfy repairs mojibake, curly quotes, ligatures, fullwidth letters, control characters and
    lone surrogates (to U+FFFD) before HTML entities are unescaped twice; whitespace is the
    ``regex`` module's ``\s`` (Unicode White_Space), as in OpenAI's code, not ``re``'s.
    """
    import ftfy
    import regex

    text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    text = regex.sub(r"\s+", " ", text).strip()
    # ftfy leaves a lone surrogate only where it cannot pair it; UTF-8 cannot carry one.
    return text.encode("utf-8", "replace").decode("utf-8").lower()


_clean = openai_clean


def pad_id_from_config(config: Path, tokenizer: Any) -> int:
    """The id of ``pad_token`` in a ``tokenizer_config.json``; 0 (OpenAI's) when it has none."""
    if config.is_file():
        try:
            pad = jsonio.read(config).get("pad_token")
        except (OSError, ValueError):
            pad = None
        if isinstance(pad, dict):
            pad = pad.get("content")
        if isinstance(pad, str) and (pad_id := tokenizer.token_to_id(pad)) is not None:
            return int(pad_id)
    return 0


_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)
_FLORES = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")


def check_language(code: str) -> None:
    """Refuse a malformed language code, whether or not the model takes one.

    Raises:
        TextInputError: ``code`` is not shaped like a Flores-200 code (``eng_Latn``).
    """
    if not _FLORES.fullmatch(code):
        raise TextInputError(
            f"language {code[:40]!r} is not a Flores-200 code like 'eng_Latn' "
            "(three lower-case letters, '_', a four-letter script)"
        )


_CLEANERS: dict[TextCleaning, Callable[[str], str]] = {
    TextCleaning.OPENAI: openai_clean,
    TextCleaning.CANONICALIZE: canonicalize,
    TextCleaning.LOWER: _lower,
    TextCleaning.WHITESPACE: _whitespace,
    TextCleaning.NONE: _none,
}
