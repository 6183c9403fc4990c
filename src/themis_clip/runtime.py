"""The core's only module that imports ``onnxruntime`` and ``openvino``: provider policy, session
options, sessions.

Provider selection is a pure function (:func:`plan_providers`) of the requested backend and
the list of providers ONNX Runtime reports, so tests drive it with injected lists. A plan is
then *proven* by creating the session and reading ``session.get_providers()``: ONNX Runtime
silently drops a GPU provider that fails to initialise, and we never let that become a silent
CPU fallback for an explicitly requested GPU backend. ``AUTO`` walks its plans in the seed's
order (CUDA → TensorRT → DirectML → OpenVINO → CPU) and keeps the first that really holds (and,
one layer up, passes the canary).

OpenVINO runs a graph on its own runtime (the ``openvino`` package, the ``openvino`` extra):
the same ONNX file compiled for one of its devices (``CPU``, ``GPU.0``, ``NPU``) with its
precision hint, behind the same :class:`ORTSession` surface. It is offered wherever the package
finds a device, any vendor's CPU included. ONNX Runtime's own OpenVINO plugin EP is not used: it
lists Intel devices only, so an AMD CPU with AVX-512 BF16 got nothing from it. AUTO takes
OpenVINO on a CPU only in bf16 (AMX or AVX-512 BF16), where it is 2-4x ONNX Runtime's fp32; in
f32 it gains little, so AUTO stays on ONNX Runtime there (``--backend openvino`` still runs it).

Every session run carries its own ``onnxruntime.RunOptions``: a run past the session's
``run_timeout_s`` is stopped by ONNX Runtime's ``terminate`` flag (one watchdog thread for the
process), and so are the runs in flight when a session is closed, so that a model that never
finishes cannot hold a core, a reload or a shutdown for ever.

ONNX Runtime's model tools (fp16 conversion, int8 quantisation) are the exporter's business and
live in :mod:`themis_clip.export.precision`, outside the core.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import json
import logging
import os
import platform
import re
import shutil
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt

import themis_clip.jsonio as jsonio
from themis_clip.errors import (
    BackendUnavailableError,
    ConfigError,
    InferenceError,
    ModelFormatError,
    ModelNotFoundError,
)
from themis_clip.interface import BackendType
from themis_clip.vocabulary import InferencePrecision, LoadingMode, OptimizationLevel

__all__ = [
    "BACKEND_ENV",
    "PROVIDER_NAMES",
    "ORTSession",
    "ProviderPlan",
    "SessionSettings",
    "TensorInfo",
    "auto_backend",
    "available_providers",
    "cpu_flags",
    "create_session",
    "forget_compiled",
    "kept_folder",
    "model_file_key",
    "openvino_devices",
    "openvino_version",
    "plan_providers",
    "prune_kept",
    "supported_backends",
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
    BackendType.METAL: "CoreMLExecutionProvider",
}
#: Providers that serve a backend, preferred first: AMD's MIGraphX replaced the ROCm provider
#: in recent ONNX Runtime releases; Metal is reached through CoreML.
PROVIDER_CANDIDATES: Mapping[BackendType, tuple[str, ...]] = {
    **{b: (name,) for b, name in PROVIDER_NAMES.items()},
    BackendType.ROCM: ("MIGraphXExecutionProvider", "ROCMExecutionProvider"),
}
#: Backends of ThemisDB's interface that ONNX Runtime has no provider for.
NO_PROVIDER: Mapping[BackendType, str] = {
    BackendType.OPENCL: "ONNX Runtime has no OpenCL execution provider",
    BackendType.VULKAN: "ONNX Runtime has no Vulkan execution provider",
}
_BACKEND_OF_PROVIDER = {
    **{v: k for k, v in PROVIDER_NAMES.items() if k is not BackendType.METAL},
    "MIGraphXExecutionProvider": BackendType.ROCM,
}
_AUTO_ORDER = (BackendType.CUDA, BackendType.TENSORRT, BackendType.DIRECTML, BackendType.OPENVINO)
#: CPU feature flags with which OpenVINO computes in bf16 natively (AMX, AVX-512 BF16).
_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})

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
        precision: the arithmetic the provider runs an fp32 graph in.
    """

    backend: BackendType
    providers: tuple[tuple[str, Mapping[str, str]], ...]
    note: str | None = None
    precision: InferencePrecision = InferencePrecision.F32

    @property
    def needs_canary(self) -> bool:
        """Anything but ONNX Runtime's CPU provider in fp32 must match it before serving."""
        return self.backend is not BackendType.CPU or self.precision is not InferencePrecision.F32

    def describe(self) -> str:
        """``backend precision`` as logs and refusals name the plan (``openvino bf16``)."""
        return f"{self.backend.value} {self.precision.value}"

    @property
    def serialize_runs(self) -> bool:
        """DirectML sessions allow one ``run`` at a time (its provider is not thread-safe)."""
        return self.backend is BackendType.DIRECTML


