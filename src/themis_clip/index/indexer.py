"""Index a folder of images: incremental, resumable, crash-safe.

* Unchanged files (same size and mtime) are skipped without being read.
* A new path whose content (SHA-256) is already indexed under a path that vanished is a
  *rename*: the row moves, nothing is re-embedded. Content indexed under a path that still
  exists is a *duplicate*: its vector is copied, nothing is re-embedded.
* Files are embedded in chunks; each chunk is committed in one transaction, so an interrupted
  run loses at most the chunk in flight and the next run resumes after the last commit.
* Files that cannot be decoded are recorded with the reason, listed in every report, and not
  retried until they change. Files that vanished from the folder are removed from the index.
* With a text reader (OCR), every item under the folder that was never read is read last, in
  chunks committed like the embeddings: new and changed files (a changed file loses its old
  reading), and on an index built without OCR every item, without embedding anything again.
"""

from __future__ import annotations

import os
import stat
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from themis_clip.errors import SearchIndexError, ThemisClipError
from themis_clip.files import IMAGE_SUFFIXES, pair_companions, sha256_of, walk_images
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow, Lexical, Store, StoredItem
from themis_clip.interface import EmbeddingResult, ImageData
from themis_clip.vocabulary import ModelIdentity

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageEmbedder",
    "IndexReport",
    "Progress",
    "TextReader",
    "file_metadata",
    "index_folder",
    "read_texts",
    "walk_images",
]

#: ``progress(done, total)``: called as embedding proceeds (the CLI draws a bar from it).
Progress = Callable[[int, int], None]

#: ``read_text(path)``: what OCR reads in an image, as ``OCRResult.to_json`` data (the index
#: imports no model code: the caller passes its engine's reader).
TextReader = Callable[[Path], Mapping[str, Any]]

#: ``metadata(path)``: what the caller reads from an image file for its metadata (the CLI passes
#: the EXIF reader); {} for none. The index never opens images itself (it imports no image code).
MetadataReader = Callable[[Path], Mapping[str, Any]]


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
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> files or folders
    merged: int = 0  # RAW and Live video files recorded beside their photo, not embedded
    read: int = 0  # items whose text was read (OCR)
    with_text: int = 0  # of those, items where some text was found
    unread: list[tuple[str, str]] = field(default_factory=list)  # OCR failed: (path, why)

    @property
    def embedded(self) -> int:
        return self.added + self.updated


def _sha256(path: Path) -> str | None:
    try:
        return sha256_of(path)
    except OSError:
        return None


