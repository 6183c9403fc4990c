from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.helpers import (
    HOSTILE_TEXT,
    PATHOLOGICAL_SPLIT,
    SessionRecorder,
    encode,
    hostile_tokenizer_model,
    make_plugin,
    photo_like,
)
from themis_clip import (
    BackendType,
    EmbeddingResult,
    ModelConfig,
    NotReadyError,
    OnnxClipPlugin,
    PluginConfig,
    PluginState,
    TextInputError,
)


def imgs(n: int, seed: int = 0) -> list[np.ndarray]:
    return [photo_like(30 + (i * 13) % 50, 25 + (i * 7) % 40, seed + i) for i in range(n)]


def test_lifecycle(tiny_model_dir: Path) -> None:
    plugin = OnnxClipPlugin()
    assert not plugin.is_ready()
    assert plugin.get_backend() is BackendType.AUTO
    assert plugin.get_statistics()["state"] == "UNINITIALIZED"
    assert plugin.initialize(PluginConfig(model=ModelConfig(path=str(tiny_model_dir))))
    assert plugin.is_ready() and plugin.get_backend() is BackendType.CPU
    stats = plugin.get_statistics()
    assert stats["state"] == PluginState.READY and stats["embedding_dim"] == 32
    assert stats["model_variant"] == "tiny-a" and stats["generation"] == 1
    assert plugin.generate_embedding(imgs(1)[0]).ok
    plugin.shutdown()
    assert not plugin.is_ready()
    assert plugin.get_statistics()["calls"] == 0  # shutdown resets statistics
    result = plugin.generate_embedding(imgs(1)[0])
    assert not result.ok and result.error_type == "NotReadyError"
    assert all(r.error_type == "NotReadyError" for r in plugin.generate_embedding_batch(imgs(2)))
    assert not plugin.generate_text_embedding("x").ok
    assert plugin.health_check() is False
    with pytest.raises(NotReadyError):
        plugin.warmup()
    plugin.shutdown()  # idempotent


def test_initialize_failures_are_reported(tmp_path: Path) -> None:
    plugin = OnnxClipPlugin()
    assert not plugin.initialize(
        PluginConfig(model=ModelConfig(path=str(tmp_path / "missing.onnx")))
    )
    assert "not found" in (plugin.last_error or "")
    assert plugin.get_statistics()["state"] == "ERROR"
    assert not plugin.initialize("not a config")  # type: ignore[arg-type]
    assert "PluginConfig" in (plugin.last_error or "")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage")
    assert not plugin.initialize(PluginConfig(model=ModelConfig(path=str(corrupt))))
    assert "cannot load" in (plugin.last_error or "")


def test_reinitialize_replaces_the_model(tiny_model_dir: Path, tiny_model_dir_b: Path) -> None:
    plugin = make_plugin(tiny_model_dir)
    first = plugin.model_identity
    assert plugin.initialize(PluginConfig(model=ModelConfig(path=str(tiny_model_dir_b))))
    assert plugin.model_identity != first and plugin.model_identity.name == "tiny-b"  # type: ignore[union-attr]
    plugin.shutdown()


def test_all_input_kinds(plugin: OnnxClipPlugin, tmp_path: Path) -> None:
    arr = photo_like(64, 48, 3)
    pil = Image.fromarray(arr)
    path = tmp_path / "x.png"
    pil.save(path)
    results = [
        plugin.generate_embedding(arr),
        plugin.generate_embedding(pil),
        plugin.generate_embedding(path),
        plugin.generate_embedding(str(path)),
        plugin.generate_embedding(path.read_bytes()),
        plugin.generate_embedding(bytearray(path.read_bytes())),
        plugin.generate_embedding(memoryview(path.read_bytes())),
    ]
    for r in results:
        assert r.ok and r.embedding is not None and r.embedding.dtype == np.float32
        assert r.embedding.shape == (32,) and abs(float(np.linalg.norm(r.embedding)) - 1) < 1e-5
        assert np.array_equal(r.embedding, results[0].embedding)
        assert r.model_id and r.model_id.startswith("tiny-a@")