@dataclass(frozen=True, kw_only=True)
class SessionSettings:
    """Session options chosen by the plugin configuration."""

    intra_op_threads: int | None = None
    device_id: int = 0
    tensorrt_cache_dir: str | None = None
    tensorrt_fp16: bool = False
    prepack_weights: bool = True
    optimization_level: OptimizationLevel = OptimizationLevel.ALL
    optimized_cache_dir: str | None = None
    cpu_mem_arena: bool = True
    allow_spinning: bool | None = None
    run_timeout_s: float | None = None
    openvino_device: str = "CPU"
    openvino_precision: InferencePrecision = InferencePrecision.AUTO
    #: the model's identity digest (computed at every load): part of every start-up cache key,
    #: so a model file rewritten with its size, time and inode kept still gets entries of its own
    model_digest: str = ""


BACKEND_ENV = "THEMIS_CLIP_BACKEND"


def auto_backend() -> BackendType:
    """What AUTO means in this process: the backend ``THEMIS_CLIP_BACKEND`` names where it is set
    (a deployment's pin, or a test run's, so that results do not depend on the CPU's vendor),
    else AUTO itself.

    Raises:
        ConfigError: the variable names no backend.
    """
    value = os.environ.get(BACKEND_ENV, "").strip().lower()
    if not value:
        return BackendType.AUTO
    try:
        return BackendType(value)
    except ValueError:
        names = ", ".join(b.value for b in BackendType)
        raise ConfigError(f"{BACKEND_ENV}={value!r} names no backend; use one of {names}") from None


def available_providers() -> list[str]:
    """Providers this ONNX Runtime build offers (a build fact, not a device probe), plus
    OpenVINO's plugin where it reports a device."""
    import onnxruntime as ort

    out = list(ort.get_available_providers())
    if openvino_devices() and PROVIDER_NAMES[BackendType.OPENVINO] not in out:
        out.append(PROVIDER_NAMES[BackendType.OPENVINO])
    return out


_OPENVINO_LOCK = threading.Lock()
_openvino_core: Any = None  # OpenVINO's Core once made; False where the package is missing


def _openvino() -> Any:
    """OpenVINO's ``Core`` (made on first call), or None without the ``openvino`` package or
    where it cannot start."""
    global _openvino_core
    with _OPENVINO_LOCK:
        if _openvino_core is None:
            _openvino_core = False
            try:
                import openvino as ov
            except ImportError:
                return None
            try:
                core = ov.Core()
                devices = core.available_devices
            except Exception as exc:  # a broken install, a driver that will not load
                log.warning("OpenVINO unusable: %s", exc)
                return None
            log.info("OpenVINO devices: %s", ", ".join(devices) or "none")
            _openvino_core = core
        return _openvino_core or None


def openvino_devices() -> tuple[str, ...]:
    """The OpenVINO devices here (``CPU``, ``GPU.0``, ...); empty without the package."""
    core = _openvino()
    return tuple(core.available_devices) if core is not None else ()


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (Linux; empty elsewhere)."""
    return frozenset(_cpu_flags().split()) if sys.platform.startswith("linux") else frozenset()


def plan_providers(
    requested: BackendType,
    available: Sequence[str],
    *,
    settings: SessionSettings = SessionSettings(),
    platform: str = sys.platform,
    flags: frozenset[str] | None = None,
) -> list[ProviderPlan]:
    """Return the provider plans to try, best first.

    OpenVINO gets one plan per precision to try, fastest first (``openvino_precision`` AUTO:
    bf16 then f32 on a CPU with AMX or AVX-512 BF16, else f32 alone; f16 then f32 on a GPU).
    Under AUTO a CPU gets only the bf16 plan: OpenVINO's f32 is not worth leaving ONNX Runtime.

    Args:
        requested: the backend asked for.
        available: what :func:`available_providers` reports.
        settings: device id, TensorRT and OpenVINO options.
        platform: ``sys.platform``; DirectML exists on Windows only.
        flags: the CPU's feature flags (default: this CPU's).

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
                plans.extend(_plans(backend, settings, flags, auto=True))
        return [*plans, cpu]
    if requested is BackendType.CPU:
        return [cpu]
    if requested in NO_PROVIDER:
        raise BackendUnavailableError(
            f"backend {requested.value!r} cannot be used: {NO_PROVIDER[requested]}; choose "
            "cpu, cuda, tensorrt, directml, openvino, rocm, metal/coreml or auto"
        )
    if requested is BackendType.DIRECTML and not platform.startswith("win"):
        # The seed: "on Linux BackendType::DirectML falls back to CPU". get_backend() says CPU.
        note = f"DirectML exists only on Windows; {platform} uses the CPU backend instead"
        return [ProviderPlan(backend=BackendType.CPU, providers=cpu.providers, note=note)]
    candidates = PROVIDER_CANDIDATES[requested]
    name = next((c for c in candidates if c in available), None)
    if name is None:
        hint = (
            "install themis-onnx-clip[openvino] (OpenVINO's runtime)"
            if requested is BackendType.OPENVINO
            else "install the matching onnxruntime package"
        )
        raise BackendUnavailableError(
            f"backend {requested.value!r} needs {' or '.join(candidates)}, which ONNX Runtime "
            f"does not offer here (available: {', '.join(available) or 'none'}); {hint}, or "
            "choose another backend"
        )
    return _plans(requested, settings, flags, provider=name)


