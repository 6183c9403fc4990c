"""``ServerSettings``: what the service needs; the CLI builds it from flags, config and env."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from themis_clip.config import PluginConfig, SearchConfig
from themis_clip.errors import ConfigError
from themis_clip.server.access import parse_networks

__all__ = ["ServerSettings"]


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """What the service needs; the CLI builds it from flags, config and environment.

    Attributes:
        plugin_config: the model to serve.
        index_path: the index for ``/search`` and ``/index/items``: an SQLite file or a
            ``postgresql://`` URL (None: search disabled).
        search_settings: the search self-tuner's target recall and graph vector type.
        model_root: folder that ``/admin/reload`` paths must stay inside (None: reload disabled).
        admin_token: bearer token for ``/admin/*`` (None: admin endpoints disabled); with a
            keys file it is one more key, with the ``admin`` scope.
        allow_pull: ``/admin/reload {"model": NAME}`` may download an uncached model.
        keys_file: the API keys file (``themis-clip keys``); given, every route but
            ``/healthz``, ``/readyz`` and the page needs a key with the route's scope
            (None: open, as the loopback demo is).
        immich_from: networks (CIDR) whose requests to immich's ``/predict`` need no key
            (immich's server sends none); empty: a key, as on every other route.
        allowed_hosts: the names the server answers for in ``Host`` (others get 421;
            ``*.example.com`` and ``*`` work; None: any, as tests built on the app use).
        max_body_bytes: larger request bodies get 413.
        max_json_bytes: larger JSON bodies get 413 (images in bulk travel as raw or multipart
            bodies; the default holds four 12 MP photos as data URLs).
        max_bodies_in_flight_bytes: request-body bytes all requests may hold at once, declared
            lengths reserved up front (503 with ``Retry-After`` beyond it).
        max_queue: waiting items per batcher before 429 (a request with more items than this
            gets 413; the default holds the largest request twice: 2,048 texts).
        max_queue_delay_ms: how long a request waits for its batch to fill.
        request_timeout_s: per-request limit, reading the body included (504 beyond it; its
            queued work is dropped); also the model's ``session.run_timeout_s`` unless the
            config sets one, so that a session run cannot outlive its requests.
        body_idle_timeout_s: longest silence while a request body arrives (408 beyond it).
        max_requests: requests in progress at once; beyond it a new one gets a JSON 503 and
            its connection is closed.
        max_labels: most labels per ``/v1/classify`` and candidates per ``/rank`` (422 beyond).
        warmup: run ``plugin.warmup()`` before ``/readyz`` turns ready.
    """

    plugin_config: PluginConfig
    index_path: str | None = None
    search_settings: SearchConfig = field(default_factory=SearchConfig)
    model_root: str | None = None
    admin_token: str | None = None
    allow_pull: bool = False
    keys_file: str | None = None
    immich_from: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] | None = None
    max_body_bytes: int = 20 * 2**20
    max_json_bytes: int = 16 * 2**20
    max_bodies_in_flight_bytes: int = 256 * 2**20
    max_queue: int = 4096
    max_queue_delay_ms: float = 5.0
    request_timeout_s: float = 30.0
    body_idle_timeout_s: float = 10.0
    max_requests: int = 1000
    max_labels: int = 1024
    warmup: bool = True

    def __post_init__(self) -> None:
        try:
            parse_networks(self.immich_from)
        except ValueError as exc:
            raise ConfigError(f"immich_from: {exc}") from None
        config = self.plugin_config
        if config.session.run_timeout_s is None:  # no session run outlives its requests
            session = replace(config.session, run_timeout_s=self.request_timeout_s)
            object.__setattr__(self, "plugin_config", replace(config, session=session))
