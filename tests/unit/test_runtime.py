from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from themis_clip import (
    BackendType,
    BackendUnavailableError,
    ModelConfig,
    OnnxClipPlugin,
    PluginConfig,
)
from themis_clip.config import OpenVINOConfig
from themis_clip.errors import InferenceError, ModelFormatError, ModelNotFoundError
from themis_clip.runtime import (
    PROVIDER_NAMES,
    ProviderPlan,
    SessionSettings,
    available_providers,
    create_session,
    openvino_devices,
    plan_providers,
    supported_backends,
)
from themis_clip.vocabulary import InferencePrecision

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TRT = "TensorrtExecutionProvider"
DML = "DmlExecutionProvider"


def names(plan: ProviderPlan) -> list[str]:
    return [n for n, _ in plan.providers]


def test_auto_probes_in_seed_order() -> None:
    plans = plan_providers(BackendType.AUTO, [TRT, CUDA, DML, CPU], platform="win32")
    assert [p.backend for p in plans] == [
        BackendType.CUDA,
        BackendType.TENSORRT,
        BackendType.DIRECTML,
        BackendType.CPU,
    ]


def test_auto_skips_what_is_missing_and_directml_off_windows() -> None:
    plans = plan_providers(BackendType.AUTO, [DML, CPU], platform="linux")
    assert [p.backend for p in plans] == [BackendType.CPU]
    plans = plan_providers(BackendType.AUTO, [TRT, CPU], platform="linux")
    assert [p.backend for p in plans] == [BackendType.TENSORRT, BackendType.CPU]


def test_tensorrt_precedes_cuda_and_gets_cache_and_fp16() -> None:
    settings = SessionSettings(tensorrt_cache_dir="/cache/trt", tensorrt_fp16=True, device_id=1)
    (plan,) = plan_providers(BackendType.TENSORRT, [TRT, CUDA, CPU], settings=settings)
    assert names(plan) == [TRT, CUDA, CPU]
    trt_options = dict(plan.providers[0][1])
    assert trt_options["trt_engine_cache_enable"] == "True"
    assert trt_options["trt_engine_cache_path"] == "/cache/trt"
    assert trt_options["trt_fp16_enable"] == "True"
    assert trt_options["device_id"] == "1"


def test_explicit_gpu_backend_missing_is_an_error_not_a_cpu_fallback() -> None:
    for backend in (BackendType.CUDA, BackendType.TENSORRT, BackendType.ROCM, BackendType.OPENVINO):
        with pytest.raises(BackendUnavailableError, match=PROVIDER_NAMES[backend]):
            plan_providers(backend, [CPU], platform="linux")


def test_directml_on_linux_falls_back_to_cpu_with_a_note() -> None:
    (plan,) = plan_providers(BackendType.DIRECTML, [CPU], platform="linux")
    assert plan.backend is BackendType.CPU
    assert plan.note and "Windows" in plan.note
    assert not plan.serialize_runs


def test_directml_on_windows_serialises_runs() -> None:
    (plan,) = plan_providers(BackendType.DIRECTML, [DML, CPU], platform="win32")
    assert names(plan) == [DML, CPU]
    assert plan.serialize_runs


def test_create_session_reads_io(tiny_model_dir: Path) -> None:
    (plan,) = plan_providers(BackendType.CPU, [CPU])
    session = create_session(
        tiny_model_dir / "visual.onnx", plan, SessionSettings(intra_op_threads=1)
    )
    assert session.backend is BackendType.CPU
    assert session.providers[0] == CPU
    (inp,) = session.inputs
    assert inp.name == "pixel_values" and inp.dtype == np.float32
    assert inp.shape[0] == "batch" and inp.fixed_dim(0) is None and inp.fixed_dim(2) == 32
    session.close()
    with pytest.raises(InferenceError, match="closed"):
        session.run(None, {"pixel_values": np.zeros((1, 3, 32, 32), np.float32)})


def test_create_session_errors(tmp_path: Path) -> None:
    (plan,) = plan_providers(BackendType.CPU, [CPU])
    with pytest.raises(ModelNotFoundError):
        create_session(tmp_path / "missing.onnx", plan, SessionSettings())
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(ModelFormatError, match="cannot load"):
        create_session(bad, plan, SessionSettings())


def test_run_errors_are_translated(tiny_model_dir: Path) -> None:
    (plan,) = plan_providers(BackendType.CPU, [CPU])
    session = create_session(tiny_model_dir / "visual.onnx", plan, SessionSettings())
    with pytest.raises(InferenceError, match="ONNX Runtime failed"):
        session.run(None, {"pixel_values": np.zeros((1, 3, 31, 32), np.float32)})


