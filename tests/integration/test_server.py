"""The HTTP service: in-process through TestClient, and as a real `themis-clip serve` subprocess (hypercorn)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from tests.helpers import (
    HOSTILE_TEXT,
    PATHOLOGICAL_SPLIT,
    ServerProcess,
    hostile_tokenizer_model,
    photo_like,
)
from themis_clip import OnnxClipPlugin, PluginConfig
from themis_clip.index.stores.sqlite import SQLiteStore
from themis_clip.runtime import ORTSession, create_session
from themis_clip.server import ServerSettings, create_app, schemas
from themis_clip.server.routes import dialects

TOKEN = "s3cret-token"


def png(seed: int = 0, w: int = 64, h: int = 48) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(photo_like(w, h, seed)).save(buf, "PNG")
    return buf.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture
def model_root(tmp_path: Path, tiny_model_dir: Path, tiny_model_dir_b: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(tiny_model_dir, root / "a")
    shutil.copytree(tiny_model_dir_b, root / "b")
    return root


def settings(model_root: Path, tmp_path: Path, **kw: Any) -> ServerSettings:
    config = PluginConfig.from_dict(
        {"model": {"path": str(model_root / "a")}, "max_batch_size": kw.pop("batch", 8)}
    )
    defaults: dict[str, Any] = {
        "index_path": str(tmp_path / "idx.db"),
        "model_root": str(model_root),
        "admin_token": TOKEN,
        "max_body_bytes": 2_000_000,
    }
    return ServerSettings(plugin_config=config, **{**defaults, **kw})


@pytest.fixture
def client(model_root: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    with TestClient(create_app(settings(model_root, tmp_path))) as c:
        yield c


def error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()["error"]
    assert body["type"] == kind, body
    return str(body["message"])


def test_health_ready_stats_metrics_docs_page(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["model_id"].startswith("tiny-a@")
    client.post("/embed/text", json={"text": "x"})
    stats = client.get("/stats").json()
    assert (
        stats["texts"] == 1
        and stats["server"]["ready"] is True
        and stats["server"]["index_items"] == 0
    )
    metrics = client.get("/metrics").text
    assert 'themis_requests_total{route="/embed/text",status="200"} 1.0' in metrics
    assert "themis_batch_size_bucket" in metrics and "themis_queue_depth" in metrics
    assert "themis_event_loop_lag_seconds_bucket" in metrics
    assert client.get("/openapi.json").json()["info"]["title"] == "themis-clip"
    assert client.get("/docs").status_code == 200
    assert '<form id="form">' in client.get("/").text


def test_docs_group_the_routes_in_markdown_and_redoc_leads_there(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    operations = [op for path in schema["paths"].values() for op in path.values()]
    assert all(op.get("tags") for op in operations)  # none under "default"
    assert [t["name"] for t in schema["tags"]] == sorted(
        {tag for op in operations for tag in op["tags"]},
        key=[t["name"] for t in schema["tags"]].index,
    )
    text = json.dumps(schema)
    assert "``" not in text and ":mod:" not in text and ":func:" not in text
    assert "HTTPValidationError" not in text  # FastAPI's body, which this service never sends
    search = schema["paths"]["/search"]["post"]
    assert "`next`" in search["description"]
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            (media, body), *_ = op["responses"]["200"]["content"].items()
            typed = body.get("schema", {}).get("$ref") or body.get("schema", {}).get("type")
            assert typed or media == "image/jpeg", (method, path)
    r = client.get("/redoc", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/docs"


def test_json_answers_are_what_the_docs_show(client: TestClient) -> None:
    """Each JSON route's real answer validates against the model ``/docs`` shows for it,
    which refuses keys it does not document."""
    models = {}
    for path, methods in client.get("/openapi.json").json()["paths"].items():
        for method, op in methods.items():
            json_body = op["responses"]["200"]["content"].get("application/json")
            if json_body is not None:
                name = json_body["schema"].get("$ref", "").rsplit("/", 1)[-1]
                if name:
                    models[method.upper(), path] = getattr(schemas, name, None) or getattr(
                        dialects, name
                    )
    checked = set()

    def check(method: str, path: str, url: str | None = None, **kw: Any) -> Any:
        r = client.request(method, url or path, **kw)
        assert r.status_code == 200, (path, r.text)
        models[method, path].model_validate(r.json())
        checked.add((method, path))
        return r.json()

    admin = {"Authorization": f"Bearer {TOKEN}"}
    check("GET", "/healthz")
    check("GET", "/readyz")
    model = check("GET", "/v1/models")["data"][0]["id"]
    check("GET", "/v1/models/{model}", f"/v1/models/{model}")
    image = data_url(png(1))
    check("POST", "/v1/embeddings", json={"input": ["a dog", image], "language": "eng_Latn"})
    check("POST", "/v1/embeddings", json={"input": "a dog", "encoding_format": "base64"})
    check("POST", "/embed/image", content=png(1), headers={"content-type": "image/png"})
    check("POST", "/embed/text", json={"texts": ["a", "b"], "language": "eng_Latn"})
    check("POST", "/v1/classify", json={"image": image, "labels": ["dog", "cat"]})
    check("POST", "/rank", json={"text": "a dog", "images": [image, data_url(png(2))]})
    items = [
        {"id": f"p{i}", "image": data_url(png(i)), "metadata": {"taken": f"2020-0{i + 1}-01"}}
        for i in range(3)
    ]
    check("POST", "/index/items", json={"items": items})
    check("POST", "/search", json={"text": "a dog"})
    check("POST", "/search", json={"item": "p0", "k": 2, "cut": "none"})
    check("POST", "/search", json={"mode": "browse", "sort": "taken"})
    check("GET", "/index/info")
    check("GET", "/index/filters")
    check("GET", "/index/photo-facets")
    check("GET", "/duplicates", "/duplicates?threshold=0.5")
    check("GET", "/items/{key}", "/items/p1")
    check("GET", "/stats")
    check("GET", "/admin/stats", headers=admin)
    check("POST", "/admin/reload", json={"path": "a"}, headers=admin)
    model = check("GET", "/v1/models")["data"][0]["id"]  # the reload's
    check("POST", "/api/embed", json={"model": model, "input": ["a dog", image]})
    cohere = {"model": model, "texts": ["a dog"], "embedding_types": ["float", "int8"]}
    check("POST", "/v2/embed", json=cohere)
    check("GET", "/admin/migrate", headers=admin)
    # A run that is still embedding when pause and resume come: more items than one chunk
    # (4 x max_batch_size 8; a server redoes up to a chunk's worth at the cut-over instead, so
    # 3 items were ready at once and the pause raced the run), and at a thousandth of a core
    # the run rests ~1000x each chunk's time after it.
    more = [{"id": f"q{i}", "image": data_url(png(10 + i))} for i in range(4 * 8)]
    assert client.post("/index/items", json={"items": more}).status_code == 200
    slow = {"path": "b", "cut_over": "command", "cores": 0.001}
    started = client.post("/admin/migrate", json=slow, headers=admin)
    assert started.status_code == 202, started.text
    models["POST", "/admin/migrate"].model_validate(started.json())
    checked.add(("POST", "/admin/migrate"))
    check("POST", "/admin/migrate/pause", headers=admin)
    check("POST", "/admin/migrate/resume", headers=admin)
    assert check("POST", "/admin/migrate/cancel", headers=admin)["state"] == "cancelled"
    again = client.post("/admin/migrate", json={"path": "b", "cut_over": "command"}, headers=admin)
    assert again.status_code == 202, again.text
    deadline = time.monotonic() + 60
    while client.get("/admin/migrate", headers=admin).json()["state"] != "ready":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    check("POST", "/admin/migrate/cut-over", headers=admin)
    check("POST", "/admin/migrate/rollback", headers=admin)
    # immich's door answers for immich's model names only: test_immich.py checks its answers
    assert checked == set(models) - {("POST", "/predict")}
    for r in (
        client.get("/items/nope"),
        client.get("/duplicates?threshold=5"),
        client.post("/search", content=b"{", headers={"content-type": "application/json"}),
        client.post("/v1/embeddings", json={"input": "x", "model": "other"}),
    ):
        assert r.status_code in (400, 404, 422), r.text
        schemas.ErrorAnswer.model_validate(r.json())


def test_embeddings_match_the_plugin(client: TestClient, model_root: Path) -> None:
    direct = OnnxClipPlugin()
    assert direct.initialize(PluginConfig.from_dict({"model": {"path": str(model_root / "a")}}))
    text = client.post("/v1/embeddings", json={"input": ["a red circle", "a dog"]}).json()
    assert text["object"] == "list" and [d["index"] for d in text["data"]] == [0, 1]
    assert np.allclose(
        text["data"][0]["embedding"],
        direct.generate_text_embedding("a red circle").embedding,
        atol=1e-6,
    )
    b64 = client.post("/v1/embeddings", json={"input": "a dog", "encoding_format": "base64"}).json()
    assert np.allclose(
        np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), "<f4"),
        text["data"][1]["embedding"],
    )
    image = client.post(
        "/v1/embeddings", json={"input": [data_url(png(1))], "modality": "image"}
    ).json()
    expected = direct.generate_embedding(png(1)).embedding
    assert np.allclose(image["data"][0]["embedding"], expected, atol=1e-6)
    raw = client.post("/embed/image", content=png(1), headers={"content-type": "image/png"}).json()
    multi = client.post("/embed/image", files={"file": ("x.png", png(1), "image/png")}).json()
    assert (
        np.allclose(raw["embedding"], expected, atol=1e-6)
        and raw["embedding"] == multi["embedding"]
    )
    many = client.post("/embed/text", json={"texts": ["a", "b " * 200]}).json()
    assert many["truncated"] == [False, True] and len(many["embeddings"]) == 2
    direct.shutdown()


def test_index_search_and_thumbnails(client: TestClient) -> None:
    items = [
        {"id": f"img-{i}", "image": data_url(png(i)), "metadata": {"group": i % 2}}
        for i in range(6)
    ]
    added = client.post("/index/items", json={"items": items})
    assert added.status_code == 200 and added.json()["added"] == 6
    by_image = client.post("/search", json={"image": data_url(png(3)), "k": 3}).json()
    assert by_image["results"][0]["id"] == "img-3" and by_image["results"][0][
        "score"
    ] == pytest.approx(1, abs=1e-4)
    assert by_image["mode"] == "exact"
    vector = client.post("/embed/image", content=png(4)).json()["embedding"]
    by_vector = client.post("/search", json={"vector": vector, "k": 1}).json()
    assert by_vector["results"][0]["id"] == "img-4"
    filtered = client.post(
        "/search", json={"vector": vector, "k": 6, "filters": {"group": 1}}
    ).json()
    assert {r["id"] for r in filtered["results"]} == {"img-1", "img-3", "img-5"}
    by_text = client.post("/search", json={"text": "a red circle", "k": 2, "cut": "none"}).json()
    assert len(by_text["results"]) == 2
    cut = client.post("/search", json={"text": "a red circle", "k": 2}).json()
    assert cut["cut"]["reason"] and len(cut["results"]) + cut["cut"]["weaker"] == 2
    thumb = client.get(by_image["results"][0]["thumbnail"])
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(thumb.content)).size[0] <= 192
    error(client.get("/items/nope/thumbnail"), 404, "NotFound")


def test_error_paths(client: TestClient, model_root: Path, tmp_path: Path) -> None:
    error(
        client.post(
            "/v1/embeddings", content=b"{bad", headers={"content-type": "application/json"}
        ),
        400,
        "BadJSON",
    )
    error(
        client.post(
            "/v1/embeddings", json={"input": "data:image/png;base64,@@@", "modality": "image"}
        ),
        400,
        "BadBase64",
    )
    error(
        client.post("/v1/embeddings", json={"input": "data:image/png,raw", "modality": "image"}),
        400,
        "BadDataURL",
    )
    msg = error(
        client.post(
            "/v1/embeddings",
            json={"input": base64.b64encode(b"text").decode(), "modality": "image"},
        ),
        422,
        "ImageDecodeError",
    )
    assert "input[0]" in msg and "not a recognised image format" in msg
    error(
        client.post(
            "/v1/embeddings", json={"input": "https://example.com/x.png", "modality": "image"}
        ),
        400,
        "URLNotAllowed",
    )
    error(client.post("/v1/embeddings", json={"input": []}), 422, "ValidationError")
    error(client.post("/v1/embeddings", json={"nothing": 1}), 422, "ValidationError")
    error(client.post("/embed/image", content=b""), 422, "ImageDecodeError")
    error(client.post("/embed/image", content=b"x" * 3_000_000), 413, "PayloadTooLarge")

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(30):
            yield b"x" * 100_000

    error(
        client.post("/embed/image", content=chunks()), 413, "PayloadTooLarge"
    )  # no Content-Length
    error(client.post("/embed/text", json={"text": "a", "texts": ["b"]}), 422, "ValidationError")
    error(client.post("/embed/text", json={"text": "a", "extra": 1}), 422, "ValidationError")
    error(client.post("/embed/text", json={"texts": []}), 422, "ValidationError")
    error(client.post("/search", json={"text": "a", "vector": [1.0]}), 422, "ValidationError")
    error(client.post("/search", json={"text": "a", "k": 0}), 422, "ValidationError")
    error(client.post("/search", json={"vector": [0.0] * 32}), 422, "ValidationError")
    error(client.get("/no/such/route"), 404, "NotFound")
    error(client.delete("/healthz"), 405, "MethodNotAllowed")
    # JSON sent as a form (curl -d without -H) is told why it was not read.
    for media in ("application/x-www-form-urlencoded", "text/plain"):
        r = client.post("/embed/text", content=b'{"text": "a"}', headers={"Content-Type": media})
        assert r.status_code == 422
        assert f"Content-Type is '{media}'" in r.json()["error"]["message"], r.text


def test_admin_reload_security(client: TestClient, model_root: Path, tmp_path: Path) -> None:
    error(client.post("/admin/reload", json={"path": "b"}), 401, "Unauthorized")
    error(
        client.post("/admin/reload", json={"path": "b"}, headers={"Authorization": "Bearer nope"}),
        403,
        "Forbidden",
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", model_root / "link")
    for bad in ("../outside", str(tmp_path / "outside"), "link", "/etc"):
        assert "outside the model root" in error(
            client.post("/admin/reload", json={"path": bad}, headers=auth), 403, "Forbidden"
        )
    # An empty index binds nothing yet; once it holds model a's vectors, swapping to model b
    # would make them incomparable: 409 naming both models, the old model keeps serving.
    client.post("/index/items", json={"items": [{"id": "x", "image": data_url(png(1))}]})
    msg = error(
        client.post("/admin/reload", json={"path": "b"}, headers=auth),
        409,
        "IndexModelMismatchError",
    )
    assert "tiny-a@" in msg and "tiny-b@" in msg and "Re-index" in msg
    assert client.get("/readyz").json()["model_id"].startswith("tiny-a@")
    ok = client.post(
        "/admin/reload", json={"path": "b", "allow_embedding_space_change": True}, headers=auth
    )
    assert ok.status_code == 200 and ok.json()["model_id"].startswith("tiny-b@")
    assert ok.json()["space_changed"] is True
    # The index was built by model a: searching it with model b is refused with a clear message.
    assert "Re-index" in error(
        client.post("/search", json={"text": "a"}), 409, "IndexModelMismatchError"
    )


def test_admin_disabled_without_token_and_search_without_index(
    model_root: Path, tmp_path: Path
) -> None:
    with TestClient(
        create_app(settings(model_root, tmp_path, admin_token=None, index_path=None))
    ) as c:
        assert "disabled" in error(
            c.post("/admin/reload", json={"path": "b"}, headers={"Authorization": "Bearer x"}),
            403,
            "Forbidden",
        )
        error(c.post("/search", json={"text": "a"}), 404, "NoIndex")


class Hold:
    """Every image-tower run waits while the hold is on (a real session underneath)."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.released.set()

    def factory(self, path: Path, plan: Any, settings: Any, **kw: Any) -> ORTSession:
        session = create_session(path, plan, settings, **kw)
        real = session.run

        def run(names: Any, feeds: Any) -> Any:
            if "visual" in path.name:
                assert self.released.wait(20)
            return real(names, feeds)

        session.run = run  # type: ignore[method-assign]
        return session