def test_metadata_passes_through(plugin: OnnxClipPlugin) -> None:
    r = plugin.generate_embedding(imgs(1)[0], {"id": 7})
    assert r.metadata == {"id": 7}
    bad = plugin.generate_embedding(b"junk", {"id": 8})
    assert bad.metadata == {"id": 8} and not bad.ok


def test_batch_equals_single_and_bad_items_fail_alone(plugin: OnnxClipPlugin) -> None:
    good = imgs(6)
    items: list[object] = [
        good[0],
        b"",
        good[1],
        b"not an image",
        good[2],
        42,
        good[3],
        good[4],
        good[5],
    ]
    results = plugin.generate_embedding_batch(items)  # type: ignore[arg-type]
    assert [r.ok for r in results] == [True, False, True, False, True, False, True, True, True]
    assert "empty" in (results[1].error or "") and "not a recognised" in (results[3].error or "")
    assert "unsupported image input type int" in (results[5].error or "")
    for r, g in zip([results[i] for i in (0, 2, 4, 6, 7, 8)], good, strict=True):
        single = plugin.generate_embedding(g)
        assert np.abs(r.embedding - single.embedding).max() < 1e-5  # type: ignore[operator]
    stats = plugin.get_statistics()
    assert stats["errors"] == 3 and stats["images"] == 9 + 6


def test_a_failed_decode_leaves_no_reference_cycle(plugin: OnnxClipPlugin) -> None:
    """A bad image is freed when its call returns: no frame, error or image bytes wait for
    the cyclic collector. (Re-raising the decode's error in the batch loop made a cycle through
    that frame, which kept every image of the call alive: a server fed 20 MB undecodable
    uploads grew by ~14 MB each, since its frozen heap put them out of the collector's reach.)"""
    import gc
    import types

    plugin.generate_embedding_batch([b"warm up"])  # first-call caches are not the point
    gc.collect()
    gc.disable()
    try:
        results = plugin.generate_embedding_batch(
            [b"not an image" * 1000, imgs(1)[0], b"\xff\xd8\xff broken jpeg"]  # type: ignore[list-item]
        )
        assert [r.ok for r in results] == [False, True, False]
        del results
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, (BaseException, types.FrameType, bytes))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not left, [type(o).__name__ for o in left][:20]


def test_empty_batches(plugin: OnnxClipPlugin) -> None:
    assert plugin.generate_embedding_batch([]) == []
    assert plugin.generate_text_embedding_batch([]) == []


def test_text_embeddings(plugin: OnnxClipPlugin) -> None:
    r = plugin.generate_text_embedding("a red circle")
    assert r.ok and r.embedding is not None and r.embedding.shape == (32,)
    assert abs(float(np.linalg.norm(r.embedding)) - 1) < 1e-5 and r.truncated is False
    long = plugin.generate_text_embedding("red " * 200)
    assert long.ok and long.truncated
    mixed = plugin.generate_text_embedding_batch(["a", None, "b"])  # type: ignore[list-item]
    assert [m.ok for m in mixed] == [True, False, True]
    assert mixed[1].error_type == "TextInputError"


def test_a_tokenizer_panic_is_one_failed_result(tiny_model_dir: Path, tmp_path: Path) -> None:
    plugin = make_plugin(hostile_tokenizer_model(tiny_model_dir, tmp_path / "m"))
    try:
        results = plugin.generate_text_embedding_batch(["a red circle", HOSTILE_TEXT, "blue"])
        assert [r.ok for r in results] == [True, False, True]
        assert results[1].error_type == "TextInputError"
        assert "tokenizer failed" in (results[1].error or "")
        alone = plugin.generate_text_embedding("a red circle")
        assert alone.embedding is not None and results[0].embedding is not None
        assert np.allclose(results[0].embedding, alone.embedding, atol=1e-6)
        assert not plugin.generate_text_embedding(HOSTILE_TEXT).ok
        with pytest.raises(TextInputError, match="tokenizer failed"):
            plugin.tokenize(["fine", HOSTILE_TEXT])
    finally:
        plugin.shutdown()


