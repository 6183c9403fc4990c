"""What a model declares about its inputs: :class:`ImageSpec` (how images are preprocessed)
and :class:`TextSpec` (how text becomes token ids).

A leaf below ``models`` (which reads them from model directories into a ``ModelSpec``) and
``preprocess`` (which applies them), so neither imports the other.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeVar

from themis_clip.vocabulary import (
    CLIP_MEAN,
    CLIP_STD,
    LanguagePrefix,
    Padding,
    ResizeMode,
    SpecialTokens,
    TextCleaning,
    member_of,
)

__all__ = [
    "LANGUAGE_PREFIXES",
    "PADDING",
    "SPECIAL_TOKENS",
    "TEXT_CLEANING",
    "ImageSpec",
    "TextSpec",
]

_E = TypeVar("_E", bound=enum.StrEnum)


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    """Image preprocessing the model was trained with."""

    image_size: int = 224
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD
    resize_mode: ResizeMode = ResizeMode.SHORTEST
    interpolation: str = "bicubic"
    fill: tuple[int, int, int] = (0, 0, 0)


#: the closed sets' values, kept for callers of the tuples (the enums are in ``vocabulary``)
TEXT_CLEANING = tuple(c.value for c in TextCleaning)
SPECIAL_TOKENS = tuple(c.value for c in SpecialTokens)
PADDING = tuple(c.value for c in Padding)
LANGUAGE_PREFIXES = tuple(c.value for c in LanguagePrefix)


@dataclass(frozen=True, kw_only=True)
class TextSpec:
    """How text becomes token ids for one model: part of its description, never a guess.

    :meth:`parse` builds one from a description's strings and names what is not allowed.

    Attributes:
        special_tokens: who adds the special tokens (:class:`SpecialTokens`).
        padding: to the longest row or the full context (:class:`Padding`).
        attention_mask: True: the graph must take a mask; False: it must not; None: as the
            graph declares.
        clean: the text cleaning rule (:class:`TextCleaning`).
        language_prefix: None, or :attr:`LanguagePrefix.FLORES200`.
        default_language: the code used when a caller gives none (None: callers must give one).
    """

    special_tokens: SpecialTokens = SpecialTokens.CLIP
    padding: Padding = Padding.LONGEST
    attention_mask: bool | None = None
    clean: TextCleaning = TextCleaning.OPENAI
    language_prefix: LanguagePrefix | None = None
    default_language: str | None = None

    @property
    def takes_language(self) -> bool:
        """Whether this text tower reads a language code (else a given one is ignored)."""
        return self.language_prefix is not None

    @classmethod
    def parse(
        cls,
        *,
        special_tokens: str,
        padding: str,
        attention_mask: bool | None,
        clean: str,
        language_prefix: str | None,
        default_language: str | None,
    ) -> tuple[TextSpec | None, list[str]]:
        """A spec from a description's strings: ``(spec, [])``, or ``(None, problems)`` naming
        each field that is not one of its closed set."""
        problems: list[str] = []

        def pick(name: str, kind: type[_E], value: str) -> _E:
            member = member_of(kind, value)
            if member is None:
                allowed = ", ".join(k.value for k in kind)
                problems.append(f"{name} must be one of {allowed}; got {value!r}")
            return member  # type: ignore[return-value]  # only used when no problems

        spec = cls(
            special_tokens=pick("special_tokens", SpecialTokens, special_tokens),
            padding=pick("padding", Padding, padding),
            attention_mask=attention_mask,
            clean=pick("clean", TextCleaning, clean),
            language_prefix=(
                None
                if language_prefix is None
                else pick("language_prefix", LanguagePrefix, language_prefix)
            ),
            default_language=default_language,
        )
        return (None, problems) if problems else (spec, [])