def _plans(
    backend: BackendType,
    settings: SessionSettings,
    flags: frozenset[str] | None,
    *,
    provider: str | None = None,
    auto: bool = False,
) -> list[ProviderPlan]:
    if backend is not BackendType.OPENVINO:
        return [_plan(backend, settings, provider=provider)]
    device = settings.openvino_device
    precisions: list[InferencePrecision]
    if settings.openvino_precision is not InferencePrecision.AUTO:
        precisions = [settings.openvino_precision]
    elif device.startswith("CPU"):
        bf16 = _BF16_FLAGS & (cpu_flags() if flags is None else flags)
        # AUTO: OpenVINO's f32 is within ~10% of ONNX Runtime's, not worth a second engine
        f32 = [] if auto else [InferencePrecision.F32]
        precisions = [InferencePrecision.BF16] * bool(bf16) + f32
    elif device.startswith("NPU"):
        precisions = [InferencePrecision.F16]
    else:
        precisions = [InferencePrecision.F16, InferencePrecision.F32]
    out = []
    for precision in precisions:
        config: dict[str, str] = {"INFERENCE_PRECISION_HINT": precision.value}
        if settings.intra_op_threads is not None and device.startswith("CPU"):
            config["INFERENCE_NUM_THREADS"] = str(settings.intra_op_threads)
        if settings.optimized_cache_dir:  # OpenVINO's own cache of compiled models
            config["CACHE_DIR"] = str(Path(settings.optimized_cache_dir) / "openvino")
        out.append(
            ProviderPlan(
                backend=backend, providers=((PROVIDER_NAMES[backend], config),), precision=precision
            )
        )
    return out


def supported_backends(
    available: Sequence[str], *, platform: str = sys.platform
) -> list[BackendType]:
    """The backends whose provider this onnxruntime build offers here (CPU always)."""
    out = [BackendType.CPU]
    for backend, candidates in PROVIDER_CANDIDATES.items():
        if backend is BackendType.CPU or (
            backend is BackendType.DIRECTML and not platform.startswith("win")
        ):
            continue
        if any(c in available for c in candidates):
            out.append(backend)
    return out


def _plan(
    backend: BackendType, settings: SessionSettings, *, provider: str | None = None
) -> ProviderPlan:
    device = {"device_id": str(settings.device_id)}
    own = provider or PROVIDER_NAMES[backend]
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
        providers = ((own, device), cpu)
    else:
        providers = ((own, {}), cpu)
    fp16 = backend is BackendType.TENSORRT and settings.tensorrt_fp16
    return ProviderPlan(
        backend=backend,
        providers=providers,
        precision=InferencePrecision.F16 if fp16 else InferencePrecision.F32,
    )


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


class _Run:
    """One run's ``RunOptions`` and, once it was stopped, why."""

    __slots__ = ("options", "stopped")

    def __init__(self, options: Any) -> None:
        self.options = options
        self.stopped: str | None = None

    def stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
        self.options.terminate = True


