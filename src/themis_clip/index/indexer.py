"""Index a folder of images: incremental, resumable, crash-safe.

* Unchanged files (same size and mtime) are skipped without being read.
* A new path whose content (SHA-256) is already indexed under a path that vanished is a
  *rename*: the row moves, nothing is re-embedded. Content indexed under a path that still
  exists is a *duplicate*: its vector is copied, nothing is re-embedded.
* Files are embedded in chunks; each chunk is committed in one transaction, so an interrupted
  run loses at most the chunk in flight and the next run resumes after the last commit.
* Files that cannot be decoded are recorded with the reason, listed in every report, and not
  retried until they change. Files that vanished from the folder are removed from the index.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from themis_clip.files import IMAGE_SUFFIXES, sha256_of, walk_images
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow, Store, StoredItem
from themis_clip.interface import EmbeddingResult, ImageData
from themis_clip.vocabulary import ModelIdentity

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageEmbedder",
    "IndexReport",
    "Progress",
    "index_folder",
    "walk_images",
]

#: ``progress(done, total)``: called as embedding proceeds (the CLI draws a bar from it).
Progress = Callable[[int, int], None]


class ImageEmbedder(Protocol):
    """What the indexer needs from a model (``OnnxClipPlugin`` is one)."""

    def generate_embedding_batch(self, images: Sequence[ImageData]) -> list[EmbeddingResult]: ...


@dataclass
class IndexReport:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    renamed: int = 0
    duplicates: int = 0
    removed: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def embedded(self) -> int:
        return self.added + self.updated


def _sha256(path: Path) -> str | None:
    try:
        return sha256_of(path)
    except OSError:
        return None


def _row(
    path: Path,
    st: os.stat_result,
    digest: str | None,
    vector: npt.NDArray[np.float32],
    metadata: dict[str, Any] | None = None,
) -> ItemRow:
    """A file's row: keyed by its path, with what the next run needs to skip it unchanged."""
    return ItemRow(
        key=str(path),
        path=str(path),
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        sha256=digest,
        vector=vector,
        metadata=metadata or None,
    )


#: ``metadata(path)``: a file's metadata (the CLI passes the EXIF reader); {} for none.
MetadataReader = Callable[[Path], dict[str, Any]]


def _refresh_metadata(
    store: Store, folder: Path, items: list[StoredItem], read: MetadataReader, version: str
) -> None:
    """Metadata for items indexed before this reader (or its ``version``) existed: read
    again and merged in, vectors untouched (no re-embedding), once per folder and version."""
    tag = f"metadata_version:{folder}"
    if store.meta().get(tag) == version:
        return
    for start in range(0, len(items), 512):
        updates = {}
        for item in items[start : start + 512]:
            fresh = read(Path(item.path or item.key))
            merged = {**(item.metadata or {}), **fresh}
            if merged != (item.metadata or {}):
                updates[item.key] = merged
        store.set_metadata(updates)
    store.set_meta({tag: version})


def index_folder(
    index: VectorIndex,
    folder: Path,
    embedder: ImageEmbedder,
    *,
    stamp: ModelIdentity,
    chunk: int = 128,
    progress: Progress | bool | None = None,
    metadata: MetadataReader | None = None,
    metadata_version: str = "1",
) -> IndexReport:
    """Bring ``index`` up to date with the images under ``folder``.

    ``progress(done, total)`` is called after every committed chunk of embeddings (library
    code draws nothing; a bool is accepted as "no callback" for older callers).
    ``metadata(path)`` gives each file's metadata (EXIF); unchanged files indexed before
    ``metadata_version`` get theirs without being embedded again.
    """
    report_progress = progress if callable(progress) else None
    t0 = time.perf_counter()
    report = IndexReport()
    index.bind_model(stamp)
    store = index.store
    folder = folder.resolve()
    known = store.items_under(str(folder))
    failures = store.failures_under(str(folder))
    seen: set[str] = set()
    unchanged: list[StoredItem] = []
    todo: list[tuple[Path, os.stat_result, str | None]] = []
    for path in walk_images(folder):
        key = str(path)
        try:
            st = path.stat()
        except OSError as exc:
            report.failed.append((key, f"cannot stat: {exc.strerror or exc}"))
            continue
        seen.add(key)
        item = known.get(key)
        if item is not None and item.size == st.st_size and item.mtime_ns == st.st_mtime_ns:
            report.unchanged += 1
            unchanged.append(item)
            continue
        failed = failures.get(key)
        if failed is not None and failed[:2] == (st.st_size, st.st_mtime_ns):
            report.failed.append((key, failed[2]))
            continue
        todo.append((path, st, None))
    vanished = set(known) - seen
    # Renames and duplicates: content already in the index needs no embedding.
    to_embed: list[tuple[Path, os.stat_result, str | None]] = []
    for path, st, _ in todo:
        digest = _sha256(path)
        same = store.by_sha256(digest) if digest else []
        moved = next((i for i in same if i.path in vanished), None)
        if moved is not None and str(path) not in known:
            store.rename(
                moved.key, str(path), path=str(path), size=st.st_size, mtime_ns=st.st_mtime_ns
            )
            vanished.discard(moved.path or "")
            report.renamed += 1
        elif same and str(path) not in known:
            vector = store.vector(same[0].key)
            assert vector is not None
            meta = metadata(path) if metadata else None
            store.upsert([_row(path, st, digest, vector, meta)], dim=stamp.dim)
            report.duplicates += 1
        else:
            to_embed.append((path, st, digest))
    if report_progress is not None:
        report_progress(0, len(to_embed))
    for start in range(0, len(to_embed), chunk):
        part = to_embed[start : start + chunk]
        results = embedder.generate_embedding_batch([p for p, _, _ in part])
        rows, failed_rows = [], []
        for (path, st, digest), r in zip(part, results, strict=True):
            if r.ok and r.embedding is not None:
                meta = metadata(path) if metadata else None
                rows.append(_row(path, st, digest, r.embedding, meta))
                if str(path) in known:
                    report.updated += 1
                else:
                    report.added += 1
            else:
                failed_rows.append(
                    (str(path), st.st_size, st.st_mtime_ns, r.error or "unknown error")
                )
                report.failed.append((str(path), r.error or "unknown error"))
        store.upsert(rows, dim=stamp.dim)  # one transaction per chunk: resumable
        store.record_failures(failed_rows)
        if report_progress is not None:
            report_progress(start + len(part), len(to_embed))
    if metadata is not None:
        _refresh_metadata(store, folder, unchanged, metadata, metadata_version)
    report.removed = store.delete_keys(known[p].key for p in vanished)
    store.delete_failures(p for p in failures if p not in seen)
    report.seconds = time.perf_counter() - t0
    return report