def test_a_gpu_plan_that_does_not_hold_is_refused(tiny_model_dir: Path) -> None:
    # This ORT build has no CUDA: ORT would silently run the session on CPU. We refuse.
    plan = ProviderPlan(backend=BackendType.CUDA, providers=((CUDA, {}), (CPU, {})))
    with pytest.raises(BackendUnavailableError, match="runs on CPUExecutionProvider"):
        create_session(tiny_model_dir / "visual.onnx", plan, SessionSettings())


def test_auto_with_injected_gpu_list_probes_and_lands_on_cpu(tiny_model_dir: Path) -> None:
    # ORT claims CUDA and TensorRT (injected), but neither can start here: AUTO must try both
    # in order and land on CPU, and get_backend() must report CPU.
    plugin = OnnxClipPlugin(available_providers=[TRT, CUDA, CPU])
    assert plugin.initialize(PluginConfig(model=ModelConfig(path=str(tiny_model_dir))))
    assert plugin.get_backend() is BackendType.CPU
    assert plugin.get_statistics()["providers"] == [CPU]
    plugin.shutdown()


def test_explicit_cuda_that_cannot_start_fails_initialize(tiny_model_dir: Path) -> None:
    plugin = OnnxClipPlugin(available_providers=[CUDA, CPU])
    config = PluginConfig(model=ModelConfig(path=str(tiny_model_dir)))
    assert not plugin.initialize(config, BackendType.CUDA)
    assert plugin.last_error and "CUDAExecutionProvider" in plugin.last_error
    assert not plugin.is_ready()
    plugin_no_cuda = OnnxClipPlugin(available_providers=[CPU])
    assert not plugin_no_cuda.initialize(config, BackendType.CUDA)
    assert "does not offer" in (plugin_no_cuda.last_error or "")


def test_directml_requested_on_linux_runs_on_cpu(tiny_model_dir: Path) -> None:
    plugin = OnnxClipPlugin(available_providers=[CPU])
    assert plugin.initialize(
        PluginConfig(model=ModelConfig(path=str(tiny_model_dir))), BackendType.DIRECTML
    )
    assert plugin.get_backend() is BackendType.CPU
    plugin.shutdown()


def test_auto_given_as_a_string_keeps_the_configured_backend(tiny_model_dir: Path) -> None:
    # initialize(config, "auto") means "use config.backend", as BackendType.AUTO does.
    plugin = OnnxClipPlugin(available_providers=[CUDA, CPU])
    config = PluginConfig(model=ModelConfig(path=str(tiny_model_dir)), backend=BackendType.CUDA)
    assert not plugin.initialize(config, "auto")  # type: ignore[arg-type]
    assert "CUDAExecutionProvider" in (plugin.last_error or "")


OV = "OpenVINOExecutionProvider"
AMX = frozenset({"avx2", "avx512f", "amx_bf16", "amx_int8"})
AVX2 = frozenset({"avx2", "fma"})


def hints(plans: list[ProviderPlan]) -> list[dict[str, str]]:
    return [dict(p.providers[0][1]) for p in plans]


def test_auto_tries_openvino_after_directml_and_before_cpu() -> None:
    plans = plan_providers(BackendType.AUTO, [TRT, CUDA, DML, OV, CPU], platform="win32", flags=AMX)
    assert [p.describe() for p in plans] == [
        "cuda f32",
        "tensorrt f32",
        "directml f32",
        "openvino bf16",
        "cpu f32",
    ]
    # OpenVINO only where its runtime offers a device (available_providers lists it then)
    plans = plan_providers(BackendType.AUTO, [CPU], flags=AMX)
    assert [p.describe() for p in plans] == ["cpu f32"]
    # on a CPU without bf16, AUTO stays on ONNX Runtime; forced f32 is honoured
    assert [p.describe() for p in plan_providers(BackendType.AUTO, [OV, CPU], flags=AVX2)] == [
        "cpu f32"
    ]
    f32 = SessionSettings(openvino_precision=InferencePrecision.F32)
    plans = plan_providers(BackendType.AUTO, [OV, CPU], settings=f32, flags=AVX2)
    assert [p.describe() for p in plans] == ["openvino f32", "cpu f32"]


