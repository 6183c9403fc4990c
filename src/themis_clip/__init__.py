"""themis-clip: the ``onnx_clip`` plugin — CLIP image and text embeddings on ONNX Runtime."""

from __future__ import annotations

from themis_clip._version import __version__
from themis_clip.config import (
    CLIP_MEAN,
    CLIP_STD,
    ModelConfig,
    PluginConfig,
    PreprocessConfig,
    ResizeMode,
    SessionConfig,
    TensorRTConfig,
)
from themis_clip.engine import ModelIdentity
from themis_clip.errors import (
    BackendUnavailableError,
    ConfigError,
    ImageDecodeError,
    ImageTooLargeError,
    IndexModelMismatchError,
    InferenceError,
    InputError,
    IntegrityError,
    ModelError,
    ModelFormatError,
    ModelMismatchError,
    ModelNotFoundError,
    NotReadyError,
    PluginNotFoundError,
    SearchIndexError,
    TextInputError,
    ThemisClipError,
)
from themis_clip.interface import (
    BackendType,
    EmbeddingResult,
    ImageAnalysisBackend,
    ImageData,
    PluginInfo,
)
from themis_clip.plugin import OnnxClipPlugin, PluginState
from themis_clip.preprocess.image import preprocess_image
from themis_clip.registry import available_backends, load_backend
from themis_clip.resources import demo_model_path

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "BackendType",
    "BackendUnavailableError",
    "ConfigError",
    "EmbeddingResult",
    "ImageAnalysisBackend",
    "ImageData",
    "ImageDecodeError",
    "ImageTooLargeError",
    "IndexModelMismatchError",
    "InferenceError",
    "InputError",
    "IntegrityError",
    "ModelConfig",
    "ModelError",
    "ModelFormatError",
    "ModelIdentity",
    "ModelMismatchError",
    "ModelNotFoundError",
    "NotReadyError",
    "OnnxClipPlugin",
    "PluginConfig",
    "PluginInfo",
    "PluginNotFoundError",
    "PluginState",
    "PreprocessConfig",
    "ResizeMode",
    "SearchIndexError",
    "SessionConfig",
    "TensorRTConfig",
    "TextInputError",
    "ThemisClipError",
    "__version__",
    "available_backends",
    "demo_model_path",
    "load_backend",
    "preprocess_image",
]
