"""The local side: the Hugging Face cache, our verification records in it, the repo lock.

A verified pull leaves ``<HF_HUB_CACHE>/models--org--name/themis/<commit>.json``: the repo's
tree listing at that commit, the layout, the SHA-256 of every file checked and any ONNX export
made from it. A load from the cache needs the record and the files; it makes no request.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from themis_clip.errors import ModelFormatError, ModelNotFoundError
from themis_clip.files import file_lock, resolves_outside, sha256_of
from themis_clip.models.catalogue import RepoLayout, find_entry
from themis_clip.models.hub.source import (
    CachedFile,
    ModelSource,
    ResolvedModel,
    is_commit,
    parse_source,
    select_files,
)
from themis_clip.models.peers import XENOVA_SUFFIXES

__all__ = [
    "cache_root",
    "cached_info",
    "describe",
    "is_cached",
    "remove",
    "verify_cached",
]

RECORD_FORMAT = "themis-clip-hub-record"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face hub cache (``HF_HUB_CACHE``, ``HF_HOME/hub``) or ``cache_dir``."""
    if cache_dir is not None:
        return Path(cache_dir)
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def storage_dir(repo: str, cache_dir: str | Path | None) -> Path:
    return cache_root(cache_dir) / ("models--" + repo.replace("/", "--"))


def record_path(storage: Path, commit: str) -> Path:
    return storage / "themis" / f"{commit}.json"


def commit_for(storage: Path, revision: str) -> str | None:
    if is_commit(revision):
        return revision
    ref = storage / "refs" / revision
    try:
        commit = ref.read_text("utf-8").strip()
    except OSError:
        return None
    return commit if is_commit(commit) else None