def _valid_text(name: str) -> str:
    """A file name as valid Unicode: its undecodable bytes written ``\\xff``, so that a report
    names the file (other stray surrogates become "?")."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return name.encode("utf-8", "replace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def file_metadata(
    path: Path, st: os.stat_result, root: Path, read: MetadataReader | None = None
) -> dict[str, Any]:
    """What ``--filter`` and the page's facets can use for a file: its folder (relative to the
    indexed folder, ``.`` at the top), name, size in bytes, modification time (ISO 8601, UTC)
    and what ``read`` gives for the image (the CLI's: EXIF, width and height after orientation)."""
    try:
        where = path.parent.relative_to(root).as_posix()
    except ValueError:  # not under the root (a link walked out of it): the folder's name
        where = path.parent.name
    meta: dict[str, Any] = {
        "folder": _valid_text(where),
        "name": _valid_text(path.name),
        "size": st.st_size,
        "mtime": datetime.fromtimestamp(st.st_mtime, UTC).isoformat(timespec="seconds"),
    }
    if read is not None:
        meta.update(read(path))
    return meta


def _with_companions(
    read: MetadataReader | None, companions: Mapping[Path, Mapping[str, Any]]
) -> MetadataReader:
    """``read`` and the files recorded beside each embedded one (its RAW, its Live video)."""

    def both(path: Path) -> Mapping[str, Any]:
        return {**(read(path) if read is not None else {}), **companions.get(path, {})}

    return both


def _row(
    path: Path,
    st: os.stat_result,
    digest: str | None,
    vector: npt.NDArray[np.float32],
    root: Path,
    read: MetadataReader | None,
) -> ItemRow:
    """A file's row: keyed by its path, with what the next run needs to skip it unchanged."""
    return ItemRow(
        key=str(path),
        path=str(path),
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        sha256=digest,
        vector=vector,
        metadata=file_metadata(path, st, root, read),
    )


def _refresh_metadata(
    store: Store, folder: Path, items: list[StoredItem], read: MetadataReader, version: str
) -> None:
    """Metadata for items indexed before this reader (or its ``version``) existed: the file
    facts and the reader's, read again and merged in, vectors untouched (no re-embedding),
    once per folder and version."""
    tag = f"metadata_version:{folder}"
    if store.meta().get(tag) == version:
        return
    for start in range(0, len(items), 512):
        updates = {}
        for item in items[start : start + 512]:
            path = Path(item.path or item.key)
            try:
                fresh = file_metadata(path, path.stat(), folder, read)
            except OSError:  # gone since the walk: the next run removes it
                continue
            merged = {**(item.metadata or {}), **fresh}
            if merged != (item.metadata or {}):
                updates[item.key] = merged
        store.set_metadata(updates)
    store.set_meta({tag: version})


def _to_embed(
    todo: list[tuple[Path, os.stat_result, str | None]],
    digests: Mapping[Path, str | None],
    store: Store,
    known: Mapping[str, StoredItem],
) -> list[Path]:
    """The files of ``todo`` that :func:`index_folder`'s loop will embed, in its order: its
    rules, read-only (a rename or duplicate only ever adds rows of a digest already stored)."""
    out: list[Path] = []
    first: set[str] = set()
    for path, _, _ in todo:
        digest = digests[path]
        new = str(path) not in known
        if new and digest and (digest in first or store.by_sha256(digest)):
            continue  # a rename, a duplicate of an indexed file, or a copy of one in this run
        out.append(path)
        if digest:
            first.add(digest)
    return out


def _names(companions: Mapping[str, str | list[str]]) -> list[str]:
    """The RAW file names a still's companions record (``raws``, else ``raw``)."""
    raws = companions.get("raws") or companions.get("raw") or []
    return [raws] if isinstance(raws, str) else list(raws)


def _stood_in(raws: list[Path]) -> str:
    """The note on a still that cannot be read whose RAWs are indexed in its place."""
    if not raws:
        return ""
    names = ", ".join(p.name for p in raws)
    return (
        f" (its RAW {names} is indexed instead)"
        if len(raws) == 1
        else (f" (its RAWs {names} are indexed instead)")
    )


def _index_stand_ins(
    raws: list[Path],
    store: Store,
    embedder: ImageEmbedder,
    known: Mapping[str, StoredItem],
    failures: Mapping[str, tuple[int, int, str]],
    stamp: ModelIdentity,
    folder: Path,
    metadata: MetadataReader | None,
    report: IndexReport,
    seen: set[str],
) -> None:
    """Index the RAWs standing in for stills that cannot be read, each as an item of its own
    (unchanged ones are kept, not embedded again)."""
    todo = []
    for raw in dict.fromkeys(raws):
        try:
            st = raw.stat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        key = str(raw)
        seen.add(key)
        report.merged -= 1  # an item of its own now
        item = known.get(key)
        if item is not None and (item.size, item.mtime_ns) == (st.st_size, st.st_mtime_ns):
            report.unchanged += 1
            continue
        failed = failures.get(key)
        if failed is not None and failed[:2] == (st.st_size, st.st_mtime_ns):
            report.failed.append((key, failed[2]))
            continue
        todo.append((raw, st))
    if not todo:
        return
    results = embedder.generate_embedding_batch([p for p, _ in todo])
    rows, failed_rows = [], []
    for (raw, st), r in zip(todo, results, strict=True):
        if r.ok and r.embedding is not None:
            rows.append(_row(raw, st, _sha256(raw), r.embedding, folder, metadata))
            if str(raw) in known:
                report.updated += 1
            else:
                report.added += 1
        else:
            error = r.error or "unknown error"
            failed_rows.append((str(raw), st.st_size, st.st_mtime_ns, error))
            report.failed.append((str(raw), error))
    store.upsert(rows, dim=stamp.dim)
    store.record_failures(failed_rows)


def index_folder(
    index: VectorIndex,
    folder: Path,
    embedder: ImageEmbedder,
    *,
    stamp: ModelIdentity | Callable[[], ModelIdentity],
    chunk: int = 128,
    progress: Progress | bool | None = None,
    metadata: MetadataReader | None = None,
    metadata_version: str = "1",
    prefetch: Callable[[list[Path]], None] | None = None,
    exclude: Sequence[str] = (),
    read_text: TextReader | None = None,
) -> IndexReport:
    """Bring ``index`` up to date with the images under ``folder``.

    The walk skips NAS, system and trash files (:data:`~themis_clip.files.JUNK`), hidden
    folders and what matches a glob of ``exclude``, counted by reason in ``report.skipped``;
    an item indexed before under a path now skipped leaves the index.

    ``progress(done, total)`` is called after every committed chunk of embeddings (library
    code draws nothing; a bool is accepted as "no callback" for older callers).
    Each file's metadata is its folder, name, size and modification time plus what
    ``metadata(path)`` reads from the image (the CLI's: EXIF and the upright size); unchanged
    files indexed before ``metadata_version`` get theirs without being embedded again.

    ``prefetch(paths)``, when given, is told the files that will be embedded, in the order they
    will be asked for, once the folder is walked and the new files hashed (the CLI decodes
    them ahead, while its model still opens). ``stamp`` may be a callable (the CLI's waits for
    the model to open): it is then called after ``prefetch``, before anything is written.

    ``read_text``, when given, reads the text in every item under ``folder`` that has no
    reading yet (:func:`read_texts`).
    """
    report_progress = progress if callable(progress) else None
    t0 = time.perf_counter()
    report = IndexReport()
    if not callable(stamp):
        index.bind_model(stamp)
    store = index.store
    folder = folder.resolve()
    known = store.items_under(str(folder))
    failures = store.failures_under(str(folder))
    seen: set[str] = set()
    unchanged: list[StoredItem] = []
    todo: list[tuple[Path, os.stat_result, str | None]] = []
    files = walk_images(folder, exclude=exclude, skipped=report.skipped)
    walked, companions = pair_companions(files)
    videos = sum(1 for m in companions.values() if "live_video" in m)
    report.merged = len(files) - len(walked) + videos
    if companions:
        metadata = _with_companions(metadata, companions)
    # A still that cannot be read is stood in for by its RAW (embedded on its own instead)
    # (every RAW of its name, each an item of its own, as where there is no still)
    twins = {s: [s.parent / n for n in _names(m)] for s, m in companions.items() if "raw" in m}
    stand_ins: list[Path] = []
    for path in walked:
        key = str(path)
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:  # bytes no encoding names: the index keeps names as text
            report.failed.append(
                (_valid_text(key), "the file name is not valid UTF-8: rename it to index it")
            )
            continue
        try:
            st = path.stat()
        except OSError as exc:
            report.failed.append((key, f"cannot stat: {exc.strerror or exc}"))
            continue
        if not stat.S_ISREG(st.st_mode):  # a FIFO would wait for a writer, /dev/zero never end
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
            report.failed.append((key, f"not a regular file but {kind}"))
            continue
        seen.add(key)
        item = known.get(key)
        if item is not None and item.size == st.st_size and item.mtime_ns == st.st_mtime_ns:
            report.unchanged += 1
            unchanged.append(item)
            continue
        failed = failures.get(key)
        if failed is not None and failed[:2] == (st.st_size, st.st_mtime_ns):
            report.failed.append((key, failed[2] + _stood_in(twins.get(path, []))))
            stand_ins += twins.get(path, [])
            continue
        todo.append((path, st, None))
    vanished = set(known) - seen
    digests = {path: _sha256(path) for path, _, _ in todo}
    if prefetch is not None:
        prefetch(_to_embed(todo, digests, store, known))
    if callable(stamp):
        stamp = stamp()
        index.bind_model(stamp)
    # Renames and duplicates: content already in the index needs no embedding.
    to_embed: list[tuple[Path, os.stat_result, str | None]] = []
    copies: list[tuple[Path, os.stat_result, str | None]] = []
    first_of_run: dict[str, Path] = {}
    for path, st, _ in todo:
        digest = digests[path]
        same = store.by_sha256(digest) if digest else []
        moved = next((i for i in same if i.path in vanished), None)
        if moved is not None and str(path) not in known:
            store.rename(
                moved.key, str(path), path=str(path), size=st.st_size, mtime_ns=st.st_mtime_ns
            )
            vanished.discard(moved.path or "")
            vector = store.vector(str(path))
            if vector is not None:  # the moved row's metadata names its new folder and name
                store.upsert([_row(path, st, digest, vector, folder, metadata)], dim=stamp.dim)
            report.renamed += 1
        elif same and str(path) not in known:
            vector = store.vector(same[0].key)
            assert vector is not None
            store.upsert([_row(path, st, digest, vector, folder, metadata)], dim=stamp.dim)
            report.duplicates += 1
        elif digest and digest in first_of_run and str(path) not in known:
            copies.append((path, st, digest))  # same bytes as a file embedded in this run
        else:
            to_embed.append((path, st, digest))
            if digest:
                first_of_run.setdefault(digest, path)
    if report_progress is not None:
        report_progress(0, len(to_embed))
    for start in range(0, len(to_embed), chunk):
        part = to_embed[start : start + chunk]
        results = embedder.generate_embedding_batch([p for p, _, _ in part])
        rows, failed_rows, stale = [], [], []
        for (path, st, digest), r in zip(part, results, strict=True):
            if r.ok and r.embedding is not None:
                rows.append(_row(path, st, digest, r.embedding, folder, metadata))
                if str(path) in known:
                    report.updated += 1
                else:
                    report.added += 1
            else:
                failed_rows.append(
                    (str(path), st.st_size, st.st_mtime_ns, r.error or "unknown error")
                )
                if str(path) in known:  # its stored vector is of bytes no longer there
                    stale.append(known[str(path)].key)
                    message = f"{r.error or 'unknown error'} (its earlier entry is removed)"
                else:
                    message = r.error or "unknown error"
                stand_ins += twins.get(path, [])
                message += _stood_in(twins.get(path, []))
                report.failed.append((str(path), message))
        store.upsert(rows, dim=stamp.dim)  # one transaction per chunk: resumable
        store.record_failures(failed_rows)
        report.removed += store.delete_keys(stale)
        if report_progress is not None:
            report_progress(start + len(part), len(to_embed))
    for path, st, digest in copies:  # their vector is the first copy's: no second embedding
        vector = store.vector(str(first_of_run[digest or ""]))
        if vector is None:  # the first copy was unreadable: so is this one
            first = str(first_of_run[digest or ""])
            cause = next((e for p, e in report.failed if p == first), "unreadable")
            error = f"the same bytes as {first}, which failed: {cause}"
            store.record_failures([(str(path), st.st_size, st.st_mtime_ns, error)])
            report.failed.append((str(path), error + _stood_in(twins.get(path, []))))
            stand_ins += twins.get(path, [])
            continue
        store.upsert([_row(path, st, digest, vector, folder, metadata)], dim=stamp.dim)
        report.duplicates += 1
    _index_stand_ins(
        stand_ins, store, embedder, known, failures, stamp, folder, metadata, report, seen
    )
    vanished -= seen
    if metadata is not None:
        _refresh_metadata(store, folder, unchanged, metadata, metadata_version)
    report.removed += store.delete_keys(known[p].key for p in vanished)
    store.delete_failures(p for p in failures if p not in seen)
    if read_text is not None:
        read_texts(store, folder, read_text, report, chunk=chunk, progress=report_progress)
    report.seconds = time.perf_counter() - t0
    return report


def read_texts(
    store: Store,
    folder: Path,
    read_text: TextReader,
    report: IndexReport,
    *,
    chunk: int = 128,
    progress: Progress | None = None,
) -> None:
    """Read the text in the items under ``folder`` that have no reading, committing each
    ``chunk`` and, when an exception stops the run, what was read of the chunk in flight;
    vectors are untouched. A picture OCR cannot read is listed in
    ``report.unread`` and tried again next time.

    Raises:
        SearchIndexError: the store keeps no text (it is not :class:`Lexical`).
    """
    if not isinstance(store, Lexical):
        raise SearchIndexError(f"the index at {store.path} cannot keep the text read in pictures")
    todo = sorted(store.unread_under(str(folder)).values(), key=lambda item: item.key)
    if progress is not None and todo:
        progress(0, len(todo))
    for start in range(0, len(todo), chunk):
        readings: dict[str, Mapping[str, Any]] = {}
        try:
            for item in todo[start : start + chunk]:
                try:
                    reading = read_text(Path(item.path or item.key))
                except (ThemisClipError, OSError) as exc:
                    report.unread.append((item.path or item.key, str(exc)))
                    continue
                readings[item.key] = reading
                report.with_text += bool(reading.get("lines"))
        finally:  # stopped part-way (SIGTERM and Ctrl-C raise here): what was read is kept
            report.read += store.set_ocr(readings)
        if progress is not None:
            progress(min(start + chunk, len(todo)), len(todo))
