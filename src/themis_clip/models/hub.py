"""Models by name: a string (path, Hub repo id, catalogue name) → a verified local folder.

How a model string is resolved (``--model``, ``model.path``, ``POST /admin/reload``):

1. An existing local path (file or directory) always wins, as it is.
2. ``NAME@REV`` splits off a revision (branch, tag or commit); otherwise the revision is ``main``.
3. A catalogue name (``ViT-B-32__openai``; case-insensitive) stands for its entry's repo.
4. Any other ``org/name`` is a Hub repo id; its layout is read from the repo's file listing.
5. Anything else is an unknown name: :class:`ModelNotFoundError` with the closest catalogue
   names.

A repo is fetched with ``huggingface_hub`` into its standard cache (``HF_HOME`` /
``HF_HUB_CACHE``; ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE`` and proxies as the client reads
them), only the files its layout needs. The client does not check a downloaded file against the
SHA-256 the Hub lists for it, so this module does: every file of the pinned commit against the
tree listing (LFS files by SHA-256, small files by their git blob id). A mismatch deletes the
cached copy and refuses. The verified digests and the commit are recorded beside the cached repo
(``<repo cache>/themis/<commit>.json``); a load from the cache never asks the network and hands
the recorded digests to the loader, which re-hashes the files against them before use.
One process at a time pulls a repo (a file lock); a second waits, then finds it cached.

This module is the home of ``huggingface_hub`` (and ``filelock``); the export of PyTorch
checkpoints on pull imports the optional ``export`` extra lazily.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from themis_clip.errors import (
    IntegrityError,
    ModelError,
    ModelFormatError,
    ModelNotFoundError,
)
from themis_clip.files import sha256_of
from themis_clip.models.catalogue import CatalogueEntry, RepoLayout, find_entry, suggest
from themis_clip.models.peers import XENOVA_SUFFIXES

__all__ = [
    "CachedFile",
    "ModelSource",
    "ResolvedModel",
    "cache_root",
    "cached_info",
    "detect_layout",
    "is_cached",
    "parse_source",
    "pull",
    "remove",
    "resolve",
    "select_files",
    "verify_cached",
]

log = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_RECORD_FORMAT = "themis-clip-hub-record"
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


def parse_source(text: str, *, revision: str | None = None) -> ModelSource:
    """Classify a model string (rules 1-5 of the module docstring); no network.

    Raises:
        ModelNotFoundError: neither an existing path, a catalogue name nor a repo id.
    """
    raw = text.strip()
    local = Path(raw).expanduser()
    if raw and local.exists():
        return ModelSource(text=text, path=local)
    name, _, rev = raw.partition("@")
    rev = revision or rev or DEFAULT_REVISION
    entry = find_entry(name)
    if entry is not None:
        return ModelSource(text=text, repo=entry.repo, revision=rev, entry=entry)
    if _REPO_ID.match(name) and not raw.startswith((".", "/", "~")):
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


# --- layouts: what a repo holds and what to fetch of it --------------------------------------

_TEXT_SIDE = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def detect_layout(files: Sequence[str]) -> str | None:
    """Which layout a repo's file listing is, or None."""
    names = set(files)
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