class _Watchdog:
    """One daemon thread that stops runs at their deadlines (started on first use)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, tuple[_Run, str]] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, run: _Run, limit_s: float) -> int:
        token = next(self._tokens)
        with self._cond:
            self._live[token] = (run, f"it ran longer than {limit_s:g} s (run_timeout_s)")
            heapq.heappush(self._heap, (time.monotonic() + limit_s, token))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="themis-run-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return token

    def done(self, token: int) -> None:
        with self._cond:
            self._live.pop(token, None)

    def _loop(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    entry = self._live.pop(heapq.heappop(self._heap)[1], None)
                    if entry is not None:
                        entry[0].stop(entry[1])
                self._cond.wait(self._heap[0][0] - now if self._heap else None)


_WATCHDOG = _Watchdog()


@dataclass
class ORTSession:
    """An ``onnxruntime.InferenceSession`` with typed I/O and translated errors.

    ``run`` is thread-safe: ONNX Runtime allows concurrent ``run`` on CPU/CUDA sessions, and
    sessions that do not (DirectML) carry a lock. A run longer than ``run_timeout_s`` (None:
    no limit) is stopped and raises :class:`InferenceError`; :meth:`stop_runs` and
    :meth:`close` stop the runs in flight.
    """

    session: Any
    backend: BackendType
    path: Path
    loading_mode: LoadingMode
    name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    providers: tuple[str, ...]
    precision: InferencePrecision = InferencePrecision.F32
    optimized_cache: str = "off"
    run_timeout_s: float | None = None
    _lock: threading.Lock | None = None
    _on_close: list[Callable[[], None]] = field(default_factory=list)
    _runs: set[_Run] = field(default_factory=set)
    _runs_lock: threading.Lock = field(default_factory=threading.Lock)

    def run(
        self, output_names: Sequence[str] | None, feeds: Mapping[str, npt.NDArray[Any]]
    ) -> list[npt.NDArray[Any]]:
        """Run the session; ONNX Runtime failures become :class:`InferenceError`, and so does
        a run stopped at ``run_timeout_s`` or by :meth:`stop_runs`."""
        import onnxruntime as ort

        session = self.session
        if session is None:
            raise InferenceError(f"session for {self.name} is closed")
        run = _Run(ort.RunOptions())
        with self._runs_lock:
            self._runs.add(run)
        token = _WATCHDOG.watch(run, self.run_timeout_s) if self.run_timeout_s else None
        try:
            if self._lock is not None:
                with self._lock:
                    return list(session.run(output_names, dict(feeds), run.options))
            return list(session.run(output_names, dict(feeds), run.options))
        except Exception as exc:  # ORT raises pybind11 types that share no useful base
            if run.stopped is not None:
                raise InferenceError(f"{self.name}: run stopped: {run.stopped}") from exc
            engine = "OpenVINO" if isinstance(session, _OpenVINOModel) else "ONNX Runtime"
            raise InferenceError(f"{self.name}: {engine} failed: {exc}") from exc
        finally:
            if token is not None:
                _WATCHDOG.done(token)
            with self._runs_lock:
                self._runs.discard(run)

    def stop_runs(self, reason: str) -> int:
        """Stop every run in flight (each raises :class:`InferenceError` naming ``reason``);
        returns how many there were."""
        with self._runs_lock:
            runs = list(self._runs)
        for run in runs:
            run.stop(reason)
        return len(runs)

    def close(self) -> None:
        """Stop the runs in flight and drop the session; later ``run`` calls fail cleanly."""
        self.stop_runs("the session was closed")
        self.session = None
        while self._on_close:
            self._on_close.pop()()


def create_session(
    path: Path,
    plan: ProviderPlan,
    settings: SessionSettings,
    *,
    loading_mode: LoadingMode = LoadingMode.PATH,
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
    if plan.backend is BackendType.OPENVINO:
        return _openvino_session(path, plan, settings, loading_mode, name or path.name)
    names = [name for name, _ in plan.providers]
    provider_options = [dict(opts) for _, opts in plan.providers]

    def open_session(source: Path, options: Any) -> Any:
        return ort.InferenceSession(
            str(source), sess_options=options, providers=names, provider_options=provider_options
        )

    cache = (
        _OptimizedModelCache(Path(settings.optimized_cache_dir), path, settings)
        if settings.optimized_cache_dir
        and plan.backend is BackendType.CPU
        and loading_mode is not LoadingMode.MMAP
        else None
    )
    cache_state = "off"
    try:
        session = None
        if cache is not None and cache.model.is_file() and not cache.intact():
            log.warning(
                "optimised-model cache entry %s changed since written; rebuilding", cache.entry
            )
            cache.discard()
        if cache is not None and cache.model.is_file():
            try:
                session = open_session(
                    cache.model, _session_options(ort, settings, plan, cached=True)
                )
                cache_state = "hit"
                if not (cache.entry / _SOURCE).is_file():  # kept by an earlier release
                    with contextlib.suppress(OSError):
                        (cache.entry / _SOURCE).write_text(_source(path))
            except Exception as exc:  # a damaged or foreign entry: rebuild it
                log.warning(
                    "optimised-model cache entry %s unusable (%s); rebuilding", cache.entry, exc
                )
                cache.discard()
        if session is None:
            options = _session_options(ort, settings, plan, cached=False)
            staging = cache.stage(options) if cache is not None else None
            if cache is not None and staging is None:
                cache_state = "failed: cache folder not writable"
            try:
                session = open_session(path, options)
            except Exception:
                if cache is None or staging is None:
                    raise
                cache.abandon(staging)
                session = open_session(path, _session_options(ort, settings, plan, cached=False))
                cache_state = "failed: ONNX Runtime could not write the optimised model"
            else:
                if cache is not None and staging is not None:
                    cache_state = cache.commit(staging)
                    prune_kept(cache.root)
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
    log.info("loaded %s on %s (%s, %s)", name or path.name, used[0], plan.describe(), loading_mode)
    return ORTSession(
        session=session,
        backend=(
            plan.backend
            if used[0] == plan.providers[0][0]
            else _BACKEND_OF_PROVIDER.get(used[0], plan.backend)
        ),
        path=path,
        loading_mode=loading_mode,
        name=name or path.name,
        inputs=inputs,
        outputs=outputs,
        providers=used,
        precision=plan.precision,
        optimized_cache=cache_state,
        run_timeout_s=settings.run_timeout_s,
        _lock=threading.Lock() if plan.serialize_runs else None,
    )


def _openvino_session(
    path: Path, plan: ProviderPlan, settings: SessionSettings, mode: LoadingMode, name: str
) -> ORTSession:
    """``path`` compiled by OpenVINO for ``settings.openvino_device`` under the plan's hints.

    OpenVINO reads the graph from its file (for ``"mmap"`` it maps the external weights itself,
    its ``ENABLE_MMAP`` default; compiling then repacks them into the device's layout). With
    ``CACHE_DIR`` in the plan (``optimized_cache_dir``), a later load takes the compiled model
    from OpenVINO's cache and neither reads nor compiles the graph (0.2 s for ViT-B/32, not 0.9).

    Raises:
        BackendUnavailableError: no OpenVINO, no such device, or the graph does not compile
            for it (an operator the device lacks): AUTO moves on to the next plan.
    """
    core = _openvino()
    wanted = settings.openvino_device
    offered = openvino_devices()
    device = next((d for d in offered if d == wanted or d.startswith(wanted + ".")), None)
    if core is None or device is None:
        raise BackendUnavailableError(
            f"OpenVINO device {wanted!r} is not offered here (OpenVINO offers: "
            f"{', '.join(offered) or 'nothing; install themis-onnx-clip[openvino]'})"
        )
    try:
        config = dict(plan.providers[0][1])
        unusable = "unwritable"
        if "CACHE_DIR" in config:  # each model's compiled models in a folder of their own
            root = Path(config["CACHE_DIR"]).parent
            try:
                config["CACHE_DIR"] = str(
                    kept_folder(root, "openvino", path, settings.model_digest)
                )
            except OSError as exc:
                unusable = str(exc)
                log.warning("OpenVINO cache %s unusable: %s", config.pop("CACHE_DIR"), exc)
        kept = _blobs(config)
        try:
            compiled = core.compile_model(str(path), device, config)
        except Exception as exc:
            if "CACHE_DIR" not in config:
                raise
            # an unwritable cache folder fails OpenVINO's compile: never fail a load for it
            reason = " ".join(str(exc).split())
            log.warning("OpenVINO cache %s unusable: %s", config.pop("CACHE_DIR"), reason)
            compiled = core.compile_model(str(path), device, config)
        if kept is None:
            cache_state = "off" if settings.optimized_cache_dir is None else f"failed: {unusable}"
        elif "CACHE_DIR" not in config:
            cache_state = "failed: OpenVINO could not use the cache folder"
        else:
            cache_state = "hit" if _blobs(config) == kept else "written"
            if cache_state == "written":
                prune_kept(root)
        # OpenVINO's CPU plugin quietly computes a precision it lacks (f16) in another (bf16)
        ran = (
            compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
            if device.startswith("CPU")
            else plan.precision.value
        )
        if ran != plan.precision.value:
            raise BackendUnavailableError(
                f"OpenVINO {device} cannot compute in {plan.precision.value}: it would run "
                f"{ran} (the device offers "
                f"{', '.join(core.get_property(device, 'OPTIMIZATION_CAPABILITIES'))})"
            )
        inputs = tuple(_port_info(p) for p in compiled.inputs)
        outputs = tuple(_port_info(p) for p in compiled.outputs)
    except (ModelFormatError, BackendUnavailableError):
        raise
    except Exception as exc:  # OpenVINO raises RuntimeError subclasses with the reason
        raise BackendUnavailableError(
            f"OpenVINO cannot compile {name} for {device} ({plan.describe()}): "
            + " ".join(str(exc).split())
        ) from exc
    log.info("loaded %s on OpenVINO %s (%s, %s)", name, device, plan.describe(), mode)
    return ORTSession(
        session=_OpenVINOModel(compiled, lambda: _framework_info(core.read_model(str(path)))),
        backend=BackendType.OPENVINO,
        path=path,
        loading_mode=mode,
        name=name,
        inputs=inputs,
        outputs=outputs,
        providers=(f"OpenVINO {device}",),
        precision=plan.precision,
        run_timeout_s=settings.run_timeout_s,
        optimized_cache=cache_state,
    )


def _blobs(config: Mapping[str, str]) -> frozenset[tuple[str, int, int]] | None:
    """The compiled models in OpenVINO's cache folder, with their size and mtime (None: no
    cache in ``config``): OpenVINO rewrites a damaged one under the same name."""
    folder = config.get("CACHE_DIR")
    if folder is None:
        return None
    out = set()
    for p in Path(folder).glob("*.blob"):
        with contextlib.suppress(OSError):
            st = p.stat()
            out.add((p.name, st.st_size, st.st_mtime_ns))
    return frozenset(out)


def forget_compiled(plan: ProviderPlan, model: Path, digest: str) -> bool:
    """Remove the compiled models (``*.blob``) OpenVINO kept for ``model`` under ``plan``
    (``digest``: ``SessionSettings.model_digest``; True where some went): one that fails its
    canary may be a damaged file, which OpenVINO would load again on every start; it is
    compiled again on its next load. Nothing else in the folder is touched, and a folder that
    is a symbolic link is not used."""
    root = dict(plan.providers[0][1]).get("CACHE_DIR") if plan.providers else None
    if plan.backend is not BackendType.OPENVINO or not root:
        return False
    folder = Path(root) / model_file_key(model, "openvino", digest)
    removed = False
    for blob in [] if folder.is_symlink() else folder.glob("*.blob"):
        if _KEPT_FILE.fullmatch(blob.name) and blob.is_file() and not blob.is_symlink():
            try:
                blob.unlink()
            except OSError as exc:
                log.warning("could not remove %s to compile it again: %s", blob, exc)
                continue
            removed = True
    if removed:
        log.warning(
            "a compiled model from the start-up cache failed its canary (it may be damaged): "
            "compiling %s again",
            model.name,
        )
    return removed


def openvino_version() -> str:
    """The installed OpenVINO's version ("" without it), read without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openvino")
    except PackageNotFoundError:
        return ""


