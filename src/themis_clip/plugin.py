"""``OnnxClipPlugin``: the seed's ONNX CLIP plugin: lifecycle, inference, statistics, hot swap.

Isolation (the seed's pImpl): every ONNX Runtime object lives in a
:class:`~themis_clip.engine.ClipModel` that the plugin holds by one reference; callers only
see numpy arrays and dataclasses.

Concurrency: no global inference mutex. ONNX Runtime's ``run`` is thread-safe on CPU and CUDA,
so concurrent callers run in parallel and get bit-identical results to serial calls; sessions
that are not thread-safe (DirectML) carry their own lock. Each request holds the model it
started with (an in-flight count on that model), so a hot swap never changes the model under a
running request, and a batch is always computed wholly by one model.

Hot swap (:meth:`OnnxClipPlugin.reload_model`), improving on the seed's drain-then-swap: the new
model is loaded and validated beside the old one while the old one keeps serving; activation
is one reference swap, so new requests never wait for a drain. The old model is then retired:
the reload waits up to ``drain_timeout_s`` for its in-flight requests and releases its sessions.
**On drain timeout** the reload still succeeds (the new model is active and no request fails);
the old model's sessions are released by its last in-flight request when that finishes, and
``drain_timeouts`` counts the event. Sessions are never closed under a running ``run`` call.


Size: this module is the seed's whole public surface in one class (lifecycle, four embedding
calls, model-only calls, health, warmup, statistics, hot-swap orchestration), each method thin
over :mod:`.engine`, :mod:`.loading`, :mod:`.pipeline` and :mod:`.hotswap`; splitting the class
would split the API the seed names.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip._version import __version__
from themis_clip.budget import PixelBudget
from themis_clip.config import PluginConfig, PreprocessConfig
from themis_clip.engine import ClipModel
from themis_clip.errors import (
    ConfigError,
    InferenceError,
    InputError,
    ModelMismatchError,
    NotReadyError,
    ThemisClipError,
)
from themis_clip.hotswap import (
    PluginState,
    ReloadReport,
    check_same_space,
    space_changed,
    validate,
)
from themis_clip.interface import (
    BackendType,
    EmbeddingResult,
    ImageAnalysisBackend,
    ImageData,
    ImageFormat,
    ImageMetadata,
    PluginCapabilities,
    PluginInfo,
)
from themis_clip.loading import load_model
from themis_clip.models.hashing import HashFunction, sha256_file
from themis_clip.models.spec import ModelSpec
from themis_clip.pipeline import elapsed_ms, embed_images, embed_texts, translate
from themis_clip.runtime import ORTSession, create_session
from themis_clip.stats import Statistics
from themis_clip.vocabulary import ModelIdentity
from themis_clip.zeroshot import (
    DEFAULT_TEMPLATE,
    MAX_LABELS,
    LabelScore,
    Ranked,
    check_labels,
    label_prompts,
    rank_scores,
    score_labels,
)

__all__ = ["OnnxClipPlugin", "PluginState", "ReloadReport"]

log = logging.getLogger(__name__)

_PILLOW_FORMAT = {
    ImageFormat.JPEG: "JPEG",
    ImageFormat.PNG: "PNG",
    ImageFormat.BMP: "BMP",
    ImageFormat.TIFF: "TIFF",
    ImageFormat.WEBP: "WEBP",
    ImageFormat.GIF: "GIF",
}


_NO_MODEL: dict[str, Any] = {
    "backend": BackendType.AUTO.value,
    "providers": [],
    "model_variant": None,
    "model_id": None,
    "model_sha256": None,
    "precision_variant": None,
    "embedding_dim": None,
    "image_size": None,
    "text_tower": False,
    "generation": 0,
    "in_flight": 0,
    "loading_mode": None,
    "loading_note": None,
    "optimized_model_cache": {},
}


class OnnxClipPlugin(ImageAnalysisBackend):
    """CLIP image and text embeddings on ONNX Runtime.

    Args:
        hash_fn: SHA-256 function for model files (seed step 4: injectable).
        available_providers: override what ONNX Runtime reports (tests, forced policies).
        session_factory: creates sessions (tests inject failures here).
    """

    NAME = "onnx_clip"

    def __init__(
        self,
        *,
        hash_fn: HashFunction = sha256_file,
        available_providers: Sequence[str] | None = None,
        session_factory: Callable[..., ORTSession] = create_session,
    ) -> None:
        self._hash_fn = hash_fn
        self._available = list(available_providers) if available_providers is not None else None
        self._session_factory = session_factory
        self._model: ClipModel | None = None
        self._model_lock = threading.Lock()  # guards the _model reference and acquire()
        self._admin_lock = threading.RLock()  # serialises initialize / reload / shutdown
        self._executor: ThreadPoolExecutor | None = None
        self._executor_workers = 0
        self._budget: PixelBudget | None = None  # decoded pixels in flight, across models
        self._label_cache: OrderedDict[tuple[str, str], npt.NDArray[np.float32]] = OrderedDict()
        self._label_lock = threading.Lock()
        self._config: PluginConfig | None = None
        self._requested_backend = BackendType.AUTO
        self._stats = Statistics()
        self._state = PluginState.UNINITIALIZED
        self._state_history: deque[str] = deque([self._state.value], maxlen=32)
        self._last_reload: ReloadReport | None = None
        self._reload_counts = {"reloads": 0, "reload_failures": 0, "drain_timeouts": 0}
        self._last_reload_error: str | None = None
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
        from themis_clip.preprocess.image import readable_formats
        from themis_clip.runtime import available_providers, supported_backends

        model = self._model
        available = self._available if self._available is not None else available_providers()
        min_mb, recommended_mb = 2048, 8192  # the header's defaults: nothing loaded yet
        if model is not None:
            files_mb = sum(p.stat().st_size for p in model.spec.model_files() if p.is_file())
            files_mb //= 2**20
            size = model.preprocessor.spec.image_size
            config = model.config
            buffers_mb = (
                (config.prefetch_batches + 1) * config.max_batch_size * 3 * size * size * 4
            ) // 2**20
            min_mb, recommended_mb = files_mb + 100, 2 * files_mb + buffers_mb + 300
        capabilities = PluginCapabilities(
            supports_embedding=True,
            supports_batch_processing=True,
            supports_streaming=False,
            thread_safe=True,
            supported_backends=tuple(supported_backends(available)),
            features=(
                "image_embedding",
                "text_embedding",
                "batch_embedding",
                "hot_reload",
                "health_check",
                "warmup",
            ),
            min_memory_mb=min_mb,
            recommended_memory_mb=recommended_mb,
        )
        return PluginInfo(
            name=self.NAME,
            version=__version__,
            description="OpenAI CLIP models exported to ONNX, on ONNX Runtime: L2-normalised "
            "image and text embeddings for multi-modal vector search",
            author="themis-clip developers",
            license="MIT",
            model_name=model.identity.name if model else "",
            model_version=model.identity.sha256[:12] if model else "",
            supported_formats=readable_formats(),
            capabilities=capabilities,
        )

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
            self._set_state(PluginState.LOADING)
            try:
                model = self._load(config, requested)
            except Exception as exc:
                self._set_state(PluginState.ERROR)
                self.last_error = _describe(exc)
                log.error("initialize failed: %s", self.last_error)
                return False
            model.generation = 1
            self._executor_workers = _workers(config)
            self._executor = ThreadPoolExecutor(
                self._executor_workers, thread_name_prefix="themis-preprocess"
            )
            self._config = config
            self._requested_backend = requested
            self._stats.reset()
            with self._model_lock:
                self._model = model
            self._set_state(PluginState.READY)
            self.last_error = None
            return True

    def shutdown(self) -> None:
        """Release sessions (after in-flight requests, bounded by drain_timeout_s); reset stats."""
        with self._admin_lock:
            with self._model_lock:
                model, self._model = self._model, None
            if model is not None:
                timeout = self._config.drain_timeout_s if self._config else 30.0
                model.retire(timeout)
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None
            self._stats.reset()
            self._reload_counts = dict.fromkeys(self._reload_counts, 0)
            self._last_reload_error = None
            self._last_health = None
            self._last_reload = None
            self._set_state(PluginState.UNINITIALIZED)
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
    def takes_language(self) -> bool:
        """Whether the loaded model's text tower reads a language code (else one is ignored)."""
        model = self._model
        return model is not None and model.spec.text.language_prefix is not None

    @property
    def model_spec(self) -> ModelSpec | None:
        """What the loaded model's directory declares (name, layout, context length, ...)."""
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
        hints: dict[str, Any] = {}
        if isinstance(metadata, ImageMetadata):
            hints = {"format_hint": _PILLOW_FORMAT.get(metadata.format)}
            hints["orientation"] = metadata.orientation
        try:
            with self._hold() as model:
                pixels = model.preprocessor(image_data, **hints)[None]
                embeddings, valid = model.embed_pixels(pixels)
                self._stats.record_batch(1)
                model_id = model.identity.model_id
            if not valid[0]:
                raise InferenceError("the model produced a non-finite or zero embedding")
            result = EmbeddingResult.succeeded(
                embeddings[0], latency_ms=elapsed_ms(t0), model_id=model_id, metadata=metadata
            )
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
        t0 = time.perf_counter()
        items = list(images)
        results: list[EmbeddingResult | None] = [None] * len(items)
        try:
            with self._hold() as model:
                embed_images(model, self._executor, items, results, t0, self._stats)
        except Exception as exc:
            failure = translate(exc)
            results = [
                r or EmbeddingResult.failure(failure, latency_ms=elapsed_ms(t0)) for r in results
            ]
        final = [
            r if r is not None else EmbeddingResult.failure(InferenceError("not processed"))
            for r in results
        ]
        errors = sum(not r.ok for r in final)
        self._stats.record_call(images=len(final), errors=errors, latency_ms=elapsed_ms(t0))
        return final

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
        check_labels(labels, template, max_labels)
        result = self.generate_embedding(image_data)
        if not result.ok or result.embedding is None:
            raise _raised(result)
        return self.classify_embedding(
            result.embedding, labels, template=template, max_labels=max_labels
        )

    def classify_embedding(
        self,
        embedding: npt.NDArray[np.float32],
        labels: Sequence[str],
        *,
        template: str = DEFAULT_TEMPLATE,
        max_labels: int = MAX_LABELS,
    ) -> list[LabelScore]:
        """:meth:`classify` for an image already embedded by this model (a stored vector)."""
        check_labels(labels, template, max_labels)
        model = self._model
        if model is None:
            raise NotReadyError("the onnx_clip plugin is not initialised (call initialize())")
        vectors = self._label_vectors(model, label_prompts(labels, template))
        vector = np.asarray(embedding, dtype=np.float32).reshape(-1)
        if vector.shape != (vectors.shape[1],):
            raise InputError(
                f"embedding has {vector.size} dimensions, this model's {vectors.shape[1]}"
            )
        return score_labels(
            vector,
            vectors,
            labels,
            logit_scale=model.spec.logit_scale,
            logit_bias=model.spec.logit_bias,
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
        items = list(candidates)
        if not items:
            raise InputError("candidates: at least one is required")
        if len(items) > max_candidates:
            raise InputError(f"candidates: {len(items)} given, at most {max_candidates}")
        text_query = isinstance(query, str)
        if text_query:
            q = self.generate_text_embedding(query, language)  # type: ignore[arg-type]
            found = self.generate_embedding_batch(items)
        else:
            bad = next((i for i, c in enumerate(items) if not isinstance(c, str)), None)
            if bad is not None:
                raise InputError(
                    f"candidates[{bad}]: an image query ranks texts; give str candidates"
                )
            q = self.generate_embedding(query)
            found = self.generate_text_embedding_batch(items, language)  # type: ignore[arg-type]
        for r in (q, *found):
            if not r.ok or r.embedding is None:
                raise _raised(r)
        if len({r.model_id for r in (q, *found)}) != 1:
            raise NotReadyError("the model was swapped while ranking; retry")
        scoring = self.scoring
        return rank_scores(
            q.embedding,  # type: ignore[arg-type]
            np.stack([r.embedding for r in found]),  # type: ignore[misc]
            logit_scale=scoring["logit_scale"],
            logit_bias=scoring["logit_bias"],
        )

    def _label_vectors(self, model: ClipModel, prompts: list[str]) -> npt.NDArray[np.float32]:
        prefix = model.identity.model_id
        with self._label_lock:
            known = {p: self._label_cache.get((prefix, p)) for p in prompts}
        missing = [p for p, v in known.items() if v is None]
        if missing:
            results = self.generate_text_embedding_batch(missing)
            for prompt, result in zip(missing, results, strict=True):
                if not result.ok or result.embedding is None:
                    raise _raised(result)
                if result.model_id != prefix:
                    raise NotReadyError("the model was swapped while classifying; retry")
                known[prompt] = result.embedding
            with self._label_lock:
                for prompt in missing:
                    self._label_cache[(prefix, prompt)] = known[prompt]  # type: ignore[assignment]
                while len(self._label_cache) > _LABEL_CACHE_SIZE:
                    self._label_cache.popitem(last=False)
        return np.stack([known[p] for p in prompts]).astype(np.float32)  # type: ignore[misc]

    def generate_text_embedding_batch(
        self, texts: Sequence[str], language: str | None = None
    ) -> list[EmbeddingResult]:
        """Embed many texts in length-sorted batches, padded as the model's text description
        says (to the longest row for CLIP, to the full context for last-token pooling);
        ``language`` as in :meth:`generate_text_embedding`."""
        t0 = time.perf_counter()
        items = list(texts)
        results: list[EmbeddingResult | None] = [None] * len(items)
        try:
            with self._hold() as model:
                embed_texts(model, items, results, t0, self._stats, language=language)
        except Exception as exc:
            failure = translate(exc)
            results = [
                r or EmbeddingResult.failure(failure, latency_ms=elapsed_ms(t0)) for r in results
            ]
        final = [
            r if r is not None else EmbeddingResult.failure(InferenceError("not processed"))
            for r in results
        ]
        self._stats.record_call(
            texts=len(final), errors=sum(not r.ok for r in final), latency_ms=elapsed_ms(t0)
        )
        return final

    # -- model-only calls (benchmarks, verification) --------------------------------------

    def preprocess(self, image_data: ImageData) -> npt.NDArray[np.float32]:
        """The ``(3, S, S)`` float32 tensor the active model's image tower receives.

        Raises:
            NotReadyError: not initialised. InputError: undecodable image.
        """
        with self._hold() as model:
            return model.preprocessor(image_data)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token rows (start and end tokens included, truncated) the text tower receives.

        Raises:
            NotReadyError: not initialised. ConfigError: the model has no text tower.
        """
        with self._hold() as model:
            if model.textual is None:
                raise ConfigError(f"model {model.identity.name} has no text tower")
            return [list(r) for r in model.textual.tokenizer.encode_batch(list(texts)).rows]

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
            log.warning("health check failed: %s", _describe(exc))
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
        timings: dict[str, float] = {}
        with self._hold() as model:
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

    def get_statistics(self) -> dict[str, Any]:
        """JSON-serialisable statistics (the seed's calls, avg_latency_ms, backend, ...)."""
        stats = self._stats.snapshot()
        model = self._model
        stats.update(
            state=self._state.value,
            ready=model is not None,
            **(model.describe() if model else _NO_MODEL),
            last_health_check=self._last_health,
            last_reload_error=self._last_reload_error,
            last_reload=self._last_reload.as_dict() if self._last_reload else None,
            state_history=list(self._state_history),
            preprocess_workers=self._executor_workers if self._executor else None,
            pixel_budget=self._budget.stats() if self._budget else None,
            **self._reload_counts,
        )
        return stats

    # -- hot swap ------------------------------------------------------------------------------

    def reload_model(
        self,
        new_config: PluginConfig,
        *,
        space_guard: Callable[[ModelIdentity, ModelIdentity], None] | None = None,
    ) -> bool:
        """Swap in the model of ``new_config`` without stopping service (seed §9.1).

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
        if self._model is None:
            self.last_error = "reload_model: the plugin is not initialised"
            return False
        with self._admin_lock:
            old = self._model
            if old is None:  # shut down while we waited for the lock
                self.last_error = "reload_model: the plugin is not initialised"
                return False
            self._reload_counts["reloads"] += 1
            log.info("reload started: %s", new_config.model.path)
            t0 = time.perf_counter()
            new: ClipModel | None = None
            try:
                self._set_state(PluginState.LOADING)
                backend = new_config.backend
                if backend is BackendType.AUTO:
                    backend = self._requested_backend
                new = self._load(new_config, backend)
                self._set_state(PluginState.VALIDATING)
                if not validate(new):
                    raise ModelMismatchError(
                        "validation inference gave a wrong shape or non-finite values"
                    )
                changed = space_changed(old.identity, new.identity)
                if changed:
                    check_same_space(old.identity, new.identity, new_config)
                    if space_guard is not None:
                        space_guard(old.identity, new.identity)
            except Exception as exc:
                self._set_state(PluginState.ERROR)
                if new is not None:
                    new.retire(0)
                self._reload_counts["reload_failures"] += 1
                self._last_reload_error = self.last_error = _describe(exc)
                self._last_reload = ReloadReport(
                    ok=False,
                    previous=old.identity,
                    current=old.identity,
                    space_changed=False,
                    error=self.last_error,
                    seconds=time.perf_counter() - t0,
                )
                log.error("reload failed, keeping %s: %s", old.identity.model_id, self.last_error)
                self._set_state(PluginState.READY)
                return False
            self._set_state(PluginState.ACTIVATING)
            new.generation = old.generation + 1
            old_executor = self._resize_executor(new_config)
            with self._model_lock:
                self._model = new
            self._config = new_config
            if changed:
                log.warning(
                    "reload changed the embedding space: %s (dim %d) -> %s (dim %d); vectors "
                    "stored with the old model are not comparable with new ones",
                    old.identity.model_id,
                    old.identity.embedding_dim,
                    new.identity.model_id,
                    new.identity.embedding_dim,
                )
            drained = old.retire(new_config.drain_timeout_s)
            if not drained:
                self._reload_counts["drain_timeouts"] += 1
                log.warning(
                    "old model %s still had requests after %.1f s; it is released when they end",
                    old.identity.model_id,
                    new_config.drain_timeout_s,
                )
            if old_executor is not None and drained:
                old_executor.shutdown(wait=False)  # undrained: its idle threads end with it
            self._last_reload = ReloadReport(
                ok=True,
                previous=old.identity,
                current=new.identity,
                space_changed=changed,
                error=None,
                seconds=time.perf_counter() - t0,
            )
            self._set_state(PluginState.READY)
            self._last_reload_error = self.last_error = None
            log.info("reload finished: %s is generation %d", new.identity.model_id, new.generation)
            return True

    @property
    def last_reload(self) -> ReloadReport | None:
        """What the last ``reload_model`` call did (None before the first one)."""
        return self._last_reload

    def _set_state(self, state: PluginState) -> None:
        self._state = state
        self._state_history.append(state.value)

    def _resize_executor(self, config: PluginConfig) -> ThreadPoolExecutor | None:
        """Apply a changed ``preprocess_workers``; return the executor to retire, if any."""
        workers = _workers(config)
        if self._executor is not None and self._executor_workers == workers:
            return None
        old, self._executor = (
            self._executor,
            ThreadPoolExecutor(workers, thread_name_prefix="themis-preprocess"),
        )
        self._executor_workers = workers
        log.info("preprocess workers: %d", workers)
        return old

    # -- internals -----------------------------------------------------------------------------

    @property
    def pixel_budget(self) -> PixelBudget:
        """The decoded-pixel budget every image decode of this plugin shares (thumbnails too)."""
        if self._budget is None:
            pre = self._config.preprocess if self._config else PreprocessConfig()
            capacity = pre.pixel_budget
            self._budget = PixelBudget(capacity)
        return self._budget

    def _load(self, config: PluginConfig, backend: BackendType) -> ClipModel:
        capacity = config.preprocess.pixel_budget
        if self._budget is None or self._budget.capacity != capacity:
            self._budget = PixelBudget(capacity)  # decodes under the old one finish under it
        return load_model(
            config,
            backend,
            available=self._available,
            hash_fn=self._hash_fn,
            session_factory=self._session_factory,
            budget=self._budget,
        )

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


def _workers(config: PluginConfig) -> int:
    return config.preprocess_workers or min(4, os.cpu_count() or 1)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ThemisClipError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


_LABEL_CACHE_SIZE = 8192  # label prompt embeddings kept, across models (oldest dropped first)


def _raised(result: EmbeddingResult) -> Exception:
    """The library exception an ``ok=False`` result stands for (its class, by name)."""
    from themis_clip import errors

    cls = getattr(errors, result.error_type or "", None)
    if isinstance(cls, type) and issubclass(cls, errors.ThemisClipError):
        return cls(result.error or "failed")
    return errors.InferenceError(result.error or "failed")
