"""Our interface against ThemisDB's published plugin contract, field by field.

Written out from ``include/plugins/image_analysis_interface.h`` (API ``1.0.0``) and
``plugins/image_analysis/onnx_clip/onnx_clip_plugin.h`` as read at ThemisDB commits
00c723d2705a79e4c6884ce4143772e480a48496 and 03329d86df44369c9a0eebd341f910ab75bbb735
(makr-code/ThemisDB). C++ names are spelled in Python: ``generateEmbedding`` is
``generate_embedding``, ``isReady`` is ``is_ready``.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import themis_clip
from themis_clip import (
    THEMIS_IMAGE_PLUGIN_API_VERSION,
    BackendType,
    BoundingBox,
    CaptionResult,
    DetectionResult,
    EmbeddingResult,
    GenerationParams,
    GenerationResult,
    ImageAnalysisBackend,
    ImageFormat,
    ImageMetadata,
    ModelConfig,
    OnnxClipPlugin,
    PluginAPIVersionError,
    PluginCapabilities,
    PluginConfig,
    PluginInfo,
    SegmentationResult,
)
from themis_clip.errors import BackendUnavailableError
from themis_clip.registry import _check_api_version

# struct name -> (our type, the header's fields in order, with the header's defaults where
# it gives them; None: no default in the header).
STRUCTS: dict[str, tuple[type, list[tuple[str, Any]]]] = {
    "ImageMetadata": (
        ImageMetadata,
        [
            ("width", 0),
            ("height", 0),
            ("channels", 0),
            ("format", ImageFormat.UNKNOWN),
            ("bits_per_channel", 8),
            ("exif", None),
            ("color_space", "sRGB"),
        ],
    ),
    "CaptionResult": (
        CaptionResult,
        [
            ("success", False),
            ("error_message", ""),
            ("caption", ""),
            ("confidence", 0.0),
            ("model_name", ""),
            ("alternatives", ()),
            ("inference_time_ms", 0),
        ],
    ),
    "DetectionResult::BoundingBox": (
        BoundingBox,
        [
            ("x", 0.0),
            ("y", 0.0),
            ("width", 0.0),
            ("height", 0.0),
            ("label", ""),
            ("confidence", 0.0),
        ],
    ),
    "DetectionResult": (
        DetectionResult,
        [
            ("success", False),
            ("error_message", ""),
            ("detections", ()),
            ("model_name", ""),
            ("inference_time_ms", 0),
        ],
    ),
    "SegmentationResult": (
        SegmentationResult,
        [
            ("success", False),
            ("error_message", ""),
            ("mask", b""),
            ("width", 0),
            ("height", 0),
            ("labels", ()),
            ("model_name", ""),
            ("inference_time_ms", 0),
        ],
    ),
    "GenerationParams": (
        GenerationParams,
        [
            ("prompt", ""),
            ("negative_prompt", ""),
            ("width", 512),
            ("height", 512),
            ("num_inference_steps", 50),
            ("guidance_scale", 7.5),
            ("seed", -1),
            ("strength", 0.8),
            ("init_image", b""),
            ("extra_params", {}),
        ],
    ),
    "GenerationResult": (
        GenerationResult,
        [
            ("success", False),
            ("error_message", ""),
            ("image_data", b""),
            ("metadata", ImageMetadata()),
            ("model_name", ""),
            ("inference_time_ms", 0),
            ("seed_used", -1),
        ],
    ),
    "PluginCapabilities": (
        PluginCapabilities,
        [
            ("supports_embedding", False),
            ("supports_captioning", False),
            ("supports_detection", False),
            ("supports_segmentation", False),
            ("supports_generation", False),
            ("supports_image_to_image", False),
            ("supports_visual_qa", False),
            ("supports_batch_processing", False),
            ("supports_streaming", False),
            ("thread_safe", False),
            ("supported_backends", ()),
            ("min_memory_mb", 2048),
            ("recommended_memory_mb", 8192),
        ],
    ),
    "PluginInfo": (
        PluginInfo,
        [
            ("name", None),
            ("version", None),
            ("description", None),
            ("author", ""),
            ("license", ""),
            ("model_name", ""),
            ("model_version", ""),
            ("supported_formats", ()),
            ("capabilities", PluginCapabilities()),
        ],
    ),
}

HEADER_BACKENDS = [
    "CPU",
    "CUDA",
    "DIRECTML",
    "OPENCL",
    "VULKAN",
    "TENSORRT",
    "OPENVINO",
    "METAL",
    "ROCM",
    "AUTO",
]
HEADER_FORMATS = ["UNKNOWN", "JPEG", "PNG", "BMP", "TIFF", "WEBP", "GIF", "SVG", "RAW"]

# IImageAnalysisBackend: method -> (parameters after self, required by the header?)
METHODS: dict[str, tuple[list[str], bool]] = {
    "get_info": ([], True),
    "initialize": (["config", "backend"], True),
    "shutdown": ([], True),
    "is_ready": ([], True),
    "get_backend": ([], True),
    "generate_embedding": (["image_data", "metadata"], True),
    "generate_caption": (["image_data", "metadata", "max_length"], False),
    "detect_objects": (["image_data", "metadata", "confidence_threshold"], False),
    "segment_image": (["image_data", "metadata"], False),
    "generate_image": (["params"], False),
    "answer_visual_question": (["image_data", "question", "metadata"], False),
    "generate_embedding_batch": (["images"], False),
    "health_check": ([], True),
    "get_statistics": ([], False),
    "warmup": ([], False),
}


@pytest.mark.parametrize("struct", list(STRUCTS))
def test_structs_have_the_headers_fields_and_defaults(struct: str) -> None:
    ours, fields = STRUCTS[struct]
    names = {f.name for f in dataclasses.fields(ours)}
    for name, _ in fields:
        assert name in names, f"{struct}.{name} missing"
    if all(d is not None for _, d in fields):
        made = ours()
        for name, default in fields:
            assert getattr(made, name) == default, f"{struct}.{name} default"


def test_embedding_result_speaks_both_names() -> None:
    vec = np.ones(4, dtype=np.float32) / 2
    r = EmbeddingResult.success(vec, latency_ms=12.6, model_id="clip-vit@abcdef123456")
    assert r.success is True and r.ok is True and r.error_message == "" and r.error is None
    assert r.dimension == 4 and r.model_name == "clip-vit" and r.inference_time_ms == 13
    f = EmbeddingResult.failure(ValueError("bad"), latency_ms=1.0)
    assert f.success is False and f.error_message == "bad" and f.dimension == 0


def test_enums_have_the_headers_members() -> None:
    assert [m for m in HEADER_BACKENDS if m not in BackendType.__members__] == []
    assert [m for m in HEADER_FORMATS if m not in ImageFormat.__members__] == []
    assert THEMIS_IMAGE_PLUGIN_API_VERSION == "1.0.0"


def test_base_class_methods_and_defaults() -> None:
    abstract = ImageAnalysisBackend.__abstractmethods__
    for name, (params, required) in METHODS.items():
        method = getattr(ImageAnalysisBackend, name)
        got = list(inspect.signature(method).parameters)[1:]
        assert got == params, (name, got)
        assert (name in abstract) == required, name

    class Minimal(ImageAnalysisBackend):  # only what the header requires
        def get_info(self) -> PluginInfo:
            return PluginInfo(name="m", version="0", description="")

        def initialize(self, config: Any, backend: Any = BackendType.AUTO) -> bool:
            return True

        def shutdown(self) -> None: ...

        def is_ready(self) -> bool:
            return True

        def get_backend(self) -> BackendType:
            return BackendType.CPU

        def generate_embedding(self, image_data: Any, metadata: Any = None) -> EmbeddingResult:
            return EmbeddingResult.success(
                np.ones(2, np.float32), latency_ms=0.0, model_id=str(image_data)
            )

        def health_check(self) -> bool:
            return True

    m = Minimal()
    assert m.generate_caption(b"x").error_message == "Captioning not supported by this plugin"
    assert not m.detect_objects(b"x").success
    assert m.detect_objects(b"x").error_message == "Object detection not supported by this plugin"
    assert m.segment_image(b"x").error_message == "Segmentation not supported by this plugin"
    assert (
        m.generate_image(GenerationParams(prompt="a cat")).error_message
        == "Image generation not supported by this plugin"
    )
    assert m.answer_visual_question(b"x", "why?") == (
        "Visual question answering not supported by this plugin"
    )
    assert [r.model_id for r in m.generate_embedding_batch(["a", "b"])] == ["a", "b"]
    assert m.get_statistics() == {} and m.warmup() == {}
    t = m.generate_text_embedding("a cat")
    assert not t.ok and "not supported" in (t.error or "")


def test_plugin_info_is_filled_truthfully(tiny_model_dir: Path) -> None:
    plugin = OnnxClipPlugin(available_providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    before = plugin.get_info()
    assert before.name == "onnx_clip" and before.model_name == ""
    caps = before.capabilities
    assert caps.supports_embedding and caps.supports_batch_processing and caps.thread_safe
    assert not (caps.supports_captioning or caps.supports_generation or caps.supports_streaming)
    assert caps.supported_backends == (BackendType.CPU, BackendType.CUDA)
    assert "image_embedding" in caps  # the names of earlier versions still answer
    assert {"JPEG", "PNG", "WEBP"} <= set(before.supported_formats)
    assert plugin.initialize(PluginConfig(model=ModelConfig(path=str(tiny_model_dir))))
    info = plugin.get_info()
    identity = plugin.model_identity
    assert identity is not None
    assert info.model_name == identity.name and info.model_version == identity.sha256[:12]
    files = sum(p.stat().st_size for p in tiny_model_dir.iterdir() if p.suffix == ".onnx")
    assert info.capabilities.min_memory_mb >= files // 2**20 + 100
    assert info.capabilities.recommended_memory_mb > info.capabilities.min_memory_mb
    assert info.license == "MIT" and info.author
    plugin.shutdown()


@pytest.mark.parametrize(
    ("backend", "provider"),
    [
        (BackendType.OPENVINO, "OpenVINOExecutionProvider"),
        (BackendType.ROCM, "MIGraphXExecutionProvider"),
        (BackendType.ROCM, "ROCMExecutionProvider"),
        (BackendType.METAL, "CoreMLExecutionProvider"),
    ],
)
def test_new_backends_map_to_their_providers(backend: BackendType, provider: str) -> None:
    from themis_clip.runtime import plan_providers

    plans = plan_providers(backend, [provider, "CPUExecutionProvider"])
    assert plans[0].backend is backend and plans[0].providers[0][0] == provider
    with pytest.raises(BackendUnavailableError, match=backend.value):
        plan_providers(backend, ["CPUExecutionProvider"])


@pytest.mark.parametrize("backend", [BackendType.OPENCL, BackendType.VULKAN])
def test_backends_without_a_provider_are_refused(
    backend: BackendType, tiny_model_dir: Path
) -> None:
    everything = ["CUDAExecutionProvider", "OpenVINOExecutionProvider", "CPUExecutionProvider"]
    plugin = OnnxClipPlugin(available_providers=everything)
    config = PluginConfig(model=ModelConfig(path=str(tiny_model_dir)))
    assert not plugin.initialize(config, backend)  # never a silent CPU fallback
    assert f"no {backend.name.title() if backend is BackendType.VULKAN else 'OpenCL'}" in (
        plugin.last_error or ""
    )
    assert not plugin.is_ready()


def test_api_version_is_checked_when_loading_a_backend() -> None:
    assert themis_clip.get_image_plugin_api_version() == "1.0.0"
    _check_api_version("ok", "1.4.2")  # same major: fine
    for bad in ("2.0.0", "0.9", None, "x"):
        with pytest.raises(PluginAPIVersionError, match="plugin API"):
            _check_api_version("other", bad)
    plugin = themis_clip.create_image_plugin("onnx_clip")
    assert isinstance(plugin, OnnxClipPlugin)
    themis_clip.destroy_image_plugin(plugin)
    assert not plugin.is_ready()


def test_config_offers_the_headers_accessors() -> None:
    config = PluginConfig.from_dict({"model": {"path": "/m", "variant": "int8"}})
    assert config.get("model.variant", "fp32") == "int8"
    assert config.get("model.missing", "fallback") == "fallback"
    assert config.has("max_batch_size") and not config.has("model.missing")
    assert config.raw()["model"]["path"] == "/m"


def test_image_metadata_orientation_and_format_hint(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from PIL import Image

    from tests.helpers import photo_like

    plugin = OnnxClipPlugin()
    assert plugin.initialize(PluginConfig(model=ModelConfig(path=str(tiny_model_dir))))
    arr = photo_like(60, 40, 11)
    # Orientation 6 (camera turned clockwise): the upright image is the array turned 90° CW.
    declared = plugin.generate_embedding(arr, ImageMetadata(exif={"Orientation": 6}))
    upright = plugin.generate_embedding(np.ascontiguousarray(np.rot90(arr, k=-1)))
    plain = plugin.generate_embedding(arr)
    assert np.array_equal(declared.embedding, upright.embedding)
    assert not np.array_equal(declared.embedding, plain.embedding)
    assert isinstance(declared.metadata, ImageMetadata)  # passed through
    # A JPEG's own EXIF orientation wins over a declared one.
    img = Image.fromarray(arr)
    exif = img.getexif()
    exif[0x0112] = 3
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=95, exif=exif.tobytes())
    own = plugin.generate_embedding(buf.getvalue())
    both = plugin.generate_embedding(buf.getvalue(), ImageMetadata(exif={274: 6}))
    assert np.array_equal(own.embedding, both.embedding)
    # The declared format is tried first; a wrong declaration still decodes from the data.
    opened: list[object] = []
    real_open = Image.open

    def spy(fp: Any, mode: str = "r", formats: Any = None) -> Image.Image:
        opened.append(formats)
        return real_open(fp, mode, formats)

    monkeypatch.setattr(Image, "open", spy)
    png = io.BytesIO()
    img.save(png, "PNG")
    hinted = plugin.generate_embedding(png.getvalue(), ImageMetadata(format=ImageFormat.PNG))
    assert opened == [["PNG"]] and hinted.ok
    opened.clear()
    wrong = plugin.generate_embedding(png.getvalue(), ImageMetadata(format=ImageFormat.JPEG))
    assert opened == [["JPEG"], None] and wrong.ok
    assert np.array_equal(wrong.embedding, hinted.embedding)
    plugin.shutdown()


def test_a_loaded_backend_can_be_asked_for_text_and_reloads() -> None:
    from themis_clip import ReloadableBackend, load_backend

    backend = load_backend("onnx_clip")
    assert isinstance(backend, ImageAnalysisBackend) and isinstance(backend, ReloadableBackend)
    assert callable(backend.generate_text_embedding)
