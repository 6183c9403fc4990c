"""themis-clip: the ``onnx_clip`` plugin — CLIP image and text embeddings on ONNX Runtime.

The names below are imported on first use, so that ``import themis_clip.index`` (vectors only)
loads neither Pillow nor ONNX Runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from themis_clip._version import __version__

if TYPE_CHECKING:
    from themis_clip.config import (
        ModelConfig,
        PluginConfig,
        PreprocessConfig,
        SessionConfig,
        TensorRTConfig,
    )
    from themis_clip.errors import (
        BackendUnavailableError,
        ConfigError,
        ExportError,
        ImageDecodeError,
        ImageTooLargeError,
        IndexModelMismatchError,
        InferenceError,
        InputError,
        IntegrityError,
        MetadataError,
        ModelError,
        ModelFormatError,
        ModelMismatchError,
        ModelNotFoundError,
        NotReadyError,
        PluginAPIVersionError,
        PluginNotFoundError,
        QueueFullError,
        RequestTooLargeError,
        ResourceBusyError,
        SearchIndexError,
        TextInputError,
        ThemisClipError,
        WhereError,
    )
    from themis_clip.interface import (
        THEMIS_IMAGE_PLUGIN_API_VERSION,
        BackendType,
        BoundingBox,
        CaptionResult,
        DetectionResult,
        EmbeddingResult,
        GenerationParams,
        GenerationResult,
        ImageAnalysisBackend,
        ImageData,
        ImageFormat,
        ImageMetadata,
        PluginCapabilities,
        PluginInfo,
        ReloadableBackend,
        SegmentationResult,
    )
    from themis_clip.plugin import (
        OnnxClipPlugin,
        PluginState,
        ReloadReport,
    )
    from themis_clip.preprocess.image import preprocess_image
    from themis_clip.registry import (
        available_backends,
        create_image_plugin,
        destroy_image_plugin,
        get_image_plugin_api_version,
        load_backend,
    )
    from themis_clip.resources import demo_model_path
    from themis_clip.vocabulary import (
        CLIP_MEAN,
        CLIP_STD,
        DecodeMode,
        ModelIdentity,
        ResizeMode,
    )

# Where each exported name lives (the imports above are for type checkers only).
_HOMES: dict[str, str] = {
    "ModelConfig": "themis_clip.config",
    "PluginConfig": "themis_clip.config",
    "PreprocessConfig": "themis_clip.config",
    "SessionConfig": "themis_clip.config",
    "TensorRTConfig": "themis_clip.config",
    "BackendUnavailableError": "themis_clip.errors",
    "ConfigError": "themis_clip.errors",
    "ExportError": "themis_clip.errors",
    "ImageDecodeError": "themis_clip.errors",
    "ImageTooLargeError": "themis_clip.errors",
    "IndexModelMismatchError": "themis_clip.errors",
    "InferenceError": "themis_clip.errors",
    "InputError": "themis_clip.errors",
    "IntegrityError": "themis_clip.errors",
    "MetadataError": "themis_clip.errors",
    "ModelError": "themis_clip.errors",
    "ModelFormatError": "themis_clip.errors",
    "ModelMismatchError": "themis_clip.errors",
    "ModelNotFoundError": "themis_clip.errors",
    "NotReadyError": "themis_clip.errors",
    "PluginAPIVersionError": "themis_clip.errors",
    "PluginNotFoundError": "themis_clip.errors",
    "QueueFullError": "themis_clip.errors",
    "RequestTooLargeError": "themis_clip.errors",
    "ResourceBusyError": "themis_clip.errors",
    "SearchIndexError": "themis_clip.errors",
    "TextInputError": "themis_clip.errors",
    "ThemisClipError": "themis_clip.errors",
    "WhereError": "themis_clip.errors",
    "THEMIS_IMAGE_PLUGIN_API_VERSION": "themis_clip.interface",
    "BackendType": "themis_clip.interface",
    "BoundingBox": "themis_clip.interface",
    "CaptionResult": "themis_clip.interface",
    "DetectionResult": "themis_clip.interface",
    "EmbeddingResult": "themis_clip.interface",
    "GenerationParams": "themis_clip.interface",
    "GenerationResult": "themis_clip.interface",
    "ImageAnalysisBackend": "themis_clip.interface",
    "ImageData": "themis_clip.interface",
    "ImageFormat": "themis_clip.interface",
    "ImageMetadata": "themis_clip.interface",
    "PluginCapabilities": "themis_clip.interface",
    "PluginInfo": "themis_clip.interface",
    "ReloadableBackend": "themis_clip.interface",
    "SegmentationResult": "themis_clip.interface",
    "OnnxClipPlugin": "themis_clip.plugin",
    "PluginState": "themis_clip.plugin",
    "ReloadReport": "themis_clip.plugin",
    "preprocess_image": "themis_clip.preprocess.image",
    "available_backends": "themis_clip.registry",
    "create_image_plugin": "themis_clip.registry",
    "destroy_image_plugin": "themis_clip.registry",
    "get_image_plugin_api_version": "themis_clip.registry",
    "load_backend": "themis_clip.registry",
    "demo_model_path": "themis_clip.resources",
    "CLIP_MEAN": "themis_clip.vocabulary",
    "CLIP_STD": "themis_clip.vocabulary",
    "DecodeMode": "themis_clip.vocabulary",
    "ModelIdentity": "themis_clip.vocabulary",
    "ResizeMode": "themis_clip.vocabulary",
}

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "THEMIS_IMAGE_PLUGIN_API_VERSION",
    "BackendType",
    "BackendUnavailableError",
    "BoundingBox",
    "CaptionResult",
    "ConfigError",
    "DecodeMode",
    "DetectionResult",
    "EmbeddingResult",
    "ExportError",
    "GenerationParams",
    "GenerationResult",
    "ImageAnalysisBackend",
    "ImageData",
    "ImageDecodeError",
    "ImageFormat",
    "ImageMetadata",
    "ImageTooLargeError",
    "IndexModelMismatchError",
    "InferenceError",
    "InputError",
    "IntegrityError",
    "MetadataError",
    "ModelConfig",
    "ModelError",
    "ModelFormatError",
    "ModelIdentity",
    "ModelMismatchError",
    "ModelNotFoundError",
    "NotReadyError",
    "OnnxClipPlugin",
    "PluginAPIVersionError",
    "PluginCapabilities",
    "PluginConfig",
    "PluginInfo",
    "PluginNotFoundError",
    "PluginState",
    "PreprocessConfig",
    "QueueFullError",
    "ReloadReport",
    "ReloadableBackend",
    "RequestTooLargeError",
    "ResizeMode",
    "ResourceBusyError",
    "SearchIndexError",
    "SegmentationResult",
    "SessionConfig",
    "TensorRTConfig",
    "TextInputError",
    "ThemisClipError",
    "WhereError",
    "__version__",
    "available_backends",
    "create_image_plugin",
    "demo_model_path",
    "destroy_image_plugin",
    "get_image_plugin_api_version",
    "load_backend",
    "preprocess_image",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'themis_clip' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