# --- the cache ------------------------------------------------------------------------------


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face hub cache (``HF_HUB_CACHE``, ``HF_HOME/hub``) or ``cache_dir``."""
    if cache_dir is not None:
        return Path(cache_dir)
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _storage(repo: str, cache_dir: str | Path | None) -> Path:
    return cache_root(cache_dir) / ("models--" + repo.replace("/", "--"))


def _record_path(storage: Path, commit: str) -> Path:
    return storage / "themis" / f"{commit}.json"


def _commit_for(storage: Path, revision: str) -> str | None:
    if _COMMIT.match(revision):
        return revision
    ref = storage / "refs" / revision
    try:
        commit = ref.read_text("utf-8").strip()
    except OSError:
        return None
    return commit if _COMMIT.match(commit) else None


def _read_record(storage: Path, commit: str) -> dict[str, Any] | None:
    try:
        data = json.loads(_record_path(storage, commit).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != _RECORD_FORMAT:
        return None
    return data


def _write_record(storage: Path, commit: str, record: dict[str, Any]) -> None:
    path = _record_path(storage, commit)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", "utf-8")
    tmp.replace(path)


@contextmanager
def _repo_lock(repo: str, cache_dir: str | Path | None) -> Iterator[None]:
    from filelock import FileLock

    lock = cache_root(cache_dir) / ".locks" / "themis" / ("models--" + repo.replace("/", "--"))
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock) + ".lock"):
        yield


def _from_record(
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
    path = _load_path(layout, snapshot, needed)
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
        text_path = Path(text_repo)
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


def _load_path(layout: str, snapshot: Path, files: Sequence[str]) -> Path:
    if layout == RepoLayout.FASTEMBED:
        return snapshot / "model.onnx"  # an image tower file (fastembed ships text separately)
    return snapshot


# --- resolving and pulling ------------------------------------------------------------------


def resolve(
    text: str,
    *,
    revision: str | None = None,
    precision: str | None = None,
    allow_download: bool = True,
    cache_dir: str | Path | None = None,
) -> ResolvedModel:
    """Turn a model string into a local, verified model (pulling it if allowed and needed).

    A cached, verified model is used without any network request.

    Raises:
        ModelNotFoundError: unknown name, no such repo or revision, gated, or not cached while
            offline / downloads not allowed. ModelFormatError: a repo layout we cannot load.
        IntegrityError: a downloaded file differs from the digest the Hub lists.
    """
    source = parse_source(text, revision=revision)
    if source.path is not None:
        return ResolvedModel(path=source.path, source=source)
    assert source.repo is not None
    found = _cached(source, precision, cache_dir)
    if found is not None:
        return found
    if not allow_download:
        raise ModelNotFoundError(
            f"model {source.label} ({source.repo}@{source.revision}) is not in the cache and "
            "downloads are not allowed here: run `themis-clip models pull "
            f"{source.label}` first (or start the server with --allow-pull)"
        )
    return pull(text, revision=revision, precision=precision, cache_dir=cache_dir)


def _cached(
    source: ModelSource, precision: str | None, cache_dir: str | Path | None
) -> ResolvedModel | None:
    assert source.repo is not None
    storage = _storage(source.repo, cache_dir)
    commit = _commit_for(storage, source.revision)
    if commit is None:
        return None
    record = _read_record(storage, commit)
    if record is None:
        return None
    return _from_record(source, storage, commit, record, precision)


def pull(
    text: str,
    *,
    revision: str | None = None,
    precision: str | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = True,
) -> ResolvedModel:
    """Ask the Hub for the revision's commit, fetch what is missing, verify, record.

    Raises: as :func:`resolve`.
    """
    source = parse_source(text, revision=revision)
    if source.path is not None:
        return ResolvedModel(path=source.path, source=source)
    assert source.repo is not None
    with _repo_lock(source.repo, cache_dir):
        return _pull_locked(source, precision, cache_dir, progress)


def _pull_locked(
    source: ModelSource,
    precision: str | None,
    cache_dir: str | Path | None,
    progress: bool,
) -> ResolvedModel:
    assert source.repo is not None
    repo = source.repo
    storage = _storage(repo, cache_dir)
    commit, tree = _remote_listing(source, cache_dir)
    record = _read_record(storage, commit)
    if record is not None:
        found = _from_record(source, storage, commit, record, precision)
        if found is not None:
            _write_ref(storage, source.revision, commit)
            return found
    layout = source.entry.layout if source.entry is not None else None
    layout = detect_layout(list(tree)) if layout is None else layout
    if layout is None or detect_layout(list(tree)) is None:
        shown = ", ".join(sorted(tree)[:8]) + (" ..." if len(tree) > 8 else "")
        raise ModelFormatError(
            f"{repo}@{source.revision} holds no model layout we load (immich, transformers.js, "
            f"fastembed, themis-clip, clip-as-service/lakera ONNX, or a transformers PyTorch "
            f"checkpoint); its files: {shown or 'none'}"
        )
    if layout == RepoLayout.PYTORCH:
        exporter = _exporter(source)  # fail before downloading gigabytes we cannot use
    needed = select_files(list(tree), layout, precision)
    snapshot = _download(repo, commit, needed, cache_dir, progress)
    verified = dict(record["verified"]) if record else {}
    for rel in needed:
        verified[rel] = _verify_file(repo, commit, snapshot / rel, rel, tree[rel])
    new_record: dict[str, Any] = {
        "format": _RECORD_FORMAT,
        "repo": repo,
        "commit": commit,
        "layout": layout,
        "tree": tree,
        "verified": verified,
        "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "exports": dict(record.get("exports", {})) if record else {},
    }
    if layout == RepoLayout.PYTORCH:
        new_record["exports"][precision or "fp32"] = _export(
            exporter, source, storage, snapshot, commit, precision or "fp32"
        )
    text_repo = source.entry.text_repo if source.entry is not None else None
    if text_repo:
        text = pull(text_repo, cache_dir=cache_dir, progress=progress)
        new_record["text_repo"] = str(text.path)
        new_record["text_sha256"] = text.digests[str(text.path)]
        tok = text.path.parent / "tokenizer.json"
        if str(tok) in text.digests:
            new_record["text_tokenizer_sha256"] = text.digests[str(tok)]
    _write_record(storage, commit, new_record)
    _write_ref(storage, source.revision, commit)
    found = _from_record(source, storage, commit, new_record, precision)
    if found is None:
        raise ModelError(f"{repo}@{commit}: pulled but the cache is incomplete")
    log.info("model %s pulled: %s@%s, %d files verified", source.label, repo, commit, len(needed))
    return ResolvedModel(
        path=found.path,
        text_path=found.text_path,
        source=source,
        commit=commit,
        layout=layout,
        digests=found.digests,
        downloaded=True,
    )


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    if _COMMIT.match(revision):
        return
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(ref.name + ".themis-tmp")
    tmp.write_text(commit, "utf-8")
    tmp.replace(ref)


def _hub_errors(source: ModelSource) -> Callable[[BaseException], ModelError]:
    """A translator of ``huggingface_hub`` / transport errors into ours, for ``source``."""
    from huggingface_hub import errors as hf_errors

    repo, rev, label = source.repo, source.revision, source.label

    def translate(exc: BaseException) -> ModelError:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(exc, hf_errors.GatedRepoError) or status in (401, 403):
            return ModelNotFoundError(
                f"{repo} is gated or private (HTTP {status}): accept its terms on the Hub and "
                "set HF_TOKEN to a token that may read it"
            )
        if isinstance(exc, hf_errors.RevisionNotFoundError):
            return ModelNotFoundError(f"{repo} has no revision {rev!r} (branch, tag or commit)")
        if isinstance(exc, hf_errors.RepositoryNotFoundError):
            return ModelNotFoundError(f"no repository {repo} on the Hub")
        if isinstance(exc, hf_errors.HfHubHTTPError) and status is not None:
            return ModelNotFoundError(f"the Hub answered HTTP {status} for {repo}: {exc}")
        return ModelNotFoundError(
            f"model {label} ({repo}@{rev}) is not cached and the Hub cannot be reached "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'offline'}). "
            f"On a machine that can reach it, run `themis-clip models pull {label}`, then copy "
            f"its cache folder {_storage(str(repo), None).name} into this machine's "
            "HF_HUB_CACHE (default ~/.cache/huggingface/hub)"
        )

    return translate


def _transport_errors() -> tuple[type[BaseException], ...]:
    import httpx2

    return (OSError, httpx2.HTTPError)


def _remote_listing(
    source: ModelSource, cache_dir: str | Path | None
) -> tuple[str, dict[str, dict[str, Any]]]:
    """``(commit, {path: {size, sha256 | None, blob_id}})`` of the repo at the revision."""
    from huggingface_hub import HfApi, RepoFile

    translate = _hub_errors(source)
    assert source.repo is not None
    api = HfApi()
    try:
        info = api.model_info(source.repo, revision=source.revision)
        commit = info.sha
        if commit is None:
            raise ModelNotFoundError(f"the Hub gave no commit for {source.repo}")
        tree = {
            f.path: {
                "size": f.size,
                "blob_id": f.blob_id,
                "sha256": f.lfs.sha256 if f.lfs is not None else None,
            }
            for f in api.list_repo_tree(source.repo, revision=commit, recursive=True)
            if isinstance(f, RepoFile)
        }
    except ModelError:
        raise
    except _transport_errors() as exc:
        raise translate(exc) from None
    return commit, tree


def _download(
    repo: str, commit: str, files: list[str], cache_dir: str | Path | None, progress: bool
) -> Path:
    from huggingface_hub import snapshot_download

    translate = _hub_errors(ModelSource(text=repo, repo=repo, revision=commit))
    try:
        folder = snapshot_download(
            repo,
            revision=commit,
            allow_patterns=files,
            cache_dir=str(cache_dir) if cache_dir is not None else None,
            tqdm_class=None if progress else _SilentBar,
        )
    except _transport_errors() as exc:
        raise translate(exc) from None
    return Path(folder)


class _SilentBar:
    """A do-nothing progress bar (``progress=False``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.n = 0
        self.total = kwargs.get("total")

    def __enter__(self) -> _SilentBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: float | None = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def refresh(self) -> None:
        pass

    def set_description(self, *a: Any, **k: Any) -> None:
        pass

    def set_description_str(self, *a: Any, **k: Any) -> None:
        pass

    def set_postfix_str(self, *a: Any, **k: Any) -> None:
        pass


def _git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _verify_file(repo: str, commit: str, path: Path, rel: str, entry: Mapping[str, Any]) -> str:
    """Check a fetched file against the listing; on a mismatch delete it and refuse."""
    expected = entry.get("sha256")
    actual = sha256_of(path)
    if expected is not None:
        if actual == str(expected).lower():
            return actual
        _evict(path)
        raise IntegrityError(
            f"{repo}@{commit[:12]}: {rel} is corrupt: the Hub lists SHA-256 {expected}, the "
            f"downloaded file has {actual}; the cached copy was deleted, pull again"
        )
    blob = _git_blob_sha1(path)
    if blob != str(entry.get("blob_id")):
        _evict(path)
        raise IntegrityError(
            f"{repo}@{commit[:12]}: {rel} is corrupt: the Hub lists git blob "
            f"{entry.get('blob_id')}, the downloaded file has {blob}; the cached copy was "
            "deleted, pull again"
        )
    return actual


def _evict(path: Path) -> None:
    """Delete a cached file: the blob the snapshot link points to, and the link."""
    target = path.resolve()
    for p in (target, path):
        with suppress(FileNotFoundError):
            p.unlink()


def _exporter(source: ModelSource) -> Callable[..., Any]:
    try:
        from themis_clip.export import hf
    except ImportError as exc:
        alt = source.entry.onnx_alternative if source.entry is not None else None
        ready = f"; or use the ready ONNX model {alt!r}" if alt else ""
        raise ModelFormatError(
            f"{source.repo} is a PyTorch checkpoint: exporting it on pull needs the export extra "
            f"({exc.name} is missing): pip install 'themis-onnx-clip[export]'{ready}"
        ) from None
    return hf.export_hf_checkpoint


def _export(
    exporter: Callable[..., Any],
    source: ModelSource,
    storage: Path,
    snapshot: Path,
    commit: str,
    precision: str,
) -> dict[str, Any]:
    rel = f"themis/export/{commit}-{precision.replace(',', '+')}"
    out = storage / rel
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    precisions = ["fp32", *[p for p in precision.split(",") if p and p != "fp32"]]
    log.info("exporting %s@%s to ONNX (%s)", source.repo, commit[:12], ",".join(precisions))
    exporter(snapshot, tmp, precisions=precisions, name=source.label)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    files = {
        p.relative_to(out).as_posix(): sha256_of(p) for p in sorted(out.rglob("*")) if p.is_file()
    }
    return {"path": rel, "files": files}


# --- the cache, for `models info / verify / rm` ----------------------------------------------


def cached_info(
    text: str, *, revision: str | None = None, cache_dir: str | Path | None = None
) -> dict[str, Any] | None:
    """What the cache holds for a model string (no network), or None if nothing."""
    source = parse_source(text, revision=revision)
    if source.repo is None:
        return None
    storage = _storage(source.repo, cache_dir)
    commit = _commit_for(storage, source.revision)
    record = _read_record(storage, commit) if commit else None
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

    Raises:
        ModelNotFoundError: nothing cached for this model.
    """
    info = cached_info(text, revision=revision, cache_dir=cache_dir)
    if info is None:
        raise ModelNotFoundError(f"model {text!r} is not in the cache")
    snapshot = Path(info["path"])
    out = []
    for f in info["files"]:
        path = snapshot / f.path
        ok = path.is_file() and sha256_of(path) == f.sha256
        out.append(CachedFile(path=f.path, size=f.size, sha256=f.sha256, ok=ok))
    return out


def remove(
    text: str, *, revision: str | None = None, cache_dir: str | Path | None = None
) -> Path | None:
    """Delete a model's whole repo folder from the cache; returns it, or None if absent."""
    source = parse_source(text, revision=revision)
    if source.repo is None:
        raise ModelNotFoundError(f"{text!r} is a local path, not a cached model")
    storage = _storage(source.repo, cache_dir)
    if not storage.exists():
        return None
    with _repo_lock(source.repo, cache_dir):
        shutil.rmtree(storage)
    return storage


def is_cached(text: str, *, cache_dir: str | Path | None = None) -> bool:
    """Whether a verified copy of the model (at its default revision) is in the cache."""
    try:
        source = parse_source(text)
    except ModelNotFoundError:
        return False
    return source.repo is not None and _cached(source, None, cache_dir) is not None