class _OpenVINOModel:
    """An OpenVINO compiled model behind the part of ``InferenceSession`` that
    :class:`ORTSession` uses: ``run`` (thread-safe: one infer request per run, ~15 us to make)
    and ``get_modelmeta``. A run whose ``RunOptions.terminate`` is set is cancelled within
    20 ms, as ONNX Runtime stops its own."""

    _POLL_MS = 20

    def __init__(self, compiled: Any, meta: Callable[[], Mapping[str, str]]) -> None:
        self._compiled = compiled
        self._index = {p.get_any_name(): i for i, p in enumerate(compiled.outputs)}
        self._meta = meta  # read on demand: a compiled model from the cache carries none

    def run(
        self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], options: Any = None
    ) -> list[npt.NDArray[Any]]:
        request = self._compiled.create_infer_request()
        request.start_async(dict(feeds))
        while not request.wait_for(self._POLL_MS):
            if options is not None and options.terminate:
                request.cancel()
                raise RuntimeError("OpenVINO run cancelled")
        wanted = output_names if output_names is not None else list(self._index)
        return [np.array(request.get_output_tensor(self._index[n]).data) for n in wanted]

    def get_modelmeta(self) -> Any:
        return SimpleNamespace(custom_metadata_map=dict(self._meta()))


def _framework_info(model: Any) -> dict[str, str]:
    """The ONNX file's ``metadata_props`` as OpenVINO keeps them (its ``framework`` rt_info)."""
    info = model.get_rt_info()
    framework = info["framework"] if "framework" in info else {}  # noqa: SIM401 (RTMap: no get)
    return {k: str(v.astype(str)) for k, v in dict(framework).items()}


