"""Hot swap's parts (seed §9.1): the state machine, the reload report, validation of a new
model, and the embedding-space checks. ``OnnxClipPlugin.reload_model`` orchestrates them."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from themis_clip.config import PluginConfig
from themis_clip.engine import ClipModel
from themis_clip.errors import ModelMismatchError
from themis_clip.vocabulary import ModelIdentity

__all__ = [
    "PluginState",
    "ReloadReport",
    "check_same_space",
    "space_changed",
    "validate",
]

log = logging.getLogger(__name__)


class PluginState(enum.StrEnum):
    """The seed's reload state machine, plus the states around it."""

    UNINITIALIZED = "UNINITIALIZED"
    LOADING = "LOADING"
    VALIDATING = "VALIDATING"
    ACTIVATING = "ACTIVATING"
    READY = "READY"
    ERROR = "ERROR"


@dataclass(frozen=True, kw_only=True)
class ReloadReport:
    """The outcome of one ``reload_model`` call.

    Attributes:
        ok: the new model is active.
        previous: the identity active before the call.
        current: the identity active after it (``previous`` when the reload failed).
        space_changed: vectors of ``previous`` are not comparable with ``current``'s.
        error: why the reload failed (None on success).
        seconds: how long the call took.
    """

    ok: bool
    previous: ModelIdentity
    current: ModelIdentity
    space_changed: bool
    error: str | None
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        def ident(i: ModelIdentity) -> dict[str, Any]:
            return {"model_id": i.model_id, "sha256": i.sha256, "embedding_dim": i.embedding_dim}

        return {
            "ok": self.ok,
            "previous": ident(self.previous),
            "current": ident(self.current),
            "space_changed": self.space_changed,
            "error": self.error,
            "seconds": round(self.seconds, 3),
        }


def validate(model: ClipModel) -> bool:
    """One inference per tower: output ``[1, embedding_dim]`` of finite values."""
    dim = model.embedding_dim
    size = model.preprocessor.spec.image_size
    out = model.visual.run(np.zeros((1, 3, size, size), dtype=np.float32))
    if out.shape != (1, dim) or not np.isfinite(out).all():
        log.warning(
            "image tower returned %s (finite: %s), expected (1, %d)",
            out.shape,
            np.isfinite(out).all(),
            dim,
        )
        return False
    if model.textual is not None:
        tok = model.textual.tokenizer
        out = model.textual.run([tok.probe_row()])
        if out.shape != (1, dim) or not np.isfinite(out).all():
            log.warning("text tower returned %s, expected (1, %d)", out.shape, dim)
            return False
    return True


def space_changed(old: ModelIdentity, new: ModelIdentity) -> bool:
    return (old.name, old.sha256, old.embedding_dim) != (new.name, new.sha256, new.embedding_dim)


def check_same_space(old: ModelIdentity, new: ModelIdentity, config: PluginConfig) -> None:
    """Strict mode (``allow_embedding_space_change: false``) refuses a change of space."""
    if config.allow_embedding_space_change:
        return
    raise ModelMismatchError(
        f"reload would change the embedding space ({old.model_id}, dim {old.embedding_dim} → "
        f"{new.model_id}, dim {new.embedding_dim}): vectors stored so far would no longer be "
        "comparable; set allow_embedding_space_change to true and re-index"
    )
