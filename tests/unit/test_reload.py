"""Hot swap (seed §9.1), the equivalents of OCP-HS-01..12."""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from tests.helpers import photo_like
from themis_clip import EmbeddingResult, ModelConfig, OnnxClipPlugin, PluginConfig
from themis_clip.export.tiny import VisionTowerSpec, build_vision_tower
from themis_clip.runtime import ORTSession, create_session

IMAGES = [photo_like(40 + 5 * i, 36 + 3 * i, 100 + i) for i in range(6)]
TEXTS = ["a red circle", "a blue square", "green star on the left"]


class Gate:
    """Holds the first image-tower run after ``arm()`` until ``open()`` (a real session)."""

    def __init__(self) -> None:
        self._armed = False
        self.entered = threading.Event()
        self._release = threading.Event()
        self._lock = threading.Lock()
        self.sessions: list[ORTSession] = []

    def arm(self) -> None:
        self._armed = True
        self.entered.clear()
        self._release.clear()

    def open(self) -> None:
        self._release.set()

    def factory(self, path: Path, plan: Any, settings: Any, **kw: Any) -> ORTSession:
        session = create_session(path, plan, settings, **kw)
        self.sessions.append(session)
        real = session.run

        def run(names: Any, feeds: Any) -> Any:
            with self._lock:
                hold = self._armed and "visual" in path.name
                if hold:
                    self._armed = False
            if hold:
                self.entered.set()
                assert self._release.wait(20)
            return real(names, feeds)

        session.run = run  # type: ignore[method-assign]
        return session


class HeldHash:
    """A hash function that, once armed, holds the caller inside it until released."""

    def __init__(self) -> None:
        self.armed, self.entered, self.release = (threading.Event() for _ in range(3))

    def __call__(self, path: Path) -> str:
        if self.armed.is_set():
            self.entered.set()
            assert self.release.wait(20)
        return hashlib.sha256(path.read_bytes()).hexdigest()


def config(path: Path, **kw: Any) -> PluginConfig:
    model_kw = {k: kw.pop(k) for k in list(kw) if k in ModelConfig.__dataclass_fields__}
    return PluginConfig(model=ModelConfig(path=str(path), **model_kw), **kw)


def reference(path: Path) -> tuple[str, dict[int, np.ndarray], dict[int, np.ndarray]]:
    p = OnnxClipPlugin()
    assert p.initialize(config(path))
    imgs = {i: r.embedding for i, r in enumerate(p.generate_embedding_batch(IMAGES))}
    txts = {i: r.embedding for i, r in enumerate(p.generate_text_embedding_batch(TEXTS))}
    model_id = p.get_statistics()["model_id"]
    p.shutdown()
    return model_id, imgs, txts  # type: ignore[return-value]


@pytest.fixture(scope="module")
def refs(
    tiny_model_dir: Path, tiny_model_dir_b: Path
) -> dict[str, tuple[dict[int, np.ndarray], dict[int, np.ndarray]]]:
    out = {}
    for path in (tiny_model_dir, tiny_model_dir_b):
        model_id, imgs, txts = reference(path)
        out[model_id] = (imgs, txts)
    return out


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def swap_plugin(tiny_model_dir: Path, gate: Gate):  # type: ignore[no-untyped-def]
    p = OnnxClipPlugin(session_factory=gate.factory)
    assert p.initialize(config(tiny_model_dir))
    yield p
    gate.open()
    p.shutdown()


def test_hs01_reload_success(
    swap_plugin: OnnxClipPlugin, tiny_model_dir_b: Path, refs: dict
) -> None:  # type: ignore[type-arg]
    old = swap_plugin.model_identity
    assert swap_plugin.reload_model(config(tiny_model_dir_b, allow_embedding_space_change=True))
    new = swap_plugin.model_identity
    assert new is not None and old is not None and new.name == "tiny-b" and new.sha256 != old.sha256
    stats = swap_plugin.get_statistics()
    assert stats["generation"] == 2 and stats["reloads"] == 1 and stats["reload_failures"] == 0
    imgs, txts = refs[stats["model_id"]]
    assert np.array_equal(swap_plugin.generate_embedding(IMAGES[0]).embedding, imgs[0])
    assert np.array_equal(swap_plugin.generate_text_embedding(TEXTS[1]).embedding, txts[1])


def test_hs_not_initialised_returns_false_at_once(tiny_model_dir: Path) -> None:
    p = OnnxClipPlugin()
    t0 = time.monotonic()
    assert p.reload_model(config(tiny_model_dir)) is False
    assert time.monotonic() - t0 < 0.5 and "not initialised" in (p.last_error or "")


