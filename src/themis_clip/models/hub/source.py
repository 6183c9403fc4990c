"""What a model string names (a path, a Hub repo at a revision), and what each repo layout needs."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from themis_clip.errors import ModelFormatError, ModelNotFoundError
from themis_clip.models.catalogue import CatalogueEntry, RepoLayout, find_entry, suggest
from themis_clip.models.peers import XENOVA_SUFFIXES

__all__ = [
    "DEFAULT_REVISION",
    "CachedFile",
    "ModelSource",
    "ResolvedModel",
    "detect_layout",
    "is_commit",
    "listed_file",
    "parse_source",
    "select_files",
]

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_REPO_ID_MAX = 96  # the Hub's own limit; the client raises a ValueError beyond it
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# One part of a repo file name: no separators or control characters, not "." or "..".
_NAME_PART = re.compile(r"^[^/\\\x00-\x1f\x7f]{1,255}$")
#: the largest file a listing may announce (the biggest single CLIP checkpoints are ~10 GB).
MAX_FILE_BYTES = 64 * 1024**3
DEFAULT_REVISION = "main"


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """What a model string names: a local path, or a Hub repo at a revision."""

    text: str
    path: Path | None = None
    repo: str | None = None
    revision: str = DEFAULT_REVISION
    entry: CatalogueEntry | None = None

    @property
    def label(self) -> str:
        """The catalogue name, else the repo id, else the path."""
        if self.entry is not None:
            return self.entry.name
        return self.repo or str(self.path)


@dataclass(frozen=True, kw_only=True)
class ResolvedModel:
    """A model string made local: the folder (or file) to load and what was verified."""

    path: Path
    text_path: Path | None = None
    source: ModelSource
    commit: str | None = None
    layout: str | None = None
    #: absolute file path → SHA-256 verified at pull time (the loader re-checks them).
    digests: Mapping[str, str] = field(default_factory=dict)
    downloaded: bool = False


@dataclass(frozen=True, kw_only=True)
class CachedFile:
    """One file of a cached repo, as ``models info`` / ``models verify`` report it."""

    path: str
    size: int
    sha256: str
    ok: bool | None = None  # None: not re-hashed
    problem: str | None = None  # why not ok


def parse_source(text: str, *, revision: str | None = None) -> ModelSource:
    """Classify a model string (rules 1-5 of the module docstring); no network.

    Raises:
        ModelNotFoundError: neither an existing path, a catalogue name nor a repo id.
    """
    raw = text.strip()
    local = Path(raw).expanduser()
    if raw and _exists(local):
        return ModelSource(text=text, path=local)
    name, _, rev = raw.partition("@")
    rev = revision or rev or DEFAULT_REVISION
    if not _REVISION.match(rev) or ".." in rev.split("/"):
        raise ModelNotFoundError(f"not a revision (branch, tag or commit): {rev!r}")
    entry = find_entry(name)
    if entry is not None:
        return ModelSource(text=text, repo=entry.repo, revision=rev, entry=entry)
    if _REPO_ID.match(name) and not raw.startswith((".", "/", "~")):
        if len(name) > _REPO_ID_MAX or "--" in name or ".." in name:
            raise ModelNotFoundError(
                f"not a Hub repo id: {name[:100]!r}: at most {_REPO_ID_MAX} characters, "
                "without '--' or '..'"
            )
        return ModelSource(text=text, repo=name, revision=rev)
    looks_like_path = (
        raw.startswith((".", "/", "~")) or os.sep in raw or raw.endswith(".onnx") or not raw
    )
    if looks_like_path:
        raise ModelNotFoundError(f"model path not found: {local}")
    close = suggest(name)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ModelNotFoundError(
        f"unknown model {name!r}: not a local path, a catalogue name or a Hub repo id "
        f"(org/name){hint} (themis-clip models list shows the catalogue)"
    )


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a NUL byte, a lone surrogate, a name too long
        return False


# --- layouts: what a repo holds and what to fetch of it --------------------------------------

_TEXT_SIDE = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def detect_layout(files: Sequence[str]) -> str | None:
    """Which layout a repo's file listing is, or None."""
    names = set(files)
    if {"detection/model.onnx", "recognition/model.onnx"} <= names:
        return RepoLayout.OCR
    if "manifest.json" in names and any(f.endswith(".onnx") for f in names):
        return RepoLayout.THEMIS
    if "visual/model.onnx" in names:
        return RepoLayout.IMMICH
    if any(fnmatch(f, "onnx/vision_model*.onnx") for f in names):
        return RepoLayout.TRANSFORMERS_JS
    if "visual.onnx" in names or any(fnmatch(f, "clip_image_model_*.onnx") for f in names):
        return RepoLayout.PEER_ONNX
    if "model.onnx" in names:
        return RepoLayout.FASTEMBED
    if "config.json" in names and ("model.safetensors" in names or "pytorch_model.bin" in names):
        return RepoLayout.PYTORCH
    return None