def test_queue_full_is_429_and_slow_requests_504(model_root: Path, tmp_path: Path) -> None:
    # One event loop drives everything (httpx over ASGI, the app's own lifespan): deterministic.
    async def scenario() -> None:
        hold = Hold()
        app = create_app(
            settings(
                model_root, tmp_path, batch=1, max_queue=1, request_timeout_s=20, warmup=False
            ),
            plugin=OnnxClipPlugin(session_factory=hold.factory),
        )
        async with app.router.lifespan_context(app):
            state = app.state.themis
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://t"
            ) as c:
                hold.released.clear()
                batcher = state.image_batcher

                async def until(condition: Callable[[], bool]) -> None:
                    for _ in range(2000):
                        if condition():
                            return
                        await asyncio.sleep(0.01)
                    raise AssertionError("state never reached")

                running = [asyncio.create_task(c.post("/embed/image", content=png(0)))]
                await until(lambda: len(batcher._running) == 1)  # batch 1 runs (held)
                running.append(asyncio.create_task(c.post("/embed/image", content=png(1))))
                await until(lambda: len(batcher._running) == 2)  # batch 2: both slots busy
                running.append(asyncio.create_task(c.post("/embed/image", content=png(2))))
                await until(lambda: batcher.depth == 1)  # the third waits: the queue is full
                full = await c.post("/embed/image", content=png(9))
                assert "queue full" in error(full, 429, "QueueFullError")
                assert int(full.headers["Retry-After"]) >= 1
                hold.released.set()
                assert [r.status_code for r in await asyncio.gather(*running)] == [200, 200, 200]

    async def timeout_scenario() -> None:
        hold = Hold()
        app = create_app(
            settings(model_root, tmp_path, request_timeout_s=0.3, warmup=False),
            plugin=OnnxClipPlugin(session_factory=hold.factory),
        )
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
        ):
            hold.released.clear()
            error(await c.post("/embed/image", content=png(1)), 504, "Timeout")
            hold.released.set()
            assert (
                await c.post("/embed/image", content=png(1))
            ).status_code == 200  # nothing poisoned

    asyncio.run(scenario())
    asyncio.run(timeout_scenario())


