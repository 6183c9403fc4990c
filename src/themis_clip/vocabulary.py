"""The shared vocabulary: closed sets and constants every layer speaks (a leaf: imports nothing).

``config``, ``interface``, ``models``, ``preprocess`` and ``runtime`` take these from here, so
that no module imports ``config`` only for a constant and ``config`` and ``interface`` do not
import each other.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "DEFAULT_DECODE_TIMEOUT_S",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "DEFAULT_MAX_PIXELS_IN_FLIGHT",
    "OPTIMIZATION_LEVELS",
    "BackendType",
    "DecodeMode",
    "GraphDType",
    "InferencePrecision",
    "LanguagePrefix",
    "Layout",
    "LoadingMode",
    "ModelIdentity",
    "OptimizationLevel",
    "Padding",
    "Precision",
    "ResizeMode",
    "SpecialTokens",
    "TextCleaning",
    "member_of",
]

_E = TypeVar("_E", bound=enum.StrEnum)

#: OpenAI CLIP's normalisation (``clip/clip.py`` ``_transform``).
CLIP_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)

#: Pillow's own default decompression-bomb limit (~179 megapixels).
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970
#: decoded pixels all concurrent decodes of one plugin may hold: one maximal image at a time
#: (≈ 0.8 GB as Pillow's 4-byte RGB), or sixteen 12-megapixel photos
DEFAULT_MAX_PIXELS_IN_FLIGHT = 200_000_000

#: one image decode stops after this long (its reads fail; see ``preprocess/deadline.py``): a
#: 179-megapixel PNG decodes in about 2 s here
DEFAULT_DECODE_TIMEOUT_S = 10.0


class OptimizationLevel(enum.StrEnum):
    """ONNX Runtime graph optimisation levels, by their config names."""

    DISABLED = "disabled"
    BASIC = "basic"
    EXTENDED = "extended"
    ALL = "all"


#: the level names, in order (kept for callers of the tuple)
OPTIMIZATION_LEVELS = tuple(level.value for level in OptimizationLevel)


class GraphDType(enum.StrEnum):
    """``search.graph_dtype``: the vector type a search graph holds (4, 2 and 1 bytes per
    component); one list for the config, the CLI and the index (``index.settings`` re-exports
    it)."""

    F32 = "f32"
    F16 = "f16"
    I8 = "i8"


class TextCleaning(enum.StrEnum):
    """How text is cleaned before tokenising: OpenAI's exact ``whitespace_clean(basic_clean(t))
    .lower()``, open_clip's ``tokenizer_kwargs.clean`` choices (``canonicalize``: SigLIP;
    ``lower``, ``whitespace``), or none."""

    OPENAI = "openai"
    CANONICALIZE = "canonicalize"
    LOWER = "lower"
    WHITESPACE = "whitespace"
    NONE = "none"


class SpecialTokens(enum.StrEnum):
    """Who adds the special tokens: this package (CLIP's SOT ... EOT) or the tokenizer's own
    post-processor (SigLIP's appended EOS, BERT's CLS/SEP, XLM-R's <s></s>)."""

    CLIP = "clip"
    TOKENIZER = "tokenizer"


class Padding(enum.StrEnum):
    """How a text batch is padded: to its longest row (graphs that take a mask or pool at EOT)
    or to the full context (graphs that pool the last position: SigLIP)."""

    LONGEST = "longest"
    MAX_LENGTH = "max_length"


class LanguagePrefix(enum.StrEnum):
    """Language prefixes: Flores-200 codes glued to the text with no space (NLLB-SigLIP)."""

    FLORES200 = "flores200"


class Precision(enum.StrEnum):
    """The exporter's precision variants (``int8-dynamic``: per-batch activation ranges)."""

    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"
    INT8_DYNAMIC = "int8-dynamic"


def member_of(kind: type[_E], value: object) -> _E | None:
    """``value`` as a member of ``kind``, or None when it names none (Python 3.11's ``in``
    raises for a non-member)."""
    try:
        return kind(value) if isinstance(value, str) else None
    except ValueError:
        return None


class InferencePrecision(enum.StrEnum):
    """The arithmetic a provider runs an fp32 graph in (OpenVINO's ``INFERENCE_PRECISION_HINT``
    names). ``AUTO``: the device's fastest that passes the canary (OpenVINO: bf16 on CPUs with
    AMX or AVX-512 BF16, f16 on GPUs, else f32)."""

    AUTO = "auto"
    F32 = "f32"
    BF16 = "bf16"
    F16 = "f16"


class BackendType(enum.StrEnum):
    """Execution backends (ThemisDB's ``BackendType``, plus ``COREML``).

    ``AUTO`` probes CUDA → TensorRT → DirectML → OpenVINO → CPU (the seed's order, with
    OpenVINO on a CPU that computes in bf16). OpenVINO runs on its own runtime; ONNX Runtime
    providers: CUDA, TensorRT, DirectML, ROCm (MIGraphX, or the older ROCm
    provider), METAL and COREML (CoreML, Apple's route to Metal). OPENCL and VULKAN have no
    ONNX Runtime provider: asking for them fails ``initialize`` with that reason.
    """

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
    TENSORRT = "tensorrt"
    DIRECTML = "directml"
    OPENCL = "opencl"
    VULKAN = "vulkan"
    OPENVINO = "openvino"
    METAL = "metal"
    ROCM = "rocm"
    COREML = "coreml"


class ResizeMode(enum.StrEnum):
    """How an image is brought to the model's square input (open_clip's ``resize_mode``)."""

    SHORTEST = "shortest"  # OpenAI CLIP: shortest side to S, centre crop S×S
    SQUASH = "squash"  # both sides to S, aspect ratio not kept (SigLIP)
    LONGEST = "longest"  # longest side to S, pad to S×S with the fill colour


class Layout(enum.StrEnum):
    """Which model-directory layout a model was read from (``ModelSpec.layout``)."""

    FILE = "file"  # a bare image-tower .onnx (plus optional text tower and tokenizer)
    THEMIS = "themis"  # this project's manifest.json layout
    IMMICH = "immich"
    TRANSFORMERS_JS = "transformers.js"
    CLIP_AS_SERVICE = "clip-as-service"
    LAKERA = "lakera"


class LoadingMode(enum.StrEnum):
    """How ONNX Runtime reads a tower: from its file, or a memory-mapped weights cache."""

    PATH = "path"
    MMAP = "mmap"


class DecodeMode(enum.StrEnum):
    """``preprocess.decode_mode``: the reference's full decode, DCT-scaled JPEG decoding to no
    less than twice the model input (the default), or, opt-in, to no less than the input
    itself (rclip's rule: other vectors, cheaper decodes)."""

    EXACT = "exact"
    FAST = "fast"
    DRAFT = "draft"


@dataclass(frozen=True, kw_only=True)
class ModelIdentity:
    """What makes two models' vectors comparable: name, content digest, dimension.

    The one identity type: the plugin reports it, an index records and enforces it. A precision
    variant (int8, fp16...) is another embedding space: :meth:`of_variant` folds its name into
    both the name and the digest, so that every check that compares ``sha256`` (the index's
    ``bind_model``, ``/index/info``'s ``comparable``, the reload guard) refuses to mix an int8
    variant's vectors with its fp32 twin's unless the operator allows the space change.
    """

    name: str
    sha256: str
    embedding_dim: int

    @property
    def model_id(self) -> str:
        return f"{self.name}@{self.sha256[:12]}"

    @property
    def dim(self) -> int:
        """Short name of ``embedding_dim`` (the index's)."""
        return self.embedding_dim

    @classmethod
    def of_variant(
        cls, *, name: str, sha256: str, embedding_dim: int, variant: str = "fp32"
    ) -> ModelIdentity:
        """The identity of precision ``variant`` of the model whose content digest is ``sha256``.

        fp32 keeps the model's own name and digest (indexes built before variants counted keep
        working); any other variant is ``name-variant`` with the SHA-256 of
        ``"<sha256>:<variant>"``: its vectors are close to fp32's (cosine ≥ 0.99) but not the
        same, and a search over a mix of both ranks by which model wrote an item.
        """
        if variant == "fp32":
            return cls(name=name, sha256=sha256, embedding_dim=embedding_dim)
        digest = hashlib.sha256(f"{sha256}:{variant}".encode()).hexdigest()
        return cls(name=f"{name}-{variant}", sha256=digest, embedding_dim=embedding_dim)

    @classmethod
    def from_model_id(cls, model_id: str, *, sha256: str, dim: int) -> ModelIdentity:
        """From a ``name@digest`` id (as indexes and Parquet outputs record it)."""
        return cls(name=model_id.rsplit("@", 1)[0], sha256=sha256, embedding_dim=dim)
