"""OpenVINO for real (on any vendor's CPU), and the batch-independence promise on
every provider: a vector must not depend on its batch-mates (alone vs in batches of 1 to 32:
bit-identical where the provider allows, else cosine >= 0.99999).

GPU providers cannot start on a machine without a GPU: they are injected at the session seam
(a real CPU session under their name), which tests the path the plugin takes for them, the
canary and the checks here; the kernels themselves are the CPU's.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import photo_like
from themis_clip import BackendType, ModelConfig, OnnxClipPlugin, PluginConfig
from themis_clip.config import OpenVINOConfig, SessionConfig
from themis_clip.resources import demo_model_path
from themis_clip.runtime import (
    ProviderPlan,
    SessionSettings,
    create_session,
    openvino_devices,
    plan_providers,
)
from themis_clip.vocabulary import InferencePrecision

CPU = "CPUExecutionProvider"

# AUTO as a user gets it (the suite pins CPU through THEMIS_CLIP_BACKEND).
pytestmark = pytest.mark.usefixtures("auto_backend")


def openvino_device() -> str | None:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return None
    return next(iter(openvino_devices()), None)


needs_openvino = pytest.mark.skipif(
    openvino_device() is None, reason="no OpenVINO wheel for this platform"
)


def injected(path: Path, plan: ProviderPlan, settings: SessionSettings, **kw: Any) -> Any:
    """A real CPU session under the plan's provider name."""
    session = create_session(path, plan_providers(BackendType.CPU, [CPU])[0], settings, **kw)
    if plan.backend is BackendType.CPU:
        return session
    return dataclasses.replace(session, backend=plan.backend, providers=(plan.providers[0][0], CPU))


PROVIDERS = {
    "cpu": (BackendType.CPU, None),
    "cuda-injected": (BackendType.CUDA, ["CUDAExecutionProvider", CPU]),
    "tensorrt-injected": (BackendType.TENSORRT, ["TensorrtExecutionProvider", CPU]),
    "openvino": (BackendType.OPENVINO, None),
}


@pytest.fixture(params=list(PROVIDERS))
def served(request: pytest.FixtureRequest) -> Iterator[OnnxClipPlugin]:
    backend, available = PROVIDERS[request.param]
    if backend is BackendType.OPENVINO and openvino_device() is None:
        pytest.skip("no OpenVINO wheel for this platform")
    plugin = (
        OnnxClipPlugin(available_providers=available, session_factory=injected)
        if available
        else OnnxClipPlugin()
    )
    config = PluginConfig(model=ModelConfig(path=str(demo_model_path())))
    assert plugin.initialize(config, backend), plugin.last_error
    assert plugin.get_backend() is backend
    yield plugin
    plugin.shutdown()


def assert_independent(alone: np.ndarray, batched: np.ndarray, where: str) -> None:
    if np.array_equal(alone, batched):
        return
    cos = np.sum(alone.astype(np.float64) * batched, axis=1)
    assert cos.min() >= 0.99999, f"{where}: min cosine {cos.min():.7f} to the vector alone"


@pytest.mark.slow
def test_a_vector_does_not_depend_on_its_batch_mates(served: OnnxClipPlugin) -> None:
    pixels = np.stack([served.preprocess(photo_like(80, 60, seed)) for seed in range(32)])
    alone = np.concatenate([served.embed_pixels(pixels[i : i + 1]) for i in range(32)])
    texts = [f"photo number {i} of a {'red' if i % 2 else 'blue'} thing" for i in range(32)]
    rows = served.tokenize(texts)
    alone_t = np.concatenate([served.embed_tokens([r]) for r in rows])
    for size in range(1, 33):
        for start in range(0, 32, size):
            stop = min(start + size, 32)
            got = served.embed_pixels(pixels[start:stop])
            assert_independent(alone[start:stop], got, f"images, batch of {size}")
            got_t = served.embed_tokens(rows[start:stop])
            assert_independent(alone_t[start:stop], got_t, f"texts, batch of {size}")


