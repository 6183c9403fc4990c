"""Hot swap (ThemisDB's reload_model): the state machine, the reload report, validation of a
new model, the embedding-space checks, and :func:`reload`, the orchestration
``OnnxClipPlugin.reload_model`` delegates to.

The new model is loaded and validated beside the old one while the old one keeps serving;
activation is one reference swap (the plugin's ``activate`` callback), so new requests never
wait for a drain. The old model is then retired: the reload waits up to ``drain_timeout_s`` for
its in-flight requests and releases its sessions. On drain timeout the reload still succeeds;
the old model's last in-flight request releases its sessions, and ``drain_timeouts`` counts it.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from themis_clip.config import PluginConfig
from themis_clip.engine import ClipModel
from themis_clip.errors import ModelMismatchError, ThemisClipError
from themis_clip.vocabulary import ModelIdentity

__all__ = [
    "PluginState",
    "ReloadReport",
    "SpaceGuard",
    "SwapRecord",
    "check_same_space",
    "describe_error",
    "reload",
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


def describe_error(exc: BaseException) -> str:
    """One line for logs and ``last_error``: our messages as they are, others with their type."""
    if isinstance(exc, ThemisClipError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


#: called with ``(old, new)`` identities before activation when the space changes; raising
#: refuses the reload
SpaceGuard = Callable[[ModelIdentity, ModelIdentity], None]


class SwapRecord:
    """A plugin's lifecycle bookkeeping: state, recent states, reload counters, last report."""

    def __init__(self) -> None:
        self.state = PluginState.UNINITIALIZED
        self.history: deque[str] = deque([self.state.value], maxlen=32)
        self.counts = {"reloads": 0, "reload_failures": 0, "drain_timeouts": 0}
        self.last_report: ReloadReport | None = None
        self.last_error: str | None = None

    def set_state(self, state: PluginState) -> None:
        self.state = state
        self.history.append(state.value)

    def reset(self) -> None:
        """Forget counters and reports (shutdown); the state is set by the caller."""
        self.counts = dict.fromkeys(self.counts, 0)
        self.last_report = None
        self.last_error = None


def reload(
    record: SwapRecord,
    old: ClipModel,
    new_config: PluginConfig,
    *,
    load: Callable[[PluginConfig], ClipModel],
    activate: Callable[[ClipModel, PluginConfig], Callable[[], None]],
    space_guard: SpaceGuard | None = None,
) -> ReloadReport:
    """Load, validate and activate the model of ``new_config`` in place of ``old``.

    Args:
        record: the plugin's bookkeeping, updated here (states, counters, report).
        old: the active model; it keeps serving until ``activate`` and is retired after.
        new_config: the configuration to run from now on.
        load: loads a model for a configuration (the plugin's backend and budget applied).
        activate: makes the new model and config the plugin's; returns a clean-up to run once
            the old model has drained (it is skipped when the drain times out).
        space_guard: see :data:`SpaceGuard`.

    Returns:
        The report (also ``record.last_report``); ``ok`` False leaves ``old`` active.
    """
    record.counts["reloads"] += 1
    log.info("reload started: %s", new_config.model.path)
    t0 = time.perf_counter()
    new: ClipModel | None = None
    try:
        record.set_state(PluginState.LOADING)
        new = load(new_config)
        record.set_state(PluginState.VALIDATING)
        if not validate(new):
            raise ModelMismatchError("validation inference gave a wrong shape or non-finite values")
        changed = space_changed(old.identity, new.identity)
        if changed:
            check_same_space(old.identity, new.identity, new_config)
            if space_guard is not None:
                space_guard(old.identity, new.identity)
    except Exception as exc:
        record.set_state(PluginState.ERROR)
        if new is not None:
            new.retire(0)
        record.counts["reload_failures"] += 1
        error = record.last_error = describe_error(exc)
        record.last_report = ReloadReport(
            ok=False,
            previous=old.identity,
            current=old.identity,
            space_changed=False,
            error=error,
            seconds=time.perf_counter() - t0,
        )
        log.error("reload failed, keeping %s: %s", old.identity.model_id, error)
        record.set_state(PluginState.READY)
        return record.last_report
    record.set_state(PluginState.ACTIVATING)
    new.generation = old.generation + 1
    after_drain = activate(new, new_config)
    if changed:
        log.warning(
            "reload changed the embedding space: %s (dim %d) -> %s (dim %d); vectors "
            "stored with the old model are not comparable with new ones",
            old.identity.model_id,
            old.identity.embedding_dim,
            new.identity.model_id,
            new.identity.embedding_dim,
        )
    if old.retire(new_config.drain_timeout_s):
        after_drain()
    else:
        record.counts["drain_timeouts"] += 1
        log.warning(
            "old model %s still had requests after %.1f s; it is released when they end",
            old.identity.model_id,
            new_config.drain_timeout_s,
        )
    record.last_report = ReloadReport(
        ok=True,
        previous=old.identity,
        current=new.identity,
        space_changed=changed,
        error=None,
        seconds=time.perf_counter() - t0,
    )
    record.set_state(PluginState.READY)
    record.last_error = None
    log.info("reload finished: %s is generation %d", new.identity.model_id, new.generation)
    return record.last_report
