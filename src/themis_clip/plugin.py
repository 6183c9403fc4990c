"""``OnnxClipPlugin``: the seed's ONNX CLIP plugin: lifecycle, inference, statistics, hot swap.

Isolation (the seed's pImpl): every ONNX Runtime object lives in a
:class:`~themis_clip.engine.ClipModel` that the plugin holds by one reference; callers only
see numpy arrays and dataclasses.

Concurrency: no global inference mutex. ONNX Runtime's ``run`` is thread-safe on CPU and CUDA,
so concurrent callers run in parallel and get bit-identical results to serial calls; sessions
that are not thread-safe (DirectML) carry their own lock. Each request holds the model it
started with (an in-flight count on that model), so a hot swap never changes the model under a
running request, and a batch is always computed wholly by one model.

Hot swap (:meth:`OnnxClipPlugin.reload_model`, orchestrated in :mod:`.hotswap`) loads and
validates the new model beside the serving one, activates it by one reference swap, then retires
the old one; sessions are never closed under a running ``run`` call.

The class is a facade over its parts: :mod:`.loading` (load a model), :mod:`.pipeline` (the
embedding calls), :mod:`.zeroshot` (classify, rank, label cache), :mod:`.hotswap` (reload),
:mod:`.info` (``PluginInfo`` and capabilities) and :mod:`.stats`.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.budget import PixelBudget
from themis_clip.config import PluginConfig, PreprocessConfig
from themis_clip.engine import ClipModel
from themis_clip.errors import ConfigError, NotReadyError
from themis_clip.hotswap import (
    PluginState,
    ReloadReport,
    SpaceGuard,
    SwapRecord,
    describe_error,
    validate,
)
from themis_clip.hotswap import reload as reload_with
from themis_clip.interface import (
    BackendType,
    EmbeddingResult,
    ImageAnalysisBackend,
    ImageData,
    ImageMetadata,
    PluginInfo,
)
from themis_clip.introspection import plugin_info, statistics
from themis_clip.loading import declared_preprocessor, load_model
from themis_clip.models.hashing import HashFunction, sha256_file
from themis_clip.models.spec import ModelSpec
from themis_clip.pipeline import (
    DecodePool,
    elapsed_ms,
    embed_image,
    embed_images,
    embed_texts,
    run_batch,
    translate,
    warm_up,
)
from themis_clip.preprocess.image import ImagePreprocessor
from themis_clip.runtime import ORTSession, create_session
from themis_clip.stats import Statistics
from themis_clip.vocabulary import ModelIdentity
from themis_clip.zeroshot import DEFAULT_TEMPLATE, MAX_LABELS, LabelScore, Ranked, ZeroShot

__all__ = ["OnnxClipPlugin", "PluginState", "ReloadReport"]

log = logging.getLogger(__name__)


class OnnxClipPlugin(ImageAnalysisBackend):
    """CLIP image and text embeddings on ONNX Runtime.

    Args:
        hash_fn: SHA-256 function for model files (seed step 4: injectable).
        available_providers: override what ONNX Runtime reports (tests, forced policies).
        session_factory: creates sessions (tests inject failures here).
        lazy_textual: open the text tower on its first use (image-only callers start faster).
    """

    NAME = "onnx_clip"

    def __init__(
        self,
        *,
        hash_fn: HashFunction = sha256_file,
        available_providers: Sequence[str] | None = None,
        session_factory: Callable[..., ORTSession] = create_session,
        lazy_textual: bool = False,
    ) -> None:
        self._available = list(available_providers) if available_providers is not None else None
        self._open_model = functools.partial(
            load_model, hash_fn=hash_fn, session_factory=session_factory, lazy_textual=lazy_textual
        )
        self._model: ClipModel | None = None
        self._model_lock = threading.Lock()  # guards the _model reference and acquire()
        self._admin_lock = threading.RLock()  # serialises initialize / reload / shutdown
        self._pool = DecodePool()
        self._zeroshot = ZeroShot(self, lambda: self._model)
        self._config: PluginConfig | None = None
        self._requested_backend = BackendType.AUTO
        self._stats = Statistics()
        self._swap = SwapRecord()
        self._last_health: bool | None = None
        self.last_error: str | None = None

    # -- the seed's interface ------------------------------------------------------------------

    def get_info(self) -> PluginInfo:
        """ThemisDB's ``PluginInfo``, filled from the loaded model and this runtime.

        ``min_memory_mb`` / ``recommended_memory_mb`` are estimates from the loaded model:
        its files (the weights ONNX Runtime holds) plus 100 MB of runtime, and twice the files
        plus the decode buffers of ``prefetch_batches + 1`` batches plus 300 MB; before
        ``initialize`` they keep the header's defaults (2048 / 8192).
        """
        return plugin_info(self.NAME, self._model, self._available)

    def initialize(self, config: PluginConfig, backend: BackendType = BackendType.AUTO) -> bool:
        """Load the model in ``config``; False on failure with the reason in ``last_error``.

        ``backend`` wins over ``config.backend`` unless it is AUTO. Calling ``initialize`` on
        an initialised plugin shuts the old model down first.
        """
        if not isinstance(config, PluginConfig):
            self.last_error = f"config must be a PluginConfig, got {type(config).__name__}"
            return False
        with self._admin_lock:
            if self._model is not None:
                self.shutdown()
            # Compared by value: "auto" (a str) is AUTO too and must not override config.backend.
            requested = BackendType(backend)
            if requested is BackendType.AUTO:
                requested = config.backend
            self._swap.set_state(PluginState.LOADING)
            try:
                model = self._load(config, requested)
            except Exception as exc:
                self._swap.set_state(PluginState.ERROR)
                self.last_error = describe_error(exc)
                log.error("initialize failed: %s", self.last_error)
                return False
            model.generation = 1
            self._pool.resize(config.preprocess_workers)()
            self._config = config
            self._requested_backend = requested
            self._stats.reset()
            with self._model_lock:
                self._model = model
            self._swap.set_state(PluginState.READY)
            self.last_error = None
            return True

    def stop_runs(self, reason: str) -> None:
        """Stop the model's session runs in flight (each such call fails with ``reason``);
        the model stays loaded."""
        model = self._model
        if model is not None:
            model.stop_runs(reason)

    def shutdown(self, drain_timeout_s: float | None = None) -> None:
        """Release sessions after in-flight requests, waiting at most ``drain_timeout_s``
        (None: the config's ``drain_timeout_s``), then stopping the runs still going; reset
        stats."""
        with self._admin_lock:
            with self._model_lock:
                model, self._model = self._model, None
            if model is not None:
                if drain_timeout_s is None:
                    drain_timeout_s = self._config.drain_timeout_s if self._config else 30.0
                model.retire(drain_timeout_s)
            self._pool.shutdown()
            self._stats.reset()
            self._swap.reset()
            self._last_health = None
            self._swap.set_state(PluginState.UNINITIALIZED)
            log.info("plugin shut down")

    def is_ready(self) -> bool:
        return self._model is not None

    def get_backend(self) -> BackendType:
        """The backend the active session really runs on (AUTO before initialisation)."""
        model = self._model
        return model.backend if model is not None else BackendType.AUTO

    @property
    def model_identity(self) -> ModelIdentity | None:
        """Name, SHA-256 and dimension of the active model: what makes vectors comparable."""
        model = self._model
        return model.identity if model is not None else None

    @property
    def model_spec(self) -> ModelSpec | None:
        """What the active model's directory declares (layout, files, image and text specs)."""
        model = self._model
        return model.spec if model is not None else None

    @property
    def scoring(self) -> dict[str, float | None]:
        """The loaded model's zero-shot constants: ``logit_scale`` and ``logit_bias``."""
        model = self._model
        spec = model.spec if model is not None else None
        return {
            "logit_scale": spec.logit_scale if spec else None,
            "logit_bias": spec.logit_bias if spec else None,
        }

    @property
    def config(self) -> PluginConfig | None:
        return self._config

    # -- embeddings ----------------------------------------------------------------------------

    def generate_embedding(
        self, image_data: ImageData, metadata: ImageMetadata | Mapping[str, Any] | None = None
    ) -> EmbeddingResult:
        """Embed one image. Never raises: failures come back as ``ok=False`` with a message.

        ``metadata`` is passed through to the result. An :class:`ImageMetadata` is also used:
        its ``format`` as a decoding hint, its EXIF orientation for images without their own
        (see :class:`~themis_clip.interface.ImageMetadata` for what is only carried).
        """
        t0 = time.perf_counter()
        try:
            with self._hold() as model:
                result = embed_image(model, image_data, metadata, t0, self._stats)
        except Exception as exc:
            result = EmbeddingResult.failure(
                translate(exc), latency_ms=elapsed_ms(t0), metadata=metadata
            )
        self._stats.record_call(
            images=1, errors=0 if result.ok else 1, latency_ms=result.latency_ms
        )
        return result

    def generate_embedding_batch(self, images: Sequence[ImageData]) -> list[EmbeddingResult]:
        """Embed many images: parallel decoding, batched session runs of ``max_batch_size``.

        One bad item fails only its own result. All results of one call come from one model.
        """
        items = list(images)
        return run_batch(
            self._hold,
            len(items),
            lambda model, results, t0: embed_images(
                model, self._pool, items, results, t0, self._stats
            ),
            self._stats,
            texts=False,
        )

    def prefetch(
        self, paths: Sequence[str | os.PathLike[str]], config: PluginConfig | None = None
    ) -> None:
        """Start decoding ``paths``, the files the next :meth:`generate_embedding_batch` calls
        will name, in that order (an indexer knows them before it asks).

        ``config`` is the one :meth:`initialize` is opening in another thread (default: the
        active one): its model's declared preprocessing lets the files decode while the
        session still opens. The decodes share the plugin's threads and pixel budget; a model
        that opens with other preprocessing decodes them again. No paths: drop what was named.
        """
        config = config or self._config
        model = self._model
        pre: ImagePreprocessor | None = None
        if config is not None and model is not None and config is self._config:
            pre = model.preprocessor
        elif config is not None:
            budget = self._pool.budget_for(config.preprocess.pixel_budget)
            pre = declared_preprocessor(config, budget=budget)
        if config is None or pre is None or not paths:
            self._pool.prefetch(None, (), 0)
            return
        self._pool.resize(config.preprocess_workers)()
        self._pool.prefetch(pre, paths, (config.prefetch_batches + 1) * config.max_batch_size)

    def generate_text_embedding(self, text: str, language: str | None = None) -> EmbeddingResult:
        """Embed one text; ``truncated`` says whether it was cut to the context length.

        ``language``: a Flores-200 code (``"eng_Latn"``) for models that take a language prefix
        (NLLB-SigLIP); other models ignore it. A model that needs one and declares no default
        fails with ``TextInputError`` when none is given.
        """
        return self.generate_text_embedding_batch([text], language=language)[0]

    # -- zero-shot classification ---------------------------------------------------------------

    def classify(
        self,
        image_data: ImageData,
        labels: Sequence[str],
        *,
        template: str = DEFAULT_TEMPLATE,
        max_labels: int = MAX_LABELS,
    ) -> list[LabelScore]:
        """Zero-shot classification of one image against ``labels`` (in label order).

        Each label becomes the prompt ``template.format(label)``; probabilities are a softmax
        over ``logit_scale * cosine`` (CLIP), or a sigmoid of ``logit_scale * cosine +
        logit_bias`` for models that record a bias (SigLIP). Label embeddings are cached per
        model.

        Raises:
            InputError: no labels, too many, an empty label, a template without one ``{}``,
                or an image that cannot be embedded (its own error class).
            ConfigError: the model has no text tower. NotReadyError: not initialised.
        """
        return self._zeroshot.classify(image_data, labels, template=template, max_labels=max_labels)

    def classify_embedding(
        self,
        embedding: npt.NDArray[np.float32],
        labels: Sequence[str],
        *,
        template: str = DEFAULT_TEMPLATE,
        max_labels: int = MAX_LABELS,
    ) -> list[LabelScore]:
        """:meth:`classify` for an image already embedded by this model (a stored vector)."""
        return self._zeroshot.classify_embedding(
            embedding, labels, template=template, max_labels=max_labels
        )

    def rank(
        self,
        query: ImageData | str,
        candidates: Sequence[ImageData] | Sequence[str],
        *,
        language: str | None = None,
        max_candidates: int = MAX_LABELS,
    ) -> list[Ranked]:
        """Rank ``candidates`` against ``query``, best first (clip-as-service's ``/rank``).

        A ``str`` query is text and ranks images (bytes, paths, PIL images, arrays); any other
        query is an image and ranks texts. Probabilities follow the model's scoring: a softmax
        over the candidates (CLIP) or a sigmoid each (SigLIP).

        Raises:
            InputError: no candidates, too many, candidates of the wrong kind, or an input that
                cannot be embedded (its own error class).
        """
        return self._zeroshot.rank(
            query, candidates, language=language, max_candidates=max_candidates
        )

    def generate_text_embedding_batch(
        self, texts: Sequence[str], language: str | None = None
    ) -> list[EmbeddingResult]:
        """Embed many texts in length-sorted batches, padded as the model's text description
        says (to the longest row for CLIP, to the full context for last-token pooling);
        ``language`` as in :meth:`generate_text_embedding`."""
        items = list(texts)
        return run_batch(
            self._hold,
            len(items),
            lambda model, results, t0: embed_texts(
                model, items, results, t0, self._stats, language=language
            ),
            self._stats,
            texts=True,
        )

    # -- model-only calls (benchmarks, verification) --------------------------------------

    def preprocess(self, image_data: ImageData) -> npt.NDArray[np.float32]:
        """The ``(3, S, S)`` float32 tensor the active model's image tower receives.

        Raises:
            NotReadyError: not initialised. InputError: undecodable image.
        """
        with self._hold() as model:
            return model.preprocessor(image_data)

    def tokenize(self, texts: Sequence[str], language: str | None = None) -> list[list[int]]:
        """Token rows (start and end tokens included, truncated) the text tower receives;
        ``language`` as in :meth:`generate_text_embedding`.

        Raises:
            NotReadyError: not initialised. ConfigError: the model has no text tower.
            TextInputError: the tokenizer failed on a text.
        """
        with self._hold() as model:
            if model.textual is None:
                raise ConfigError(f"model {model.identity.name} has no text tower")
            batch = model.textual.tokenizer.encode_batch(list(texts), language)
            batch.raise_first()
            return [list(r) for r in batch.rows]

    def embed_pixels(self, pixels: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Embed an already preprocessed batch ``(n, 3, S, S)``: session run + normalisation.

        Raises:
            NotReadyError: not initialised. InferenceError: the session failed.
        """
        with self._hold() as model:
            embeddings, _ = model.embed_pixels(np.ascontiguousarray(pixels, dtype=np.float32))
            return embeddings

    def embed_tokens(self, rows: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        """Embed token rows (as :meth:`tokenize` returns them): session run + normalisation.

        Raises:
            NotReadyError: not initialised. ModelFormatError: no text tower.
        """
        with self._hold() as model:
            embeddings, _ = model.embed_token_rows(rows)
            return embeddings

    def health_check(self) -> bool:
        """Run an inference on each tower and check shape ``[1, embedding_dim]`` and finiteness."""
        try:
            with self._hold() as model:
                ok = validate(model)
        except Exception as exc:
            log.warning("health check failed: %s", describe_error(exc))
            ok = False
        self._last_health = ok
        return ok

    def warmup(self) -> Mapping[str, float]:
        """Run zero inputs at batch 1 and ``max_batch_size`` on each tower.

        Returns:
            milliseconds per step, e.g. ``{"visual_b1_ms": ..., "visual_b32_ms": ...}``.

        Raises:
            NotReadyError: the plugin is not initialised.
        """
        with self._hold() as model:
            return warm_up(model)

    def get_statistics(self) -> dict[str, Any]:
        """JSON-serialisable statistics (the seed's calls, avg_latency_ms, backend, ...)."""
        return statistics(self._stats, self._model, self._swap, self._pool, self._last_health)

    # -- hot swap ------------------------------------------------------------------------------

    def reload_model(
        self,
        new_config: PluginConfig,
        *,
        space_guard: SpaceGuard | None = None,
    ) -> bool:
        """Swap in the model of ``new_config`` without stopping service (ThemisDB's reload_model).

        Any model that loads, hashes and validates is accepted, as in the seed (whose own
        example moves to a 768-d model). When the embedding space changes (another name,
        SHA-256 or dimension) the log says so at warning level and :attr:`last_reload` /
        ``get_statistics()["last_reload"]`` report both identities. Strict mode,
        ``allow_embedding_space_change: false`` in the new config, refuses such a reload.

        Args:
            new_config: the configuration to run from now on.
            space_guard: called with ``(old, new)`` identities before activation when the
                space changes; raising refuses the reload (the HTTP service uses this to
                protect an attached index).

        Returns:
            True when the new model is active. False (old model still active and serving)
            when the plugin is not initialised, or loading, hashing, validation, the strict
            check or ``space_guard`` failed; the reason is in ``last_error``.

        States (``get_statistics()["state"]``, ``["state_history"]``): READY → LOADING →
        VALIDATING → ACTIVATING (swap, then drain of the old model) → READY; on failure
        LOADING or VALIDATING → ERROR (the new model is released) → READY with the old model.
        """
        if self._model is None:  # fail fast, without waiting for a running reload
            self.last_error = "reload_model: the plugin is not initialised"
            return False
        with self._admin_lock:
            old = self._model
            if old is None:  # shut down while we waited for the lock
                self.last_error = "reload_model: the plugin is not initialised"
                return False
            backend = self._requested_backend
            report = reload_with(
                self._swap,
                old,
                new_config,
                load=lambda c: self._load(
                    c, backend if c.backend is BackendType.AUTO else c.backend
                ),
                activate=self._activate,
                space_guard=space_guard,
            )
            self.last_error = report.error
            return report.ok

    @property
    def last_reload(self) -> ReloadReport | None:
        """What the last ``reload_model`` call did (None before the first one)."""
        return self._swap.last_report

    def _activate(self, model: ClipModel, config: PluginConfig) -> Callable[[], None]:
        """Make ``model`` and ``config`` active; returns the clean-up to run once drained."""
        after_drain = self._pool.resize(config.preprocess_workers)
        with self._model_lock:
            self._model = model
        self._config = config
        return after_drain

    # -- internals -----------------------------------------------------------------------------

    @property
    def pixel_budget(self) -> PixelBudget:
        """The decoded-pixel budget every image decode of this plugin shares (thumbnails too)."""
        if self._pool.budget is None:
            pre = self._config.preprocess if self._config else PreprocessConfig()
            return self._pool.budget_for(pre.pixel_budget)
        return self._pool.budget

    def _load(self, config: PluginConfig, backend: BackendType) -> ClipModel:
        budget = self._pool.budget_for(config.preprocess.pixel_budget)
        return self._open_model(config, backend, available=self._available, budget=budget)

    @contextmanager
    def _hold(self) -> Iterator[ClipModel]:
        with self._model_lock:
            model = self._model
            if model is None or not model.acquire():
                raise NotReadyError("the onnx_clip plugin is not initialised (call initialize())")
        try:
            yield model
        finally:
            model.release()
