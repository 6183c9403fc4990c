"""``/admin/*``: authenticated before anything else, the body included.

The router declares the ``admin`` scope; :class:`~themis_clip.server.access.Authenticate`
enforces it before a byte of the body is read (the routes also declare no body parameter and
parse it themselves), so an unauthenticated caller learns nothing about the schema: 401/403
whatever it sends. ``THEMIS_ADMIN_TOKEN`` is an admin key.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError

from themis_clip.errors import IndexModelMismatchError
from themis_clip.server.access import ADMIN
from themis_clip.server.errors import APIError, validation_message
from themis_clip.server.routes import ops
from themis_clip.server.schemas import ReloadRequest
from themis_clip.server.state import StateDep
from themis_clip.vocabulary import ModelIdentity

router = APIRouter(prefix="/admin", dependencies=[ADMIN])


async def _body(request: Request) -> ReloadRequest:
    try:
        return ReloadRequest.model_validate_json(await request.body())
    except ValidationError as exc:
        status, kind, message = validation_message(list(exc.errors()))
        raise APIError(status, kind, message) from None


@router.get("/stats")
async def admin_stats(state: StateDep) -> dict[str, Any]:
    """All statistics, reload errors with their paths and runtime messages included."""
    out = ops.full_stats(state)
    if state.index is not None:
        index = state.index

        def search_stats() -> dict[str, Any]:
            with state.index_lock:
                return index.stats()

        out["index"] = await asyncio.to_thread(search_stats)
    return out


@router.post("/reload")
async def reload(request: Request, state: StateDep) -> dict[str, Any]:
    body = await _body(request)
    settings = state.settings
    if not settings.model_root:
        raise APIError(
            403, "Forbidden", "model reload is disabled (start the server with --model-root)"
        )
    target = _inside_root(settings.model_root, body.path)
    base = settings.plugin_config
    model_changes: dict[str, Any] = {
        "path": str(target),
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


def _inside_root(root: str, requested: str) -> Path:
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