def _port_info(port: Any) -> TensorInfo:
    try:
        dtype = np.dtype(port.get_element_type().to_dtype())
    except Exception as exc:
        raise ModelFormatError(f"tensor {port.get_any_name()!r}: {exc}") from exc
    dims = port.get_partial_shape()
    shape = tuple(d.get_length() if d.is_static else None for d in dims)
    return TensorInfo(name=port.get_any_name(), shape=shape, dtype=dtype)


_LEVELS = {
    OptimizationLevel.DISABLED: "ORT_DISABLE_ALL",
    OptimizationLevel.BASIC: "ORT_ENABLE_BASIC",
    OptimizationLevel.EXTENDED: "ORT_ENABLE_EXTENDED",
    OptimizationLevel.ALL: "ORT_ENABLE_ALL",
}


def _session_options(
    ort: Any, settings: SessionSettings, plan: ProviderPlan, *, cached: bool
) -> Any:
    """Session options for ``settings`` (``cached``: the graph is already optimised)."""
    options = ort.SessionOptions()
    level = OptimizationLevel.DISABLED if cached else settings.optimization_level
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[level])
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = settings.cpu_mem_arena
    if settings.intra_op_threads is not None:
        options.intra_op_num_threads = settings.intra_op_threads
    if settings.allow_spinning is not None:
        options.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if settings.allow_spinning else "0"
        )
    if not settings.prepack_weights:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if plan.serialize_runs:
        options.enable_mem_pattern = False
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return options


