"""The embedding pipeline: one decode path for images (decoded ahead, batched) and sorted
text batches.

Functions over a loaded :class:`~themis_clip.engine.ClipModel`; the plugin holds the model
(in-flight counted) and hands in its :class:`DecodePool` and statistics.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.budget import PixelBudget
from themis_clip.engine import ClipModel
from themis_clip.errors import (
    ConfigError,
    InferenceError,
    NotReadyError,
    TextInputError,
    ThemisClipError,
)
from themis_clip.interface import EmbeddingResult, ImageData, ImageFormat, ImageMetadata
from themis_clip.preprocess.image import ImagePreprocessor
from themis_clip.stats import Statistics

__all__ = [
    "DecodePool",
    "elapsed_ms",
    "embed_image",
    "embed_images",
    "embed_texts",
    "finish_batch",
    "result_of",
    "run_batch",
    "translate",
    "warm_up",
]

log = logging.getLogger("themis_clip.plugin")

_Pixels = npt.NDArray[np.float32]

_PILLOW_FORMAT = {
    ImageFormat.JPEG: "JPEG",
    ImageFormat.PNG: "PNG",
    ImageFormat.BMP: "BMP",
    ImageFormat.TIFF: "TIFF",
    ImageFormat.WEBP: "WEBP",
    ImageFormat.GIF: "GIF",
}


class DecodePool:
    """The decode resources of one plugin, shared across its models: the decode threads
    (``preprocess_workers``; None means ``min(4, CPUs)``), the decoded-pixel budget, and the
    files named ahead (:meth:`prefetch`) whose decodes the batch calls take (:meth:`take`).

    Every image a plugin embeds is decoded here, so a run never holds more decoded pixels
    than the one budget the user set.
    """

    def __init__(self) -> None:
        self.executor: ThreadPoolExecutor | None = None
        self.budget: PixelBudget | None = None
        self._workers = 0
        self._lock = threading.Lock()  # guards the executor swap and the files named ahead
        self._pre: ImagePreprocessor | None = None
        self._window = 1
        self._named: deque[str] = deque()  # named, not yet submitted
        self._queued: deque[tuple[str, Future[_Pixels]]] = deque()  # submitted, in order
        self._keys: set[str] = set()  # named or queued

    def budget_for(self, capacity: int) -> PixelBudget:
        """The budget of ``capacity`` pixels; a new one when the capacity changed (decodes
        under the old one finish under it)."""
        if self.budget is None or self.budget.capacity != capacity:
            self.budget = PixelBudget(capacity)
        return self.budget

    @property
    def workers(self) -> int | None:
        """Threads of the running pool (None when shut down)."""
        return self._workers if self.executor is not None else None

    def resize(self, workers: int | None) -> Callable[[], None]:
        """Start a pool of ``workers`` threads unless one of that size runs.

        Returns:
            the clean-up that shuts the replaced pool down (a no-op when none was replaced);
            callers run it once no request can still submit to the old pool.
        """
        workers = workers or min(4, os.cpu_count() or 1)
        with self._lock:
            if self.executor is not None and self._workers == workers:
                return lambda: None
            old = self.executor
            self.executor = ThreadPoolExecutor(workers, thread_name_prefix="themis-preprocess")
            self._workers = workers
        log.info("preprocess workers: %d", workers)
        if old is None:
            return lambda: None
        return lambda: old.shutdown(wait=False)

    def prefetch(
        self,
        preprocessor: ImagePreprocessor | None,
        paths: Sequence[str | os.PathLike[str]],
        window: int,
    ) -> None:
        """Decode ``paths`` with ``preprocessor``, in order, at most ``window`` ahead of the
        batch calls that take them; replaces what was named before (no paths: drops it)."""
        with self._lock:
            self._drop()
            self._pre, self._window = preprocessor, max(1, window)
            self._named.extend(os.fspath(p) for p in paths)
            self._keys.update(self._named)
            self._fill()

    def take(self, item: ImageData, preprocessor: ImagePreprocessor) -> Future[_Pixels] | None:
        """The decode of ``item`` if it was named and decoded as ``preprocessor`` would (the
        ones named before it are dropped); None for the caller to decode it."""
        if not isinstance(item, str | os.PathLike):
            return None
        key = os.fspath(item)
        with self._lock:
            if key not in self._keys or (not self._queued and self.executor is None):
                return None
            if self._pre is not preprocessor:
                if self._pre != preprocessor:  # the model opened with other preprocessing
                    self._drop()
                    return None
                self._pre = preprocessor
            while True:
                self._fill()
                name, fut = self._queued.popleft()
                self._keys.discard(name)
                if name == key:
                    self._fill()
                    return fut
                fut.cancel()

    def shutdown(self) -> None:
        with self._lock:
            self._drop()
            if self.executor is not None:
                self.executor.shutdown(wait=False)
                self.executor = None

    def _fill(self) -> None:
        if self.executor is None or self._pre is None:
            return
        while self._named and len(self._queued) < self._window:
            key = self._named.popleft()
            self._queued.append((key, self.executor.submit(self._pre, key)))

    def _drop(self) -> None:
        for _, fut in self._queued:
            fut.cancel()
        self._queued.clear()
        self._named.clear()
        self._keys.clear()


def embed_image(
    model: ClipModel,
    image_data: ImageData,
    metadata: ImageMetadata | Mapping[str, Any] | None,
    t0: float,
    stats: Statistics,
) -> EmbeddingResult:
    """One image, decoded in the caller's thread; an :class:`ImageMetadata` gives the decoder
    its format hint and EXIF orientation. Raises what decoding or the session raised."""
    hints: dict[str, Any] = {}
    if isinstance(metadata, ImageMetadata):
        hints = {"format_hint": _PILLOW_FORMAT.get(metadata.format)}
        hints["orientation"] = metadata.orientation
    pixels = model.preprocessor(image_data, **hints)[None]
    embeddings, valid = model.embed_pixels(pixels)
    stats.record_batch(1)
    if not valid[0]:
        raise InferenceError("the model produced a non-finite or zero embedding")
    return EmbeddingResult.succeeded(
        embeddings[0],
        latency_ms=elapsed_ms(t0),
        model_id=model.identity.model_id,
        metadata=metadata,
    )


def finish_batch(
    results: list[EmbeddingResult | None], failure: BaseException | None, t0: float
) -> list[EmbeddingResult]:
    """The batch calls' finalisation: a ``failure`` of the whole call fails every slot not
    yet filled with it; a slot still empty after that is reported as not processed."""
    if failure is not None:
        error = translate(failure)
        results = [r or EmbeddingResult.failure(error, latency_ms=elapsed_ms(t0)) for r in results]
    return [
        r if r is not None else EmbeddingResult.failure(InferenceError("not processed"))
        for r in results
    ]


def run_batch(
    hold: Callable[[], AbstractContextManager[ClipModel]],
    n: int,
    fill: Callable[[ClipModel, list[EmbeddingResult | None], float], None],
    stats: Statistics,
    *,
    texts: bool,
) -> list[EmbeddingResult]:
    """One batch call: ``fill`` the ``n`` result slots with the model ``hold`` gives, finalise
    them (:func:`finish_batch`) and count the call as ``texts`` or images."""
    t0 = time.perf_counter()
    results: list[EmbeddingResult | None] = [None] * n
    failure: Exception | None = None
    try:
        with hold() as model:
            fill(model, results, t0)
    except Exception as exc:
        failure = exc
    final = finish_batch(results, failure, t0)
    errors = sum(not r.ok for r in final)
    if texts:
        stats.record_call(texts=len(final), errors=errors, latency_ms=elapsed_ms(t0))
    else:
        stats.record_call(images=len(final), errors=errors, latency_ms=elapsed_ms(t0))
    return final


def warm_up(model: ClipModel) -> dict[str, float]:
    """Zero inputs at batch 1 and the batch limit on each tower; milliseconds per step."""
    timings: dict[str, float] = {}
    size = model.preprocessor.spec.image_size
    for n in sorted({1, model.visual.batch_limit}):
        t0 = time.perf_counter()
        model.visual.run(np.zeros((n, 3, size, size), dtype=np.float32))
        timings[f"visual_b{n}_ms"] = elapsed_ms(t0)
    if model.textual is not None:
        tok = model.textual.tokenizer
        for n in sorted({1, model.textual.batch_limit}):
            t0 = time.perf_counter()
            model.textual.run([tok.probe_row()] * n)
            timings[f"textual_b{n}_ms"] = elapsed_ms(t0)
    log.info("warmup done: %s", ", ".join(f"{k}={v:.1f}" for k, v in timings.items()))
    return timings


def embed_images(
    model: ClipModel,
    pool: DecodePool,
    items: list[ImageData],
    results: list[EmbeddingResult | None],
    t0: float,
    stats: Statistics,
) -> None:
    """Fill ``results`` for ``items``: decode ahead in ``pool``, run batches, normalise.

    Each chunk of ``model.visual.batch_limit`` images is decoded into a preallocated buffer
    while the session runs the chunk before it (``prefetch_batches`` deep); an image the pool
    was told of (:meth:`DecodePool.prefetch`) comes from its decode started earlier. One
    undecodable image fails only its own result.
    """
    executor = pool.executor
    if executor is None:
        raise NotReadyError("the onnx_clip plugin is shut down")
    step = model.visual.batch_limit
    chunks = [list(range(s, min(s + step, len(items)))) for s in range(0, len(items), step)]
    prepare = model.preprocessor

    def submit(idx: list[int]) -> tuple[_Pixels, list[tuple[Future[_Pixels], bool]]]:
        buf = np.empty((len(idx), *prepare.shape), dtype=np.float32)
        decodes: list[tuple[Future[_Pixels], bool]] = []
        for j, i in enumerate(idx):
            early = pool.take(items[i], prepare)
            if early is None:
                decodes.append((executor.submit(prepare, items[i], buf[j]), False))
            else:
                decodes.append((early, True))
        return buf, decodes

    # Decoding of the next ``prefetch_batches`` chunks overlaps the session run of this one.
    ahead = model.config.prefetch_batches
    pending: deque[tuple[_Pixels, list[tuple[Future[_Pixels], bool]]]] = deque()
    submitted = 0
    for k, idx in enumerate(chunks):
        while submitted < len(chunks) and submitted <= k + ahead:
            pending.append(submit(chunks[submitted]))
            submitted += 1
        buf, decodes = pending.popleft()
        good: list[int] = []
        for j, (i, (fut, early)) in enumerate(zip(idx, decodes, strict=True)):
            # exception(), not result(): re-raised here, the decode's error would take this
            # frame into its traceback, and this frame holds the future that holds the error:
            # a reference cycle keeping every image of the call (up to 20 MB each) alive.
            exc = fut.exception()
            if exc is None:
                good.append(j)
                if early:
                    buf[j] = fut.result()
            else:
                results[i] = EmbeddingResult.failure(translate(exc), latency_ms=elapsed_ms(t0))
        if not good:
            continue
        pixels = buf if len(good) == len(idx) else buf[good]
        try:
            embeddings, valid = model.embed_pixels(pixels)
        except Exception as exc:
            failure = translate(exc)
            for j in good:
                results[idx[j]] = EmbeddingResult.failure(failure, latency_ms=elapsed_ms(t0))
            continue
        stats.record_batch(len(good))
        latency = elapsed_ms(t0)
        for row, j in enumerate(good):
            results[idx[j]] = result_of(embeddings[row], bool(valid[row]), latency, model)


def embed_texts(
    model: ClipModel,
    items: list[str],
    results: list[EmbeddingResult | None],
    t0: float,
    stats: Statistics,
    *,
    language: str | None = None,
) -> None:
    """Fill ``results`` for ``items``: tokenise, run length-sorted padded batches, normalise."""
    if model.textual is None:
        raise ConfigError(
            f"model {model.identity.name} has no text tower; configure model.text_path "
            "or use a model directory with textual.onnx"
        )
    tokenizer = model.textual.tokenizer
    valid_idx: list[int] = []
    for i, text in enumerate(items):
        if isinstance(text, str):
            valid_idx.append(i)
        else:
            results[i] = EmbeddingResult.failure(
                TextInputError(f"text must be str, got {type(text).__name__}")
            )
    if not valid_idx:
        return
    batch = tokenizer.encode_batch([items[i] for i in valid_idx], language)
    encoded: list[int] = []  # positions in valid_idx the tokenizer could encode
    for k, i in enumerate(valid_idx):
        if (error := batch.error(k)) is not None:
            results[i] = EmbeddingResult.failure(error)
        else:
            encoded.append(k)
    if not encoded:
        return
    rows = batch.rows if len(encoded) == len(valid_idx) else [batch.rows[k] for k in encoded]
    embeddings, valid = model.embed_token_rows(rows)
    step = model.textual.fixed_batch or model.textual.batch_limit
    for start in range(0, len(encoded), step):
        stats.record_batch(min(step, len(encoded) - start))
    latency = elapsed_ms(t0)
    for row, k in enumerate(encoded):
        results[valid_idx[k]] = result_of(
            embeddings[row],
            bool(valid[row]),
            latency,
            model,
            truncated=batch.truncated[k],
            tokens=len(batch.rows[k]),
        )


def result_of(
    embedding: npt.NDArray[np.float32],
    valid: bool,
    latency_ms: float,
    model: ClipModel,
    *,
    truncated: bool = False,
    tokens: int | None = None,
) -> EmbeddingResult:
    if not valid:
        return EmbeddingResult.failure(
            InferenceError("the model produced a non-finite or zero embedding"),
            latency_ms=latency_ms,
        )
    return EmbeddingResult.succeeded(
        embedding,
        latency_ms=latency_ms,
        model_id=model.identity.model_id,
        truncated=truncated,
        tokens=tokens,
    )


def translate(exc: BaseException) -> BaseException:
    if isinstance(exc, ThemisClipError):
        return exc
    log.exception("unexpected error while embedding", exc_info=exc)
    return InferenceError(f"unexpected {type(exc).__name__}: {exc}")


def elapsed_ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0
