"""The plugin interface (the seed's ``IImageAnalysisBackend``) and the value types it speaks."""

from __future__ import annotations

import enum
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from PIL import Image

    from themis_clip.config import PluginConfig

__all__ = [
    "BackendType",
    "EmbeddingResult",
    "ImageAnalysisBackend",
    "ImageData",
    "PluginInfo",
]

#: What ``generate_embedding`` accepts: encoded bytes, a file path, a PIL image, or an
#: HWC (or HW) ``uint8`` array in RGB order.
ImageData: TypeAlias = (
    "bytes | bytearray | memoryview | str | os.PathLike[str] | Image.Image | npt.NDArray[np.uint8]"
)


class BackendType(enum.StrEnum):
    """Execution backends. ``AUTO`` probes CUDA → TensorRT → DirectML → CPU (the seed's order)."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
    TENSORRT = "tensorrt"
    DIRECTML = "directml"
    ROCM = "rocm"
    OPENVINO = "openvino"
    COREML = "coreml"


@dataclass(frozen=True, kw_only=True)
class PluginInfo:
    """Static description of a plugin (the seed's ``PluginInfo``)."""

    name: str
    version: str
    description: str
    capabilities: tuple[str, ...] = ()


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
    metadata: Mapping[str, Any] | None = field(default=None, compare=False)
    tokens: int | None = None

    @classmethod
    def success(
        cls,
        embedding: npt.NDArray[np.float32],
        *,
        latency_ms: float,
        model_id: str | None,
        truncated: bool = False,
        metadata: Mapping[str, Any] | None = None,
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

    @classmethod
    def failure(
        cls,
        exc: BaseException,
        *,
        latency_ms: float = 0.0,
        metadata: Mapping[str, Any] | None = None,
    ) -> EmbeddingResult:
        return cls(
            ok=False,
            error=str(exc) or type(exc).__name__,
            error_type=type(exc).__name__,
            latency_ms=latency_ms,
            metadata=metadata,
        )


class ImageAnalysisBackend(ABC):
    """Abstract base class of image-analysis plugins (the seed's ``IImageAnalysisBackend``).

    ``generate_*`` methods never raise for bad input: they return ``EmbeddingResult(ok=False)``.
    """

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
        self, image_data: ImageData, metadata: Mapping[str, Any] | None = None
    ) -> EmbeddingResult: ...

    @abstractmethod
    def generate_embedding_batch(self, images: Sequence[ImageData]) -> list[EmbeddingResult]: ...

    @abstractmethod
    def health_check(self) -> bool: ...

    @abstractmethod
    def warmup(self) -> Mapping[str, float]: ...

    @abstractmethod
    def get_statistics(self) -> dict[str, Any]: ...