def read_record(storage: Path, commit: str) -> dict[str, Any] | None:
    try:
        data = json.loads(record_path(storage, commit).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
        return None
    return data


def write_record(storage: Path, commit: str, record: dict[str, Any]) -> None:
    path = record_path(storage, commit)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", "utf-8")
    tmp.replace(path)


@contextmanager
def repo_lock(repo: str, cache_dir: str | Path | None) -> Iterator[None]:
    """Hold the cache's lock on ``repo``: one process at a time pulls or removes it."""
    name = "models--" + repo.replace("/", "--") + ".lock"
    with file_lock(cache_root(cache_dir) / ".locks" / "themis" / name):
        yield


def from_record(
    source: ModelSource, storage: Path, commit: str, record: dict[str, Any], precision: str | None
) -> ResolvedModel | None:
    """The model a verification record describes, if every file it needs is recorded."""
    layout = str(record["layout"])
    snapshot = storage / "snapshots" / commit
    tree: dict[str, Any] = record["tree"]
    verified: dict[str, str] = record["verified"]
    try:
        needed = select_files(list(tree), layout, precision)
    except ModelFormatError:
        return None
    if not needed or any(f not in verified or not (snapshot / f).is_file() for f in needed):
        return None
    digests = {str(snapshot / f): verified[f] for f in needed}
    path = load_path(layout, snapshot, needed)
    if layout == RepoLayout.PYTORCH:
        export = record.get("exports", {}).get(precision or "fp32")
        if not isinstance(export, dict) or not (storage / export["path"]).is_dir():
            return None
        root = storage / export["path"]
        path = root
        digests = {str(root / rel): d for rel, d in export["files"].items()}
    text_path = None
    text_repo = record.get("text_repo")
    if isinstance(text_repo, str):
        text_path = storage.parent / text_repo  # relative to the cache: it can be copied
        if not text_path.is_file():
            return None
        digests[str(text_path)] = record["text_sha256"]
        tok = text_path.parent / "tokenizer.json"
        if tok.is_file() and "text_tokenizer_sha256" in record:
            digests[str(tok)] = record["text_tokenizer_sha256"]
    return ResolvedModel(
        path=path,
        text_path=text_path,
        source=source,
        commit=commit,
        layout=layout,
        digests=digests,
    )


def load_path(layout: str, snapshot: Path, files: Sequence[str]) -> Path:
    if layout == RepoLayout.FASTEMBED:
        return snapshot / "model.onnx"  # an image tower file (fastembed ships text separately)
    return snapshot


def cached(
    source: ModelSource, precision: str | None, cache_dir: str | Path | None
) -> ResolvedModel | None:
    assert source.repo is not None
    storage = storage_dir(source.repo, cache_dir)
    commit = commit_for(storage, source.revision)
    if commit is None:
        return None
    record = read_record(storage, commit)
    if record is None:
        return None
    return from_record(source, storage, commit, record, precision)


def write_ref(storage: Path, revision: str, commit: str) -> None:
    if is_commit(revision):
        return
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(ref.name + ".themis-tmp")
    tmp.write_text(commit, "utf-8")
    tmp.replace(ref)


def cached_info(
    text: str, *, revision: str | None = None, cache_dir: str | Path | None = None
) -> dict[str, Any] | None:
    """What the cache holds for a model string (no network), or None if nothing."""
    source = parse_source(text, revision=revision)
    if source.repo is None:
        return None
    storage = storage_dir(source.repo, cache_dir)
    commit = commit_for(storage, source.revision)
    record = read_record(storage, commit) if commit else None
    if commit is None or record is None:
        return None
    snapshot = storage / "snapshots" / commit
    files = [
        CachedFile(path=rel, size=int(record["tree"][rel]["size"] or 0), sha256=digest)
        for rel, digest in sorted(record["verified"].items())
    ]
    variants = _variants(record)
    return {
        "name": source.label,
        "repo": source.repo,
        "revision": source.revision,
        "commit": commit,
        "layout": record["layout"],
        "path": str(snapshot),
        "files": files,
        "variants": variants,
        "exports": {k: str(storage / v["path"]) for k, v in record.get("exports", {}).items()},
        "verified_at": record.get("verified_at"),
    }


def _variants(record: Mapping[str, Any]) -> list[str]:
    tree = list(record["tree"])
    if record["layout"] == RepoLayout.TRANSFORMERS_JS:
        return [v for v, s in XENOVA_SUFFIXES.items() if f"onnx/vision_model{s}.onnx" in tree]
    return ["fp32"]


def verify_cached(
    text: str, *, revision: str | None = None, cache_dir: str | Path | None = None
) -> list[CachedFile]:
    """Re-hash every recorded file of a cached model against its recorded digest.

    A file must also stay inside its repo's cache folder once links are resolved (a snapshot's
    files are links into its ``blobs``): a link out of it is refused unread.

    Raises:
        ModelNotFoundError: nothing cached for this model.
    """
    info = cached_info(text, revision=revision, cache_dir=cache_dir)
    if info is None:
        raise ModelNotFoundError(f"model {text!r} is not in the cache")
    snapshot = Path(info["path"])
    storage = snapshot.parent.parent
    out = []
    for f in info["files"]:
        path = snapshot / f.path
        target = resolves_outside(path, snapshot, storage / "blobs")
        if target is not None:
            problem: str | None = f"a link out of the cache (to {target})"
        elif not path.is_file():
            problem = "missing"
        elif sha256_of(path) != f.sha256:
            problem = "differs from its verified digest"
        else:
            problem = None
        out.append(
            CachedFile(
                path=f.path, size=f.size, sha256=f.sha256, ok=problem is None, problem=problem
            )
        )
    return out


def remove(
    text: str, *, revision: str | None = None, cache_dir: str | Path | None = None
) -> Path | None:
    """Delete a model's whole repo folder from the cache; returns it, or None if absent."""
    source = parse_source(text, revision=revision)
    if source.repo is None:
        raise ModelNotFoundError(f"{text!r} is a local path, not a cached model")
    storage = storage_dir(source.repo, cache_dir)
    if not storage.exists():
        return None
    with repo_lock(source.repo, cache_dir):
        shutil.rmtree(storage)
    return storage


def is_cached(text: str, *, cache_dir: str | Path | None = None) -> bool:
    """Whether a verified copy of the model (at its default revision) is in the cache."""
    try:
        source = parse_source(text)
    except ModelNotFoundError:
        return False
    return source.repo is not None and cached(source, None, cache_dir) is not None


def describe(text: str) -> dict[str, Any] | None:
    """How a served model string reads in the catalogue (no network), None for a local path."""
    try:
        source = parse_source(text)
    except ModelNotFoundError:
        return None
    if source.repo is None:
        return None
    entry = source.entry or find_entry(source.repo)
    commit = commit_for(storage_dir(source.repo, None), source.revision)
    return {
        "catalogue_name": entry.name if entry is not None else None,
        "repo": source.repo,
        "revision": source.revision,
        "commit": commit,
    }