def test_a_tokenizer_panic_fails_only_its_own_text(model_root: Path, tmp_path: Path) -> None:
    # It was a plain-text 500 that also failed the other clients' texts batched with it.
    hostile_tokenizer_model(model_root / "a", model_root / "h")

    async def scenario() -> None:
        config = PluginConfig.from_dict({"model": {"path": str(model_root / "h")}})
        app = create_app(
            ServerSettings(plugin_config=config, index_path=str(tmp_path / "i.db"), warmup=False)
        )
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
        ):
            posts = [
                c.post("/embed/text", json={"texts": [text]})
                for text in ("a red circle", HOSTILE_TEXT, "blue", "green")
            ]
            good, bad, *others = await asyncio.gather(*posts)
            assert good.status_code == 200 and all(r.status_code == 200 for r in others)
            assert "tokenizer failed" in error(bad, 422, "TextInputError")

    asyncio.run(scenario())


def test_a_tokenizer_failing_on_plain_text_is_refused_at_reload(
    client: TestClient, model_root: Path
) -> None:
    # Its regex used to fail /v1/embeddings request by request; now the model never loads.
    hostile_tokenizer_model(model_root / "a", model_root / "h", pattern=PATHOLOGICAL_SPLIT)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = client.post("/admin/reload", json={"path": "h"}, headers=auth)
    assert 400 <= r.status_code < 500, r.text
    assert "backtracks without bound" in r.json()["error"]["message"]
    assert client.get("/readyz").json()["model_id"].startswith("tiny-a@")
    r = client.post("/v1/embeddings", json={"input": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"})
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_real_server_process_and_graceful_shutdown(model_root: Path, tmp_path: Path) -> None:
    server = ServerProcess(
        [
            "--model",
            str(model_root / "a"),
            "--index",
            str(tmp_path / "idx.db"),
            "--model-root",
            str(model_root),
        ],
        env={"THEMIS_ADMIN_TOKEN": TOKEN},
    )
    proc, base = server.proc, server.base
    try:
        assert httpx.post(f"{base}/embed/text", json={"text": "a red circle"}).status_code == 200
        add = httpx.post(
            f"{base}/index/items", json={"items": [{"id": "p", "image": data_url(png(5))}]}
        )
        assert add.status_code == 200
        assert (
            httpx.post(f"{base}/search", json={"image": data_url(png(5)), "k": 1}).json()[
                "results"
            ][0]["id"]
            == "p"
        )
        assert httpx.get(f"{base}/nowhere").json()["error"]["type"] == "NotFound"
        reload = httpx.post(
            f"{base}/admin/reload", json={"path": "a"}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert reload.status_code == 200 and reload.json()["generation"] == 2
        # Graceful shutdown under load: requests in flight finish; the process exits cleanly.
        big = png(7, 1600, 1200)
        with ThreadPoolExecutor(16) as pool:
            futures = [
                pool.submit(httpx.post, f"{base}/embed/image", content=big, timeout=60)
                for _ in range(16)
            ]
            deadline = time.monotonic() + 30  # SIGTERM only once requests are in flight
            while httpx.get(f"{base}/stats").json()["in_flight"] == 0:
                assert time.monotonic() < deadline, "no request ever reached the model"
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            statuses = []
            for f in futures:
                try:
                    statuses.append(f.result().status_code)
                except httpx.TransportError:
                    statuses.append("refused")  # sent after the listener closed: never half-served
        assert proc.wait(60) == 0
        assert 200 in statuses and all(s in (200, "refused") for s in statuses), statuses
    finally:
        if proc.poll() is None:
            proc.kill()
    with SQLiteStore(tmp_path / "idx.db", readonly=True) as store:
        assert store.integrity_ok() and store.count() == 1


@pytest.mark.slow
def test_slow_and_vanishing_clients_do_not_hurt_others(model_root: Path, tmp_path: Path) -> None:
    server = ServerProcess(["--model", str(model_root / "a"), "--no-warmup"])
    proc, base = server.proc, server.base
    port = int(base.rsplit(":", 1)[1])
    try:
        body = png(3)
        head = (
            f"POST /embed/image HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
        for s in slow:  # slowloris: headers and a trickle of body, then nothing
            s.sendall(head + body[:10])
        for _ in range(4):  # clients that vanish mid-body and right after sending everything
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(head + body[: len(body) // 2])
            s.close()
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(head + body)
            s.close()
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            results = list(
                pool.map(
                    lambda i: httpx.post(f"{base}/embed/image", content=png(i), timeout=30),
                    range(16),
                )
            )
        assert all(r.status_code == 200 for r in results)
        assert time.monotonic() - t0 < 20  # served while the slow clients hang on
        for s in slow:  # the slow clients finally finish: still answered correctly
            s.sendall(body[10:])
        for s in slow:
            s.settimeout(30)
            assert s.recv(64).startswith(b"HTTP/1.1 200")
            s.close()
        assert proc.poll() is None and httpx.get(f"{base}/healthz").status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


@pytest.mark.parametrize(
    "body",
    [
        b"garbage{",
        b'{"model": {"path": "x"}}',
        b"{}",
        b'{"path": 5}',
        b'{"path": "a", "unknown": 1}',
        b"",
    ],
)
def test_admin_authenticates_before_reading_the_body(client: TestClient, body: bytes) -> None:
    headers = {"content-type": "application/json"}
    for auth, status in ((None, 401), ("Bearer nope", 403), ("Basic abc", 401)):
        h = {**headers, **({"Authorization": auth} if auth else {})}
        r = client.post("/admin/reload", content=body, headers=h)
        assert r.status_code == status, (auth, body, r.text)
        assert r.json()["error"]["type"] in ("Unauthorized", "Forbidden")
        assert "path" not in r.text and "field" not in r.text.lower()  # nothing about the schema
    # With the token, the same bodies are validated (and named) as before.
    ok = client.post(
        "/admin/reload", content=body, headers={**headers, "Authorization": f"Bearer {TOKEN}"}
    )
    assert ok.status_code in (400, 422), ok.text


def test_one_status_table_for_raised_and_reported_errors() -> None:
    from themis_clip.errors import ConfigError, InferenceError, TextInputError
    from themis_clip.server.errors import status_for, status_for_name

    for exc in (ConfigError("x"), TextInputError("x"), InferenceError("x")):
        assert status_for(exc) == status_for_name(type(exc).__name__)
    assert status_for(ConfigError("x")) == 422


def test_an_item_added_over_http_keeps_a_preview_a_migration_re_embeds_at_full_size(
    client: TestClient, tmp_path: Path, model_root: Path
) -> None:
    big = io.BytesIO()
    Image.fromarray(photo_like(1200, 900, 5)).save(big, "PNG")
    item = {"id": "upload", "image": data_url(big.getvalue())}
    assert client.post("/index/items", json={"items": [item]}).status_code == 200
    with SQLiteStore(tmp_path / "idx.db", readonly=True) as store:
        kept = store.thumbnail("upload")
    assert kept is not None and Image.open(io.BytesIO(kept)).size == (448, 336)
    thumb = client.get("/items/upload/thumbnail")
    assert max(Image.open(io.BytesIO(thumb.content)).size) == 192  # what the grid loads
    preview = client.get("/items/upload/preview?size=1024")
    assert preview.content == kept  # nothing larger exists: the kept preview as it is

    admin = {"Authorization": f"Bearer {TOKEN}"}
    r = client.post("/admin/migrate", json={"path": "b"}, headers=admin)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while (status := client.get("/admin/migrate", headers=admin).json())["state"] != "done":
        assert status["state"] not in ("failed", "blocked") and time.monotonic() < deadline
        time.sleep(0.02)
    assert status["from_previews"] == 1 and status["missing"] == []
    plugin = OnnxClipPlugin()
    assert plugin.initialize(PluginConfig.from_dict({"model": {"path": str(model_root / "b")}}))
    try:
        (want,) = plugin.generate_embedding_batch([kept])
    finally:
        plugin.shutdown()
    with SQLiteStore(tmp_path / "idx.db", readonly=True) as store:
        got = store.vectors_by_id([1], 32)[0]
    assert want.embedding is not None
    assert np.allclose(got, want.embedding, atol=1e-5)  # embedded from the kept preview


def test_migrating_an_empty_postgresql_index_is_refused_with_a_clear_error(
    model_root: Path, tmp_path: Path, pg_url: str
) -> None:
    app = create_app(settings(model_root, tmp_path, index_path=pg_url))
    with TestClient(app) as client:
        admin = {"Authorization": f"Bearer {TOKEN}"}
        r = client.post("/admin/migrate", json={"path": "b"}, headers=admin)
        assert "holds no items yet" in error(r, 422, "ValidationError")
        assert client.get("/admin/migrate", headers=admin).json() == {"state": "idle"}


def test_a_mixed_request_straddling_a_swap_is_embedded_again_on_the_new_model(
    model_root: Path, tmp_path: Path
) -> None:
    """Images and texts go through their own batchers: a swap to another model between the two
    must not mix models in one answer, nor fail the request (docs/operations.md)."""

    async def scenario() -> None:
        app = create_app(settings(model_root, tmp_path, warmup=False))
        async with app.router.lifespan_context(app):
            state = app.state.themis
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://t"
            ) as c:
                embed_images = state.embed_images
                swapped = []

                async def then_swap(raw: list[bytes]) -> Any:
                    out = await embed_images(raw)
                    if not swapped:  # once: the texts then meet the new model
                        reload = await c.post(
                            "/admin/reload",
                            json={"path": "b"},
                            headers={"Authorization": f"Bearer {TOKEN}"},
                        )
                        assert reload.status_code == 200, reload.text
                        swapped.append(reload.json())
                    return out

                state.embed_images = then_swap
                body = {"input": ["a dog", data_url(png(1)), "a cat"]}
                r = await c.post("/v1/embeddings", json=body)
                assert r.status_code == 200, r.text
                assert swapped, "the swap happened inside the request"
                models = (await c.get("/v1/models")).json()["data"]
                assert r.json()["model"] == models[0]["id"]  # all from the new model
                assert models[0]["id"].startswith("tiny-b@")
                again = await c.post("/v1/embeddings", json=body)  # no swap: the same vectors
                assert [d["embedding"] for d in again.json()["data"]] == [
                    d["embedding"] for d in r.json()["data"]
                ]

    asyncio.run(scenario())
