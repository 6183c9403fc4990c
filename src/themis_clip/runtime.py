"""The only module that imports ``onnxruntime``: provider policy, session options, sessions.

Provider selection is a pure function (:func:`plan_providers`) of the requested backend and
the list of providers ONNX Runtime reports, so tests drive it with injected lists. A plan is
then *proven* by creating the session and reading ``session.get_providers()``: ONNX Runtime
silently drops a GPU provider that fails to initialise, and we never let that become a silent
CPU fallback for an explicitly requested GPU backend. ``AUTO`` walks its plans in the seed's
order (CUDA → TensorRT → DirectML → CPU) and keeps the first that really holds.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.errors import (
    BackendUnavailableError,
    InferenceError,
    ModelFormatError,
    ModelNotFoundError,
)
from themis_clip.interface import BackendType

__all__ = [
    "PROVIDER_NAMES",
    "ORTSession",
    "ProviderPlan",
    "SessionSettings",
    "TensorInfo",
    "available_providers",
    "create_session",
    "plan_providers",
]

log = logging.getLogger(__name__)

PROVIDER_NAMES: Mapping[BackendType, str] = {
    BackendType.CPU: "CPUExecutionProvider",
    BackendType.CUDA: "CUDAExecutionProvider",
    BackendType.TENSORRT: "TensorrtExecutionProvider",
    BackendType.DIRECTML: "DmlExecutionProvider",
    BackendType.ROCM: "ROCMExecutionProvider",
    BackendType.OPENVINO: "OpenVINOExecutionProvider",
    BackendType.COREML: "CoreMLExecutionProvider",
}
_BACKEND_OF_PROVIDER = {v: k for k, v in PROVIDER_NAMES.items()}
_AUTO_ORDER = (BackendType.CUDA, BackendType.TENSORRT, BackendType.DIRECTML)

_ORT_DTYPES: Mapping[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(bool)": np.dtype(np.bool_),
}


@dataclass(frozen=True, kw_only=True)
class ProviderPlan:
    """One candidate provider list for a session.

    Attributes:
        backend: the backend this plan stands for.
        providers: ``(provider name, options)`` in ONNX Runtime priority order.
        note: why this plan differs from what was asked (e.g. DirectML off Windows).
    """

    backend: BackendType
    providers: tuple[tuple[str, Mapping[str, str]], ...]
    note: str | None = None

    @property
    def serialize_runs(self) -> bool:
        """DirectML sessions allow one ``run`` at a time (REFERENCE.md §4)."""
        return self.backend is BackendType.DIRECTML


@dataclass(frozen=True, kw_only=True)
class SessionSettings:
    """Session options chosen by the plugin configuration."""

    intra_op_threads: int | None = None
    device_id: int = 0
    tensorrt_cache_dir: str | None = None
    tensorrt_fp16: bool = False
    prepack_weights: bool = True


def available_providers() -> list[str]:
    """Providers this ONNX Runtime build offers (a build fact, not a device probe)."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def plan_providers(
    requested: BackendType,
    available: Sequence[str],
    *,
    settings: SessionSettings = SessionSettings(),
    platform: str = sys.platform,
) -> list[ProviderPlan]:
    """Return the provider plans to try, best first.

    Args:
        requested: the backend asked for.
        available: what ``onnxruntime.get_available_providers()`` reports.
        settings: device id and TensorRT options.
        platform: ``sys.platform``; DirectML exists on Windows only.

    Raises:
        BackendUnavailableError: an explicit backend whose provider is not available.
    """
    cpu_only: tuple[tuple[str, Mapping[str, str]], ...] = ((PROVIDER_NAMES[BackendType.CPU], {}),)
    cpu = ProviderPlan(backend=BackendType.CPU, providers=cpu_only)
    if requested is BackendType.AUTO:
        plans = []
        for backend in _AUTO_ORDER:
            if backend is BackendType.DIRECTML and not platform.startswith("win"):
                continue
            if PROVIDER_NAMES[backend] in available:
                plans.append(_plan(backend, settings))
        return [*plans, cpu]
    if requested is BackendType.CPU:
        return [cpu]
    if requested is BackendType.DIRECTML and not platform.startswith("win"):
        # The seed: "on Linux BackendType::DirectML falls back to CPU". get_backend() says CPU.
        note = f"DirectML exists only on Windows; {platform} uses the CPU backend instead"
        return [ProviderPlan(backend=BackendType.CPU, providers=cpu.providers, note=note)]
    name = PROVIDER_NAMES[requested]
    if name not in available:
        raise BackendUnavailableError(
            f"backend {requested.value!r} needs {name}, which this onnxruntime build does not "
            f"offer (available: {', '.join(available) or 'none'}); install the matching "
            "onnxruntime package or choose another backend"
        )
    return [_plan(requested, settings)]


def _plan(backend: BackendType, settings: SessionSettings) -> ProviderPlan:
    device = {"device_id": str(settings.device_id)}
    cpu: tuple[str, Mapping[str, str]] = (PROVIDER_NAMES[BackendType.CPU], {})
    if backend is BackendType.TENSORRT:
        trt: dict[str, str] = {**device, "trt_fp16_enable": str(settings.tensorrt_fp16)}
        if settings.tensorrt_cache_dir:
            trt["trt_engine_cache_enable"] = "True"
            trt["trt_engine_cache_path"] = settings.tensorrt_cache_dir
            trt["trt_timing_cache_enable"] = "True"
            trt["trt_timing_cache_path"] = settings.tensorrt_cache_dir
        # TensorRT must precede CUDA to receive any node; CUDA then CPU take the rest.
        providers: tuple[tuple[str, Mapping[str, str]], ...] = (
            (PROVIDER_NAMES[BackendType.TENSORRT], trt),
            (PROVIDER_NAMES[BackendType.CUDA], device),
            cpu,
        )
    elif backend in (BackendType.CUDA, BackendType.DIRECTML, BackendType.ROCM):
        providers = ((PROVIDER_NAMES[backend], device), cpu)
    else:
        providers = ((PROVIDER_NAMES[backend], {}), cpu)
    return ProviderPlan(backend=backend, providers=providers)