def select_files(files: Sequence[str], layout: str, precision: str | None) -> list[str]:
    """The files of ``files`` a ``layout`` repo needs for ``precision`` (one allow-list each).

    Raises:
        ModelFormatError: the precision is not one this layout offers.
    """
    chosen = precision or "fp32"
    patterns: list[str]
    if layout == RepoLayout.IMMICH:
        _only_fp32(layout, chosen)
        # Not the fp16 / ARM NN / RKNN variants immich repos also carry.
        patterns = [
            "config.json",
            "visual/model.onnx",
            "visual/model.onnx_data",
            "visual/model.onnx.data",
            "visual/preprocess_cfg.json",
            "textual/model.onnx",
            "textual/model.onnx_data",
            "textual/model.onnx.data",
            *(f"textual/{n}" for n in _TEXT_SIDE),
        ]
    elif layout == RepoLayout.TRANSFORMERS_JS:
        if chosen not in XENOVA_SUFFIXES:
            raise ModelFormatError(
                f"transformers.js repos offer {', '.join(XENOVA_SUFFIXES)}; got {chosen!r}"
            )
        sfx = XENOVA_SUFFIXES[chosen]
        towers = [f"onnx/{t}_model{sfx}.onnx" for t in ("vision", "text")]
        patterns = [
            "config.json",
            "preprocessor_config.json",
            *_TEXT_SIDE,
            *towers,
            *(t + "_data" for t in towers),
            *(t + ".data" for t in towers),
        ]
        if f"onnx/vision_model{sfx}.onnx" not in files:
            have = [v for v, s in XENOVA_SUFFIXES.items() if f"onnx/vision_model{s}.onnx" in files]
            raise ModelFormatError(f"no {chosen} variant in this repo; it has {', '.join(have)}")
    elif layout == RepoLayout.OCR:
        _only_fp32(layout, chosen)
        patterns = [
            "detection/model.onnx",
            "recognition/model.onnx",
            "recognition/*.txt",
            "textline_orientation/model.onnx",
            "classification/model.onnx",
        ]
    elif layout == RepoLayout.FASTEMBED:
        _only_fp32(layout, chosen)
        patterns = ["model.onnx", "model.onnx_data", "*.json"]
    elif layout in (RepoLayout.THEMIS, RepoLayout.PEER_ONNX):
        patterns = ["*.onnx", "*.onnx.data", "*.onnx_data", "*.json", "*.txt"]
    elif layout == RepoLayout.PYTORCH:
        weights = "model.safetensors" if "model.safetensors" in files else "pytorch_model.bin"
        patterns = [weights, "*.json", "*.txt", "*.model", "vocab.*", "merges.txt"]
    else:
        raise ModelFormatError(f"unknown layout {layout!r}")
    return sorted(f for f in files if any(fnmatch(f, p) for p in patterns))


def _only_fp32(layout: str, precision: str) -> None:
    if precision != "fp32":
        raise ModelFormatError(f"{layout} repos hold fp32 ONNX towers only; got {precision!r}")


def is_commit(revision: object) -> bool:
    """Whether ``revision`` is a full commit hash (immutable: no look-up needed)."""
    return isinstance(revision, str) and _COMMIT.fullmatch(revision) is not None


def listed_file(path: object, size: object, sha256: object, blob_id: object) -> dict[str, Any]:
    """One entry of a Hub tree listing, checked: every value a Hub returns is untrusted.

    The name must stay inside the snapshot (relative POSIX parts, no ``..``), the size is an
    integer in ``[0, MAX_FILE_BYTES]``, the digests are hex of their length.

    Raises:
        ModelFormatError: naming the value refused.
    """
    shown = repr(path)[:120]
    parts = path.split("/") if isinstance(path, str) and len(path) <= 1000 else []
    if not parts or not all(_NAME_PART.fullmatch(p) and p not in (".", "..") for p in parts):
        raise ModelFormatError(f"the Hub listed a file name we refuse: {shown}")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES:
        raise ModelFormatError(
            f"the Hub listed {shown} with a size we refuse: {str(size)[:40]} "
            f"(at most {MAX_FILE_BYTES} bytes)"
        )
    if sha256 is not None and not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
        raise ModelFormatError(f"the Hub listed {shown} with a malformed SHA-256")
    if not (isinstance(blob_id, str) and _COMMIT.fullmatch(blob_id)):
        raise ModelFormatError(f"the Hub listed {shown} with a malformed git blob id")
    return {"size": size, "blob_id": blob_id, "sha256": sha256}
