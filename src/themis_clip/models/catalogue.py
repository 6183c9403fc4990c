"""The catalogue of models users run by name: ``catalogue.json`` in this package, read as data.

Each entry names a short name (immich's ``ViT-B-32__openai``, ``clip-vit-base-patch32__xenova``,
a PyTorch checkpoint's own name such as ``siglip2-base-patch16-224``), the Hub repository holding
it, the repository's layout and the figures its own published configs state (``null`` where no
source was read). The figures are never used to load a model: the model directory's own files
are; the catalogue only lets a user pick one.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from themis_clip.errors import ModelFormatError

__all__ = ["CatalogueEntry", "RepoLayout", "catalogue", "find_entry", "suggest"]


class RepoLayout:
    """The repository layouts a pull knows how to fetch (the ``layout`` of an entry)."""

    IMMICH = "immich"
    TRANSFORMERS_JS = "transformers.js"
    FASTEMBED = "fastembed"
    THEMIS = "themis"
    PEER_ONNX = "onnx"  # clip-as-service / lakera: top-level .onnx towers
    PYTORCH = "pytorch"  # a transformers checkpoint, exported on pull (``export`` extra)
    OCR = "ocr"  # PaddleOCR ONNX models in immich's folders (detection/, recognition/)

    ALL = (IMMICH, TRANSFORMERS_JS, FASTEMBED, THEMIS, PEER_ONNX, PYTORCH, OCR)


@dataclass(frozen=True, kw_only=True)
class CatalogueEntry:
    """One model of the catalogue (figures ``None`` where no source stated them)."""

    name: str
    repo: str
    layout: str
    family: str
    embedding_dim: int | None = None
    image_size: int | None = None
    context_length: int | None = None
    languages: tuple[str, ...] | None = None
    license: str | None = None
    download_size_bytes: int | None = None
    text_repo: str | None = None
    onnx_alternative: str | None = None
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "repo": self.repo,
            "layout": self.layout,
            "family": self.family,
            "embedding_dim": self.embedding_dim,
            "image_size": self.image_size,
            "context_length": self.context_length,
            "languages": list(self.languages) if self.languages is not None else None,
            "license": self.license,
            "download_size_bytes": self.download_size_bytes,
            "text_repo": self.text_repo,
            "onnx_alternative": self.onnx_alternative,
            "source": self.source,
        }


_FIELDS = {
    "name": str,
    "repo": str,
    "layout": str,
    "family": str,
    "embedding_dim": int,
    "image_size": int,
    "context_length": int,
    "languages": list,
    "license": str,
    "download_size_bytes": int,
    "text_repo": str,
    "onnx_alternative": str,
    "source": str,
}
_REQUIRED = ("name", "repo", "layout", "family")


def parse_catalogue(data: Any) -> tuple[CatalogueEntry, ...]:
    """Check and convert the catalogue document (``catalogue.json``'s content).

    Raises:
        ModelFormatError: a field is missing, unknown, of the wrong type, or a name repeats.
    """
    if not isinstance(data, dict) or data.get("format") != "themis-clip-catalogue":
        raise ModelFormatError("catalogue: not a themis-clip-catalogue document")
    models = data.get("models")
    if not isinstance(models, list):
        raise ModelFormatError("catalogue: models must be a list")
    entries: list[CatalogueEntry] = []
    seen: set[str] = set()
    for i, raw in enumerate(models):
        where = f"catalogue.models[{i}]"
        if not isinstance(raw, dict):
            raise ModelFormatError(f"{where} must be an object")
        unknown = set(raw) - set(_FIELDS)
        if unknown:
            raise ModelFormatError(f"{where}: unknown fields {sorted(unknown)}")
        for key, typ in _FIELDS.items():
            value = raw.get(key)
            if value is None:
                if key in _REQUIRED:
                    raise ModelFormatError(f"{where}: {key} is required")
                continue
            if not isinstance(value, typ) or isinstance(value, bool):
                raise ModelFormatError(f"{where}: {key} must be {typ.__name__}, got {value!r}")
        if raw["layout"] not in RepoLayout.ALL:
            raise ModelFormatError(f"{where}: unknown layout {raw['layout']!r}")
        if raw["repo"].count("/") != 1:
            raise ModelFormatError(f"{where}: repo must be org/name, got {raw['repo']!r}")
        key = raw["name"].lower()
        if key in seen:
            raise ModelFormatError(f"{where}: name {raw['name']!r} repeats")
        seen.add(key)
        langs = raw.get("languages")
        entries.append(
            CatalogueEntry(
                **{k: v for k, v in raw.items() if k != "languages"},
                languages=tuple(str(x) for x in langs) if langs is not None else None,
            )
        )
    return tuple(entries)


@functools.cache
def catalogue() -> tuple[CatalogueEntry, ...]:
    """Every catalogue entry, in the file's order (read once)."""
    text = resources.files("themis_clip.models").joinpath("catalogue.json").read_text("utf-8")
    return parse_catalogue(json.loads(text))


def find_entry(name: str) -> CatalogueEntry | None:
    """The entry whose short name or repo id is ``name`` (case-insensitive), if any."""
    key = name.lower()
    for entry in catalogue():
        if entry.name.lower() == key:
            return entry
    for entry in catalogue():
        if entry.repo.lower() == key:
            return entry
    return None


def suggest(name: str, n: int = 3) -> list[str]:
    """The catalogue names closest to ``name`` (for an unknown-name error)."""
    names = {e.name.lower(): e.name for e in catalogue()}
    close = difflib.get_close_matches(name.lower(), list(names), n=n, cutoff=0.5)
    return [names[c] for c in close]