@dataclass(frozen=True, kw_only=True)
class TensorInfo:
    """Name, shape (ints for fixed axes, str/None for dynamic ones) and dtype of a tensor."""

    name: str
    shape: tuple[int | str | None, ...]
    dtype: np.dtype[Any]

    def fixed_dim(self, axis: int) -> int | None:
        """The axis length if it is fixed in the graph, else None."""
        if axis >= len(self.shape):
            return None
        dim = self.shape[axis]
        return dim if isinstance(dim, int) and dim > 0 else None


@dataclass
class ORTSession:
    """An ``onnxruntime.InferenceSession`` with typed I/O and translated errors.

    ``run`` is thread-safe: ONNX Runtime allows concurrent ``run`` on CPU/CUDA sessions, and
    sessions that do not (DirectML) carry a lock.
    """

    session: Any
    backend: BackendType
    path: Path
    loading_mode: str
    name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    providers: tuple[str, ...]
    _lock: threading.Lock | None = None
    _on_close: list[Callable[[], None]] = field(default_factory=list)

    def run(
        self, output_names: Sequence[str] | None, feeds: Mapping[str, npt.NDArray[Any]]
    ) -> list[npt.NDArray[Any]]:
        """Run the session; ONNX Runtime failures become :class:`InferenceError`."""
        session = self.session
        if session is None:
            raise InferenceError(f"session for {self.name} is closed")
        try:
            if self._lock is not None:
                with self._lock:
                    return list(session.run(output_names, dict(feeds)))
            return list(session.run(output_names, dict(feeds)))
        except Exception as exc:  # ORT raises pybind11 types that share no useful base
            raise InferenceError(f"{self.name}: ONNX Runtime failed: {exc}") from exc

    def close(self) -> None:
        """Drop the session; later ``run`` calls fail cleanly."""
        self.session = None
        while self._on_close:
            self._on_close.pop()()


def create_session(
    path: Path,
    plan: ProviderPlan,
    settings: SessionSettings,
    *,
    loading_mode: str = "path",
    name: str | None = None,
) -> ORTSession:
    """Create a session under ``plan`` and check that its first provider really holds.

    Args:
        path: the ONNX file ONNX Runtime loads (for ``"mmap"``, the converted graph whose
            page-aligned external weights ONNX Runtime maps instead of reading).
        plan: providers to use. settings: thread and provider options.
        loading_mode: reported in statistics. name: how errors name the model file.

    Raises:
        ModelNotFoundError: the file is missing.
        ModelFormatError: ONNX Runtime cannot load the file.
        BackendUnavailableError: the plan's provider did not initialise.
    """
    import onnxruntime as ort

    if not path.is_file():
        raise ModelNotFoundError(f"model file not found: {path}")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if settings.intra_op_threads is not None:
        options.intra_op_num_threads = settings.intra_op_threads
    if not settings.prepack_weights:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if plan.serialize_runs:
        options.enable_mem_pattern = False
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    names = [name for name, _ in plan.providers]
    provider_options = [dict(opts) for _, opts in plan.providers]
    try:
        session = ort.InferenceSession(
            str(path), sess_options=options, providers=names, provider_options=provider_options
        )
    except Exception as exc:  # InvalidProtobuf, InvalidGraph, Fail, ... (pybind11 types)
        if plan.backend is not BackendType.CPU and "Provider" in str(exc):
            raise BackendUnavailableError(f"{names[0]} failed to initialise: {exc}") from exc
        raise ModelFormatError(f"ONNX Runtime cannot load {name or path}: {exc}") from exc
    used = tuple(session.get_providers())
    if not used or used[0] != names[0]:
        raise BackendUnavailableError(
            f"{names[0]} was requested for backend {plan.backend.value!r} but the session runs "
            f"on {', '.join(used) or 'nothing'} (no usable device or driver?)"
        )
    inputs = tuple(_info(x) for x in session.get_inputs())
    outputs = tuple(_info(x) for x in session.get_outputs())
    log.info(
        "loaded %s on %s (%s, %s)", name or path.name, used[0], plan.backend.value, loading_mode
    )
    return ORTSession(
        session=session,
        backend=_BACKEND_OF_PROVIDER.get(used[0], plan.backend),
        path=path,
        loading_mode=loading_mode,
        name=name or path.name,
        inputs=inputs,
        outputs=outputs,
        providers=used,
        _lock=threading.Lock() if plan.serialize_runs else None,
    )


def _info(node: Any) -> TensorInfo:
    dtype = _ORT_DTYPES.get(node.type)
    if dtype is None:
        raise ModelFormatError(f"tensor {node.name!r} has unsupported type {node.type}")
    shape = tuple(d if isinstance(d, int | str) else None for d in (node.shape or ()))
    return TensorInfo(name=node.name, shape=shape, dtype=dtype)
