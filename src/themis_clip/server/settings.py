"""``ServerSettings``: what the service needs; the CLI builds it from flags, config and env."""

from __future__ import annotations

from dataclasses import dataclass

from themis_clip.config import PluginConfig

__all__ = ["ServerSettings"]


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """What the service needs; the CLI builds it from flags, config and environment.

    Attributes:
        plugin_config: the model to serve.
        index_path: SQLite index for ``/search`` and ``/index/items`` (None: search disabled).
        model_root: folder that ``/admin/reload`` paths must stay inside (None: reload disabled).
        admin_token: bearer token for ``/admin/*`` (None: admin endpoints disabled).
        max_body_bytes: larger request bodies get 413.
        max_queue: waiting items per batcher before 429.
        max_queue_delay_ms: how long a request waits for its batch to fill.
        request_timeout_s: per-request limit (504 beyond it).
        warmup: run ``plugin.warmup()`` before ``/readyz`` turns ready.
    """

    plugin_config: PluginConfig
    index_path: str | None = None
    model_root: str | None = None
    admin_token: str | None = None
    max_body_bytes: int = 20 * 2**20
    max_queue: int = 512
    max_queue_delay_ms: float = 5.0
    request_timeout_s: float = 30.0
    warmup: bool = True
