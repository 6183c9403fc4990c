"""100 hot swaps (two good models and three kinds of bad one) under 16 HTTP client threads."""

from __future__ import annotations

import io
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers import ServerProcess, photo_like
from themis_clip import OnnxClipPlugin, PluginConfig
from themis_clip.export.tiny import VisionTowerSpec, build_vision_tower

pytestmark = pytest.mark.slow
TOKEN = "swap-token"
RELOADS = 100
IMAGES = []
for _seed in range(4):
    _buf = io.BytesIO()
    Image.fromarray(photo_like(64, 48, 300 + _seed)).save(_buf, "PNG")
    IMAGES.append(_buf.getvalue())
TEXTS = ["a red circle", "a blue square", "green star"]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def references(model: Path) -> tuple[str, list[np.ndarray], list[np.ndarray]]:
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig.from_dict({"model": {"path": str(model)}}))
    out = (
        p.get_statistics()["model_id"],
        [r.embedding for r in p.generate_embedding_batch(IMAGES)],
        [r.embedding for r in p.generate_text_embedding_batch(TEXTS)],
    )
    p.shutdown()
    return out  # type: ignore[return-value]


def test_hundred_reloads_under_http_load(
    tmp_path: Path, tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    root = tmp_path / "models"
    shutil.copytree(tiny_model_dir, root / "a")
    shutil.copytree(tiny_model_dir_b, root / "b")
    shutil.copytree(tiny_model_dir, root / "corrupt")
    (root / "corrupt" / "visual.onnx").write_bytes(b"\x08\x01 not a model")
    shutil.copytree(tiny_model_dir, root / "wrong-shape")
    build_vision_tower(VisionTowerSpec(dim=24), root / "wrong-shape" / "visual.onnx")
    refs = {
        mid: (imgs, txts) for mid, imgs, txts in (references(root / "a"), references(root / "b"))
    }
    server = ServerProcess(
        ["--model", str(root / "a"), "--model-root", str(root), "--no-warmup"],
        env={"THEMIS_ADMIN_TOKEN": TOKEN},
    )
    proc, base = server.proc, server.base
    stop = threading.Event()
    failures: list[str] = []
    counts = {"requests": 0}
    lock = threading.Lock()

    def client(k: int) -> None:
        with httpx.Client(base_url=base, timeout=30) as c:
            n = 0
            while not stop.is_set():
                n += 1
                if (k + n) % 2:
                    i = (k + n) % len(IMAGES)
                    r = c.post("/embed/image", content=IMAGES[i])
                    ok = r.status_code == 200
                    if ok:
                        body = r.json()
                        want = refs.get(body["model_id"], (None, None))[0]
                        ok = want is not None and np.allclose(body["embedding"], want[i], atol=1e-6)
                else:
                    i = (k + n) % len(TEXTS)
                    r = c.post("/v1/embeddings", json={"input": TEXTS[i]})
                    ok = r.status_code == 200
                    if ok:
                        body = r.json()
                        want = refs.get(body["model"], (None, None))[1]
                        ok = want is not None and np.allclose(
                            body["data"][0]["embedding"], want[i], atol=1e-6
                        )
                with lock:
                    counts["requests"] += 1
                if not ok:
                    failures.append(f"{r.status_code} {r.text[:200]}")

    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with ThreadPoolExecutor(16) as pool:
            workers = [pool.submit(client, k) for k in range(16)]
            deadline = time.monotonic() + 60  # the baseline once every client is under way
            while counts["requests"] < 64:
                assert time.monotonic() < deadline and not failures, failures[:3]
                time.sleep(0.01)
            rss_start = rss_mib(proc.pid)
            good = bad = 0
            with httpx.Client(base_url=base, timeout=60, headers=auth) as admin:
                for i in range(RELOADS):
                    if (
                        i % 5 == 4
                    ):  # a bad model: wrong hash, corrupt file, wrong output shape in turn
                        body = [
                            {
                                "path": "a",
                                "expected_sha256": "0" * 64,
                                "allow_embedding_space_change": True,
                            },
                            {"path": "corrupt", "allow_embedding_space_change": True},
                            {"path": "wrong-shape", "allow_embedding_space_change": True},
                        ][(i // 5) % 3]
                        r = admin.post("/admin/reload", json=body)
                        assert r.status_code == 422, r.text
                        bad += 1
                    else:
                        r = admin.post(
                            "/admin/reload",
                            json={
                                "path": "b" if i % 2 else "a",
                                "allow_embedding_space_change": True,
                            },
                        )
                        assert r.status_code == 200, r.text
                        good += 1
            rss_end = rss_mib(proc.pid)
            stop.set()
            for w in workers:
                w.result()
        stats = httpx.get(f"{base}/stats").json()
    finally:
        stop.set()
        proc.terminate()
        proc.wait(60)
    print(
        f"reloads: {good} good + {bad} bad under 16 clients; requests {counts['requests']}, failed "
        f"{len(failures)}; server RSS {rss_start:.0f} -> {rss_end:.0f} MiB"
    )
    assert not failures, failures[:5]
    assert counts["requests"] > 200
    assert stats["reloads"] == RELOADS and stats["reload_failures"] == bad
    assert rss_end - rss_start < 150, "memory must stay bounded across reloads"