class _OptimizedModelCache:
    """One cache entry: ``<dir>/<key>/model.onnx`` + ``model.data``, the optimised graph.

    The key covers what could make a saved graph wrong or unloadable: the model files (name,
    size, mtime and inode of the ``.onnx`` and of its siblings named after it, i.e. external
    data), ONNX Runtime's version, the optimisation level, the machine and its CPU feature flags
    (level ``all`` may bake in CPU-specific kernels). Entries are written to a private staging
    folder and renamed into place, so concurrent loaders never see half an entry.
    """

    def __init__(self, root: Path, model: Path, settings: SessionSettings) -> None:
        self.root = root
        self.source = model
        self.entry = root / model_file_key(
            model, settings.optimization_level, settings.model_digest
        )
        self.model = self.entry / "model.onnx"

    def stage(self, options: Any) -> Path | None:
        """Point ``options`` at a fresh staging folder; None if the cache is not writable."""
        staging = self.root / f".staging-{uuid.uuid4().hex}"
        try:
            staging.mkdir(parents=True)
        except OSError as exc:
            log.warning("optimised-model cache %s not writable: %s", self.root, exc)
            return None
        options.optimized_model_filepath = str(staging / "model.onnx")
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "model.data"
        )
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
        return staging

    def commit(self, staging: Path) -> str:
        """Move a written entry into place; a concurrent writer's entry wins a race."""
        if not (staging / "model.onnx").is_file():
            self.abandon(staging)
            return "failed: ONNX Runtime wrote no optimised model"
        try:  # what the files are now (a rename keeps it): any later write shows
            (staging / "stamp").write_text(self._stamp(staging))
            (staging / _SOURCE).write_text(_source(self.source))
        except OSError:
            self.abandon(staging)
            return "failed: could not write the entry's stamp"
        try:
            os.rename(staging, self.entry)
        except OSError:  # another loader committed first (or the folder vanished)
            self.abandon(staging)
            return "written" if self.model.is_file() else "failed: could not commit the entry"
        return "written"

    def intact(self) -> bool:
        """Whether the entry's files are as written (size, mtime, inode and CRC-32): an entry
        changed in place, even to the same size and time, would load and give other vectors
        (CPU fp32 has no canary to notice). The CRC costs 0.1 s for ViT-B/32's 350 MB."""
        try:
            return (self.entry / "stamp").read_text() == self._stamp(self.entry)
        except OSError:
            return False

    @staticmethod
    def _stamp(folder: Path) -> str:
        parts = []
        for name in ("model.onnx", "model.data"):
            try:
                st = (folder / name).stat()
            except FileNotFoundError:
                continue
            crc = 0
            with open(folder / name, "rb") as f:
                while chunk := f.read(1 << 22):
                    crc = zlib.crc32(chunk, crc)
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{crc:08x}")
        return "\n".join(parts)

    def abandon(self, staging: Path) -> None:
        """Remove a staging folder."""
        shutil.rmtree(staging, ignore_errors=True)

    def discard(self) -> None:
        """Remove this entry (it failed to load)."""
        shutil.rmtree(self.entry, ignore_errors=True)


def model_file_key(model: Path, *parts: str) -> str:
    """A key for what ONNX Runtime computed from ``model`` on this machine: the model files
    (path, and name, size, mtime and inode of the ``.onnx`` and of its siblings named after it,
    i.e. external data), ONNX Runtime's version, the machine and its CPU feature flags, and
    ``parts``. A changed file, runtime or CPU gives another key."""
    import onnxruntime as ort

    h = hashlib.sha256()
    for part in (ort.__version__, platform.machine(), _cpu_flags(), *parts):
        h.update(part.encode() + b"\0")
    h.update(str(model.resolve()).encode() + b"\0")
    h.update(_files_stamp(model).encode())
    return h.hexdigest()[:32]