@needs_openvino
@pytest.mark.parametrize("precision", ["bf16", "f32"])
def test_openvino_serves_with_its_precision_and_canary(precision: str) -> None:
    from themis_clip.runtime import cpu_flags

    if precision == "bf16" and not {"amx_bf16", "avx512_bf16"} & cpu_flags():
        # where OpenVINO computes bf16 otherwise is its business: a CPU it substitutes on is
        # refused (test_a_precision_the_cpu_lacks_is_refused_not_misreported)
        pytest.skip("the CPU has no bf16 arithmetic (AMX or AVX-512 BF16)")
    plugin = OnnxClipPlugin()
    config = PluginConfig(
        model=ModelConfig(path=str(demo_model_path())),
        openvino=OpenVINOConfig(precision=InferencePrecision(precision)),
    )
    assert plugin.initialize(config), plugin.last_error  # AUTO honours a forced precision
    try:
        stats = plugin.get_statistics()
        assert (stats["backend"], stats["precision"]) == ("openvino", precision)
        assert stats["providers"] == ["OpenVINO CPU"]
        # the canary ran on both towers against ONNX Runtime's CPU fp32 and passed
        assert set(stats["canary"]["min_cosine"]) == {"visual", "textual"}
        assert min(stats["canary"]["min_cosine"].values()) >= 0.9999
        # and OpenVINO really computed: its vectors are not the reference's bit for bit
        reference = OnnxClipPlugin()  # (a forced OpenVINO precision on the CPU is refused)
        assert reference.initialize(dataclasses.replace(config, openvino=OpenVINOConfig()), "cpu")
        mine = plugin.generate_text_embedding("a red circle").embedding
        theirs = reference.generate_text_embedding("a red circle").embedding
        reference.shutdown()
        assert not np.array_equal(mine, theirs)
        assert float(np.dot(mine, theirs)) >= 0.9999
    finally:
        plugin.shutdown()


@needs_openvino
def test_a_stopped_openvino_run_is_cancelled(tmp_path: Path) -> None:
    from themis_clip.errors import InferenceError

    plan = plan_providers(BackendType.OPENVINO, ["OpenVINOExecutionProvider"])[-1]
    session = create_session(demo_model_path() / "visual.onnx", plan, SessionSettings())
    name, size = session.inputs[0].name, session.inputs[0].fixed_dim(2)
    pixels = np.zeros((4096, 3, size, size), np.float32)  # seconds of work
    stopper = threading.Timer(0.05, session.stop_runs, args=("the test stopped it",))
    stopper.start()
    with pytest.raises(InferenceError, match="run stopped: the test stopped it"):
        session.run(None, {name: pixels})
    (out,) = session.run(None, {name: pixels[:2]})  # the session still serves
    assert out.shape[0] == 2
    session.close()


