"""The plugin interface (the seed's ``IImageAnalysisBackend``) and the value types it speaks."""

from __future__ import annotations

import enum
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
import numpy.typing as npt

from themis_clip.vocabulary import BackendType

if TYPE_CHECKING:
    from PIL import Image

    from themis_clip.config import PluginConfig

__all__ = [
    "THEMIS_IMAGE_PLUGIN_API_VERSION",
    "BackendType",
    "BoundingBox",
    "CaptionResult",
    "DetectionResult",
    "EmbeddingResult",
    "GenerationParams",
    "GenerationResult",
    "ImageAnalysisBackend",
    "ImageData",
    "ImageFormat",
    "ImageMetadata",
    "PluginCapabilities",
    "PluginInfo",
    "ReloadableBackend",
    "SegmentationResult",
]

#: What ``generate_embedding`` accepts: encoded bytes, a file path, a PIL image, or an
#: HWC (or HW) ``uint8`` array in RGB order.
ImageData: TypeAlias = (
    "bytes | bytearray | memoryview | str | os.PathLike[str] | Image.Image | npt.NDArray[np.uint8]"
)


#: ``THEMIS_IMAGE_PLUGIN_API_VERSION`` of ThemisDB's ``image_analysis_interface.h``: the plugin
#: contract this package implements. A backend whose major version differs is refused.
THEMIS_IMAGE_PLUGIN_API_VERSION = "1.0.0"


class ImageFormat(enum.StrEnum):
    """ThemisDB's ``ImageFormat`` (a declared container format)."""

    UNKNOWN = "unknown"
    JPEG = "jpeg"
    PNG = "png"
    BMP = "bmp"
    TIFF = "tiff"
    WEBP = "webp"
    GIF = "gif"
    SVG = "svg"
    RAW = "raw"


@dataclass(frozen=True, kw_only=True)
class ImageMetadata:
    """ThemisDB's ``ImageMetadata``: what a caller declares about an image.

    Used: ``format`` is a decoding hint (the declared decoder is tried first; bytes of another
    format still decode, the bytes are the truth); ``exif`` ``Orientation`` (274 or
    ``"Orientation"``) is applied to images that carry no orientation of their own (arrays, PIL
    images, formats without EXIF) when ``preprocess.apply_exif`` is on. Carried only (passed
    through to ``EmbeddingResult.metadata``): ``width``, ``height``, ``channels``,
    ``bits_per_channel``, ``color_space``: the decoder reads these from the data itself.
    """

    width: int = 0
    height: int = 0
    channels: int = 0
    format: ImageFormat = ImageFormat.UNKNOWN
    bits_per_channel: int = 8
    exif: Mapping[str | int, Any] | None = None
    color_space: str = "sRGB"

    @property
    def orientation(self) -> int | None:
        """The EXIF orientation (1-8) declared in ``exif``, if any."""
        if not self.exif:
            return None
        value = self.exif.get("Orientation", self.exif.get(274))
        return value if isinstance(value, int) and 1 <= value <= 8 else None


@dataclass(frozen=True, kw_only=True)
class PluginCapabilities:
    """ThemisDB's ``PluginCapabilities``.

    ``"image_embedding" in caps`` (and iteration) also answers with the capability names of
    earlier versions (``image_embedding``, ``text_embedding``, ``batch_embedding``,
    ``hot_reload``, ``health_check``, ``warmup``) listed in ``features``.
    """

    supports_embedding: bool = False
    supports_captioning: bool = False
    supports_detection: bool = False
    supports_segmentation: bool = False
    supports_generation: bool = False
    supports_image_to_image: bool = False
    supports_visual_qa: bool = False
    supports_batch_processing: bool = False
    supports_streaming: bool = False
    thread_safe: bool = False
    supported_backends: tuple[BackendType, ...] = ()
    min_memory_mb: int = 2048
    recommended_memory_mb: int = 8192
    features: tuple[str, ...] = ()

    def __contains__(self, name: object) -> bool:
        return name in self.features

    def __iter__(self) -> Iterator[str]:
        return iter(self.features)


@dataclass(frozen=True, kw_only=True)
class PluginInfo:
    """Description of a plugin (ThemisDB's ``PluginInfo``).

    ``model_name`` / ``model_version`` describe the loaded model (empty before
    ``initialize``); ``supported_formats`` are the image formats the decoder reads.
    """

    name: str
    version: str
    description: str
    author: str = ""
    license: str = ""
    model_name: str = ""
    model_version: str = ""
    supported_formats: tuple[str, ...] = ()
    capabilities: PluginCapabilities = field(default_factory=PluginCapabilities)