def test_hs02_state_transitions(tiny_model_dir: Path, tiny_model_dir_b: Path) -> None:
    seen: list[str] = []
    plugin: OnnxClipPlugin

    def observing_factory(path: Path, plan: Any, settings: Any, **kw: Any) -> ORTSession:
        seen.append(plugin.get_statistics()["state"])
        session = create_session(path, plan, settings, **kw)
        real = session.run

        def run(names: Any, feeds: Any) -> Any:
            seen.append(plugin.get_statistics()["state"])
            return real(names, feeds)

        session.run = run  # type: ignore[method-assign]
        return session

    plugin = OnnxClipPlugin(session_factory=observing_factory)
    assert plugin.initialize(config(tiny_model_dir))
    seen.clear()
    assert plugin.reload_model(config(tiny_model_dir_b, allow_embedding_space_change=True))
    assert seen[0] == "LOADING" and "VALIDATING" in seen
    assert seen.index("VALIDATING") > seen.index("LOADING")
    assert plugin.get_statistics()["state"] == "READY"
    plugin.shutdown()


def test_hs03_sequential_reloads(
    swap_plugin: OnnxClipPlugin, tiny_model_dir: Path, tiny_model_dir_b: Path, refs: dict
) -> None:  # type: ignore[type-arg]
    for i in range(6):
        target = tiny_model_dir_b if i % 2 == 0 else tiny_model_dir
        assert swap_plugin.reload_model(config(target, allow_embedding_space_change=True))
        stats = swap_plugin.get_statistics()
        assert stats["generation"] == i + 2
        assert stats["model_variant"] == ("tiny-b" if i % 2 == 0 else "tiny-a")
        imgs, _ = refs[stats["model_id"]]
        for r, (k, ref) in zip(
            swap_plugin.generate_embedding_batch(IMAGES), imgs.items(), strict=True
        ):
            assert np.array_equal(r.embedding, ref), k
    assert swap_plugin.get_statistics()["reloads"] == 6


def test_hs04_health_after_reload(swap_plugin: OnnxClipPlugin, tiny_model_dir_b: Path) -> None:
    assert swap_plugin.reload_model(config(tiny_model_dir_b, allow_embedding_space_change=True))
    assert swap_plugin.health_check() is True
    assert swap_plugin.get_statistics()["last_health_check"] is True


def test_hs05_in_flight_counting(swap_plugin: OnnxClipPlugin, gate: Gate) -> None:
    assert swap_plugin.get_statistics()["in_flight"] == 0
    gate.arm()
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(swap_plugin.generate_embedding, IMAGES[0])
        assert gate.entered.wait(10)
        assert swap_plugin.get_statistics()["in_flight"] == 1
        gate.open()
        assert fut.result().ok
    assert swap_plugin.get_statistics()["in_flight"] == 0


def test_hs06_drain_waits_and_new_requests_go_to_the_new_model(
    swap_plugin: OnnxClipPlugin,
    gate: Gate,
    tiny_model_dir_b: Path,
    refs: dict,  # type: ignore[type-arg]
) -> None:
    old_id = swap_plugin.get_statistics()["model_id"]
    gate.arm()
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(swap_plugin.generate_embedding, IMAGES[1])
        assert gate.entered.wait(10)
        reload = pool.submit(
            swap_plugin.reload_model, config(tiny_model_dir_b, allow_embedding_space_change=True)
        )
        deadline = time.monotonic() + 10
        while swap_plugin.get_statistics()["state"] != "ACTIVATING":
            assert time.monotonic() < deadline, "reload never reached the drain"
            time.sleep(0.005)
        assert not reload.done()  # waiting for the held request
        new_id = swap_plugin.get_statistics()["model_id"]
        assert new_id != old_id
        during = swap_plugin.generate_embedding(IMAGES[1])  # served at once by the new model
        assert during.model_id == new_id and np.array_equal(during.embedding, refs[new_id][0][1])
        gate.open()
        assert reload.result(10) is True
        result = held.result(10)
    assert result.ok and result.model_id == old_id  # finished on the model it started with
    assert np.array_equal(result.embedding, refs[old_id][0][1])
    assert swap_plugin.get_statistics()["drain_timeouts"] == 0