@needs_openvino
def test_openvino_hot_swap_and_mmap(tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "demo"
    shutil.copytree(demo_model_path(), copy)
    plugin = OnnxClipPlugin()
    config = PluginConfig(model=ModelConfig(path=str(demo_model_path())))
    assert plugin.initialize(config, BackendType.OPENVINO), plugin.last_error
    try:
        before = plugin.generate_text_embedding("a red circle").embedding
        mapped = PluginConfig(model=ModelConfig(path=str(copy), enable_mmap_loading=True))
        assert plugin.reload_model(mapped), plugin.last_error
        stats = plugin.get_statistics()
        assert (stats["backend"], stats["loading_mode"]) == ("openvino", "mmap")
        assert stats["generation"] == 2
        assert min(stats["canary"]["min_cosine"].values()) >= 0.9999
        after = plugin.generate_text_embedding("a red circle").embedding
        assert float(np.dot(before, after)) >= 0.9999
    finally:
        plugin.shutdown()


@needs_openvino
@pytest.mark.slow
def test_ocr_on_openvino_reads_what_the_cpu_reads(tmp_path: Path) -> None:
    """PP-OCRv4's real models, compiled by OpenVINO in its default precision (bf16 where the
    CPU has it, which is what AUTO takes), read the same lines as ONNX Runtime's fp32."""
    from importlib import metadata

    from tests.ocr_gallery import fonts, make_scene
    from themis_clip.config import OCRConfig
    from themis_clip.models.ocr import OCR_WHEEL
    from themis_clip.ocr import OCREngine

    try:
        metadata.distribution(OCR_WHEEL)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{OCR_WHEEL} (the OCR models) is not installed")
    font = next(iter(fonts()), None)
    if font is None:
        pytest.skip("no gallery font (apt install fonts-dejavu-core)")
    scenes = []
    for i, (kind, rotation, tilt) in enumerate([("receipt", 0, 0.0), ("screen", 0, 12.0)]):
        path = tmp_path / f"{kind}.jpg"
        make_scene(path, kind=kind, font=font, seed=40 + i, rotation=rotation, tilt=tilt)
        scenes.append(path)
    read = {}
    for backend in (BackendType.CPU, BackendType.OPENVINO):
        engine = OCREngine.load(OCRConfig(enabled=True), backend=backend)
        try:
            read[backend] = [engine.read_text(path) for path in scenes]
        finally:
            engine.close()
    for cpu, ov in zip(read[BackendType.CPU], read[BackendType.OPENVINO], strict=True):
        assert cpu.lines, "the scene has text"
        assert sorted(x.text for x in ov.lines) == sorted(x.text for x in cpu.lines)
        boxes = {x.text: np.array(x.box) for x in cpu.lines}
        for line in ov.lines:
            assert np.abs(np.array(line.box) - boxes[line.text]).max() <= 4.0, line.text


@needs_openvino
def test_openvino_keeps_its_compiled_model_and_the_canary_reference(tmp_path: Path) -> None:
    """``session.optimized_model_cache_dir``: OpenVINO's compiled models go to its own cache
    (``CACHE_DIR``), the canary's CPU fp32 references beside them; a second load serves the
    same vectors from both."""
    cache = tmp_path / "cache"
    config = PluginConfig(
        model=ModelConfig(path=str(demo_model_path())),
        session=SessionConfig(optimized_model_cache_dir=str(cache)),
        openvino=OpenVINOConfig(precision=InferencePrecision.F32),
    )
    vectors = []
    for _ in range(2):
        plugin = OnnxClipPlugin()
        assert plugin.initialize(config, BackendType.OPENVINO), plugin.last_error
        try:
            assert plugin.get_statistics()["providers"] == ["OpenVINO CPU"]
            vectors.append(plugin.generate_text_embedding("a red circle").embedding)
        finally:
            plugin.shutdown()
        assert len(list(cache.glob("openvino/*/*.blob"))) == 2  # one folder a tower
        assert len(list(cache.glob("canary/*/canary-*.npy"))) == 2
    assert float(np.dot(vectors[0], vectors[1])) >= 0.99999


@needs_openvino
def test_a_changed_model_leaves_no_compiled_model_behind(tmp_path: Path) -> None:
    """Each model's compiled models and canary references are kept in a folder of their own,
    keyed by its files; when a file changes, the next load compiles it again and removes
    what was kept for the old one (the cache does not grow with every new version)."""
    model = tmp_path / "model"
    shutil.copytree(demo_model_path(), model)
    cache = tmp_path / "cache"
    config = PluginConfig(
        model=ModelConfig(path=str(model)),
        session=SessionConfig(optimized_model_cache_dir=str(cache)),
        openvino=OpenVINOConfig(precision=InferencePrecision.F32),
    )

    def load() -> dict[str, str]:
        plugin = OnnxClipPlugin()
        assert plugin.initialize(config, BackendType.OPENVINO), plugin.last_error
        try:
            return dict(plugin.get_statistics()["optimized_model_cache"])
        finally:
            plugin.shutdown()

    def kept() -> dict[str, list[str]]:
        return {
            kind: sorted(f.name for f in (cache / kind).iterdir() if not f.name.startswith("."))
            for kind in ("openvino", "canary")
        }

    assert set(load().values()) == {"written"}
    before = kept()
    assert [len(v) for v in before.values()] == [2, 2]  # a folder a tower, each
    data = (model / "visual.onnx").read_bytes()
    (model / "visual.onnx").unlink()
    (model / "visual.onnx").write_bytes(data)  # the same bytes, another file
    assert load() == {"visual": "written", "textual": "hit"}
    after = kept()
    for kind in ("openvino", "canary"):
        assert len(after[kind]) == 2
        assert len(set(before[kind]) & set(after[kind])) == 1  # textual's stays, visual's went


@needs_openvino
def test_an_unusable_cache_folder_never_fails_an_openvino_load(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    config = PluginConfig(
        model=ModelConfig(path=str(demo_model_path())),
        session=SessionConfig(optimized_model_cache_dir=str(blocker / "cache")),
        openvino=OpenVINOConfig(precision=InferencePrecision.F32),
    )
    plugin = OnnxClipPlugin()
    assert plugin.initialize(config, BackendType.OPENVINO), plugin.last_error
    try:
        assert plugin.get_statistics()["providers"] == ["OpenVINO CPU"]
        assert np.isfinite(plugin.generate_text_embedding("a red circle").embedding).all()
    finally:
        plugin.shutdown()


@needs_openvino
def test_a_damaged_kept_openvino_model_is_compiled_again(tmp_path: Path) -> None:
    """A compiled model in OpenVINO's cache whose weights were damaged (same size) fails its
    canary; the load empties the cache, compiles afresh, passes, and keeps the new one."""
    cache = tmp_path / "cache"
    config = PluginConfig(
        model=ModelConfig(path=str(demo_model_path())),
        session=SessionConfig(optimized_model_cache_dir=str(cache)),
        openvino=OpenVINOConfig(precision=InferencePrecision.F32),
    )

    def load() -> dict[str, Any]:
        plugin = OnnxClipPlugin()
        assert plugin.initialize(config, BackendType.OPENVINO), plugin.last_error
        try:
            return plugin.get_statistics()
        finally:
            plugin.shutdown()

    assert set(load()["optimized_model_cache"].values()) == {"written"}
    assert set(load()["optimized_model_cache"].values()) == {"hit"}
    rng = np.random.default_rng(0)
    damaged = set()
    for folder in cache.glob("openvino/*/"):
        (folder / "notes.txt").write_text("the user's")
        (folder / "mine").mkdir()
    for blob in cache.glob("openvino/*/*.blob"):
        data = bytearray(blob.read_bytes())
        for at in range(len(data) // 2, len(data) * 3 // 4, 4096):  # weights, not the header
            data[at : at + 64] = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
        blob.write_bytes(bytes(data))
        damaged.add(bytes(data))
    stats = load()
    assert stats["backend"] == "openvino"
    assert min(stats["canary"]["min_cosine"].values()) >= 0.9999
    assert stats["canary"]["refused"] == []
    # each tower failed on its damaged file, which was removed and compiled again (the second
    # tower's retry finds the first one's fresh file: "hit")
    blobs = list(cache.glob("openvino/*/*.blob"))
    assert len(blobs) == 2 and not damaged & {b.read_bytes() for b in blobs}
    assert set(load()["optimized_model_cache"].values()) == {"hit"}
    # only the compiled models went: what else is in the folder stays
    assert len(list(cache.glob("openvino/*/notes.txt"))) == len(list(cache.glob("openvino/*/mine")))
    assert len(list(cache.glob("openvino/*/notes.txt"))) == 2


@needs_openvino
def test_a_refusal_is_kept_and_a_kept_model_is_compiled_again_only_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider the canary refuses on a fresh compile is refused at once on the next start
    (kept beside the references), not compiled and probed again each time; a lower floor runs
    the canary again. A kept model that fails is compiled again once per file, never in a loop,
    even where its file cannot be removed (a read-only cache)."""
    cache = tmp_path / "cache"

    def config(floor: float) -> PluginConfig:
        return PluginConfig(
            model=ModelConfig(path=str(demo_model_path())),
            session=SessionConfig(optimized_model_cache_dir=str(cache)),
            openvino=OpenVINOConfig(precision=InferencePrecision.F32),
            canary_min_cosine=floor,
        )

    def load(floor: float) -> tuple[bool, str]:
        plugin = OnnxClipPlugin()
        try:
            return plugin.initialize(config(floor), BackendType.OPENVINO), plugin.last_error or ""
        finally:
            plugin.shutdown()

    assert load(0.9999)[0]  # compiled and kept; its references too
    ok, error = load(1.0)  # a kept model, refused: compiled again once, refused again
    if ok:
        pytest.skip("OpenVINO's f32 matched the CPU's bit for bit here: no refusal to keep")
    assert "refused by the canary" in error and "earlier load" not in error
    # the figure to 10 digits (6 read 0.99999998 as "1.000000"), the floor exactly
    assert re.search(r"cosine to cpu f32 is 0\.\d{7,}, below canary_min_cosine 1\.0\b", error)
    assert len(list(cache.glob("canary/*/refused-*.json"))) == 1
    blobs = {b: b.stat().st_mtime_ns for b in cache.glob("openvino/*/*.blob")}
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ok, error = load(1.0)
    assert not ok and "measured on a fresh compile at an earlier load" in error
    assert "compiling" not in caplog.text  # refused at once: the kept model stays
    assert {b: b.stat().st_mtime_ns for b in cache.glob("openvino/*/*.blob")} == blobs
    assert load(0.9999)[0]  # a lower floor: the canary runs again, and passes

    # a kept model whose files cannot go (read-only): one try, then refused, no loop
    for kept in cache.glob("canary/*/refused-*.json"):
        kept.unlink()
    tries = []

    def cannot_remove(plan: Any, model: Path, digest: str) -> bool:
        tries.append(model)
        return True  # "removed": the next compile takes the same kept file again

    monkeypatch.setattr("themis_clip.loading.forget_compiled", cannot_remove)
    ok, error = load(1.0)
    assert not ok and "refused by the canary" in error
    assert len(tries) == 1


@needs_openvino
def test_a_symlinked_entry_is_not_written_through(tmp_path: Path) -> None:
    """An entry folder, or the ``openvino`` folder, replaced by a symbolic link (to anywhere) is
    not used: nothing is written where it points, and the load goes on without keeping the
    compiled model."""
    cache = tmp_path / "cache"
    config = PluginConfig(
        model=ModelConfig(path=str(demo_model_path())),
        session=SessionConfig(optimized_model_cache_dir=str(cache)),
        openvino=OpenVINOConfig(precision=InferencePrecision.F32),
    )
    plugin = OnnxClipPlugin()
    assert plugin.initialize(config, BackendType.OPENVINO), plugin.last_error
    plugin.shutdown()
    precious = tmp_path / "precious"
    precious.mkdir()
    for folder in cache.glob("openvino/*/"):
        shutil.rmtree(folder)
        folder.symlink_to(precious, target_is_directory=True)
    plugin = OnnxClipPlugin()
    try:
        assert plugin.initialize(config, BackendType.OPENVINO), plugin.last_error
        states = plugin.get_statistics()["optimized_model_cache"]
    finally:
        plugin.shutdown()
    assert list(precious.iterdir()) == []
    assert all(state.endswith("is a symbolic link; not used") for state in states.values())
    shutil.rmtree(cache / "openvino")  # the kind's folder a link: not written through either
    (cache / "openvino").symlink_to(precious, target_is_directory=True)
    plugin = OnnxClipPlugin()
    try:
        assert plugin.initialize(config, BackendType.OPENVINO), plugin.last_error
    finally:
        plugin.shutdown()
    assert list(precious.iterdir()) == []


@needs_openvino
def test_a_precision_the_cpu_lacks_is_refused_not_misreported() -> None:
    """Asked for f16, OpenVINO's CPU plugin silently computes bf16 where the CPU has no f16
    arithmetic: that is refused with the reason, never reported as f16."""
    import openvino

    offers = openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    config = PluginConfig(
        model=ModelConfig(path=str(demo_model_path())),
        openvino=OpenVINOConfig(precision=InferencePrecision.F16),
    )
    plugin = OnnxClipPlugin()
    try:
        if "FP16" in offers:
            assert plugin.initialize(config, BackendType.OPENVINO), plugin.last_error
            assert plugin.get_statistics()["precision"] == "f16"
        else:
            assert not plugin.initialize(config, BackendType.OPENVINO)
            assert "cannot compute in f16" in (plugin.last_error or "")
            # under auto the load goes on on the CPU, and says why OpenVINO was not used
            assert plugin.initialize(config, BackendType.AUTO), plugin.last_error
            stats = plugin.get_statistics()
            assert stats["backend"] == "cpu"
            assert any("cannot compute in f16" in r for r in stats["canary"]["refused"])
    finally:
        plugin.shutdown()
