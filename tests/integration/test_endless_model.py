"""A model that never finishes, through the real server and the library.

Before every session run carried its own ``RunOptions``, an image tower ending in an enormous
``Loop`` answered 504 but kept a core busy for ever: the run never returned, a reload waited on
it, SIGTERM never ended the process and a reload to such a model never failed.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.helpers import ServerProcess, endless_model, err, make_plugin
from themis_clip import ModelConfig, PluginConfig
from themis_clip.config import SessionConfig

pytestmark = pytest.mark.slow

TOKEN = "endless-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def until(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``condition`` held (polled; fails after ``timeout_s``)."""
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)
    return time.monotonic() - t0


def in_flight(base: str) -> int:
    return int(httpx.get(f"{base}/stats", timeout=5).json()["in_flight"])


@pytest.fixture
def root(tmp_path: Path, tiny_model_dir: Path) -> Path:
    import shutil

    root = tmp_path / "models"
    shutil.copytree(tiny_model_dir, root / "good")
    endless_model(tiny_model_dir, root / "endless")
    return root


def serve(root: Path, model: str) -> ServerProcess:
    args = ["--model", str(root / model), "--model-root", str(root), "--no-warmup"]
    return ServerProcess([*args, "--request-timeout-s", "2"], env={"THEMIS_ADMIN_TOKEN": TOKEN})


def test_an_endless_model_is_stopped_and_replaced(root: Path) -> None:
    with serve(root, "endless") as server:
        base = server.base
        t0 = time.monotonic()
        err(httpx.post(f"{base}/embed/image", content=png(), timeout=30), 504, "Timeout")
        assert time.monotonic() - t0 < 10
        # The run itself returns (its core is free again), not only the request.
        until(lambda: in_flight(base) == 0, 10, "the endless run returned")
        r = httpx.post(f"{base}/admin/reload", json={"path": "good"}, headers=ADMIN, timeout=30)
        assert r.status_code == 200, r.text
        assert httpx.post(f"{base}/embed/image", content=png(), timeout=30).status_code == 200
        # Back to the endless model: its validation run is stopped, and the good one stays.
        r = httpx.post(f"{base}/admin/reload", json={"path": "endless"}, headers=ADMIN, timeout=30)
        assert r.status_code in (422, 504), r.text
        until(lambda: in_flight(base) == 0, 10, "the validation run returned")
        assert httpx.post(f"{base}/embed/image", content=png(), timeout=30).status_code == 200


def test_sigterm_stops_a_server_running_an_endless_model(root: Path) -> None:
    with serve(root, "endless") as server:
        base = server.base
        answers: list[int] = []

        def embed() -> None:
            answers.append(httpx.post(f"{base}/embed/image", content=png(), timeout=30).status_code)

        client = threading.Thread(target=embed)
        client.start()
        until(lambda: in_flight(base) == 1, 10, "the endless run started")
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=15)
        client.join(30)
        assert answers == [504]


def test_the_library_stops_runs_at_run_timeout_s(root: Path) -> None:
    # Initialisation validates nothing by running; the first embedding and a warm-up do run.
    config = PluginConfig(
        model=ModelConfig(path=str(root / "endless")), session=SessionConfig(run_timeout_s=0.5)
    )
    plugin = make_plugin(root / "endless", session=config.session)
    try:
        t0 = time.monotonic()
        result = plugin.generate_embedding(png())
        assert not result.ok and "run_timeout_s" in (result.error or "")
        assert time.monotonic() - t0 < 10
        assert plugin.get_statistics()["in_flight"] == 0
        assert not plugin.reload_model(config)  # validation is stopped too
        assert "run_timeout_s" in (plugin.last_error or "")
    finally:
        plugin.shutdown()


def test_sigterm_at_default_settings_ends_within_15_s(root: Path) -> None:
    """With the default 30 s request timeout, SIGTERM waited for the endless run's 504: the
    drain now gives requests in flight 10 s, then stops their runs."""
    args = ["--model", str(root / "endless"), "--model-root", str(root), "--no-warmup"]
    with ServerProcess(args, env={"THEMIS_ADMIN_TOKEN": TOKEN}) as server:
        base = server.base
        answers: list[int] = []

        def embed() -> None:
            answers.append(httpx.post(f"{base}/embed/image", content=png(), timeout=60).status_code)

        client = threading.Thread(target=embed)
        client.start()
        until(lambda: in_flight(base) == 1, 10, "the endless run started")
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=15) == 0
        assert time.monotonic() - t0 < 15
        client.join(30)
        assert answers and answers[0] >= 500