def test_hs07_drain_timeout(tiny_model_dir: Path, tiny_model_dir_b: Path, gate: Gate) -> None:
    plugin = OnnxClipPlugin(session_factory=gate.factory)
    assert plugin.initialize(config(tiny_model_dir))
    old_sessions = list(gate.sessions)  # the old model's towers; closed means released
    assert old_sessions and all(s.session is not None for s in old_sessions)
    gate.arm()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(plugin.generate_embedding, IMAGES[2])
        assert gate.entered.wait(10)
        t0 = time.monotonic()
        assert plugin.reload_model(
            config(tiny_model_dir_b, allow_embedding_space_change=True, drain_timeout_s=0.2)
        )
        assert 0.15 < time.monotonic() - t0 < 5
        assert plugin.get_statistics()["drain_timeouts"] == 1
        # never closed under a running request
        assert all(s.session is not None for s in old_sessions)
        gate.open()
        assert held.result(10).ok
    assert all(s.session is None for s in old_sessions)  # released by its last request
    plugin.shutdown()


def test_hs08_no_request_lost(
    swap_plugin: OnnxClipPlugin, tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    stop = threading.Event()
    counts = {"sent": 0, "ok": 0}
    lock = threading.Lock()

    def client() -> None:
        while not stop.is_set():
            r = swap_plugin.generate_embedding(IMAGES[3])
            with lock:
                counts["sent"] += 1
                counts["ok"] += r.ok

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client) for _ in range(4)]
        for i in range(10):
            assert swap_plugin.reload_model(
                config(
                    tiny_model_dir_b if i % 2 == 0 else tiny_model_dir,
                    allow_embedding_space_change=True,
                )
            )
        stop.set()
        for f in futures:
            f.result()
    assert counts["sent"] > 0 and counts["ok"] == counts["sent"]


def test_hs09_concurrent_inference_and_reloads(
    tiny_model_dir: Path,
    tiny_model_dir_b: Path,
    refs: dict,  # type: ignore[type-arg]
) -> None:
    plugin = OnnxClipPlugin()
    assert plugin.initialize(config(tiny_model_dir, max_batch_size=4))
    stop = threading.Event()
    bad: list[str] = []
    done = [0]
    lock = threading.Lock()

    def check(r: EmbeddingResult, kind: int, i: int) -> None:
        if (
            not r.ok
            or r.model_id not in refs
            or not np.array_equal(r.embedding, refs[r.model_id][kind][i])
        ):
            bad.append(f"{r.model_id} {kind} {i} {r.error}")

    def client(k: int) -> None:
        n = 0
        while not stop.is_set() or n < 3:
            n += 1
            i = (k + n) % len(IMAGES)
            check(plugin.generate_embedding(IMAGES[i]), 0, i)
            check(plugin.generate_text_embedding(TEXTS[i % 3]), 1, i % 3)
            batch = plugin.generate_embedding_batch(IMAGES)
            if len({r.model_id for r in batch}) != 1:
                bad.append("a batch mixed two models")
            for j, r in enumerate(batch):
                check(r, 0, j)
            with lock:
                done[0] += 1

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(client, k) for k in range(8)]
        for i in range(20):
            target = tiny_model_dir_b if i % 2 == 0 else tiny_model_dir
            assert plugin.reload_model(
                config(target, max_batch_size=4, allow_embedding_space_change=True)
            ), plugin.last_error
        stop.set()
        for f in futures:
            f.result()
    assert not bad, bad[:5]
    assert done[0] >= 8 * 3
    assert plugin.get_statistics()["reloads"] == 20 and plugin.get_statistics()["generation"] == 21
    plugin.shutdown()


def test_hs10_embeddings_valid_before_and_after(
    swap_plugin: OnnxClipPlugin, tiny_model_dir_b: Path
) -> None:
    before = swap_plugin.generate_embedding_batch(IMAGES)
    assert swap_plugin.reload_model(config(tiny_model_dir_b, allow_embedding_space_change=True))
    after = swap_plugin.generate_embedding_batch(IMAGES)
    for r in before + after:
        assert r.ok and abs(float(np.linalg.norm(r.embedding)) - 1) < 1e-5
    assert not np.array_equal(before[0].embedding, after[0].embedding)


def test_hs11_concurrent_reloads_are_serialised_and_shutdown_is_safe(
    swap_plugin: OnnxClipPlugin, tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda i: swap_plugin.reload_model(
                    config(
                        tiny_model_dir_b if i % 2 else tiny_model_dir,
                        allow_embedding_space_change=True,
                    )
                ),
                range(4),
            )
        )
    assert results == [True] * 4 and swap_plugin.get_statistics()["generation"] == 5
    # shutdown() during a reload waits for it: hold the reload inside its hashing step, start
    # shutdown, and see shutdown finish only after the reload has (successfully) finished.
    held = HeldHash()
    p = OnnxClipPlugin(hash_fn=held)
    assert p.initialize(config(tiny_model_dir))
    held.armed.set()
    with ThreadPoolExecutor(2) as pool:
        reload = pool.submit(p.reload_model, config(tiny_model_dir_b))
        assert held.entered.wait(20)
        stop = pool.submit(p.shutdown)
        with pytest.raises(FutureTimeout):
            stop.result(0.3)  # blocked behind the reload
        assert not reload.done()
        held.release.set()
        assert reload.result(20) is True
        stop.result(20)
    assert not p.is_ready()
    assert p.reload_model(config(tiny_model_dir)) is False


