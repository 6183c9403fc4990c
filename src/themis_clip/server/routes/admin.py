"""``/admin/*``: authenticated before anything else, the body included.

The router declares the ``admin`` scope; :class:`~themis_clip.server.access.Authenticate`
enforces it before a byte of the body is read (the routes also declare no body parameter and
parse it themselves), so an unauthenticated caller learns nothing about the schema: 401/403
whatever it sends. ``THEMIS_ADMIN_TOKEN`` is an admin key.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from themis_clip.errors import IndexModelMismatchError, ModelNotFoundError, ThemisClipError
from themis_clip.models import hub
from themis_clip.server.access import ADMIN
from themis_clip.server.bodies import JSONRoute, documented, read_model
from themis_clip.server.errors import APIError
from themis_clip.server.routes import ops
from themis_clip.server.schemas import Reloaded, ReloadRequest, Statistics, answer
from themis_clip.server.state import INDEX_HELD, AppState, StateDep
from themis_clip.vocabulary import ModelIdentity

log = logging.getLogger(__name__)

router = APIRouter(route_class=JSONRoute, prefix="/admin", dependencies=[ADMIN], tags=["admin"])


@router.get("/stats", dependencies=[INDEX_HELD], **answer(Statistics))
async def admin_stats(request: Request, state: StateDep) -> dict[str, Any]:
    """All statistics, reload errors with their paths and runtime messages included."""
    out = ops.full_stats(state)
    out["pulls"] = dict(request.app.state.__dict__.get("hub_pulls", {}))
    if state.index is not None:
        index = state.index

        def search_stats() -> dict[str, Any]:
            with state.index_lock:
                return index.stats()

        out["index"] = await asyncio.to_thread(search_stats)
    return out


@router.post("/reload", openapi_extra=documented(ReloadRequest), **answer(Reloaded))
async def reload(request: Request, state: StateDep) -> Any:
    body = await read_model(request, ReloadRequest)
    settings = state.settings
    if (body.path is None) == (body.model is None):
        raise APIError(
            422,
            "ValidationError",
            "send one of path (a folder inside the model root) or model (a catalogue name or "
            "Hub repo id)",
        )
    if body.model is not None:
        target = await _named_model(request, state, body)
        if target is None:  # pulling in the background; the old model serves meanwhile
            return JSONResponse(
                status_code=202,
                content={"reloaded": False, "pulling": body.model, "status": "/admin/stats"},
            )
    else:
        if not settings.model_root:
            raise APIError(
                403, "Forbidden", "model reload is disabled (start the server with --model-root)"
            )
        target = str(inside_root(settings.model_root, body.path or ""))
    return await _apply(state, body, target)


async def _apply(state: AppState, body: ReloadRequest, target: str) -> dict[str, Any]:
    base = state.settings.plugin_config
    model_changes: dict[str, Any] = {
        "path": target,
        "variant": body.variant,
        "expected_sha256": body.expected_sha256,
        "name": None,
        "embedding_dim": None,
    }
    if body.enable_mmap_loading is not None:
        model_changes["enable_mmap_loading"] = body.enable_mmap_loading
    new_config = replace(base, model=replace(base.model, **model_changes))
    refused: list[str] = []

    def protect_index(old: ModelIdentity, new: ModelIdentity) -> None:
        """The attached index's vectors must stay comparable unless the caller accepts it."""
        stamp = state.index.stamp if state.index is not None else None
        if stamp is None or body.allow_embedding_space_change:
            return
        if (stamp.sha256, stamp.dim) != (new.sha256, new.embedding_dim):
            refused.append(
                f"the index holds vectors of {stamp.model_id} (dim {stamp.dim}); {new.model_id} "
                f"(dim {new.embedding_dim}) would make them incomparable. Re-index with the new "
                "model (a new --index, or 'themis-clip index --rebuild'), or send "
                "allow_embedding_space_change: true to swap anyway"
            )
            raise IndexModelMismatchError(refused[-1])

    ok = await asyncio.to_thread(state.plugin.reload_model, new_config, space_guard=protect_index)
    if refused:
        raise APIError(409, "IndexModelMismatchError", refused[-1])
    if not ok:
        raise APIError(422, "ReloadFailed", state.plugin.last_error or "reload failed")
    report = state.plugin.last_reload
    return {
        "reloaded": True,
        "model_id": state.model_id(),
        "generation": state.plugin.get_statistics()["generation"],
        "space_changed": bool(report and report.space_changed),
    }


async def _named_model(request: Request, state: AppState, body: ReloadRequest) -> str | None:
    """A cached model's name to reload now, or None when a background pull was started.

    Names resolve as ``--model`` does (models/hub); only repos, never local paths, which must
    stay inside the model root.
    """
    name = body.model or ""
    if not name or any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for c in name):
        raise APIError(
            422,
            "ValidationError",
            "model: must be a non-empty name without control characters or lone surrogates",
        )
    try:
        source = hub.parse_source(name)
    except ModelNotFoundError as exc:
        raise APIError(404, "ModelNotFound", str(exc)) from None
    if source.repo is None:
        raise APIError(
            422,
            "ValidationError",
            "model: a catalogue name or Hub repo id; a folder goes in path (inside the model root)",
        )
    try:
        await asyncio.to_thread(hub.resolve, name, precision=body.variant, allow_download=False)
        return name
    except ModelNotFoundError as exc:
        if not state.settings.allow_pull:
            raise APIError(409, "ModelNotCached", str(exc)) from None
    pulls: dict[str, dict[str, Any]] = request.app.state.__dict__.setdefault("hub_pulls", {})
    if pulls.get(name, {}).get("state") == "pulling":
        return None
    pulls[name] = {"state": "pulling", "error": None}

    async def pull_then_reload() -> None:
        # The one boundary of a background pull: whatever ends it (ours, the client's, a
        # library's BaseException) marks it failed with its reason, so the name can be retried.
        try:
            await asyncio.to_thread(hub.pull, name, precision=body.variant, progress=False)
            result = await _apply(state, body, name)
            pulls[name] = {"state": "reloaded", "error": None, "model_id": result["model_id"]}
        except APIError as exc:
            pulls[name] = {"state": "failed", "error": exc.message}
        except ThemisClipError as exc:
            pulls[name] = {"state": "failed", "error": str(exc)}
        except BaseException as exc:
            pulls[name] = {"state": "failed", "error": f"{type(exc).__name__}: {exc}"}
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
            log.exception("background pull of %s failed", name)

    tasks: set[asyncio.Task[None]] = request.app.state.__dict__.setdefault("hub_tasks", set())
    task = asyncio.create_task(pull_then_reload())
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return None


def inside_root(root: str, requested: str) -> Path:
    """Resolve ``requested`` against ``root`` (symlinks followed); refuse anything outside it."""
    if not requested or any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for c in requested):
        raise APIError(
            422,
            "ValidationError",
            "path: must be a non-empty relative path without control characters (NUL...) "
            "or lone surrogates",
        )
    base = Path(root).resolve()
    target = (base / requested).resolve()
    if target != base and base not in target.parents:
        raise APIError(403, "Forbidden", f"model path {requested!r} is outside the model root")
    return target