class _SuccessField:
    """``EmbeddingResult.success(...)`` builds a result; ``result.success`` is the header's bool."""

    def __get__(self, obj: EmbeddingResult | None, owner: type[EmbeddingResult]) -> Any:
        if obj is None:
            return owner.succeeded
        return obj.ok


@dataclass(frozen=True, kw_only=True)
class EmbeddingResult:
    """The outcome of embedding one image or text.

    Attributes:
        ok: True when ``embedding`` holds a valid vector.
        embedding: shape ``(embedding_dim,)``, float32, L2 norm 1; None when not ok.
        error: a message naming the problem when not ok, else None.
        error_type: the exception class name behind ``error`` (``"ImageDecodeError"``, ...).
        latency_ms: wall time spent on this item's call (a batch reports the batch's time).
        truncated: for text, True when the input was longer than the context and was cut.
        model_id: identity of the model that produced the vector (name@sha256 prefix).
        metadata: the caller's metadata, passed through unchanged.
        tokens: for text, how many token positions the text tower processed (start and end
            tokens included, after truncation); None for images.
    """

    ok: bool
    embedding: npt.NDArray[np.float32] | None = None
    error: str | None = None
    error_type: str | None = None
    latency_ms: float = 0.0
    truncated: bool = False
    model_id: str | None = None
    metadata: ImageMetadata | Mapping[str, Any] | None = field(default=None, compare=False)
    tokens: int | None = None

    @classmethod
    def succeeded(
        cls,
        embedding: npt.NDArray[np.float32],
        *,
        latency_ms: float,
        model_id: str | None,
        truncated: bool = False,
        metadata: ImageMetadata | Mapping[str, Any] | None = None,
        tokens: int | None = None,
    ) -> EmbeddingResult:
        return cls(
            ok=True,
            embedding=embedding,
            latency_ms=latency_ms,
            model_id=model_id,
            truncated=truncated,
            metadata=metadata,
            tokens=tokens,
        )

    # ThemisDB's field names (image_analysis_interface.h), one source of truth each. ``success``
    # is both the header's field (on a result) and the constructor (on the class).
    success = _SuccessField()

    @property
    def error_message(self) -> str:
        """Header name of ``error`` ("" on success, as the header's ``std::string``)."""
        return self.error or ""

    @property
    def dimension(self) -> int:
        """Header ``dimension``: the embedding's length (0 when there is none)."""
        return 0 if self.embedding is None else int(self.embedding.shape[0])

    @property
    def model_name(self) -> str:
        """Header ``model_name``: the model's name (``model_id`` without the digest)."""
        return (self.model_id or "").rsplit("@", 1)[0]

    @property
    def inference_time_ms(self) -> int:
        """Header ``inference_time_ms`` (an integer there): ``latency_ms`` rounded."""
        return round(self.latency_ms)

    @classmethod
    def failure(
        cls,
        exc: BaseException,
        *,
        latency_ms: float = 0.0,
        metadata: ImageMetadata | Mapping[str, Any] | None = None,
    ) -> EmbeddingResult:
        return cls(
            ok=False,
            error=str(exc) or type(exc).__name__,
            error_type=type(exc).__name__,
            latency_ms=latency_ms,
            metadata=metadata,
        )


@dataclass(frozen=True, kw_only=True)
class CaptionResult:
    """ThemisDB's ``CaptionResult``."""

    success: bool = False
    error_message: str = ""
    caption: str = ""
    confidence: float = 0.0
    model_name: str = ""
    alternatives: tuple[tuple[str, float], ...] = ()
    inference_time_ms: int = 0


@dataclass(frozen=True, kw_only=True)
class BoundingBox:
    """ThemisDB's ``DetectionResult::BoundingBox`` (normalised 0-1 coordinates)."""

    x: float = 0.0
    y: float = 0.0
    width: float = 0.0
    height: float = 0.0
    label: str = ""
    confidence: float = 0.0


@dataclass(frozen=True, kw_only=True)
class DetectionResult:
    """ThemisDB's ``DetectionResult``."""

    success: bool = False
    error_message: str = ""
    detections: tuple[BoundingBox, ...] = ()
    model_name: str = ""
    inference_time_ms: int = 0


@dataclass(frozen=True, kw_only=True)
class SegmentationResult:
    """ThemisDB's ``SegmentationResult`` (``mask`` is W x H bytes)."""

    success: bool = False
    error_message: str = ""
    mask: bytes = b""
    width: int = 0
    height: int = 0
    labels: tuple[str, ...] = ()
    model_name: str = ""
    inference_time_ms: int = 0