def corrupt(tmp: Path, src: Path) -> Path:
    dst = Path(shutil.copytree(src, tmp / "corrupt"))
    (dst / "visual.onnx").write_bytes(b"\x08\x01 not onnx at all")
    return dst


def wrong_dim(tmp: Path) -> Path:
    build_vision_tower(VisionTowerSpec(dim=24), tmp / "w.onnx")
    return tmp / "w.onnx"


def nan_model(tmp: Path) -> Path:
    # A graph whose output is NaN for every input: fails the validation inference.
    build_vision_tower(VisionTowerSpec(), tmp / "n.onnx")
    model = onnx.load(str(tmp / "n.onnx"))
    for init in model.graph.initializer:
        if init.name == "proj":
            arr = onnx.numpy_helper.to_array(init).copy()
            arr[:] = np.nan
            init.CopyFrom(onnx.numpy_helper.from_array(arr, "proj"))
    onnx.save(model, str(tmp / "n.onnx"))
    return tmp / "n.onnx"


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "not found"),
        ("bad hash", "SHA-256 mismatch"),
        ("corrupt", "cannot load"),
        ("dimension", "embedding_dim is 32 but the model outputs 24"),
        ("nan output", "validation inference"),
        ("space change", "would change the embedding space"),
    ],
)
def test_hs12_failed_reload_rolls_back(
    swap_plugin: OnnxClipPlugin,
    tiny_model_dir: Path,
    tiny_model_dir_b: Path,
    tmp_path: Path,
    kind: str,
    message: str,
    refs: dict,  # type: ignore[type-arg]
) -> None:
    old_id = swap_plugin.get_statistics()["model_id"]
    bad = {
        "missing": lambda: config(tmp_path / "nothing", allow_embedding_space_change=True),
        "bad hash": lambda: config(
            tiny_model_dir_b, expected_sha256="0" * 64, allow_embedding_space_change=True
        ),
        "corrupt": lambda: config(
            corrupt(tmp_path, tiny_model_dir), allow_embedding_space_change=True
        ),
        "dimension": lambda: config(
            wrong_dim(tmp_path), embedding_dim=32, allow_embedding_space_change=True
        ),
        "nan output": lambda: config(nan_model(tmp_path), allow_embedding_space_change=True),
        # Strict mode (the default before the seed's contract was restored) refuses it.
        "space change": lambda: config(tiny_model_dir_b, allow_embedding_space_change=False),
    }[kind]()
    assert swap_plugin.reload_model(bad) is False
    assert message in (swap_plugin.last_error or "")
    stats = swap_plugin.get_statistics()
    assert stats["model_id"] == old_id and stats["state"] == "READY" and stats["generation"] == 1
    assert stats["reload_failures"] == 1 and message in (stats["last_reload_error"] or "")
    r = swap_plugin.generate_embedding(IMAGES[0])
    assert r.ok and np.array_equal(r.embedding, refs[old_id][0][0])  # old model still serving
    assert swap_plugin.reload_model(
        replace(config(tiny_model_dir), max_batch_size=8)
    )  # same space: allowed
    assert swap_plugin.get_statistics()["last_reload_error"] is None


