"""The embedding pipeline of one call: decode-ahead image batches and sorted text batches.

Pure functions over a loaded :class:`~themis_clip.engine.ClipModel`; the plugin holds the model
(in-flight counted) and hands in its decode pool and statistics.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.engine import ClipModel
from themis_clip.errors import (
    ConfigError,
    InferenceError,
    NotReadyError,
    TextInputError,
    ThemisClipError,
)
from themis_clip.interface import EmbeddingResult, ImageData
from themis_clip.stats import Statistics

__all__ = ["elapsed_ms", "embed_images", "embed_texts", "result_of", "translate"]

log = logging.getLogger("themis_clip.plugin")


def embed_images(
    model: ClipModel,
    executor: ThreadPoolExecutor | None,
    items: list[ImageData],
    results: list[EmbeddingResult | None],
    t0: float,
    stats: Statistics,
) -> None:
    """Fill ``results`` for ``items``: decode ahead in ``executor``, run batches, normalise.

    Each chunk of ``model.visual.batch_limit`` images is decoded into a preallocated buffer
    while the session runs the chunk before it (``prefetch_batches`` deep); one undecodable
    image fails only its own result.
    """
    if executor is None:
        raise NotReadyError("the onnx_clip plugin is shut down")
    step = model.visual.batch_limit
    chunks = [list(range(s, min(s + step, len(items)))) for s in range(0, len(items), step)]
    prepare = model.preprocessor

    def submit(idx: list[int]) -> tuple[npt.NDArray[np.float32], list[Future[Any]]]:
        buf = np.empty((len(idx), *prepare.shape), dtype=np.float32)
        return buf, [executor.submit(prepare, items[i], buf[j]) for j, i in enumerate(idx)]

    # Decoding of the next ``prefetch_batches`` chunks overlaps the session run of this one.
    ahead = model.config.prefetch_batches
    pending: deque[tuple[npt.NDArray[np.float32], list[Future[Any]]]] = deque()
    submitted = 0
    for k, idx in enumerate(chunks):
        while submitted < len(chunks) and submitted <= k + ahead:
            pending.append(submit(chunks[submitted]))
            submitted += 1
        buf, futures = pending.popleft()
        good: list[int] = []
        for j, (i, fut) in enumerate(zip(idx, futures, strict=True)):
            try:
                fut.result()
                good.append(j)
            except Exception as exc:
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
    embeddings, valid = model.embed_token_rows(batch.rows)
    step = model.textual.fixed_batch or model.textual.batch_limit
    for start in range(0, len(valid_idx), step):
        stats.record_batch(min(step, len(valid_idx) - start))
    latency = elapsed_ms(t0)
    for row, i in enumerate(valid_idx):
        results[i] = result_of(
            embeddings[row],
            bool(valid[row]),
            latency,
            model,
            truncated=batch.truncated[row],
            tokens=len(batch.rows[row]),
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