@dataclass(frozen=True, kw_only=True)
class GenerationParams:
    """ThemisDB's ``GenerationParams``."""

    prompt: str = ""
    negative_prompt: str = ""
    width: int = 512
    height: int = 512
    num_inference_steps: int = 50
    guidance_scale: float = 7.5
    seed: int = -1
    strength: float = 0.8
    init_image: bytes = b""
    extra_params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class GenerationResult:
    """ThemisDB's ``GenerationResult`` (``image_data`` is PNG)."""

    success: bool = False
    error_message: str = ""
    image_data: bytes = b""
    metadata: ImageMetadata = field(default_factory=ImageMetadata)
    model_name: str = ""
    inference_time_ms: int = 0
    seed_used: int = -1


class ImageAnalysisBackend(ABC):
    """ThemisDB's ``IImageAnalysisBackend`` (``image_analysis_interface.h``, API 1.0.0), spelled
    in Python: the required methods are abstract, the optional ones answer "not supported" by
    default exactly as the header's do.

    ``generate_*`` methods never raise for bad input: they return a result with
    ``success``/``ok`` False and the reason. Beyond the header, backends may answer text
    (``generate_text_embedding``; default: not supported) so that a backend found through
    :func:`~themis_clip.registry.load_backend` can be asked for text embeddings.
    """

    #: The plugin API this backend was written against (checked by ``load_backend``).
    plugin_api_version: str = THEMIS_IMAGE_PLUGIN_API_VERSION

    @abstractmethod
    def get_info(self) -> PluginInfo: ...

    @abstractmethod
    def initialize(self, config: PluginConfig, backend: BackendType = BackendType.AUTO) -> bool: ...

    @abstractmethod
    def shutdown(self) -> None: ...

    @abstractmethod
    def is_ready(self) -> bool: ...

    @abstractmethod
    def get_backend(self) -> BackendType: ...

    @abstractmethod
    def generate_embedding(
        self, image_data: ImageData, metadata: ImageMetadata | Mapping[str, Any] | None = None
    ) -> EmbeddingResult: ...

    def generate_caption(
        self,
        image_data: ImageData,
        metadata: ImageMetadata | None = None,
        max_length: int = 50,
    ) -> CaptionResult:
        return CaptionResult(error_message="Captioning not supported by this plugin")

    def detect_objects(
        self,
        image_data: ImageData,
        metadata: ImageMetadata | None = None,
        confidence_threshold: float = 0.5,
    ) -> DetectionResult:
        return DetectionResult(error_message="Object detection not supported by this plugin")

    def segment_image(
        self, image_data: ImageData, metadata: ImageMetadata | None = None
    ) -> SegmentationResult:
        return SegmentationResult(error_message="Segmentation not supported by this plugin")

    def generate_image(self, params: GenerationParams) -> GenerationResult:
        return GenerationResult(error_message="Image generation not supported by this plugin")

    def answer_visual_question(
        self, image_data: ImageData, question: str, metadata: ImageMetadata | None = None
    ) -> str:
        return "Visual question answering not supported by this plugin"

    def generate_embedding_batch(self, images: Sequence[ImageData]) -> list[EmbeddingResult]:
        """Default as in the header: one ``generate_embedding`` call per image."""
        return [self.generate_embedding(image) for image in images]

    def generate_text_embedding(self, text: str) -> EmbeddingResult:
        """Not in the header (an extension): default answers "not supported"."""
        return EmbeddingResult(
            ok=False,
            error="Text embedding not supported by this plugin",
            error_type="NotSupported",
        )

    @abstractmethod
    def health_check(self) -> bool: ...

    def get_statistics(self) -> dict[str, Any]:
        """Default as in the header: an empty object."""
        return {}

    def warmup(self) -> Mapping[str, float]:
        """Default as in the header: nothing to do (returns no timings)."""
        return {}


@runtime_checkable
class ReloadableBackend(Protocol):
    """A backend that also swaps its model in place (``OnnxClipPlugin`` is one).

    Not in ThemisDB's header (ThemisDB's plugin spec adds reload_model): check with
    ``isinstance(backend, ReloadableBackend)`` before calling.
    """

    def reload_model(self, new_config: PluginConfig) -> bool: ...

    def generate_text_embedding_batch(self, texts: Sequence[str]) -> list[EmbeddingResult]: ...
