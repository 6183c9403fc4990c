"""``/admin/migrate``: move the server's index to another model while it keeps serving.

``POST /admin/migrate`` loads the new model with a share of the cores and builds the shadow
(:func:`themis_clip.migration.migrate_index`) on a worker thread; searches, embeddings and
writes keep using the old model and the live index meanwhile, and the catch-up passes bring
the writes over. The cut-over holds the :class:`~themis_clip.server.state.IndexGate` alone
(requests using the index answer first; new ones wait), redoes the last writes, renames the
shadow into place with the CLI's own cut-over and activates the model through the hot swap's
``reload_model``: a request sees the old model and index or the new ones, never one of each.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from themis_clip.config import PluginConfig
from themis_clip.errors import ModelNotFoundError, SearchIndexError, ThemisClipError
from themis_clip.migration import (
    MigrationControl,
    MigrationReport,
    MigrationState,
    RollbackReport,
    migrate_index,
    remove_shadow,
    rollback,
)
from themis_clip.models import hub
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.server.access import ADMIN
from themis_clip.server.bodies import JSONRoute, documented, read_model
from themis_clip.server.errors import APIError
from themis_clip.server.routes.admin import inside_root
from themis_clip.server.schemas import MigrateRequest, MigrationStatus, answer
from themis_clip.server.state import AppState, MigrationJob, StateDep, open_index
from themis_clip.vocabulary import ModelIdentity

__all__ = ["router", "stop"]

log = logging.getLogger(__name__)

router = APIRouter(
    route_class=JSONRoute, prefix="/admin/migrate", dependencies=[ADMIN], tags=["admin"]
)

#: a migration in these states holds the index: another one is refused (409)
_BUSY = (
    MigrationState.RUNNING,
    MigrationState.PAUSING,
    MigrationState.PAUSED,
    MigrationState.READY,
    MigrationState.CUTTING_OVER,
    MigrationState.BLOCKED,
)


@router.get("", **answer(MigrationStatus))
async def migration_status(state: StateDep) -> dict[str, Any]:
    """The migration's state, counts, rate and ETA (``idle`` when none ran)."""
    return state.migration_status()


@router.post(
    "", status_code=202, openapi_extra=documented(MigrateRequest), **answer(MigrationStatus)
)
async def start(request: Request, state: StateDep) -> JSONResponse:
    """Start (or, after a restart, resume) moving the index to the model in the body."""
    body = await read_model(request, MigrateRequest)
    idx = state.require_index()
    _refuse_if_busy(state)
    target = await _target(state, body)
    serving = state.plugin.config or state.settings.plugin_config
    model = replace(
        serving.model,
        path=target,
        variant=body.variant,
        expected_sha256=None,
        name=None,
        embedding_dim=None,
    )
    config = replace(serving, model=model, allow_embedding_space_change=True)
    here = os.cpu_count() or 1
    if body.cores is not None and body.cores > here:
        # More threads than cores only slow serving down (1024 of them stalled a 2-core server).
        raise APIError(
            422,
            "ValidationError",
            f"cores must be at most {here} (this machine's), got {body.cores:g}",
        )
    cores = body.cores or max(0.5, here / 4)
    threads = math.ceil(cores)
    migrator = OnnxClipPlugin(lazy_textual=True)
    share = replace(config, intra_op_threads=threads, preprocess_workers=threads)
    if not await asyncio.to_thread(migrator.initialize, share):
        raise APIError(422, "ReloadFailed", migrator.last_error or "cannot load the model")
    identity = _identity(migrator)
    stamp = idx.stamp
    refused = None
    if state.migration is not None and state.migration.control.state in _BUSY:
        refused = "another migration started meanwhile"  # two POSTs at once: the first wins
    elif stamp is None:
        refused = "the index holds no items yet: swap the model with /admin/reload instead"
    elif (stamp.sha256, stamp.dim) == (identity.sha256, identity.dim):
        refused = f"the index is made by {identity.model_id} already"
    if refused is not None:
        await asyncio.to_thread(migrator.shutdown)
        _refuse_if_busy(state)
        raise APIError(422, "ValidationError", refused)
    state.migration = job = MigrationJob(
        control=MigrationControl(identity.model_id, duty=cores / threads),
        migrator=migrator,
        config=config,
        previous=serving,
        auto_cut_over=body.cut_over == "auto",
        drop_missing=body.drop_missing,
        chunk=4 * share.max_batch_size,
    )
    job.task = asyncio.create_task(_run(state, job))
    log.info("migration to %s started (%g of the cores)", identity.model_id, cores)
    return JSONResponse(status_code=202, content=state.migration_status())


