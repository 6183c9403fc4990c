"""What the plugin says about itself: ThemisDB's ``PluginInfo`` and its capabilities, and its
``get_statistics()`` document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from themis_clip._version import __version__
from themis_clip.engine import ClipModel
from themis_clip.hotswap import SwapRecord
from themis_clip.interface import BackendType, PluginCapabilities, PluginInfo
from themis_clip.pipeline import DecodePool
from themis_clip.preprocess.image import readable_formats
from themis_clip.runtime import available_providers, supported_backends
from themis_clip.stats import Statistics

__all__ = [
    "FEATURES",
    "NO_MODEL",
    "capabilities",
    "memory_estimate_mb",
    "plugin_info",
    "statistics",
]

FEATURES = (
    "image_embedding",
    "text_embedding",
    "batch_embedding",
    "hot_reload",
    "health_check",
    "warmup",
)

#: the header's defaults, kept until a model is loaded
_DEFAULT_MEMORY_MB = (2048, 8192)

#: ``get_statistics()``'s model fields before ``initialize`` (what ``ClipModel.describe`` fills)
NO_MODEL: dict[str, Any] = {
    "backend": BackendType.AUTO.value,
    "providers": [],
    "precision": None,
    "canary": None,
    "model_variant": None,
    "model_id": None,
    "model_sha256": None,
    "precision_variant": None,
    "embedding_dim": None,
    "image_size": None,
    "text_tower": False,
    "text_input": None,
    "generation": 0,
    "in_flight": 0,
    "loading_mode": None,
    "loading_note": None,
    "optimized_model_cache": {},
}


def memory_estimate_mb(model: ClipModel | None) -> tuple[int, int]:
    """``(min_memory_mb, recommended_memory_mb)`` for ``model``.

    The minimum is the model's files (the weights ONNX Runtime holds) plus 100 MB of runtime;
    the recommendation twice the files plus the decode buffers of ``prefetch_batches + 1``
    batches plus 300 MB. Without a model: the header's defaults (2048 / 8192).
    """
    if model is None:
        return _DEFAULT_MEMORY_MB
    files_mb = sum(p.stat().st_size for p in model.spec.model_files() if p.is_file()) // 2**20
    size = model.preprocessor.spec.image_size
    config = model.config
    buffers_mb = (
        (config.prefetch_batches + 1) * config.max_batch_size * 3 * size * size * 4
    ) // 2**20
    return files_mb + 100, 2 * files_mb + buffers_mb + 300


def capabilities(model: ClipModel | None, available: Sequence[str] | None) -> PluginCapabilities:
    """The plugin's capabilities; ``available`` overrides what ONNX Runtime reports."""
    providers = list(available) if available is not None else available_providers()
    min_mb, recommended_mb = memory_estimate_mb(model)
    return PluginCapabilities(
        supports_embedding=True,
        supports_batch_processing=True,
        supports_streaming=False,
        thread_safe=True,
        supported_backends=tuple(supported_backends(providers)),
        features=FEATURES,
        min_memory_mb=min_mb,
        recommended_memory_mb=recommended_mb,
    )


def plugin_info(name: str, model: ClipModel | None, available: Sequence[str] | None) -> PluginInfo:
    """ThemisDB's ``PluginInfo`` for a plugin called ``name`` running ``model`` (or none)."""
    return PluginInfo(
        name=name,
        version=__version__,
        description="OpenAI CLIP models exported to ONNX, on ONNX Runtime: L2-normalised "
        "image and text embeddings for multi-modal vector search",
        author="themis-clip developers",
        license="MIT",
        model_name=model.identity.name if model else "",
        model_version=model.identity.sha256[:12] if model else "",
        supported_formats=readable_formats(),
        capabilities=capabilities(model, available),
    )


def statistics(
    stats: Statistics,
    model: ClipModel | None,
    swap: SwapRecord,
    pool: DecodePool,
    last_health: bool | None,
) -> dict[str, Any]:
    """The JSON-serialisable ``get_statistics()`` of a plugin made of these parts."""
    out = stats.snapshot()
    out.update(
        state=swap.state.value,
        ready=model is not None,
        **(model.describe() if model else NO_MODEL),
        last_health_check=last_health,
        last_reload_error=swap.last_error,
        last_reload=swap.last_report.as_dict() if swap.last_report else None,
        state_history=list(swap.history),
        preprocess_workers=pool.workers,
        pixel_budget=pool.budget.stats() if pool.budget else None,
        **swap.counts,
    )
    return out
