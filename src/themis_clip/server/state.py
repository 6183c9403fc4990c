"""The state one app shares with its routers, handed to them with FastAPI ``Depends``.

:class:`AppState` owns the plugin, the batchers and the optional index; its methods are the
use cases routes share (embed through the batchers, all items by one model; the model's index
stamp). Routes get it through :data:`StateDep` and never reach for globals.

Routes that use the index hold :class:`IndexGate` shared (:data:`INDEX_HELD`); a migration's
cut-over, which replaces the model and the index together, holds it alone.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from themis_clip.batching import MicroBatcher
from themis_clip.config import PluginConfig
from themis_clip.errors import NotReadyError, ThemisClipError
from themis_clip.index.search import VectorIndex
from themis_clip.interface import EmbeddingResult
from themis_clip.migration import MigrationControl, MigrationState
from themis_clip.ocr import OCREngine
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.server.errors import APIError
from themis_clip.server.metrics import Metrics
from themis_clip.server.payloads import decode_image_fields, raise_for
from themis_clip.server.settings import ServerSettings
from themis_clip.vocabulary import ModelIdentity

__all__ = [
    "INDEX_HELD",
    "AppState",
    "IndexGate",
    "MigrationJob",
    "Part",
    "StateDep",
    "get_state",
    "open_index",
    "text_batch_fn",
]

log = logging.getLogger(__name__)

#: What a request keeps of its deadline, after reading text, to store it and answer.
ANSWER_MARGIN_S = 2.0


class IndexGate:
    """Many requests that use the index (and the model that reads it), or one cut-over that
    replaces both: no request sees the new model with the old index or the reverse.

    Write-preferring: a waiting cut-over holds new requests back, and takes over once those
    inside have answered. Event-loop only; releasing never awaits, so a cancelled request
    cannot leave it held.
    """

    def __init__(self) -> None:
        self._inside = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._alone = asyncio.Lock()

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        while not self._open.is_set():
            await self._open.wait()
        self._inside += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._inside -= 1
            if not self._inside:
                self._idle.set()

    async def acquire_alone(self) -> None:
        """Hold new requests back and wait for those inside to answer."""
        await self._alone.acquire()
        self._open.clear()
        while self._inside:
            await self._idle.wait()

    def release_alone(self) -> None:
        self._open.set()
        self._alone.release()


#: items that cannot be re-embedded, listed by key in a migration's status
_LISTED = 100


@dataclass
class MigrationJob:
    """The server's migration (``/admin/migrate``): its control and what a cut-over and a
    rollback switch between."""

    control: MigrationControl
    #: the new model, loaded with the migration's share of the cores
    migrator: OnnxClipPlugin
    #: the serving configuration with the new model (cut-over) and the one before (rollback)
    config: PluginConfig
    previous: PluginConfig
    auto_cut_over: bool
    drop_missing: bool
    chunk: int
    task: asyncio.Task[None] | None = None
    #: cancel discards the shadow; a server shutdown stops the run and keeps it
    discard: bool = False
    #: items written or deleted after the cut-over that a rollback did not bring back
    lost_by_rollback: int | None = None

    def status(self, *, private: bool = True) -> dict[str, Any]:
        """State, counts, rate and ETA; ``private`` adds the keys that cannot be re-embedded
        and the error message (else their count and a flag)."""
        p = self.control.snapshot()
        listed = [{"id": k, "reason": r} for k, r in p.missing[:_LISTED]]
        running = p.state is MigrationState.RUNNING  # an ETA only while it moves
        return {
            "state": str(p.state),
            "model_id": p.model_id,
            "done": p.done,
            "total": p.total,
            "embedded": p.embedded,
            "items_per_s": round(p.items_per_s, 2),
            "eta_s": round(p.eta_s, 1) if p.eta_s is not None and running else None,
            "from_previews": p.from_previews,
            "missing": listed if private else len(p.missing),
            "error": p.error if private else p.error is not None,
            "cut_over": "auto" if self.auto_cut_over else "command",
            "lost_by_rollback": self.lost_by_rollback,
        }


@dataclass(frozen=True, kw_only=True)
class Part:
    """One input of an embedding request, in any dialect: a text, or an image given as raw
    bytes or as a data URL / bare base64 string."""

    text: str | None = None
    image: str | bytes | None = None


@dataclass
class AppState:
    settings: ServerSettings
    plugin: OnnxClipPlugin
    metrics: Metrics
    ready: bool = False
    index: VectorIndex | None = None
    #: Reads the text in items added over HTTP (the config's ``ocr.enabled`` with an index).
    ocr: OCREngine | None = None
    # Orders index writes (bind_model + upsert); searches never take it (VectorIndex serves
    # concurrent readers itself).
    index_lock: threading.Lock = field(default_factory=threading.Lock)
    image_batcher: MicroBatcher[bytes, EmbeddingResult] | None = None
    text_batcher: MicroBatcher[tuple[str, str | None], EmbeddingResult] | None = None
    #: (model id, index write version) → the weak-match line measured there (collection.weak_line)
    weak_lines: dict[tuple[str, int], Any] = field(default_factory=dict)
    #: (index write version, threshold) → the duplicate groups found there, one computation
    #: at a time (server/routes/duplicates.py): a client cannot make the server repeat it
    duplicate_groups: dict[tuple[int, float, float], Any] = field(default_factory=dict)
    duplicates_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: float = field(default_factory=time.monotonic)
    loaded_at: float = field(default_factory=time.time)
    gate: IndexGate = field(default_factory=IndexGate)
    migration: MigrationJob | None = None

    def migration_status(self, *, private: bool = True) -> dict[str, Any]:
        """:meth:`MigrationJob.status`, ``{"state": "idle"}`` when none ran."""
        if self.migration is None:
            return {"state": "idle"}
        return self.migration.status(private=private)

    def require_ready(self) -> OnnxClipPlugin:
        if not self.plugin.is_ready():
            raise NotReadyError("the model is not loaded")
        return self.plugin

    async def embed_image(self, data: bytes) -> EmbeddingResult:
        (result,) = await self.embed_images([data])
        return result

    async def embed_text(self, text: str, language: str | None = None) -> EmbeddingResult:
        (result,) = await self.embed_texts([text], language)
        return result

    async def embed_images(self, items: list[bytes]) -> list[EmbeddingResult]:
        self.require_ready()
        assert self.image_batcher is not None
        return await self._all_one_model(self.image_batcher, items)

    async def embed_texts(
        self, items: list[str], language: str | None = None
    ) -> list[EmbeddingResult]:
        """Texts (with the request's language code, for models that take one)."""
        self.require_ready()
        assert self.text_batcher is not None
        return await self._all_one_model(self.text_batcher, [(t, language) for t in items])

    async def embed_parts(
        self,
        parts: Sequence[Part],
        *,
        language: str | None = None,
        truncate: bool = True,
        where: str = "input",
        truncate_hint: str = 'send "truncate": true to embed its first tokens',
    ) -> list[EmbeddingResult]:
        """Every door's one embedding path: images and texts through the batchers, in order.

        Returns:
            One successful result per part, all from one model.

        Raises:
            APIError: a part that cannot be embedded (named ``where[i]``), three hot swaps
                during the request (503; after one, it is embedded again on the new model),
                or a text over the context with ``truncate`` off (422).
        """
        image_at = [i for i, p in enumerate(parts) if p.image is not None]
        text_at = [i for i, p in enumerate(parts) if p.image is None]
        raw: list[bytes] = []
        if image_at:
            given = [parts[i].image for i in image_at]
            encoded = [(k, v) for k, v in enumerate(given) if isinstance(v, str)]
            decoded = await decode_image_fields([v for _, v in encoded])
            for (k, _), data in zip(encoded, decoded, strict=True):
                given[k] = data
            raw = [v for v in given if isinstance(v, bytes)]
        texts = [parts[i].text or "" for i in text_at]
        # Images and texts go through their own batchers: a hot swap between the two leaves
        # them from two models. The request is then embedded again, on the new model.
        for _ in range(3):
            results: list[EmbeddingResult | None] = [None] * len(parts)
            if image_at:
                for i, r in zip(image_at, await self.embed_images(raw), strict=True):
                    results[i] = r
            if text_at:
                for i, r in zip(text_at, await self.embed_texts(texts, language), strict=True):
                    results[i] = r
            done = [r for r in results if r is not None]
            for i, r in enumerate(done):
                raise_for(r, f"{where}[{i}]")
            if len({r.model_id for r in done}) <= 1:
                break
        else:  # three swaps within one request
            raise APIError(
                503,
                "ModelSwapped",
                "the model was swapped during the request; retry",
                {"Retry-After": "1"},
            )
        cut = [i for i, r in enumerate(done) if r.truncated]
        if cut and not truncate:
            spec = self.plugin.model_spec
            context = spec.context_length if spec is not None else 0
            raise APIError(
                422,
                "TextTooLong",
                f"{where}[{cut[0]}] is longer than the model's context of {context} tokens "
                f"({truncate_hint})",
            )
        return done

    async def _all_one_model(
        self, batcher: MicroBatcher[Any, EmbeddingResult], items: list[Any]
    ) -> list[EmbeddingResult]:
        """A request's items, admitted together, all embedded by one model (re-run when a hot
        swap split them)."""
        results: list[EmbeddingResult] = []
        for _ in range(3):
            results = await batcher.submit_many(items, timeout_s=self.settings.request_timeout_s)
            if len({r.model_id for r in results if r.ok}) <= 1:
                break
        return results

    async def read_texts(
        self, pictures: Sequence[tuple[str, bytes]], deadline: float
    ) -> dict[str, dict[str, Any]]:
        """What OCR reads in ``pictures`` (key, encoded image), key → ``OCRResult.to_json``
        data, read one after another in a worker thread while the request stands.

        Reading stops before a picture whose read would end past ``deadline`` (a
        ``time.monotonic()`` instant, less :data:`ANSWER_MARGIN_S`; the slowest read so far is
        the guess) and as soon as this coroutine is cancelled (its client gone): an abandoned
        request burns no more CPU. A picture OCR fails on is left out, as are those not
        reached; the caller stored the items first, so they are only missing their text.
        """
        ocr = self.ocr
        if ocr is None:
            return {}
        stop = threading.Event()

        def read() -> dict[str, dict[str, Any]]:
            readings: dict[str, dict[str, Any]] = {}
            slowest = 0.0
            for key, data in pictures:
                began = time.monotonic()
                if stop.is_set() or began + slowest + ANSWER_MARGIN_S > deadline:
                    break
                try:
                    readings[key] = ocr.read_text(data).to_json()
                except ThemisClipError as exc:
                    log.warning("item %r: its text was not read: %s", key, exc)
                slowest = max(slowest, time.monotonic() - began)
            if len(readings) < len(pictures):
                log.warning(
                    "read the text of %d of %d items added%s; the rest are stored without it",
                    len(readings),
                    len(pictures),
                    " (request gone)" if stop.is_set() else "",
                )
            return readings

        try:
            return await asyncio.to_thread(read)
        finally:
            stop.set()  # cancelled: the thread stops before its next picture

    def model_id(self) -> str | None:
        identity = self.plugin.model_identity
        return identity.model_id if identity else None

    def require_index(self) -> VectorIndex:
        if self.index is None:
            raise APIError(404, "NoIndex", "this server has no index (start it with --index PATH)")
        return self.index

    def stamp(self) -> ModelIdentity:
        identity = self.plugin.model_identity
        if identity is None:
            raise NotReadyError("the model is not loaded")
        return identity


async def get_state(request: Request) -> AppState:
    """The app's state (``async``: a plain function would run in a worker thread)."""
    state: AppState = request.app.state.themis
    return state


StateDep = Annotated[AppState, Depends(get_state)]


async def _hold_index(request: Request) -> AsyncIterator[None]:
    async with (await get_state(request)).gate.shared():
        yield


#: a router's (or route's) dependency: the index and the model stay a pair until it answers
INDEX_HELD = Depends(_hold_index, scope="function")


def open_index(settings: ServerSettings) -> VectorIndex:
    """The server's index, as it opens it at start and after a cut-over."""
    assert settings.index_path is not None
    return VectorIndex(
        settings.index_path, background_build=True, settings=settings.search_settings
    )


def text_batch_fn(
    plugin: OnnxClipPlugin,
) -> Callable[[list[tuple[str, str | None]]], list[EmbeddingResult]]:
    """The text batcher's function: requests of several languages share a batch; each
    language's texts are embedded together."""

    def run(items: list[tuple[str, str | None]]) -> list[EmbeddingResult]:
        groups: dict[str | None, list[int]] = {}
        for i, (_, language) in enumerate(items):
            groups.setdefault(language, []).append(i)
        out: dict[int, EmbeddingResult] = {}
        for language, idx in groups.items():
            texts = [items[i][0] for i in idx]
            out.update(zip(idx, plugin.generate_text_embedding_batch(texts, language), strict=True))
        return [out[i] for i in range(len(items))]  # every item answered, in order

    return run
