"""Resolve a model source (an ``.onnx`` file or a model directory) into a ``ModelSpec``.

This project's directory layout::

    manifest.json     {"format": "themis-clip-model", "format_version": 1, "name": ...,
                       "embedding_dim": 512,
                       "visual":  {"file": "visual.onnx", "image_size": 224, "mean": [...],
                                   "std": [...], "resize_mode": "shortest"},
                       "textual": {"file": "textual.onnx", "tokenizer": "tokenizer.json",
                                   "context_length": 77, "pad_id": 0,
                                   "special_tokens": "clip", "padding": "longest",
                                   "attention_mask": null, "clean": "openai",
                                   "language_prefix": null, "default_language": null},
                       "variants": {"int8": {"visual": "visual.int8.onnx", ...}},
                       "scoring": {"logit_scale": 100.0, "logit_bias": null},
                       "files": {"visual.onnx": "<sha256>", ...}}
    visual.onnx       pixel_values [N,3,S,S] float → image embedding [N,D]
    textual.onnx      input_ids [N,L] int32/int64 (+ attention_mask) → text embedding [N,D]
    tokenizer.json    Hugging Face ``tokenizers`` file (CLIP BPE)
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import themis_clip.jsonio as jsonio
from themis_clip.errors import ModelFormatError, ModelNotFoundError
from themis_clip.models.hashing import HashFunction, sha256_file, verify_digest
from themis_clip.models.peers import detect_peer_layout, stay_inside
from themis_clip.models.spec import ImageSpec, ModelSpec, TextSpec
from themis_clip.vocabulary import (
    CLIP_MEAN,
    CLIP_STD,
    Layout,
    Padding,
    ResizeMode,
    SpecialTokens,
    TextCleaning,
)

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "model_identity_digest",
    "resolve_model",
    "write_manifest",
]

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "themis-clip-model"
_SUPPORTED_FORMAT_VERSION = 1


def resolve_model(
    path: str | Path,
    *,
    name: str | None = None,
    text_path: str | Path | None = None,
    tokenizer_path: str | Path | None = None,
    variant: str | None = None,
) -> ModelSpec:
    """Find out what ``path`` holds and describe it.

    Raises:
        ModelNotFoundError: ``path`` (or a file it names) does not exist.
        ModelFormatError: the directory layout or manifest is not understood.
    """
    root = Path(path)
    if not root.exists():
        raise ModelNotFoundError(f"model path not found: {root}")
    if root.is_dir():
        manifest = root / MANIFEST_NAME
        if manifest.is_file() or manifest.is_symlink():
            stay_inside(root, manifest)
            spec = _from_manifest(manifest, variant=variant, name=name)
        else:
            peer = detect_peer_layout(root, variant=variant, name=name)
            if peer is None:
                raise ModelFormatError(
                    f"{root} holds no model layout we know: expected this project's "
                    f"({MANIFEST_NAME}, visual.onnx, textual.onnx, tokenizer.json), immich's, "
                    "transformers.js's, clip-as-service's or lakera's; or give the path of an "
                    "image-tower .onnx file"
                )
            spec = peer
            if tokenizer_path:
                spec = replace(spec, tokenizer_path=Path(tokenizer_path))
        _stay_inside(spec, given=Path(tokenizer_path) if tokenizer_path else None)
    else:
        if variant not in (None, "fp32"):
            raise ModelFormatError(
                f"variant {variant!r} needs a model directory with a manifest; {root} is a file"
            )
        textual = Path(text_path) if text_path else None
        tokenizer = Path(tokenizer_path) if tokenizer_path else None
        if (
            textual is not None
            and tokenizer is None
            and (textual.parent / "tokenizer.json").is_file()
        ):
            tokenizer = textual.parent / "tokenizer.json"
        spec = ModelSpec(
            name=name or root.stem,
            layout=Layout.FILE,
            root=root.parent,
            visual_path=root,
            textual_path=textual,
            tokenizer_path=tokenizer,
        )
    for file in (spec.visual_path, spec.textual_path, spec.tokenizer_path):
        if file is not None and not file.is_file():
            raise ModelNotFoundError(f"model file not found: {file}")
    if spec.textual_path is not None and spec.tokenizer_path is None:
        if spec.layout in (Layout.FILE, Layout.THEMIS):
            raise ModelFormatError(
                f"text tower {spec.textual_path} has no tokenizer.json beside it"
            )
        log.warning(
            "%s: text tower %s has no tokenizer.json; loading image-only (set "
            "model.tokenizer_path to embed text)",
            spec.layout,
            spec.textual_path.name,
        )
        spec = replace(spec, textual_path=None)
    return spec


def _stay_inside(spec: ModelSpec, *, given: Path | None) -> None:
    """Refuse a model file that leaves the model folder once links are resolved.

    The tokenizer's sidecar (``tokenizer_config.json``, read for its pad token) counts as a
    model file. ``given`` (a tokenizer the configuration names) is exempt.

    Raises:
        ModelFormatError: naming the file and where it leads.
    """
    files = [spec.visual_path, spec.textual_path, spec.tokenizer_path]
    files += [spec.root / rel for rel in spec.declared_sha256]
    if spec.tokenizer_path is not None and spec.tokenizer_path != given:
        sidecar = spec.tokenizer_path.parent / "tokenizer_config.json"
        files += [sidecar] if sidecar.is_file() or sidecar.is_symlink() else []
    for file in files:
        if file is not None and file != given:
            stay_inside(spec.root, file)


def model_identity_digest(
    spec: ModelSpec,
    expected: str | Mapping[str, str] | None,
    hash_fn: HashFunction = sha256_file,
) -> str:
    """Verify the expected digests (if any) and return the model's identity digest.

    * ``expected`` a string: for a directory it is the manifest's digest, and every file the
      manifest lists is then verified too; for a single file it is that file's digest.
    * ``expected`` a mapping: relative file name → digest, each verified.
    * The identity is the manifest's digest for directories, else the digest of the model files.

    Raises:
        IntegrityError: a digest differs. ModelNotFoundError: a listed file is missing.
    """
    if isinstance(expected, Mapping):
        for rel, digest in expected.items():
            verify_digest(spec.root / rel, digest, hash_fn)
    if spec.manifest_path is not None:
        if isinstance(expected, str):
            identity = verify_digest(spec.manifest_path, expected, hash_fn)
            for rel, digest in spec.declared_sha256.items():
                verify_digest(spec.root / rel, digest, hash_fn)
            return identity
        return hash_fn(spec.manifest_path).lower()
    digests = []
    for i, file in enumerate(spec.model_files()):
        if i == 0 and isinstance(expected, str):
            digests.append(verify_digest(file, expected, hash_fn))
        else:
            digests.append(hash_fn(file).lower())
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()


def _from_manifest(manifest: Path, *, variant: str | None, name: str | None) -> ModelSpec:
    try:
        data = jsonio.loads(manifest.read_bytes())
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"cannot read {manifest}: {exc}") from exc
    m = _Fields(data, manifest)
    fmt = m.get("format", str)
    if fmt != MANIFEST_FORMAT:
        raise ModelFormatError(f"{manifest}: format must be {MANIFEST_FORMAT!r}, got {fmt!r}")
    version = m.get("format_version", int)
    if version is None or version > _SUPPORTED_FORMAT_VERSION:
        raise ModelFormatError(
            f"{manifest}: format_version {version!r} is newer than this themis-clip supports "
            f"({_SUPPORTED_FORMAT_VERSION}); upgrade themis-onnx-clip"
        )
    root = manifest.parent
    visual = m.section("visual", required=True)
    textual = m.section("textual")
    files = {"visual": visual.name("file") or "visual.onnx"}
    if textual.present:
        files["textual"] = textual.name("file") or "textual.onnx"
    chosen = variant or "fp32"
    if chosen != "fp32":
        variants = m.get("variants", dict) or {}
        if chosen not in variants:
            available = ", ".join(["fp32", *sorted(variants)])
            raise ModelFormatError(f"{manifest}: no variant {chosen!r}; available: {available}")
        override = _Fields(variants[chosen], manifest, f"variants.{chosen}.")
        for tower in list(files):
            files[tower] = override.name(tower) or files[tower]
    declared = m.get("files", dict) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in declared.items()):
        raise ModelFormatError(f"{manifest}: files must map file names to SHA-256 strings")
    for rel in declared:
        _relative(rel, manifest, "files")
    image = ImageSpec(
        image_size=visual.get("image_size", int) or 224,
        mean=visual.triple("mean") or CLIP_MEAN,
        std=visual.triple("std") or CLIP_STD,
        resize_mode=visual.resize_mode(),
        interpolation=visual.get("interpolation", str) or "bicubic",
    )
    tokenizer = (textual.name("tokenizer") or "tokenizer.json") if textual.present else None
    scoring = _Fields(m.get("scoring", dict), manifest, "scoring.")
    return ModelSpec(
        name=name or m.get("name", str) or root.name,
        layout=Layout.THEMIS,
        root=root,
        visual_path=root / files["visual"],
        textual_path=root / files["textual"] if "textual" in files else None,
        tokenizer_path=root / tokenizer if tokenizer else None,
        embedding_dim=m.get("embedding_dim", int),
        image=image,
        context_length=textual.get("context_length", int) or 77,
        pad_id=textual.get("pad_id", int),
        variant=chosen,
        manifest_path=manifest,
        declared_sha256={k: v.lower() for k, v in declared.items()},
        logit_scale=scoring.finite("logit_scale", positive=True),
        logit_bias=scoring.finite("logit_bias"),
        text=_text_spec(textual, manifest),
    )


def _text_spec(textual: _Fields, source: Path) -> TextSpec:
    spec, problems = TextSpec.parse(
        special_tokens=textual.get("special_tokens", str) or SpecialTokens.CLIP,
        padding=textual.get("padding", str) or Padding.LONGEST,
        attention_mask=textual.get("attention_mask", bool),
        clean=textual.get("clean", str) or TextCleaning.OPENAI,
        language_prefix=textual.get("language_prefix", str),
        default_language=textual.get("default_language", str),
    )
    if spec is None:
        raise ModelFormatError(f"{source}: textual: {'; '.join(problems)}")
    return spec


def _relative(name: str, source: Path, key: str) -> str:
    """``name`` if it is a relative path that stays in the model folder by its spelling."""
    pure = PurePosixPath(name.replace("\\", "/"))
    if not name or pure.is_absolute() or ".." in pure.parts or PureWindowsPath(name).drive:
        raise ModelFormatError(
            f"{source}: {key} {name[:200]!r} leaves the model folder; name a file inside it"
        )
    return name


class _Fields:
    def __init__(self, data: Any, source: Path, prefix: str = "") -> None:
        self.present = data is not None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ModelFormatError(
                f"{source}: {prefix.rstrip('.') or 'manifest'} must be an object"
            )
        self._data = data
        self._source = source
        self._prefix = prefix

    def _fail(self, key: str, what: str) -> ModelFormatError:
        return ModelFormatError(f"{self._source}: {self._prefix}{key} {what}")

    def get(self, key: str, typ: type) -> Any:
        value = self._data.get(key)
        if value is not None and (
            not isinstance(value, typ) or (isinstance(value, bool) and typ is not bool)
        ):
            raise self._fail(key, f"must be {typ.__name__}, got {value!r}")
        if typ is int and isinstance(value, int) and value < 0:
            raise self._fail(key, f"must be >= 0, got {value!r}")
        return value

    def name(self, key: str) -> str | None:
        """A file name inside the model folder (relative, without ``..``), or None."""
        value = self.get(key, str)
        return None if value is None else _relative(value, self._source, self._prefix + key)

    def finite(self, key: str, *, positive: bool = False) -> float | None:
        value = self._data.get(key)
        if value is None:
            return None
        if not jsonio.is_number(value) or (positive and value <= 0):
            raise self._fail(
                key, f"must be a {'positive ' if positive else ''}number, got {value!r}"
            )
        return float(value)

    def triple(self, key: str) -> tuple[float, float, float] | None:
        value = self._data.get(key)
        if value is None:
            return None
        if not (
            isinstance(value, list) and len(value) == 3 and all(jsonio.is_number(v) for v in value)
        ):
            raise self._fail(key, f"must be three numbers, got {value!r}")
        return (float(value[0]), float(value[1]), float(value[2]))

    def resize_mode(self) -> ResizeMode:
        value = self._data.get("resize_mode", "shortest")
        try:
            return ResizeMode(value)
        except ValueError:
            allowed = ", ".join(m.value for m in ResizeMode)
            raise self._fail("resize_mode", f"must be one of {allowed}, got {value!r}") from None

    def section(self, key: str, *, required: bool = False) -> _Fields:
        value = self._data.get(key)
        if value is None and required:
            raise self._fail(key, "is required")
        return _Fields(value, self._source, f"{self._prefix}{key}.")


def write_manifest(
    root: Path,
    *,
    name: str,
    embedding_dim: int,
    visual: Mapping[str, Any],
    textual: Mapping[str, Any] | None = None,
    variants: Mapping[str, Mapping[str, str]] | None = None,
    extra: Mapping[str, Any] | None = None,
    hash_fn: HashFunction = sha256_file,
) -> Path:
    """Write ``manifest.json`` for the model files in ``root``, with each file's SHA-256.

    Every file in ``root`` except the manifest itself is listed under ``files``.
    """
    files = {
        p.relative_to(root).as_posix(): hash_fn(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "format_version": _SUPPORTED_FORMAT_VERSION,
        "name": name,
        "embedding_dim": embedding_dim,
        "visual": dict(visual),
    }
    if textual is not None:
        manifest["textual"] = dict(textual)
    if variants:
        manifest["variants"] = {k: dict(v) for k, v in variants.items()}
    if extra:
        manifest.update(extra)
    manifest["files"] = files
    path = root / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n", "utf-8")
    return path