@router.post("/pause", **answer(MigrationStatus))
async def pause(state: StateDep) -> dict[str, Any]:
    """Stop embedding after the chunk in flight; the model keeps its memory."""
    _moving(state, "pause").control.pause()
    return state.migration_status()


@router.post("/resume", **answer(MigrationStatus))
async def resume(state: StateDep) -> dict[str, Any]:
    _moving(state, "resume").control.resume()
    return state.migration_status()


def _moving(state: AppState, verb: str) -> MigrationJob:
    """The job, when it is still building its shadow (what pause and resume act on)."""
    job = _job(state)
    current = job.control.state
    if current not in (MigrationState.RUNNING, MigrationState.PAUSING, MigrationState.PAUSED):
        raise APIError(409, "MigrationState", f"the migration is {current}: nothing to {verb}")
    return job


@router.post("/cancel", **answer(MigrationStatus))
async def cancel(state: StateDep) -> dict[str, Any]:
    """Stop the migration and delete its shadow (a pause keeps it)."""
    job = _job(state)
    current = job.control.state
    if current not in (*_BUSY, MigrationState.FAILED) or current is MigrationState.CUTTING_OVER:
        raise APIError(409, "MigrationState", f"the migration is {current}: nothing to cancel")
    job.discard = True
    job.control.cancel()
    if job.task is not None:
        await asyncio.gather(job.task, return_exceptions=True)
    if job.control.state is not MigrationState.CANCELLED:  # it had ended its run
        await _discard(state, job)
    return state.migration_status()


@router.post("/cut-over", **answer(MigrationStatus))
async def cut_over(state: StateDep, drop_missing: bool = False) -> dict[str, Any]:
    """Switch to the new model and index now (the shadow must have caught up);
    ``drop_missing`` cuts over without the items that cannot be re-embedded."""
    job = _job(state)
    if job.control.state not in (MigrationState.READY, MigrationState.BLOCKED):
        raise APIError(
            409,
            "MigrationState",
            f"the migration is {job.control.state}; the cut-over needs it ready",
        )
    await _cut_over(state, job, drop_missing=drop_missing or job.drop_missing)
    return state.migration_status()


@router.post("/rollback", **answer(MigrationStatus))
async def roll_back(state: StateDep) -> dict[str, Any]:
    """Put back the old index and model (the replaced index becomes the shadow again)."""
    job = _job(state)
    if job.control.state is not MigrationState.DONE:
        raise APIError(
            409, "MigrationState", f"the migration is {job.control.state}: nothing to roll back"
        )
    path = _index_path(state)
    reports: list[RollbackReport] = []
    ok, error = await _switch(
        state,
        job.previous,
        lambda: _replace_index(state, lambda: reports.append(rollback(path))),
    )
    if not ok:
        raise APIError(409, "RollbackFailed", error or "rollback failed")
    job.control.set_state(MigrationState.ROLLED_BACK)
    job.lost_by_rollback = reports[-1].written_since
    log.log(
        logging.WARNING if job.lost_by_rollback else logging.INFO,
        "migration to %s rolled back; %d item(s) written or deleted after the cut-over are "
        "not in the restored index",
        job.control.model_id,
        job.lost_by_rollback,
    )
    return state.migration_status()


async def stop(state: AppState) -> None:
    """End the migration's run at the server's shutdown; its shadow is kept for a resume."""
    job = state.migration
    if job is None:
        return
    job.control.cancel()
    if job.task is not None:
        await asyncio.gather(job.task, return_exceptions=True)
    await asyncio.to_thread(job.migrator.shutdown, 0.0)


# -- the run and the switch --------------------------------------------------------------------


async def _run(state: AppState, job: MigrationJob) -> None:
    """Build the shadow to within a chunk of the live index, then cut over when automatic."""
    control = job.control
    try:
        report = await asyncio.to_thread(
            migrate_index,
            _index_path(state),
            job.migrator,
            _identity(job.migrator),
            chunk=job.chunk,
            cut_over=False,
            control=control,
            settle=job.chunk,
        )
    except ThemisClipError as exc:
        control.set_state(MigrationState.FAILED, str(exc))
        await asyncio.to_thread(job.migrator.shutdown, 0.0)
        return
    except Exception as exc:  # the run's boundary: the server keeps serving the old pair
        log.exception("migration to %s failed", control.model_id)
        control.set_state(MigrationState.FAILED, f"{type(exc).__name__}: {exc}")
        await asyncio.to_thread(job.migrator.shutdown, 0.0)
        return
    if report.cancelled:
        if job.discard:
            await _discard(state, job)
        return
    if report.missing and not job.drop_missing:
        control.finish(report, MigrationState.BLOCKED, _blocked(report))
        return
    control.finish(report, MigrationState.READY, None)
    if job.auto_cut_over:
        await _cut_over(state, job, drop_missing=job.drop_missing)


