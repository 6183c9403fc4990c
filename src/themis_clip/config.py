"""``PluginConfig``: the seed's JSON configuration, parsed once into frozen dataclasses.

The seed's keys are accepted exactly::

    {
      "model": {"name": "clip-vit-large-patch14", "embedding_dim": 768,
                "path": "/models/clip-vit-l-14.onnx", "expected_sha256": "abc123...",
                "enable_mmap_loading": false},
      "backend": "cuda",
      "max_batch_size": 64
    }

plus the keys documented on each dataclass below. Unknown keys are rejected (a typo must not
silently fall back to a default), and every error names the dotted key.

The strict key-by-key reader is :class:`themis_clip.configreader.JSONReader`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import themis_clip.jsonio as jsonio
from themis_clip.configreader import JSONReader
from themis_clip.errors import ConfigError
from themis_clip.vocabulary import (
    CLIP_MEAN,
    CLIP_STD,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_PIXELS_IN_FLIGHT,
    OPTIMIZATION_LEVELS,
    BackendType,
    DecodeMode,
    GraphDType,
    InferencePrecision,
    OptimizationLevel,
    ResizeMode,
    member_of,
)

__all__ = [  # the vocabulary's names stay importable from here
    "CLIP_MEAN",
    "CLIP_STD",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "OPTIMIZATION_LEVELS",
    "BackendType",
    "DecodeMode",
    "InferencePrecision",
    "ModelConfig",
    "OCRConfig",
    "OpenVINOConfig",
    "PluginConfig",
    "PreprocessConfig",
    "ResizeMode",
    "SearchConfig",
    "SessionConfig",
    "TensorRTConfig",
]


@dataclass(frozen=True, kw_only=True)
class PreprocessConfig:
    """Overrides of the model's preprocessing; None keeps what the model directory declares.

    Keys (JSON ``"preprocess": {...}``): ``image_size``, ``mean``, ``std``, ``resize_mode``,
    ``apply_exif`` (default true), ``max_image_pixels`` (default Pillow's 178,956,970),
    ``decode_mode``: ``"fast"`` (default: JPEG DCT scaling to no less than twice the model
    input before the resize, measured 3x faster on 12 MP photos with embedding cosine ≥ 0.999)
    or ``"exact"`` (the reference's full decode, bit-for-bit parity with OpenAI's transform),
    or, opt-in, ``"draft"`` (DCT scaling to no less than the model input itself, rclip's rule:
    a 12 MP photo decodes at 1/8 instead of 1/4, a 1024x768 one at 1/2 instead of full size;
    the vectors differ from fast's, see bench/RESULTS.md).
    ``max_pixels_in_flight``: decoded pixels that all concurrent decodes of the plugin may hold
    at once (default 200,000,000, at least ``max_image_pixels``): a decode reserves its
    image's declared size before allocating it and waits for room, so concurrency cannot
    multiply a decompression bomb.
    """

    image_size: int | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    resize_mode: ResizeMode | None = None
    apply_exif: bool = True
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    decode_mode: DecodeMode = DecodeMode.FAST
    max_pixels_in_flight: int | None = None

    def __post_init__(self) -> None:
        if self.max_pixels_in_flight is not None:
            _check_positive(self.max_pixels_in_flight, "preprocess.max_pixels_in_flight")
            if self.max_pixels_in_flight < self.max_image_pixels:
                raise ConfigError(
                    f"preprocess.max_pixels_in_flight ({self.max_pixels_in_flight}) must be at "
                    f"least max_image_pixels ({self.max_image_pixels}): an image within the "
                    "limit must be able to decode"
                )

    @property
    def pixel_budget(self) -> int:
        """The budget in force: the setting, or the default raised to ``max_image_pixels``."""
        if self.max_pixels_in_flight is not None:
            return self.max_pixels_in_flight
        return max(DEFAULT_MAX_PIXELS_IN_FLIGHT, self.max_image_pixels)


@dataclass(frozen=True, kw_only=True)
class TensorRTConfig:
    """TensorRT options (JSON ``"tensorrt": {...}``): engine cache directory and fp16."""

    cache_dir: str | None = None
    fp16: bool = False


@dataclass(frozen=True, kw_only=True)
class OpenVINOConfig:
    """OpenVINO options (JSON ``"openvino": {...}``), used by the ``openvino`` backend.

    Attributes:
        device: the OpenVINO device: ``"CPU"`` (default), ``"GPU"`` (or ``"GPU.1"``), ``"NPU"``.
        precision: ``"auto"`` (default: the device's fastest precision that passes the
            canary, bf16 first where the CPU has AMX or AVX-512 BF16, else f32), or
            ``"f32"``, ``"bf16"``, ``"f16"`` to force one (a forced one that fails the canary
            fails the load).
    """

    device: str = "CPU"
    precision: InferencePrecision = InferencePrecision.AUTO

    def __post_init__(self) -> None:
        if not self.device or not self.device.replace(".", "").isalnum():
            raise ConfigError(
                f"must name an OpenVINO device (CPU, GPU, GPU.1, NPU), got {self.device!r}",
                key="openvino.device",
            )
        precision = member_of(InferencePrecision, self.precision)
        if precision is None:
            raise ConfigError(
                f"must be one of {', '.join(InferencePrecision)}, got {self.precision!r}",
                key="openvino.precision",
            )
        object.__setattr__(self, "precision", precision)  # its string given: the member


@dataclass(frozen=True, kw_only=True)
class SessionConfig:
    """ONNX Runtime session tuning (JSON ``"session": {...}``); defaults chosen by measurement.

    ``bench/bench_session.py`` measures every knob side by side; its figures are in
    ``bench/RESULTS.md``.

    Attributes:
        optimization_level: ``"all"`` (default), ``"extended"``, ``"basic"`` or ``"disabled"``.
        optimized_model_cache_dir: where a load keeps what it computed, for later loads:
            each CPU session's optimised graph (start-up and hot swap skip the graph
            optimisation; not with memory-mapped loading), OpenVINO's compiled models and the
            canary's CPU fp32 reference vectors. Keyed by the model files' size, mtime and
            inode, ONNX Runtime's version, the level and the CPU's feature flags (level
            ``"all"`` may write CPU-specific kernels). None: off (the commands default to
            ``$XDG_CACHE_HOME/themis-clip/sessions``).
        cpu_mem_arena: ONNX Runtime's CPU memory arena (default on).
        allow_spinning: whether idle intra-op threads spin waiting for work. None: ONNX
            Runtime's default (spin). Spinning makes a lone session faster but burns the cores
            that image-decoding threads need.
        run_timeout_s: the longest one session run may take (validation and warm-up runs
            too); a run past it is stopped and its items fail, so that a model that never
            finishes cannot hold a core. None: no limit (the server uses its request timeout).
    """

    optimization_level: OptimizationLevel = OptimizationLevel.ALL
    optimized_model_cache_dir: str | None = None
    cpu_mem_arena: bool = True
    allow_spinning: bool | None = None
    run_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.run_timeout_s is not None and not (
            math.isfinite(self.run_timeout_s) and self.run_timeout_s > 0
        ):
            raise ConfigError(
                f"must be a finite number > 0, got {self.run_timeout_s!r}",
                key="session.run_timeout_s",
            )
        level = member_of(OptimizationLevel, self.optimization_level)
        if level is None:
            raise ConfigError(
                f"must be one of {', '.join(OPTIMIZATION_LEVELS)}; got {self.optimization_level!r}",
                key="session.optimization_level",
            )
        object.__setattr__(self, "optimization_level", level)  # its string given: the member


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Which model to load (JSON ``"model": {...}``).

    Attributes:
        path: an image-tower ``.onnx`` file, or a model directory (``manifest.json`` layout).
        name: model name reported in statistics; defaults to the manifest's or the file stem.
        embedding_dim: declared output dimension; a model that differs fails initialisation.
        expected_sha256: for a file, its hex digest; for a directory, the digest of
            ``manifest.json`` (whose per-file digests are then all verified), or a mapping of
            relative file name to digest.
        enable_mmap_loading: serve weights from a memory map (see ``runtime``).
        text_path / tokenizer_path: a text tower and its ``tokenizer.json`` when ``path`` is a
            single file.
        variant: which precision variant of a directory to load (``"fp16"``, ``"int8"``).
        mmap_cache_dir: where memory-mappable copies are cached (default: ``.themis-mmap``
            beside the model file).
    """

    path: str
    name: str | None = None
    embedding_dim: int | None = None
    expected_sha256: str | Mapping[str, str] | None = None
    enable_mmap_loading: bool = False
    text_path: str | None = None
    tokenizer_path: str | None = None
    variant: str | None = None
    mmap_cache_dir: str | None = None


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """The search index and its tuner (``search`` section; the CLI, the server and the index
    read it, checked once here).

    Attributes:
        index: the index: an SQLite file (relative to the config file) or a
            ``postgresql://`` URL. ``--index`` overrides it.
        target_recall: recall@10 against exact search that the self-tuned graph must reach.
        graph_dtype: vector type of the search graph, ``i8`` (default), ``f16`` or ``f32``
            (i8 and f16 candidates are re-scored exactly from the stored float32 vectors). i8
            is the default because it is the smallest and, re-scored, as accurate per breadth
            and the fastest (bench/RESULTS.md).
        rescore: candidates fetched per requested result and re-scored (f16, i8).
        sample: index members held out of the graph as tuning queries (at most a fifth).
        exact_fast_ms: exact search at or below this latency is kept without building a graph.

    Raises:
        ConfigError: a value out of range, or a dtype that is not one of :class:`GraphDType`.
    """

    index: str | None = None
    target_recall: float = 0.98
    graph_dtype: GraphDType = GraphDType.I8
    rescore: int = 3
    sample: int = 1000
    exact_fast_ms: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.target_recall <= 1:
            raise ConfigError(
                f"must be in (0, 1], got {self.target_recall!r}", key="search.target_recall"
            )
        dtype = member_of(GraphDType, self.graph_dtype)
        if dtype is None:
            raise ConfigError(
                f"must be f16, i8 or f32, got {self.graph_dtype!r}", key="search.graph_dtype"
            )
        object.__setattr__(self, "graph_dtype", dtype)  # its string given: the member
        if self.rescore < 1 or self.sample < 10:
            raise ConfigError(
                f"rescore >= 1 and sample >= 10 are required, got {self.rescore}, {self.sample}",
                key="search",
            )

    def fetch(self, k: int, dtype: str) -> int:
        """Candidates to ask a graph holding ``dtype`` vectors for, for ``k`` results."""
        return k if dtype == GraphDType.F32 else k * self.rescore


@dataclass(frozen=True, kw_only=True)
class OCRConfig:
    """Reading the text in pictures (``ocr`` section; off unless ``enabled``).

    Attributes:
        enabled: read text when indexing.
        models: a folder of PaddleOCR ONNX models (detector, recogniser, optional direction
            classifier) or a Hub repo id in immich's layout; None: the PP-OCRv4 set the
            ``rapidocr-onnxruntime`` wheel installs.
        gate: run the detector small first (``gate_side``, its shorter side in pixels) and
            skip pictures where it finds no text region.
        detection_side: the detector's shorter side in pixels (PaddleOCR's 736).
        box_threshold: mean text probability a detected region needs.
        min_confidence: lines read with a lower confidence are dropped.
    """

    enabled: bool = False
    models: str | None = None
    gate: bool = True
    gate_side: int = 416
    detection_side: int = 736
    box_threshold: float = 0.5
    min_confidence: float = 0.5

    def __post_init__(self) -> None:
        for key in ("gate_side", "detection_side"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 32 <= value <= 4096:
                raise ConfigError(
                    f"must be an integer from 32 to 4096, got {value!r}", key=f"ocr.{key}"
                )
        for key in ("box_threshold", "min_confidence"):
            value = getattr(self, key)
            if not (isinstance(value, int | float) and 0 <= value <= 1):
                raise ConfigError(f"must be a number from 0 to 1, got {value!r}", key=f"ocr.{key}")


@dataclass(frozen=True, kw_only=True)
class PluginConfig:
    """Everything ``OnnxClipPlugin.initialize`` needs.

    Attributes:
        model: the model to load.
        backend: requested backend; the ``backend`` argument of ``initialize`` wins unless AUTO.
        max_batch_size: largest batch handed to a session in one call.
        intra_op_threads: ONNX Runtime intra-op threads (None: ORT's default, one per core).
        preprocess_workers: threads decoding images for a batch (None: min(4, cores)).
        prefetch_batches: how many batches of ``max_batch_size`` images are decoded ahead of the
            one in the session (0: decode, then infer, no overlap; default 1, measured).
        preprocess: preprocessing overrides.
        tensorrt: TensorRT options.
        openvino: OpenVINO device and precision.
        canary_min_cosine: the canary's floor: a provider other than ONNX Runtime's CPU
            provider in fp32 (a GPU, OpenVINO, a reduced precision) serves only if the golden
            inputs' embeddings, alone and in one batch, have at least this cosine to the CPU
            fp32 ones (default 0.9999); else it is refused with the figure, and AUTO moves on.
        session: ONNX Runtime session tuning.
        device_id: GPU ordinal for CUDA/TensorRT/DirectML/ROCm.
        drain_timeout_s: how long a hot swap waits for in-flight requests on the old model.
        allow_embedding_space_change: let ``reload_model`` change model identity or dimension
            (default True, the seed's contract: any model that loads and validates is
            accepted and the change is reported); False is the strict mode that refuses it.
        prepack_weights: let ONNX Runtime prepack weight matrices (faster GEMMs, but a private
            copy of every weight). None: on, except with memory-mapped loading, where the copy
            would defeat the shared mapping.
        search: the search index and its tuning (the CLI and server read it).
        ocr: reading the text in pictures.
    """

    model: ModelConfig
    backend: BackendType = BackendType.AUTO
    max_batch_size: int = 32
    intra_op_threads: int | None = None
    preprocess_workers: int | None = None
    prefetch_batches: int = 1
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    tensorrt: TensorRTConfig = field(default_factory=TensorRTConfig)
    openvino: OpenVINOConfig = field(default_factory=OpenVINOConfig)
    canary_min_cosine: float = 0.9999
    session: SessionConfig = field(default_factory=SessionConfig)
    device_id: int = 0
    drain_timeout_s: float = 30.0
    allow_embedding_space_change: bool = True
    prepack_weights: bool | None = None
    search: SearchConfig = field(default_factory=SearchConfig)
    ocr: OCRConfig = field(default_factory=OCRConfig)

    def __post_init__(self) -> None:
        _check_positive(self.max_batch_size, "max_batch_size")
        for key in ("intra_op_threads", "preprocess_workers"):
            threads = getattr(self, key)
            if threads is not None:
                _check_positive(threads, key)
                if threads > MAX_THREADS:
                    # Each is a real OS thread: 100000 of them froze the machine.
                    raise ConfigError(f"must be at most {MAX_THREADS}, got {threads}", key=key)
        if (
            isinstance(self.prefetch_batches, bool)
            or not isinstance(self.prefetch_batches, int)
            or not 0 <= self.prefetch_batches <= 16
        ):
            raise ConfigError(
                f"must be an integer from 0 to 16, got {self.prefetch_batches!r}",
                key="prefetch_batches",
            )
        if self.device_id < 0:
            raise ConfigError("must be >= 0", key="device_id")
        if not (
            isinstance(self.canary_min_cosine, int | float)
            and not isinstance(self.canary_min_cosine, bool)
            and 0 <= self.canary_min_cosine <= 1
        ):
            raise ConfigError(
                f"must be a number from 0 to 1, got {self.canary_min_cosine!r}",
                key="canary_min_cosine",
            )
        if not (math.isfinite(self.drain_timeout_s) and self.drain_timeout_s >= 0):
            raise ConfigError("must be a finite number >= 0", key="drain_timeout_s")

    # -- parsing -----------------------------------------------------------------------------

    def raw(self) -> dict[str, Any]:
        """The whole configuration as JSON-ready data; ``from_dict(c.raw()) == c`` (lossless).

        ThemisDB's ``PluginConfig::raw()``; also how the configuration travels to Ray actors.
        """
        out = _plain(self)
        assert isinstance(out, dict)
        return out

    def get(self, path: str, default: Any = None) -> Any:
        """The value at a dotted ``path`` of :meth:`raw` (``"model.path"``), else ``default``.

        ThemisDB's ``PluginConfig::get(path, default)``; the typed fields stay the primary API.
        """
        node: Any = self.raw()
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def has(self, path: str) -> bool:
        """Whether a dotted ``path`` names a key of :meth:`raw` (ThemisDB's ``has``)."""
        missing = object()
        return self.get(path, missing) is not missing

    @classmethod
    def from_json(
        cls, text: str | bytes, *, base_dir: str | os.PathLike[str] | None = None
    ) -> PluginConfig:
        """Parse the seed's JSON text. Relative model paths resolve against ``base_dir``."""
        try:
            data = jsonio.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"not valid JSON: {exc}") from exc
        return cls.from_dict(data, base_dir=base_dir)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> PluginConfig:
        """Read a JSON config file; relative model paths resolve against the file's folder."""
        p = Path(path)
        try:
            text = p.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from exc
        return cls.from_json(text, base_dir=p.parent)

    @classmethod
    def from_dict(
        cls, data: Any, *, base_dir: str | os.PathLike[str] | None = None
    ) -> PluginConfig:
        """Build a config from already-parsed JSON (a mapping)."""
        r = JSONReader(data, "", base_dir)
        model_r = r.section("model", required=True)
        model = ModelConfig(
            path=model_r.path("path", required=True, name_ok=True) or "",
            name=model_r.get("name", str),
            embedding_dim=model_r.positive_int("embedding_dim"),
            expected_sha256=model_r.sha256("expected_sha256"),
            enable_mmap_loading=model_r.get("enable_mmap_loading", bool, False),
            text_path=model_r.path("text_path"),
            tokenizer_path=model_r.path("tokenizer_path"),
            variant=model_r.get("variant", str),
            mmap_cache_dir=model_r.path("mmap_cache_dir"),
        )
        model_r.finish()
        pre_r = r.section("preprocess")
        preprocess = PreprocessConfig(
            image_size=pre_r.positive_int("image_size"),
            mean=pre_r.triple("mean"),
            std=pre_r.triple("std", positive=True),
            resize_mode=pre_r.choice("resize_mode", ResizeMode),
            apply_exif=pre_r.get("apply_exif", bool, True),
            max_image_pixels=pre_r.positive_int("max_image_pixels") or DEFAULT_MAX_IMAGE_PIXELS,
            decode_mode=DecodeMode(pre_r.one_of("decode_mode", tuple(DecodeMode), "fast")),
            max_pixels_in_flight=pre_r.positive_int("max_pixels_in_flight"),
        )
        pre_r.finish()
        trt_r = r.section("tensorrt")
        tensorrt = TensorRTConfig(
            cache_dir=trt_r.path("cache_dir"), fp16=trt_r.get("fp16", bool, False)
        )
        trt_r.finish()
        ov_r = r.section("openvino")
        openvino = OpenVINOConfig(
            device=ov_r.get("device", str, "CPU"),
            precision=InferencePrecision(
                ov_r.one_of("precision", tuple(InferencePrecision), "auto")
            ),
        )
        ov_r.finish()
        ses_r = r.section("session")
        session = SessionConfig(
            optimization_level=OptimizationLevel(
                ses_r.one_of("optimization_level", OPTIMIZATION_LEVELS, "all")
            ),
            optimized_model_cache_dir=ses_r.path("optimized_model_cache_dir"),
            cpu_mem_arena=ses_r.get("cpu_mem_arena", bool, True),
            allow_spinning=ses_r.get("allow_spinning", bool),
            run_timeout_s=(
                None if ses_r.raw("run_timeout_s") is None else ses_r.number("run_timeout_s", 0)
            ),
        )
        ses_r.finish()
        search_r = r.section("search")
        index = search_r.get("index", str)
        if index is not None and not index.startswith(("postgresql://", "postgres://")):
            index = search_r.path("index")
        search = SearchConfig(
            index=index,
            target_recall=search_r.number("target_recall", 0.98),
            graph_dtype=GraphDType(
                search_r.one_of("graph_dtype", tuple(d.value for d in GraphDType), "i8")
            ),
            rescore=search_r.get("rescore", int, 3),
            sample=search_r.get("sample", int, 1000),
            exact_fast_ms=search_r.number("exact_fast_ms", 1.0),
        )
        search_r.finish()
        ocr_r = r.section("ocr")
        ocr = OCRConfig(
            enabled=ocr_r.get("enabled", bool, False),
            models=ocr_r.path("models", name_ok=True),
            gate=ocr_r.get("gate", bool, True),
            gate_side=ocr_r.get("gate_side", int, 416),
            detection_side=ocr_r.get("detection_side", int, 736),
            box_threshold=ocr_r.number("box_threshold", 0.5),
            min_confidence=ocr_r.number("min_confidence", 0.5),
        )
        ocr_r.finish()
        config = cls(
            model=model,
            backend=r.choice("backend", BackendType) or BackendType.AUTO,
            max_batch_size=r.positive_int("max_batch_size") or 32,
            intra_op_threads=r.positive_int("intra_op_threads"),
            preprocess_workers=r.positive_int("preprocess_workers"),
            prefetch_batches=r.get("prefetch_batches", int, 1),
            preprocess=preprocess,
            tensorrt=tensorrt,
            openvino=openvino,
            canary_min_cosine=r.number("canary_min_cosine", 0.9999),
            session=session,
            device_id=r.get("device_id", int, 0),
            drain_timeout_s=r.number("drain_timeout_s", 30.0),
            allow_embedding_space_change=r.get("allow_embedding_space_change", bool, True),
            prepack_weights=r.get("prepack_weights", bool),
            search=search,
            ocr=ocr,
        )
        r.finish()
        return config


def _plain(value: Any) -> Any:
    """Dataclasses, enums, tuples and mappings as JSON data (the inverse of ``from_dict``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


MAX_THREADS = 1024
"""The most threads a session or decode pool may be given (far above any machine's use)."""


def _check_positive(value: int, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"must be a positive integer, got {value!r}", key=key)
