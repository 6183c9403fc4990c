"""Decoding a known run of image files ahead of the model, from before it is open.

:meth:`OnnxClipPlugin.generate_embedding_batch <themis_clip.plugin.OnnxClipPlugin.
generate_embedding_batch>` decodes its images and runs them, once the model is open. An indexer
knows its files before that: :class:`DecodeAhead` decodes them in order, a window ahead, with the
preprocessing the model will use (:func:`~themis_clip.loading.declared_preprocessor`), starting
while the session still opens (ViT-B/32 takes one core about 0.6 s there, leaving the others idle)
and going on across the indexer's calls. Each call's images are embedded through the plugin's
session in the batches the plugin itself would form (``max_batch_size`` from the call's start, an
undecodable image left out of its batch), so the vectors are the plugin's to the bit. Images it
was not told of, or a model whose preprocessing turns out other than declared, go to the
plugin's own batch call.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt

from themis_clip.errors import InferenceError
from themis_clip.interface import EmbeddingResult, ImageData
from themis_clip.loading import declared_preprocessor
from themis_clip.pipeline import elapsed_ms, translate
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.preprocess.image import ImagePreprocessor

__all__ = ["DecodeAhead"]

_Pixels = npt.NDArray[np.float32]


class DecodeAhead:
    """An ``ImageEmbedder`` for :func:`~themis_clip.index.indexer.index_folder` that decodes the
    files :meth:`prefetch` names ahead, in ``workers`` threads, at most ``window`` images ahead
    of the calls; ``plugin()`` gives the open plugin (it may wait for it to open, and raises
    what opening it raised). Close it (or use it as a context manager) to stop its threads.
    """

    def __init__(
        self,
        preprocessor: ImagePreprocessor,
        plugin: Callable[[], OnnxClipPlugin],
        *,
        workers: int | None = None,
        window: int = 64,
    ) -> None:
        self._pre = preprocessor
        self._plugin = plugin
        self._pool = ThreadPoolExecutor(
            workers or min(4, os.cpu_count() or 1), thread_name_prefix="themis-decode-ahead"
        )
        self._window = max(1, window)
        self._queue: deque[tuple[str, Future[_Pixels]]] = deque()
        self._todo: deque[str] = deque()
        self._ahead: set[str] = set()  # keys queued or still to queue
        self._checked = False

    def prefetch(self, paths: Sequence[Path | str]) -> None:
        """Start decoding ``paths``, the images the next calls will ask for, in their order."""
        self._drop()
        self._todo.extend(os.fspath(p) for p in paths)
        self._ahead.update(self._todo)
        self._fill()

    def generate_embedding_batch(self, images: Sequence[ImageData]) -> list[EmbeddingResult]:
        """The plugin's results for ``images``: decoded ahead where they were named in order,
        else by the plugin's own batch call."""
        plugin = self._plugin()
        if not self._checked:  # the model opened: is its preprocessing the one decoded with?
            self._checked = True
            config, spec = plugin.config, plugin.model_spec
            if (
                config is None
                or spec is None
                or declared_preprocessor(config, spec=spec) != self._pre
            ):
                self._drop()
        items = list(images)
        t0 = time.perf_counter()
        results: list[EmbeddingResult | None] = [None] * len(items)
        taken = [self._take(item) for item in items[:1]]
        if not taken or taken[0] is None:
            return plugin.generate_embedding_batch(items)
        step = plugin.config.max_batch_size if plugin.config else 32
        others: list[int] = []
        for start in range(0, len(items), step):
            batch: list[tuple[int, Future[_Pixels]]] = []
            for i in range(start, min(start + step, len(items))):
                fut = taken[0] if i == 0 else self._take(items[i])
                if fut is None:
                    others.append(i)
                else:
                    batch.append((i, fut))
            self._embed(plugin, batch, results, t0)
        if others:  # named out of order: the plugin decodes these itself
            rest = plugin.generate_embedding_batch([items[i] for i in others])
            for i, r in zip(others, rest, strict=True):
                results[i] = r
        return [r or EmbeddingResult.failure(InferenceError("not processed")) for r in results]

    def close(self) -> None:
        self._drop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> DecodeAhead:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _embed(
        self,
        plugin: OnnxClipPlugin,
        batch: list[tuple[int, Future[_Pixels]]],
        results: list[EmbeddingResult | None],
        t0: float,
    ) -> None:
        good: list[tuple[int, _Pixels]] = []
        for i, fut in batch:
            # exception() first: a decode error re-raised here would make a reference cycle
            # (this frame holds the futures, the error's traceback this frame)
            exc = fut.exception()
            if exc is None:
                good.append((i, fut.result()))
            else:  # this image only
                results[i] = EmbeddingResult.failure(translate(exc), latency_ms=elapsed_ms(t0))
        if not good:
            return
        try:
            embeddings = plugin.embed_pixels(np.stack([pixels for _, pixels in good]))
        except Exception as exc:
            failure = translate(exc)
            for i, _ in good:
                results[i] = EmbeddingResult.failure(failure, latency_ms=elapsed_ms(t0))
            return
        identity = plugin.model_identity
        model_id = identity.model_id if identity is not None else None
        latency = elapsed_ms(t0)
        for row, (i, _) in enumerate(good):
            # embed_pixels leaves a row it could not normalise (non-finite, zero) at zeros
            if np.any(embeddings[row]):
                results[i] = EmbeddingResult.succeeded(
                    embeddings[row], latency_ms=latency, model_id=model_id
                )
            else:
                results[i] = EmbeddingResult.failure(
                    InferenceError("the model produced a non-finite or zero embedding"),
                    latency_ms=latency,
                )

    def _take(self, item: ImageData) -> Future[_Pixels] | None:
        """The decode of ``item`` if it was named (those named before it are dropped)."""
        if not isinstance(item, str | os.PathLike) or os.fspath(item) not in self._ahead:
            return None
        key = os.fspath(item)
        while True:
            self._fill()
            name, fut = self._queue.popleft()
            self._ahead.discard(name)
            if name == key:
                self._fill()
                return fut
            fut.cancel()

    def _fill(self) -> None:
        while self._todo and len(self._queue) < self._window:
            key = self._todo.popleft()
            self._queue.append((key, self._pool.submit(self._pre, key)))

    def _drop(self) -> None:
        for _, fut in self._queue:
            fut.cancel()
        self._queue.clear()
        self._todo.clear()
        self._ahead.clear()
