"""The exception tree of themis-clip.

::

    ThemisClipError
    ├── ConfigError                 a config key has a wrong type or value (names the key)
    ├── PluginNotFoundError         no image-analysis plugin registered under that name
    │   └── PluginAPIVersionError   the plugin implements another major plugin-API version
    ├── NotReadyError               the plugin is not initialised (or was shut down)
    ├── BackendUnavailableError     the requested execution provider cannot be used here
    ├── ModelError                  a model could not be loaded or does not behave
    │   ├── ModelNotFoundError      a model file or directory is missing
    │   ├── ModelFormatError        not a readable ONNX model, or a layout we cannot use
    │   ├── IntegrityError          a file's SHA-256 differs from the expected one
    │   └── ModelMismatchError      output shape / embedding dimension differs from the declared one
    ├── SearchIndexError            the search index cannot be opened or used
    │   └── IndexModelMismatchError an index built with another model (identity or dimension)
    ├── InputError                  a caller's input cannot be embedded
    │   ├── ImageDecodeError        bytes/path/array are not a decodable image
    │   ├── ImageTooLargeError      the image declares more pixels than ``max_image_pixels``
    │   ├── TextInputError          not a string, or not encodable
    │   ├── MetadataError           item metadata is not bounded, strict JSON (names the limit)
    │   │   └── WhereError          a ``where`` filter is malformed (names its path)
    │   └── RequestTooLargeError    more items in one request than the service can ever queue
    ├── ResourceBusyError           a shared budget (decoded pixels in flight) stayed full; retry
    ├── QueueFullError              the micro-batching queue is full now; retry after retry_after_s
    ├── ExportError                 the exporter cannot use a checkpoint, tokenizer or calibration
    │                               set (also a ValueError, as the exporter's callers expect)
    ├── CLIError                    a usage or set-up problem of the command line (exit code 2;
    │                               defined in ``themis_clip.cli.common``, the CLI's edge)
    └── InferenceError              ONNX Runtime or OpenVINO failed while running a session

Third-party errors (ONNX Runtime, Pillow, tokenizers) are translated into these where they
enter the package (``runtime.py``, ``preprocess/``); the CLI and the plugin's ``generate_*``
methods are the edges that turn them into exit codes or ``EmbeddingResult(ok=False)``.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "ConfigError",
    "ExportError",
    "ImageDecodeError",
    "ImageTooLargeError",
    "IndexModelMismatchError",
    "InferenceError",
    "InputError",
    "IntegrityError",
    "MetadataError",
    "ModelError",
    "ModelFormatError",
    "ModelMismatchError",
    "ModelNotFoundError",
    "NotReadyError",
    "PluginAPIVersionError",
    "PluginNotFoundError",
    "QueueFullError",
    "RequestTooLargeError",
    "ResourceBusyError",
    "SearchIndexError",
    "TextInputError",
    "ThemisClipError",
    "WhereError",
]


class ThemisClipError(Exception):
    """Base class of every error raised by themis-clip."""


class ConfigError(ThemisClipError):
    """A configuration value is missing, of the wrong type or out of range.

    Attributes:
        key: dotted name of the offending key (``"model.embedding_dim"``), if known.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


class PluginNotFoundError(ThemisClipError):
    """No plugin is registered under the requested name."""


class PluginAPIVersionError(PluginNotFoundError):
    """The plugin was written against another major version of the plugin API."""


class NotReadyError(ThemisClipError):
    """The plugin has not been initialised, or has been shut down."""


class BackendUnavailableError(ThemisClipError):
    """The requested backend (execution provider) is not available on this machine."""


class ModelError(ThemisClipError):
    """A model could not be loaded or validated."""


class ModelNotFoundError(ModelError):
    """A model file or directory does not exist."""


class ModelFormatError(ModelError):
    """The file is not a usable ONNX model, or the directory layout is not understood."""


class IntegrityError(ModelError):
    """A model file's SHA-256 digest differs from the expected one."""


class ModelMismatchError(ModelError):
    """The model's outputs do not match what the configuration or manifest declares."""


class SearchIndexError(ThemisClipError):
    """The index cannot be opened or used (newer schema, corrupt file, missing)."""


class IndexModelMismatchError(SearchIndexError):
    """The index was built with another model: its vectors are not comparable."""


class InputError(ThemisClipError):
    """A caller's input cannot be embedded."""


class ImageDecodeError(InputError):
    """The input is not a decodable image."""


class ImageTooLargeError(InputError):
    """The image declares more pixels than allowed (decompression-bomb guard)."""


class TextInputError(InputError):
    """The text input is not a string or cannot be tokenised."""


class MetadataError(InputError):
    """Item metadata is not bounded, strict JSON (the message names the path and the limit)."""


class WhereError(MetadataError):
    """A ``where`` filter is malformed: an unknown operator, a wrong operand, a bad date or a
    limit passed. ``path`` names where (``where.$or[1].taken.$gte``)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path


class RequestTooLargeError(InputError):
    """One request holds more items than the service can ever queue at once."""


class ResourceBusyError(ThemisClipError):
    """A shared budget (decoded pixels in flight) stayed full for too long; retry later."""


class QueueFullError(ThemisClipError):
    """The batching queue is full; retry after ``retry_after_s``."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ExportError(ThemisClipError, ValueError):
    """The exporter cannot use its input: an unreadable or unsupported checkpoint, tokenizer,
    merges file or calibration set (the message names the file and the problem)."""


class InferenceError(ThemisClipError):
    """ONNX Runtime raised while running a session."""