def test_injected_hash_function_is_used_for_reload(
    tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    hashed: list[str] = []

    def hash_fn(path: Path) -> str:
        hashed.append(path.name)
        import hashlib

        return hashlib.sha256(path.read_bytes()).hexdigest()

    p = OnnxClipPlugin(hash_fn=hash_fn)
    assert p.initialize(config(tiny_model_dir))
    manifest_digest = hash_fn(tiny_model_dir_b / "manifest.json")
    hashed.clear()
    assert p.reload_model(
        config(tiny_model_dir_b, expected_sha256=manifest_digest, allow_embedding_space_change=True)
    )
    assert hashed[0] == "manifest.json" and {
        "visual.onnx",
        "textual.onnx",
        "tokenizer.json",
    } <= set(hashed)
    p.shutdown()


@pytest.mark.parametrize("mmap", [False, True])
def test_model_files_changed_or_deleted_while_loaded(
    tiny_model_dir: Path, tmp_path: Path, mmap: bool
) -> None:
    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    plugin = OnnxClipPlugin()
    cfg = config(model, enable_mmap_loading=mmap)
    assert plugin.initialize(cfg)
    before = plugin.generate_embedding(IMAGES[0]).embedding
    digest = hashlib.sha256((model / "manifest.json").read_bytes()).hexdigest()
    # Overwritten on disk: the running model is unaffected; a verified reload reports it.
    (model / "visual.onnx").write_bytes(b"\x08\x01 replaced with garbage")
    assert np.array_equal(plugin.generate_embedding(IMAGES[0]).embedding, before)
    assert not plugin.reload_model(config(model, expected_sha256=digest, enable_mmap_loading=mmap))
    assert "SHA-256 mismatch for" in (plugin.last_error or "") and "visual.onnx" in (
        plugin.last_error or ""
    )
    # Deleted: still unaffected; a reload says the file is missing.
    shutil.rmtree(model)
    assert np.array_equal(plugin.generate_embedding(IMAGES[0]).embedding, before)
    assert plugin.generate_text_embedding("a red circle").ok
    assert not plugin.reload_model(cfg)
    assert "not found" in (plugin.last_error or "")
    plugin.shutdown()


def test_reload_to_another_model_follows_the_seed_and_reports_the_change(
    swap_plugin: OnnxClipPlugin, tiny_model_dir_b: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The seed's own example reloads to another model and expects true: no opt-in needed.
    before = swap_plugin.model_identity
    assert before is not None
    with caplog.at_level("WARNING", logger="themis_clip.plugin"):
        assert swap_plugin.reload_model(config(tiny_model_dir_b)) is True
    report = swap_plugin.last_reload
    assert report is not None and report.ok and report.space_changed
    assert report.previous == before and report.current == swap_plugin.model_identity
    assert report.current.model_id.startswith("tiny-b@")
    stats = swap_plugin.get_statistics()["last_reload"]
    assert stats["space_changed"] is True
    assert stats["previous"]["model_id"] == before.model_id
    assert stats["current"]["embedding_dim"] == report.current.embedding_dim
    assert any("changed the embedding space" in r.getMessage() for r in caplog.records)
    # Same space again: reported as unchanged.
    assert swap_plugin.reload_model(config(tiny_model_dir_b, max_batch_size=4))
    assert swap_plugin.last_reload is not None and not swap_plugin.last_reload.space_changed


def _tail(plugin: OnnxClipPlugin, n: int) -> list[str]:
    return list(plugin.get_statistics()["state_history"])[-n:]


def test_reload_states_are_real(
    swap_plugin: OnnxClipPlugin, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    assert swap_plugin.reload_model(config(tmp_path / "nothing")) is False
    assert _tail(swap_plugin, 3) == ["LOADING", "ERROR", "READY"]
    assert swap_plugin.reload_model(config(nan_model(tmp_path))) is False
    assert _tail(swap_plugin, 4) == ["LOADING", "VALIDATING", "ERROR", "READY"]
    assert swap_plugin.reload_model(config(tiny_model_dir_b)) is True
    assert _tail(swap_plugin, 4) == ["LOADING", "VALIDATING", "ACTIVATING", "READY"]
    assert swap_plugin.get_statistics()["state"] == "READY"


def test_reload_state_is_observable_while_it_runs(
    tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    held = HeldHash()  # holds the reload's hashing step until the test has looked
    p = OnnxClipPlugin(hash_fn=held)
    assert p.initialize(config(tiny_model_dir))
    held.armed.set()
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(p.reload_model, config(tiny_model_dir_b))
        assert held.entered.wait(20)
        assert p.get_statistics()["state"] == "LOADING"
        assert p.generate_embedding(IMAGES[0]).ok  # the old model serves meanwhile
        held.release.set()
        assert done.result(20) is True
    assert p.get_statistics()["state"] == "READY"
    p.shutdown()


def test_reload_applies_a_changed_preprocess_worker_count(
    tiny_model_dir: Path,
    refs: dict,  # type: ignore[type-arg]
) -> None:
    p = OnnxClipPlugin()
    assert p.initialize(config(tiny_model_dir, preprocess_workers=1))
    assert p.get_statistics()["preprocess_workers"] == 1
    assert p.reload_model(config(tiny_model_dir, preprocess_workers=3))
    assert p.get_statistics()["preprocess_workers"] == 3
    model_id = p.get_statistics()["model_id"]
    results = p.generate_embedding_batch(IMAGES)
    for i, r in enumerate(results):  # the new pool decodes, and decodes the same
        assert r.ok and np.array_equal(r.embedding, refs[model_id][0][i])
    p.shutdown()
