"""Move an index to another model: a shadow index built beside the live one, an atomic
cut-over, and a rollback (docs/migration.md draws the design).

The shadow is an ordinary index bound to the new model that holds every live item under the
same key, path, metadata, preview and OCR reading, with a vector from the new model: a file
``photos.db.migrating-<model>`` beside an SQLite index, a schema ``"<live>.migrating-<model>"``
beside a PostgreSQL one. It is filled in committed chunks, so a killed run resumes where it
stopped without embedding a committed item again. The cut-over renames the file over the live
one, or moves the tables between the schemas in one transaction (the old index kept as
``photos.db.before-<model>`` or in ``"<live>.before-<model>"``); :func:`rollback` puts the
old one back.

A :class:`MigrationControl` lets another thread pause, resume or cancel a run between chunks
and read its progress (the server's ``/admin/migrate``).
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from themis_clip.errors import ConfigError, InputError, SearchIndexError
from themis_clip.files import file_lock
from themis_clip.index.indexer import ImageEmbedder
from themis_clip.index.search import GRAPH_SUFFIX, VectorIndex
from themis_clip.index.stores import ItemRow, Lexical, Store, StoredItem, is_url, open_store
from themis_clip.index.stores.postgres import PgStore, redact
from themis_clip.index.vectors import VECTORS_SUFFIX
from themis_clip.interface import ImageData
from themis_clip.vocabulary import ModelIdentity

__all__ = [
    "MigrationControl",
    "MigrationProgress",
    "MigrationReport",
    "MigrationState",
    "RollbackReport",
    "before_path",
    "migrate_index",
    "remove_shadow",
    "rollback",
    "shadow_path",
]

log = logging.getLogger(__name__)

#: Shadow meta: the live index's write version at which the shadow's last complete pass began
#: (what the live index wrote after it is embedded again), and the model it migrates from.
_SINCE = "migration_since"
_FROM = "migration_from"
#: The shadow's own write version at its cut-over (what is written after it, a rollback loses).
_CUT_AT = "migration_cut_at"
#: Files an index consists of beside its database that belong to one model's vectors.
_SIDE_FILES = (GRAPH_SUFFIX, VECTORS_SUFFIX)
#: PostgreSQL's longest name (bytes): a longer one is cut, so two schemas could share one.
_MAX_IDENTIFIER = 63


@dataclass(frozen=True, kw_only=True)
class MigrationReport:
    """What a migration run did.

    Attributes:
        model_id: the model the index moves to.
        shadow: the shadow index's file (the live file's name once cut over), or its
            PostgreSQL URL (password left out).
        total: items in the live index.
        embedded: items this run embedded (a resumed run skips those committed before).
        from_previews: keys re-embedded from their stored preview (no file; lower quality).
        missing: ``(key, reason)`` of items that could not be re-embedded: not in the shadow.
        removed: items deleted from the shadow because the live index no longer holds them.
        before: where the old index was kept, once cut over (a file, or a PostgreSQL
            schema's name); None when not cut over.
        seconds: the run's wall time.
        cancelled: the run stopped at a :meth:`MigrationControl.cancel` (shadow kept as is).
    """

    model_id: str
    shadow: Path | str
    total: int
    embedded: int
    from_previews: tuple[str, ...]
    missing: tuple[tuple[str, str], ...]
    removed: int
    before: Path | str | None
    seconds: float
    cancelled: bool = False


@dataclass(frozen=True, kw_only=True)
class RollbackReport:
    """What :func:`rollback` did.

    Attributes:
        restored: the old index file that is live again (its model id).
        model_id: the model of the index put back.
        shadow: where the index it replaced was kept (a migration run again resumes from it).
        written_since: items written or deleted in the replaced index after its cut-over,
            which the restored index does not have.
    """

    restored: Path | str
    model_id: str
    shadow: Path | str
    written_since: int


class MigrationState(enum.StrEnum):
    """Where a migration run stands (what ``GET /admin/migrate`` shows)."""

    RUNNING = "running"
    #: asked to pause: the chunk in flight is being committed
    PAUSING = "pausing"
    PAUSED = "paused"
    #: the shadow has caught up; it waits for the cut-over command
    READY = "ready"
    CUTTING_OVER = "cutting-over"
    #: cut over: the new model and index are live
    DONE = "done"
    #: some items cannot be re-embedded: not cut over until they are back or dropped
    BLOCKED = "blocked"
    CANCELLED = "cancelled"
    FAILED = "failed"
    ROLLED_BACK = "rolled-back"


@dataclass(frozen=True, kw_only=True)
class MigrationProgress:
    """A migration's progress at one moment.

    Attributes:
        model_id: the model the index moves to.
        state: see :class:`MigrationState`.
        done: live items the shadow holds up to date; ``total``: items in the live index.
        embedded: items embedded by this run (a resumed run skips what was committed).
        items_per_s: this run's rate, paused time left out (0 before a chunk ends).
        eta_s: seconds left at that rate (None while unknown).
        from_previews: items re-embedded from their stored preview.
        missing: ``(key, reason)`` of items that cannot be re-embedded.
        error: why the run failed or was not cut over (None otherwise).
    """

    model_id: str
    state: MigrationState
    done: int
    total: int
    embedded: int
    items_per_s: float
    eta_s: float | None
    from_previews: int
    missing: tuple[tuple[str, str], ...]
    error: str | None


class MigrationControl:
    """Pause, resume or cancel a running :func:`migrate_index` from another thread, and read
    its progress; the run checks it after each committed chunk (what a pause waits for).

    ``duty`` (0 < duty <= 1) is the share of time the run embeds: after a chunk that took
    ``t`` seconds it rests ``t * (1 - duty) / duty``, so a single thread can use less than a
    core (a pause or cancel ends the rest at once).
    """

    def __init__(self, model_id: str, *, duty: float = 1.0) -> None:
        if not 0 < duty <= 1:
            raise ConfigError(f"duty must be in (0, 1], got {duty}")
        self.model_id = model_id
        self.duty = duty
        self._cond = threading.Condition()
        self._state = MigrationState.RUNNING
        self._paused = False
        self._cancelled = False
        self._done = self._total = self._embedded = self._from_previews = 0
        self._missing: tuple[tuple[str, str], ...] = ()
        self._error: str | None = None
        self._active_s = 0.0  # embedding time of this run, pauses left out
        self._since: float | None = time.monotonic()  # when this stretch of embedding began

    def pause(self) -> None:
        with self._cond:
            if self._state is MigrationState.RUNNING:
                self._paused = True
                self._set(MigrationState.PAUSING)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            if self._state in (MigrationState.PAUSING, MigrationState.PAUSED):
                self._set(MigrationState.RUNNING)
            self._cond.notify_all()

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._paused = False
            self._cond.notify_all()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def state(self) -> MigrationState:
        return self._state

    def set_state(self, state: MigrationState, error: str | None = None) -> None:
        with self._cond:
            self._set(state)
            self._error = error

    def finish(self, report: MigrationReport, state: MigrationState, error: str | None) -> None:
        """Record a run's report and where it leaves the migration."""
        with self._cond:
            self._done = report.total - len(report.missing)
            self._total = report.total
            self._from_previews = len(report.from_previews)
            self._missing = report.missing
            self._set(state)
            self._error = error

    def checkpoint(self, done: int, total: int, embedded: int) -> bool:
        """Record progress; wait while paused. Returns False once cancelled."""
        with self._cond:
            self._done, self._total, self._embedded = done, total, embedded
            now = time.monotonic()
            if self._since is not None:
                stretch = now - self._since
                rest_until = now + stretch * (1 - self.duty) / self.duty
                while not (self._paused or self._cancelled) and time.monotonic() < rest_until:
                    self._cond.wait(rest_until - time.monotonic())
                self._active_s += time.monotonic() - self._since  # rests count: the ETA's
            self._since = None
            while self._paused and not self._cancelled:
                self._set(MigrationState.PAUSED)
                self._cond.wait()
            self._since = time.monotonic()
            return not self._cancelled

    def snapshot(self) -> MigrationProgress:
        with self._cond:
            rate = self._embedded / self._active_s if self._active_s > 0 else 0.0
            left = self._total - self._done
            return MigrationProgress(
                model_id=self.model_id,
                state=self._state,
                done=self._done,
                total=self._total,
                embedded=self._embedded,
                items_per_s=rate,
                eta_s=left / rate if rate > 0 else (0.0 if left <= 0 and self._total else None),
                from_previews=self._from_previews,
                missing=self._missing,
                error=self._error,
            )

    def _set(self, state: MigrationState) -> None:
        self._state = state
        if state is MigrationState.RUNNING and self._since is None:
            self._since = time.monotonic()


def _slug(identity_id: str) -> str:
    """A model id fit for a file name."""
    return re.sub(r"[^A-Za-z0-9._@+-]", "_", identity_id)


def shadow_path(index: str | Path, model_id: str) -> Path:
    """The shadow of ``index`` for the model ``model_id``."""
    return Path(f"{index}.migrating-{_slug(model_id)}")


def before_path(index: str | Path, model_id: str) -> Path:
    """Where ``index`` is kept once migrated to ``model_id``."""
    return Path(f"{index}.before-{_slug(model_id)}")


def migrate_index(
    index: str | Path,
    embedder: ImageEmbedder,
    identity: ModelIdentity,
    *,
    chunk: int = 128,
    progress: Callable[[int, int], None] | None = None,
    cut_over: bool = True,
    drop_missing: bool = False,
    control: MigrationControl | None = None,
    settle: int = 0,
) -> MigrationReport:
    """Build (or resume) the shadow of ``index`` for the model ``identity``, then cut over.

    Args:
        index: the live index: an SQLite file or a PostgreSQL URL.
        embedder: the new model (its ``generate_embedding_batch``).
        identity: the new model's identity (the shadow is bound to it).
        chunk: items embedded and committed together (what a kill can lose).
        progress: ``(done, total)`` as items are committed.
        cut_over: replace the live index once the shadow is complete.
        drop_missing: cut over even when some items could not be re-embedded (the old index,
            kept for rollback, still holds them).
        control: checked after each chunk (pause, cancel) and fed the progress.
        settle: stop the catch-up passes once at most this many items are left to redo (a
            server redoes them with writes held, just before it cuts over); only with
            ``cut_over`` False.

    Returns:
        What was done; ``before`` is None when there was no cut-over (``missing`` says why,
        unless ``cut_over`` was False).

    Raises:
        InputError: no index, or one that already uses ``identity``.
        SearchIndexError: the cut-over cannot happen safely (another process has the index
            open, or a previous index is still kept under the name it needs).
    """
    started = time.monotonic()
    location = _live(index)
    one = (
        _one_migrator(shadow_path(location, identity.model_id))
        if isinstance(location, Path)
        else nullcontext()
    )
    with one:
        live = open_store(location)
        try:
            old_id = _check_models(live, identity)
            shadow = _shadow(live, location, identity.model_id)
            with VectorIndex(shadow) as target:
                if target.stamp is None:  # a new shadow: changes from now on are caught up
                    target.bind_model(identity)
                    target.store.set_meta({_SINCE: live.write_version, _FROM: old_id})
                pass_report = _fill(
                    live, target.store, embedder, identity, chunk, progress, control, settle
                )
                if isinstance(target.store, PgStore) and not pass_report.cancelled:
                    target.prepare_graph()  # pgvector's HNSW index, built before the cut-over
            total = live.count()
        finally:
            live.close()
        missing = tuple(sorted(pass_report.missing.items()))
        before: Path | str | None = None
        if cut_over and not pass_report.cancelled and (drop_missing or not missing):
            if isinstance(location, Path):
                before = _cut_over(location, Path(shadow), identity.model_id, pass_report.synced)
            else:
                before = _cut_over_schema(
                    location, str(shadow), identity.model_id, pass_report.synced
                )
            log.info("index %s migrated to %s; the old one kept as %s", index, identity, before)
    return MigrationReport(
        model_id=identity.model_id,
        shadow=redact(shadow) if isinstance(shadow, str) else shadow,
        total=total,
        embedded=pass_report.embedded,
        from_previews=tuple(sorted(pass_report.from_previews)),
        missing=missing,
        removed=pass_report.removed,
        before=before,
        seconds=time.monotonic() - started,
        cancelled=pass_report.cancelled,
    )


def rollback(index: str | Path) -> RollbackReport:
    """Put back the index that a migration of ``index`` replaced (``index.before-<model>``);
    the one it replaces becomes that migration's shadow again.

    Raises:
        InputError: no index, or no index kept by its last cut-over.
        SearchIndexError: another process has the index open (SQLite).
    """
    location = _live(index)
    if not isinstance(location, Path):
        return _rollback_schema(location)
    live_path = location
    _check_unopened(live_path)
    store = open_store(live_path)
    try:
        current_id, written_since = _since_cut(store)
    finally:
        store.close()
    # The last cut-over kept the index it replaced under the name of the model it moved to,
    # which is the live index's model: that is the one to put back (older ones stay).
    before = before_path(live_path, current_id)
    if not current_id or not before.is_file():
        raise InputError(
            f"no previous index of {live_path} is kept (looked for {before.name}): "
            "nothing to roll back"
        )
    with VectorIndex(before, readonly=True) as old:
        stamp = old.stamp
    _check_unopened(before)  # the read above left SQLite's side files: a writer removes them
    shadow = shadow_path(live_path, current_id)
    if shadow.exists():
        raise SearchIndexError(
            f"{shadow} exists already; delete it (an unfinished migration) and roll back again"
        )
    for suffix in _SIDE_FILES:
        _move(Path(f"{live_path}{suffix}"), Path(f"{shadow}{suffix}"))
    _link_or_copy(live_path, shadow)
    os.replace(before, live_path)
    for suffix in _SIDE_FILES:
        _move(Path(f"{before}{suffix}"), Path(f"{live_path}{suffix}"))
    log.info("index %s rolled back to %s", live_path, stamp)
    return RollbackReport(
        restored=before,
        model_id=stamp.model_id if stamp is not None else "",
        shadow=shadow,
        written_since=written_since,
    )


# -- the passes --------------------------------------------------------------------------------


@dataclass(kw_only=True)
class _Passes:
    embedded: int = 0
    removed: int = 0
    from_previews: set[str]
    missing: dict[str, str]
    synced: int = 0
    cancelled: bool = False


def _fill(
    live: Store,
    shadow: Store,
    embedder: ImageEmbedder,
    identity: ModelIdentity,
    chunk: int,
    progress: Callable[[int, int], None] | None,
    control: MigrationControl | None = None,
    settle: int = 0,
) -> _Passes:
    """Passes over the live index until one finds nothing to do (at most ``settle`` items):
    each embeds the items the shadow lacks or the live index wrote since the last complete
    pass, and deletes from the shadow what the live index no longer holds."""
    done = _Passes(from_previews=set(), missing={})
    live_dim = int(live.meta()["dim"])
    while True:
        began = live.write_version
        since = int(shadow.meta()[_SINCE])
        keys = live.keys_by_id()
        have = set(shadow.keys_by_id().values())
        written = live.changes_since(since, live_dim)[0].tolist()
        changed = {keys[i] for i in written if i in keys}
        wanted = {key: i for i, key in keys.items()}
        gone = have - wanted.keys()
        todo_keys = [
            key
            for key in sorted(wanted)
            if (key not in have or key in changed) and key not in done.missing
        ]
        if not todo_keys and not gone:
            _copy_readings(live, shadow)
            done.synced = began
            return done
        if settle and len(todo_keys) + len(gone) <= settle:
            done.synced = -1  # not in sync: the caller catches up the rest
            return done
        done.removed += shadow.delete_keys(gone)
        before = done.embedded
        for start in range(0, len(todo_keys), chunk):
            keys_part = todo_keys[start : start + chunk]
            found = live.items_by_id([wanted[key] for key in keys_part])
            # an item deleted (or its id reused) since the keys were read: the next pass
            part = [
                found[wanted[key]]
                for key in keys_part
                if wanted[key] in found and found[wanted[key]].key == key
            ]
            _embed_part(live, shadow, embedder, identity, part, done)
            now_done = len(wanted) - len(todo_keys) + start + len(keys_part)
            if progress is not None:
                progress(now_done, len(wanted))
            if control is not None and not control.checkpoint(now_done, len(wanted), done.embedded):
                done.cancelled, done.synced = True, -1
                return done
        if done.embedded == before and not gone:  # nothing could be done: never spin
            _copy_readings(live, shadow)
            done.synced = began
            return done
        shadow.set_meta({_SINCE: began})


def _copy_readings(live: Store, shadow: Store) -> int:
    """Copy to the shadow each live item's OCR reading it lacks or holds otherwise (text does
    not depend on the model: copied, never read again); returns how many were copied."""
    if not isinstance(live, Lexical) or not isinstance(shadow, Lexical):
        return 0
    keys = live.keys_by_id()
    readings = {keys[i]: r for i, r in live.ocr_readings(list(keys)).items() if i in keys}
    if not readings:
        return 0
    shadow_keys = shadow.keys_by_id()
    held = set(shadow_keys.values())  # an item the shadow lacks is missing: named elsewhere
    have = {shadow_keys[i]: r for i, r in shadow.ocr_readings(list(shadow_keys)).items()}
    todo = {k: r for k, r in readings.items() if k in held and have.get(k) != r}
    return shadow.set_ocr(todo) if todo else 0


def _embed_part(
    live: Store,
    shadow: Store,
    embedder: ImageEmbedder,
    identity: ModelIdentity,
    part: list[StoredItem],
    done: _Passes,
) -> None:
    """Embed ``part`` with the new model and commit it to the shadow in one transaction."""
    sources: list[tuple[StoredItem, ImageData, bytes | None]] = []
    for item in part:
        preview = live.thumbnail(item.key)
        if item.path is not None and os.path.isfile(item.path):
            sources.append((item, item.path, preview))
        elif preview is not None:
            sources.append((item, preview, preview))
            done.from_previews.add(item.key)
        else:
            done.missing[item.key] = (
                f"file {item.path} is gone" if item.path else "added without a file or a preview"
            )
    results = embedder.generate_embedding_batch([image for _, image, _ in sources])
    rows = []
    for (item, _, preview), result in zip(sources, results, strict=True):
        if not result.ok or result.embedding is None:
            done.missing[item.key] = f"cannot embed it: {result.error}"
            done.from_previews.discard(item.key)
            continue
        rows.append(
            ItemRow(
                key=item.key,
                vector=result.embedding,
                path=item.path,
                size=item.size,
                mtime_ns=item.mtime_ns,
                sha256=item.sha256,
                metadata=item.metadata,
                thumbnail=preview,
            )
        )
    shadow.upsert(rows, dim=identity.dim)  # one transaction: a kill loses this part only
    done.embedded += len(rows)
    if rows and isinstance(live, Lexical) and isinstance(shadow, Lexical):
        # their readings now, outside a server's cut-over; the last pass copies what is left
        keys = {item.id: item.key for item, _, _ in sources}
        readings = live.ocr_readings(list(keys))
        if readings:
            shadow.set_ocr({keys[i]: r for i, r in readings.items()})


# -- where the indexes are ---------------------------------------------------------------------


def _live(index: str | Path) -> Path | str:
    """The live index's file, or its URL."""
    if is_url(index):
        return str(index)
    path = Path(index)
    if not path.is_file():
        raise InputError(f"no index at {path}")
    return path


@contextmanager
def _one_migrator(shadow: Path) -> Iterator[None]:
    """Hold the shadow's lock: two migrations writing one shadow (a CLI run beside a server's)
    would each embed the same items and one could delete the shadow under the other."""
    lock = Path(f"{shadow}.lock")
    held = False
    try:
        with file_lock(lock, timeout_s=0):
            held = True
            yield
    except TimeoutError:
        if held:
            raise
        raise SearchIndexError(
            f"another migration of this index to the same model is running (it holds {lock})"
        ) from None
    finally:
        if held and not shadow.exists():
            lock.unlink(missing_ok=True)


def _check_models(live: Store, identity: ModelIdentity) -> str:
    """The live index's model id; raises when there is none or it is ``identity`` already."""
    path = live.path
    meta = live.meta()
    if "model_id" not in meta:
        raise InputError(f"index {path} holds no items yet: index it with the new model instead")
    if meta["model_sha256"] == identity.sha256 and int(meta["dim"]) == identity.dim:
        raise InputError(f"index {path} is made by {identity.model_id} already")
    return meta["model_id"]


def _since_cut(store: Store) -> tuple[str, int]:
    """The index's model id, and how many items were written or deleted after its cut-over."""
    meta = store.meta()
    cut_at = meta.get(_CUT_AT)
    written_since = 0
    if cut_at is not None and "dim" in meta:
        ids, _, gone = store.changes_since(int(cut_at), int(meta["dim"]))
        written_since = len(ids) + len(gone)
    return meta.get("model_id", ""), written_since


def _shadow(live: Store, location: Path | str, model_id: str) -> Path | str:
    """The shadow's file, or the URL of its schema (created when missing)."""
    if isinstance(location, Path):
        return shadow_path(location, model_id)
    assert isinstance(live, PgStore)
    return live.sibling(_schema_name(live.schema, "migrating", model_id))


# -- PostgreSQL: sibling schemas ---------------------------------------------------------------


def _schema_name(live: str, tag: str, model_id: str) -> str:
    """The schema of the live schema ``live``'s shadow (``tag`` "migrating") or kept index
    ("before") for ``model_id``: ``<live>.<tag>-<model id>``, the id hashed when too long."""
    name = f"{live}.{tag}-{model_id}"
    if len(name.encode()) > _MAX_IDENTIFIER:
        name = f"{live}.{tag}-{hashlib.sha256(model_id.encode()).hexdigest()[:16]}"
    if len(name.encode()) > _MAX_IDENTIFIER:
        raise InputError(f"schema {live!r}: its name is too long to name a migration's schemas")
    return name


def _cut_over_schema(url: str, shadow: str, model_id: str, synced: int) -> str:
    """Swap the shadow's tables into the live schema (the old ones kept in a schema of their
    own) in one transaction; returns the kept schema's name."""
    live = PgStore(url)
    try:
        here = live.schema
        before = _schema_name(here, "before", model_id)
        if before in live.schemas(before):
            raise SearchIndexError(
                f'a previous index is kept in schema "{before}": drop it (or roll back) before '
                "cutting over"
            )
        target = open_store(shadow)
        try:  # this write commits as the next version: what comes after it, a rollback loses
            target.set_meta({_CUT_AT: target.write_version + 1})
        finally:
            target.close()
        live.swap(before, _schema_name(here, "migrating", model_id), expect_version=synced)
    finally:
        live.close()
    return before


def _rollback_schema(url: str) -> RollbackReport:
    """:func:`rollback` of a PostgreSQL index: the kept schema's tables swapped back."""
    live = PgStore(url)
    try:
        here = live.schema
        kept = live.schemas(f"{here}.before-")
        if not kept:
            raise InputError(f"no previous index is kept beside {live.path}: nothing to roll back")
        if len(kept) > 1:
            raise InputError(
                f"more than one previous index is kept beside {live.path} (schemas "
                f"{', '.join(kept)}); drop those you do not want, then roll back"
            )
        current_id, written_since = _since_cut(live)
        with VectorIndex(live.sibling(kept[0]), readonly=True) as old:
            stamp = old.stamp
        shadow = _schema_name(here, "migrating", current_id)
        if shadow in live.schemas(shadow):
            raise SearchIndexError(
                f'schema "{shadow}" exists already; drop it (an unfinished migration) and roll '
                "back again"
            )
        live.swap(shadow, kept[0])
    finally:
        live.close()
    log.info("index %s rolled back to %s", live.path, stamp)
    return RollbackReport(
        restored=kept[0],
        model_id=stamp.model_id if stamp is not None else "",
        shadow=shadow,
        written_since=written_since,
    )


def remove_shadow(index: str | Path, model_id: str) -> None:
    """Delete the shadow of ``index`` for ``model_id`` (a cancelled migration's)."""
    location = _live(index)
    if isinstance(location, Path):
        VectorIndex.remove(shadow_path(location, model_id))
        return
    live = PgStore(location)
    try:
        live.drop_schema(_schema_name(live.schema, "migrating", model_id))
    finally:
        live.close()


# -- files -------------------------------------------------------------------------------------


def _cut_over(live_path: Path, shadow: Path, model_id: str, synced: int) -> Path:
    """Rename ``shadow`` over ``live_path`` (kept first as ``before``); returns ``before``."""
    before = before_path(live_path, model_id)
    if before.exists():
        raise SearchIndexError(
            f"a previous index is kept as {before}: delete it (or roll back) before cutting over"
        )
    _check_unopened(live_path)
    live = open_store(live_path)
    try:
        if live.write_version != synced:
            raise SearchIndexError(
                f"index {live_path} changed during the cut-over; run the migration again "
                "(the shadow is kept and catches up)"
            )
    finally:
        live.close()
    target = open_store(shadow)
    try:  # this write commits as the next version: what comes after it, a rollback loses
        target.set_meta({_CUT_AT: target.write_version + 1})
    finally:
        target.close()
    for suffix in _SIDE_FILES:
        _move(Path(f"{live_path}{suffix}"), Path(f"{before}{suffix}"))
    _link_or_copy(live_path, before)
    os.replace(shadow, live_path)  # atomic: an opener sees the old file or the new one
    return before


def _check_unopened(path: Path) -> None:
    """Raise when another process has ``path`` open. SQLite removes the write-ahead log when
    the last connection that may write closes, so a log left after this process opened and
    closed it belongs to a connection still open elsewhere (a read-only open, which cannot
    remove it, leaves one behind: this open clears that too)."""
    open_store(path).close()
    if Path(f"{path}-wal").exists():
        raise SearchIndexError(
            f"index {path} is open in another process (a server?): stop it, then run again"
        )


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copy2(source, target)


def _move(source: Path, target: Path) -> None:
    if source.exists():
        os.replace(source, target)