def test_openvino_precisions_follow_the_device() -> None:
    cpu_amx = plan_providers(BackendType.OPENVINO, [OV, CPU], flags=AMX)
    assert hints(cpu_amx) == [
        {"INFERENCE_PRECISION_HINT": "bf16"},
        {"INFERENCE_PRECISION_HINT": "f32"},
    ]
    assert all(names(p) == [OV] for p in cpu_amx)  # OpenVINO runs the whole graph
    cpu_avx2 = plan_providers(BackendType.OPENVINO, [OV, CPU], flags=AVX2)
    assert [p.precision for p in cpu_avx2] == [InferencePrecision.F32]
    gpu = SessionSettings(openvino_device="GPU.1")
    assert [p.describe() for p in plan_providers(BackendType.OPENVINO, [OV], settings=gpu)] == [
        "openvino f16",
        "openvino f32",
    ]
    forced = SessionSettings(openvino_precision=InferencePrecision.BF16, intra_op_threads=2)
    (plan,) = plan_providers(BackendType.OPENVINO, [OV, CPU], settings=forced, flags=AVX2)
    assert hints([plan]) == [{"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": "2"}]


def test_reported_precision_of_other_providers() -> None:
    fp16 = SessionSettings(tensorrt_fp16=True)
    assert plan_providers(BackendType.TENSORRT, [TRT, CUDA], settings=fp16)[0].describe() == (
        "tensorrt f16"
    )
    assert not plan_providers(BackendType.CPU, [CPU])[0].needs_canary
    assert plan_providers(BackendType.CUDA, [CUDA])[0].needs_canary


def test_openvino_missing_names_the_extra_and_its_hardware() -> None:
    with pytest.raises(BackendUnavailableError, match=r"themis-onnx-clip\[openvino\]"):
        plan_providers(BackendType.OPENVINO, [CPU])


def test_openvino_is_offered_where_its_runtime_finds_a_device() -> None:
    pytest.importorskip("openvino", reason="no OpenVINO wheel for this platform")
    devices = openvino_devices()  # any vendor's CPU: OpenVINO's CPU plugin runs on all x86-64
    assert "CPU" in devices
    assert openvino_devices() == devices
    assert OV in available_providers()
    assert BackendType.OPENVINO in supported_backends(available_providers())


@pytest.mark.usefixtures("auto_backend")
def test_openvino_without_the_device_asked_fails_with_the_reason(tiny_model_dir: Path) -> None:
    pytest.importorskip("openvino", reason="no OpenVINO wheel for this platform")
    plugin = OnnxClipPlugin()
    config = PluginConfig(model=ModelConfig(path=str(tiny_model_dir)))
    npu = PluginConfig(model=config.model, openvino=OpenVINOConfig(device="NPU"))
    assert not plugin.initialize(npu, BackendType.OPENVINO)
    assert "OpenVINO device 'NPU' is not offered here (OpenVINO offers: CPU" in (
        plugin.last_error or ""
    )
    assert plugin.initialize(npu)  # AUTO moves on to the CPU
    assert plugin.get_backend() is BackendType.CPU
    plugin.shutdown()


def test_the_environment_pins_what_auto_means(monkeypatch: pytest.MonkeyPatch) -> None:
    from themis_clip.errors import ConfigError
    from themis_clip.runtime import auto_backend

    monkeypatch.delenv("THEMIS_CLIP_BACKEND", raising=False)
    assert auto_backend() is BackendType.AUTO
    monkeypatch.setenv("THEMIS_CLIP_BACKEND", " CPU ")
    assert auto_backend() is BackendType.CPU
    monkeypatch.setenv("THEMIS_CLIP_BACKEND", "gpu")
    with pytest.raises(ConfigError, match="THEMIS_CLIP_BACKEND='gpu' names no backend"):
        auto_backend()


def test_a_forced_openvino_precision_is_never_ignored_quietly(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A forced ``openvino.precision`` with a backend that never runs OpenVINO fails the load
    with both named, whichever way the backend was chosen (config, ``initialize``'s argument);
    it is checked on the backend that is used, so a flag that overrides a config's backend
    can settle it. Where ``THEMIS_CLIP_BACKEND`` pins what auto means, it is a warning."""
    forced = OpenVINOConfig(precision=InferencePrecision.BF16)
    model = ModelConfig(path=str(tiny_model_dir))
    expected = "forces OpenVINO's precision (bf16), which the cpu backend does not use"
    plugin = OnnxClipPlugin()
    in_config = PluginConfig(model=model, backend=BackendType.CPU, openvino=forced)
    assert not plugin.initialize(in_config)
    assert expected in (plugin.last_error or "")
    assert not plugin.initialize(PluginConfig(model=model, openvino=forced), BackendType.CPU)
    assert expected in (plugin.last_error or "")
    monkeypatch.setenv("THEMIS_CLIP_BACKEND", "cpu")
    with caplog.at_level("WARNING", logger="themis_clip.loading"):
        assert plugin.initialize(PluginConfig(model=model, openvino=forced)), plugin.last_error
    assert expected in caplog.text and "THEMIS_CLIP_BACKEND=cpu pins what auto means" in caplog.text
    assert plugin.get_backend() is BackendType.CPU
    plugin.shutdown()