async def _cut_over(state: AppState, job: MigrationJob, *, drop_missing: bool) -> None:
    control = job.control
    control.set_state(MigrationState.CUTTING_OVER)
    path = _index_path(state)
    identity = _identity(job.migrator)
    reports: list[MigrationReport] = []

    def finish() -> None:
        report = migrate_index(
            path, job.migrator, identity, chunk=job.chunk, drop_missing=drop_missing
        )
        reports.append(report)
        if report.before is None:
            raise SearchIndexError(_blocked(report))

    ok, error = await _switch(state, job.config, lambda: _replace_index(state, finish))
    if ok:
        control.finish(reports[-1], MigrationState.DONE, None)
        await asyncio.to_thread(job.migrator.shutdown, 0.0)
        log.info("index %s cut over to %s", path, identity.model_id)
    elif reports:
        control.finish(reports[-1], MigrationState.BLOCKED, error)
    else:
        control.set_state(MigrationState.BLOCKED, error)


async def _switch(
    state: AppState, config: PluginConfig, move_index: Callable[[], None]
) -> tuple[bool, str | None]:
    """Swap the served model for ``config``'s and move the index, together.

    The hot swap loads and checks the model while the old pair serves; its space guard, run
    just before activation, takes the gate alone and moves the index (raising refuses the
    swap, the old index back in place); the gate opens once the new model is active.
    """
    loop = asyncio.get_running_loop()
    held: list[float] = []

    def guard(old: ModelIdentity, new: ModelIdentity) -> None:
        waited = time.monotonic()
        asyncio.run_coroutine_threadsafe(state.gate.acquire_alone(), loop).result()
        held[:] = [waited, time.monotonic()]
        move_index()

    try:
        ok = await asyncio.to_thread(state.plugin.reload_model, config, space_guard=guard)
    finally:
        if held:
            state.weak_lines.clear()
            state.duplicate_groups.clear()
            state.gate.release_alone()
            log.info(
                "switch to %s: %.3f s waiting for requests to answer, then %.3f s with "
                "requests held",
                config.model.path,
                held[1] - held[0],
                time.monotonic() - held[1],
            )
    return ok, state.plugin.last_error


def _replace_index(state: AppState, move: Callable[[], Any]) -> None:
    """Close the server's index, ``move()`` its files, open what is there then."""
    assert state.index is not None
    state.index.close()  # SQLite's log must be gone before the file is renamed
    try:
        move()
    finally:
        state.index = open_index(state.settings)


async def _discard(state: AppState, job: MigrationJob) -> None:
    await asyncio.to_thread(remove_shadow, _index_path(state), job.control.model_id)
    await asyncio.to_thread(job.migrator.shutdown, 0.0)
    job.control.set_state(MigrationState.CANCELLED)
    log.info("migration to %s cancelled; its shadow deleted", job.control.model_id)


def _blocked(report: MigrationReport) -> str:
    return (
        f"not cut over: {len(report.missing)} item(s) cannot be re-embedded; restore their "
        "files and cut over again, or cut over with drop_missing"
    )


def _refuse_if_busy(state: AppState) -> None:
    job = state.migration
    if job is not None and job.control.state in _BUSY:
        raise APIError(
            409,
            "MigrationRunning",
            f"a migration to {job.control.model_id} is {job.control.state}: cancel it or "
            "finish its cut-over first",
        )


def _job(state: AppState) -> MigrationJob:
    if state.migration is None:
        raise APIError(404, "NoMigration", "no migration ran since the server started")
    return state.migration


def _index_path(state: AppState) -> str:
    assert state.settings.index_path is not None
    return state.settings.index_path


def _identity(plugin: OnnxClipPlugin) -> ModelIdentity:
    identity = plugin.model_identity
    assert identity is not None
    return identity


async def _target(state: AppState, body: MigrateRequest) -> str:
    """The new model: a folder inside the model root, or a cached catalogue name."""
    if (body.path is None) == (body.model is None):
        raise APIError(
            422,
            "ValidationError",
            "send one of path (a folder inside the model root) or model (a cached catalogue "
            "name or Hub repo id)",
        )
    if body.path is not None:
        if not state.settings.model_root:
            raise APIError(
                403, "Forbidden", "model changes are disabled (start the server with --model-root)"
            )
        return str(inside_root(state.settings.model_root, body.path))
    name = body.model or ""
    try:
        source = hub.parse_source(name)
        if source.repo is None:
            raise APIError(
                422,
                "ValidationError",
                "model: a catalogue name or Hub repo id; a folder goes in path",
            )
        await asyncio.to_thread(hub.resolve, name, precision=body.variant, allow_download=False)
    except ModelNotFoundError as exc:
        raise APIError(409, "ModelNotCached", str(exc)) from None
    return name
