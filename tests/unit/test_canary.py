"""The canary, driven through the plugin with providers injected at the session seam.

``Provider`` opens a real CPU session and labels it as the plan's provider (CUDA, OpenVINO...),
optionally corrupting its outputs the way a broken provider does: one vector for every input
(Frigate's CUDA bug), batch-mates leaking into each other, or precision lost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from themis_clip import BackendType, ModelConfig, OnnxClipPlugin, PluginConfig, runtime
from themis_clip.config import OpenVINOConfig
from themis_clip.runtime import ORTSession, ProviderPlan, SessionSettings, create_session
from themis_clip.vocabulary import InferencePrecision

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
OV = "OpenVINOExecutionProvider"

Corruption = Callable[[np.ndarray], np.ndarray]

# AUTO as a user gets it (the suite pins CPU through THEMIS_CLIP_BACKEND).
pytestmark = pytest.mark.usefixtures("auto_backend")


def same_vector(out: np.ndarray) -> np.ndarray:
    return np.repeat(out[:1], len(out), axis=0)


def leaky(out: np.ndarray) -> np.ndarray:
    return out + 0.05 * out.mean(axis=0, keepdims=True) if len(out) > 1 else out


def noisy(scale: float) -> Corruption:
    def corrupt(out: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(len(out))
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out + scale * norms * rng.standard_normal(out.shape).astype(np.float32)

    return corrupt


class _Corrupting:
    def __init__(self, session: Any, corrupt: Corruption | None) -> None:
        self._session = session
        self._corrupt = corrupt

    def run(self, names: Any, feeds: Any, options: Any = None) -> list[np.ndarray]:
        outs = self._session.run(names, feeds, options)
        return [self._corrupt(o) if self._corrupt else o for o in outs]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class Provider:
    """A session factory: CPU plans as they are; other plans a relabelled CPU session whose
    outputs ``corruption[precision]`` (or ``corruption[None]``) corrupts."""

    def __init__(self, corruption: dict[InferencePrecision | None, Corruption] | None = None):
        self.corruption = corruption or {}
        self.opened: list[str] = []

    def __call__(self, path: Path, plan: ProviderPlan, settings: SessionSettings, **kw: Any):
        self.opened.append(plan.describe())
        cpu = runtime.plan_providers(BackendType.CPU, [CPU])[0]
        session = create_session(path, cpu, settings, **kw)
        if plan.backend is BackendType.CPU:
            return session
        corrupt = self.corruption.get(plan.precision, self.corruption.get(None))
        return dataclasses.replace(
            session,
            session=_Corrupting(session.session, corrupt),
            backend=plan.backend,
            providers=(plan.providers[0][0], CPU),
            precision=plan.precision,
        )


def start(
    model: Path, available: list[str], factory: Provider, backend=BackendType.AUTO, **config: Any
) -> OnnxClipPlugin:
    plugin = OnnxClipPlugin(available_providers=available, session_factory=factory)
    plugin.initialize(PluginConfig(model=ModelConfig(path=str(model)), **config), backend)
    return plugin


def test_an_honest_gpu_provider_passes_and_its_figures_are_reported(tiny_model_dir: Path) -> None:
    plugin = start(tiny_model_dir, [CUDA, CPU], Provider())
    try:
        stats = plugin.get_statistics()
        assert plugin.get_backend() is BackendType.CUDA
        assert stats["precision"] == "f32"
        canary = stats["canary"]
        assert canary["floor"] == 0.9999
        assert set(canary["min_cosine"]) == {"visual", "textual"}
        assert min(canary["min_cosine"].values()) > 0.99999
        assert canary["refused"] == []
    finally:
        plugin.shutdown()


def test_cpu_fp32_is_the_reference_and_runs_no_canary(tiny_model_dir: Path) -> None:
    factory = Provider()
    plugin = start(tiny_model_dir, [CPU], factory)
    try:
        assert factory.opened == ["cpu f32", "cpu f32"]  # the two towers, no reference sessions
        assert plugin.get_statistics()["canary"]["min_cosine"] == {}
    finally:
        plugin.shutdown()


@pytest.mark.parametrize(
    "corrupt", [same_vector, leaky, noisy(0.02)], ids=["same-vector", "leaky-batch", "noisy"]
)
def test_auto_refuses_a_provider_that_fails_the_canary_and_moves_on(
    tiny_model_dir: Path, corrupt: Corruption
) -> None:
    plugin = start(tiny_model_dir, [CUDA, CPU], Provider({None: corrupt}))
    try:
        assert plugin.is_ready(), plugin.last_error
        assert plugin.get_backend() is BackendType.CPU
        (reason,) = plugin.get_statistics()["canary"]["refused"]
        assert reason.startswith("cuda f32 refused by the canary: visual tower's min cosine")
        assert "below canary_min_cosine 0.9999" in reason
        a, b = plugin.generate_text_embedding("red"), plugin.generate_text_embedding("blue")
        assert not np.allclose(a.embedding, b.embedding)  # the CPU model serves
    finally:
        plugin.shutdown()


def test_an_explicit_backend_that_fails_the_canary_fails_initialize(tiny_model_dir: Path) -> None:
    plugin = start(tiny_model_dir, [CUDA, CPU], Provider({None: same_vector}), BackendType.CUDA)
    assert not plugin.is_ready()
    assert "cuda f32 refused by the canary" in (plugin.last_error or "")


def test_the_floor_is_configurable(tiny_model_dir: Path) -> None:
    slightly = Provider({None: noisy(0.005)})
    plugin = start(tiny_model_dir, [CUDA, CPU], slightly, BackendType.CUDA)
    assert not plugin.is_ready()
    plugin = start(tiny_model_dir, [CUDA, CPU], slightly, BackendType.CUDA, canary_min_cosine=0.99)
    try:
        assert plugin.get_backend() is BackendType.CUDA
        assert 0.99 <= min(plugin.get_statistics()["canary"]["min_cosine"].values()) < 0.9999
    finally:
        plugin.shutdown()


def test_the_text_tower_has_its_own_canary(tiny_model_dir: Path) -> None:
    class TextOnly(Provider):
        def __call__(self, path: Path, plan: ProviderPlan, *a: Any, **kw: Any) -> ORTSession:
            self.corruption = {None: same_vector} if "textual" in path.name else {}
            return super().__call__(path, plan, *a, **kw)

    plugin = start(tiny_model_dir, [CUDA, CPU], TextOnly())
    try:
        assert plugin.get_backend() is BackendType.CPU
        (reason,) = plugin.get_statistics()["canary"]["refused"]
        assert "textual tower's min cosine" in reason
    finally:
        plugin.shutdown()


def test_openvino_walks_its_precisions_fastest_first(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CPU with AMX: bf16 is tried first; here it loses too much and f32 serves.
    monkeypatch.setattr(runtime, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    factory = Provider({InferencePrecision.BF16: noisy(0.02)})
    plugin = start(tiny_model_dir, [OV, CPU], factory, BackendType.OPENVINO)
    try:
        stats = plugin.get_statistics()
        assert (stats["backend"], stats["precision"]) == ("openvino", "f32")
        assert stats["providers"] == [OV, CPU]
        (reason,) = stats["canary"]["refused"]
        assert reason.startswith("openvino bf16 refused by the canary")
    finally:
        plugin.shutdown()
    # AUTO: OpenVINO only in bf16 on a CPU; refused, ONNX Runtime's CPU fp32 serves
    factory = Provider({InferencePrecision.BF16: noisy(0.02)})
    plugin = start(tiny_model_dir, [OV, CPU], factory)
    try:
        stats = plugin.get_statistics()
        assert (stats["backend"], stats["precision"]) == ("cpu", "f32")
        assert factory.opened.count("openvino f32") == 0
        (reason,) = stats["canary"]["refused"]
        assert reason.startswith("openvino bf16 refused by the canary")
    finally:
        plugin.shutdown()
    plugin = start(tiny_model_dir, [OV, CPU], Provider({InferencePrecision.BF16: noisy(1e-4)}))
    try:
        assert plugin.get_statistics()["precision"] == "bf16"
    finally:
        plugin.shutdown()


def test_openvino_on_a_cpu_without_bf16_uses_f32_and_a_forced_precision_is_kept(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    factory = Provider()
    plugin = start(tiny_model_dir, [OV, CPU], factory, BackendType.OPENVINO)
    try:
        assert plugin.get_statistics()["precision"] == "f32"
        assert "openvino bf16" not in factory.opened
    finally:
        plugin.shutdown()
    forced = OpenVINOConfig(precision=InferencePrecision.BF16)
    bad = Provider({InferencePrecision.BF16: noisy(0.02)})
    plugin = start(tiny_model_dir, [OV, CPU], bad, BackendType.OPENVINO, openvino=forced)
    assert not plugin.is_ready()
    assert "openvino bf16 refused by the canary" in (plugin.last_error or "")
    assert "openvino f32" not in bad.opened  # forced: no other precision is tried


def test_the_canary_runs_again_on_every_hot_swap(
    tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    factory = Provider()
    plugin = start(tiny_model_dir, [CUDA, CPU], factory, BackendType.CUDA)
    try:
        assert plugin.get_backend() is BackendType.CUDA
        factory.corruption = {None: same_vector}  # the provider breaks (a driver update)
        config_b = PluginConfig(model=ModelConfig(path=str(tiny_model_dir_b)))
        assert not plugin.reload_model(config_b)
        assert "cuda f32 refused by the canary" in (plugin.last_error or "")
        assert plugin.model_identity.name == "tiny-a"  # the old model keeps serving
        factory.corruption = {}
        assert plugin.reload_model(config_b)
        assert plugin.model_identity.name == "tiny-b"
        assert plugin.get_backend() is BackendType.CUDA
        assert min(plugin.get_statistics()["canary"]["min_cosine"].values()) > 0.99999
    finally:
        plugin.shutdown()


def test_a_kept_reference_skips_the_reference_sessions_but_not_the_verdict(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """With ``session.optimized_model_cache_dir`` the CPU fp32 reference vectors are kept:
    the next load opens no reference session, still refuses a broken provider, and a changed
    model file or a damaged entry gets a fresh reference."""
    import shutil

    from themis_clip.config import SessionConfig

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    cache = tmp_path / "cache"
    kept = {"session": SessionConfig(optimized_model_cache_dir=str(cache))}

    def load(factory: Provider) -> OnnxClipPlugin:
        plugin = start(model, [CUDA, CPU], factory, BackendType.CUDA, **kept)
        plugin.generate_text_embedding("a red circle")  # the text tower and its canary
        return plugin

    first, again = Provider(), Provider()
    a = load(first)
    b = load(again)
    try:
        assert first.opened.count("cpu f32") == 2  # a reference session per tower
        assert again.opened == ["cuda f32", "cuda f32"]  # none: the references were kept
        assert len(list(cache.glob("canary/*/canary-*.npy"))) == 2
        cos_a, cos_b = (p.get_statistics()["canary"]["min_cosine"] for p in (a, b))
        assert set(cos_b) == {"visual", "textual"}
        assert cos_a == pytest.approx(cos_b, abs=1e-6)
    finally:
        a.shutdown()
        b.shutdown()
    broken = start(model, [CUDA, CPU], Provider({None: same_vector}), BackendType.CUDA, **kept)
    assert not broken.is_ready()
    assert "refused by the canary" in (broken.last_error or "")
    for entry in cache.glob("canary/*/canary-*.npy"):  # damaged entries are computed again
        entry.write_bytes(b"\x93NUMPY garbage")
    damaged = Provider()
    load(damaged).shutdown()
    assert damaged.opened.count("cpu f32") == 2
    kept_vectors = {e: np.load(e) for e in cache.glob("canary/*/canary-*.npy")}
    rng = np.random.default_rng(0)
    for entry, good in kept_vectors.items():  # readable but wrong: never refuses a provider
        np.save(entry, rng.standard_normal(good.shape).astype(np.float32))
    poisoned = Provider()
    plugin = load(poisoned)
    try:
        assert plugin.get_backend() is BackendType.CUDA
        assert min(plugin.get_statistics()["canary"]["min_cosine"].values()) > 0.99999
    finally:
        plugin.shutdown()
    assert poisoned.opened.count("cpu f32") == 2  # fresh references, kept in their place
    for entry, good in kept_vectors.items():
        np.testing.assert_allclose(np.load(entry), good, atol=1e-5)
    (model / "visual.onnx").touch()  # another file: another key, another reference
    changed = Provider()
    load(changed).shutdown()
    assert changed.opened.count("cpu f32") == 1  # the image tower's; the text tower's is kept