def test_a_model_whose_tokenizer_fails_on_plain_text_is_refused_at_load(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = hostile_tokenizer_model(tiny_model_dir, tmp_path / "m", pattern=PATHOLOGICAL_SPLIT)
    plugin = OnnxClipPlugin()
    try:
        assert not plugin.initialize(PluginConfig.from_dict({"model": {"path": str(model)}}))
        assert "backtracks without bound" in (plugin.last_error or "")
    finally:
        plugin.shutdown()


def test_image_only_model_refuses_text(tiny_model_dir: Path) -> None:
    plugin = make_plugin(tiny_model_dir / "visual.onnx")
    r = plugin.generate_text_embedding("x")
    assert not r.ok and "no text tower" in (r.error or "")
    assert plugin.get_statistics()["text_tower"] is False
    plugin.shutdown()


def test_concurrent_calls_are_bit_identical_to_serial(plugin: OnnxClipPlugin) -> None:
    data = [encode(Image.fromarray(a), "PNG") for a in imgs(12, seed=50)]
    texts = [f"a {c} shape number {i}" for i, c in enumerate(["red", "blue", "green"] * 4)]
    serial_img = [plugin.generate_embedding(d).embedding for d in data]
    serial_txt = [plugin.generate_text_embedding(t).embedding for t in texts]
    serial_batch = [r.embedding for r in plugin.generate_embedding_batch(data)]
    barrier = threading.Barrier(8)

    def worker(k: int) -> list[tuple[str, int, np.ndarray | None]]:
        barrier.wait()
        out = []
        for rep in range(6):
            i = (k + rep) % len(data)
            out.append(("img", i, plugin.generate_embedding(data[i]).embedding))
            out.append(("txt", i, plugin.generate_text_embedding(texts[i]).embedding))
            if rep % 3 == 0:
                for j, r in enumerate(plugin.generate_embedding_batch(data)):
                    out.append(("batch", j, r.embedding))
        return out

    with ThreadPoolExecutor(8) as pool:
        outputs = [o for chunk in pool.map(worker, range(8)) for o in chunk]
    assert len(outputs) > 8 * 12
    for kind, i, emb in outputs:
        expected = {"img": serial_img, "txt": serial_txt, "batch": serial_batch}[kind][i]
        assert emb is not None and np.array_equal(emb, expected), (kind, i)


def test_statistics(plugin: OnnxClipPlugin) -> None:
    plugin.generate_embedding(imgs(1)[0])
    plugin.generate_embedding_batch(imgs(4))
    plugin.generate_text_embedding_batch(["a", "b", "c"])
    plugin.generate_embedding(b"bad")
    stats = plugin.get_statistics()
    json.dumps(stats)  # JSON-serialisable
    assert (
        stats["calls"] == 4
        and stats["images"] == 6
        and stats["texts"] == 3
        and stats["errors"] == 1
    )
    assert stats["batches"] == 3 and stats["mean_batch_size"] == pytest.approx(8 / 3)
    assert 0 < stats["p50_latency_ms"] <= stats["p95_latency_ms"] <= stats["p99_latency_ms"]
    assert stats["avg_latency_ms"] > 0 and stats["uptime_s"] > 0
    for key in (
        "backend",
        "model_variant",
        "embedding_dim",
        "model_id",
        "loading_mode",
        "in_flight",
    ):
        assert key in stats
    assert stats["backend"] == "cpu" and stats["in_flight"] == 0


def test_warmup_and_health(plugin: OnnxClipPlugin) -> None:
    timings = plugin.warmup()
    assert set(timings) == {"visual_b1_ms", "visual_b32_ms", "textual_b1_ms", "textual_b32_ms"}
    assert all(v > 0 for v in timings.values())
    assert plugin.health_check() is True


def test_no_exception_escapes_for_any_input(plugin: OnnxClipPlugin) -> None:
    weird: list[object] = [
        None,
        object(),
        3.5,
        [],
        {},
        b"\xff\xd8\xff",
        "/dev/null",
        np.zeros(0, np.uint8),
        np.zeros((0, 0, 3), np.uint8),
        np.zeros((2, 2, 3, 1), np.uint8),
    ]
    for item in weird:
        r = plugin.generate_embedding(item)  # type: ignore[arg-type]
        assert isinstance(r, EmbeddingResult) and not r.ok and r.error, item
    results = plugin.generate_embedding_batch(weird)  # type: ignore[arg-type]
    assert len(results) == len(weird) and not any(r.ok for r in results)
    assert plugin.generate_embedding(imgs(1)[0]).ok  # and nothing was poisoned


@pytest.mark.parametrize(("ahead", "queued_at_first_run"), [(0, 4), (1, 8), (3, 13)])
def test_prefetch_depth_decodes_that_many_batches_ahead(
    tiny_model_dir: Path, ahead: int, queued_at_first_run: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = SessionRecorder()
    plugin = make_plugin(
        tiny_model_dir, session_factory=sessions, max_batch_size=4, prefetch_batches=ahead
    )
    images: list[object] = [photo_like(40 + i, 30, i) for i in range(13)]
    images[5] = b"not an image"
    reference = [r.embedding for r in make_plugin(tiny_model_dir).generate_embedding_batch(images)]
    session = sessions.last("visual")
    submitted: list[int] = []
    seen_at_run: list[int] = []
    real_submit, real_run = ThreadPoolExecutor.submit, session.run

    def counting_submit(self: ThreadPoolExecutor, *a: Any, **kw: Any) -> Any:
        submitted.append(1)  # only the plugin's decode pool submits during the call below
        return real_submit(self, *a, **kw)

    def recording_run(names: Any, feeds: Any) -> Any:
        seen_at_run.append(len(submitted))
        return real_run(names, feeds)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", counting_submit)
    session.run = recording_run  # type: ignore[method-assign]
    results = plugin.generate_embedding_batch(images)
    assert seen_at_run[0] == queued_at_first_run  # decoding ran that far ahead of the session
    assert len(seen_at_run) == 4 and len(submitted) == 13
    assert not results[5].ok and results[5].error_type == "ImageDecodeError"
    for i, r in enumerate(results):
        if i != 5:
            assert r.ok and np.allclose(r.embedding, reference[i], atol=1e-6)


def test_model_spec_and_text_input_describe_the_loaded_model(tiny_model_dir: Path) -> None:
    plugin = make_plugin(tiny_model_dir)
    spec = plugin.model_spec
    assert spec is not None and spec.visual_path.name == "visual.onnx"
    assert spec.image.image_size == plugin.get_statistics()["image_size"]
    text_input = plugin.get_statistics()["text_input"]
    assert text_input["context_length"] == len(plugin.tokenize(["word " * 500])[0])
    assert text_input["attention_mask"] is False  # the tiny CLIP text tower takes ids only
    plugin.shutdown()
    assert plugin.model_spec is None and plugin.get_statistics()["text_input"] is None


def test_lazy_text_tower_opens_on_first_text_call_only(tiny_model_dir: Path) -> None:
    sessions = SessionRecorder()
    plugin = OnnxClipPlugin(session_factory=sessions, lazy_textual=True)
    assert plugin.initialize(PluginConfig(model=ModelConfig(path=str(tiny_model_dir))))
    assert plugin.generate_embedding_batch(imgs(3))[0].ok
    assert [s.path.name for s in sessions.sessions] == ["visual.onnx"]  # images never open it
    stats = plugin.get_statistics()
    assert stats["text_tower"] is True and stats["text_input"] is None  # declared, not opened
    eager = make_plugin(tiny_model_dir)
    lazy_vec = plugin.generate_text_embedding("a red circle").embedding
    assert [s.path.name for s in sessions.sessions] == ["visual.onnx", "textual.onnx"]
    assert np.allclose(lazy_vec, eager.generate_text_embedding("a red circle").embedding)
    assert plugin.get_statistics()["text_input"] == eager.get_statistics()["text_input"]
    plugin.generate_text_embedding("again")
    assert len(sessions.sessions) == 2  # opened once
    plugin.shutdown()
    eager.shutdown()