def _files_stamp(model: Path) -> str:
    """Name, size, mtime and inode of ``model`` and of its siblings named after it (its
    external data): any change to the files changes it."""
    siblings = sorted(
        p for p in model.parent.iterdir() if p.name.startswith((model.name, model.stem + "."))
    )
    out = []
    for p in siblings:
        st = p.stat()
        out.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}\0")
    return "".join(out)


_SOURCE = "source.json"  # in each kept entry: the model it was made from, and its files' stamp


def _source(model: Path) -> str:
    model = model.resolve()
    return json.dumps({"model": str(model), "files": _files_stamp(model), "host": platform.node()})


def kept_folder(root: Path, kind: str, model: Path, *parts: str) -> Path:
    """``root/kind/<key>``, a folder for what is kept about ``model`` (OpenVINO's compiled
    models, the canary's references), made whole with its ``source.json`` so that
    :func:`prune_kept` can tell when the model has changed or gone. Raises ``OSError``."""
    folder = root / kind / model_file_key(model, kind, *parts)
    for link in (folder.parent, folder):  # never written through: it could point anywhere
        if link.is_symlink():
            raise OSError(f"{link} is a symbolic link; not used")
    if not folder.is_dir():
        staging = root / kind / f".staging-{uuid.uuid4().hex}"
        staging.mkdir(parents=True)
        (staging / _SOURCE).write_text(_source(model))
        try:
            os.rename(staging, folder)
        except OSError:  # another loader made it first
            shutil.rmtree(staging, ignore_errors=True)
            if not folder.is_dir():
                raise
    return folder


#: a staging folder this old was left by a loader that died
_STALE_STAGING_S = 24 * 3600
_STAGING = re.compile(r"\.staging-[0-9a-f]{32}")  # ours only: never another program's file
_KEY = re.compile(r"[0-9a-f]{32}")
#: the files a load writes in an entry: ONNX Runtime's graph, OpenVINO's compiled models, the
#: canary's references (and their half-written forms)
_KEPT_FILE = re.compile(
    r"model\.onnx|model\.data|stamp|source\.json|[0-9a-f]+\.blob"
    r"|canary-[0-9a-f]{32}\.npy|\.canary-[0-9a-f]{32}\.npy\.[0-9a-f]{32}"
    r"|refused-[0-9a-f]{32}\.json|\.refused-[0-9a-f]{32}\.json\.[0-9a-f]{32}"
)


def prune_kept(root: Path) -> list[Path]:
    """Remove from the start-up cache ``root`` what this machine kept for model files that
    have since changed or gone (no later load can use it: a changed file gets another key),
    and staging folders a crashed loader left a day ago. Only what the cache wrote goes: an
    entry is a folder named by its 32-hex key holding this machine's ``source.json``, and of
    it only the files a load writes are removed (the folder stays if anything else is in it);
    symbolic links are never followed. Entries written on another machine are left to it (a
    cache shared between machines whose model paths differ does not thrash), and so are those
    of files still on disk, whatever runtime or CPU wrote them. Returns what was removed."""
    removed = []
    now = time.time()
    host = platform.node()
    for base in (root, root / "openvino", root / "canary"):
        if base != root and base.is_symlink():
            continue
        try:
            entries = list(base.iterdir())
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_symlink() or not entry.is_dir():
                    continue
                if _STAGING.fullmatch(entry.name):
                    if now - entry.stat().st_mtime > _STALE_STAGING_S:
                        _remove_kept(entry)
                        removed.append(entry)
                    continue
                if not _KEY.fullmatch(entry.name):
                    continue
                source = jsonio.read(entry / _SOURCE)
                if source.get("host", host) != host:
                    continue
                model = Path(source["model"])
                if model.is_file() and _files_stamp(model) == source["files"]:
                    continue
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # not ours, or unreadable: left alone
            _remove_kept(entry)
            removed.append(entry)
    if removed:
        log.info("start-up cache %s: removed %d entries of gone models", root, len(removed))
    return removed


def _remove_kept(entry: Path) -> None:
    """The files a load writes in ``entry``, then the folder if nothing else is in it."""
    with contextlib.suppress(OSError):
        for f in entry.iterdir():
            if _KEPT_FILE.fullmatch(f.name) and f.is_file() and not f.is_symlink():
                f.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        entry.rmdir()


def _cpu_flags() -> str:
    """The CPU feature flags (Linux), or the processor name elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _info(node: Any) -> TensorInfo:
    dtype = _ORT_DTYPES.get(node.type)
    if dtype is None:
        raise ModelFormatError(f"tensor {node.name!r} has unsupported type {node.type}")
    shape = tuple(d if isinstance(d, int | str) else None for d in (node.shape or ()))
    return TensorInfo(name=node.name, shape=shape, dtype=dtype)
