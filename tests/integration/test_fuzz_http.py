"""Fuzzing the HTTP layer (hypothesis): bodies, metadata, filters and headers on every route.

Every answer must be a documented JSON error (4xx) or a success, never a 500, and the index read
path must keep working after each write: a new route or field cannot reopen what issue 15 closed
(poisoned metadata, plain-text 500s). Examples per test: ``THEMIS_HTTP_FUZZ_EXAMPLES`` (300).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.helpers import encode, photo_like
from themis_clip import PluginConfig
from themis_clip.server import ServerSettings, create_app

# Hundreds of requests per test: slow by nature (CI runs them; `-m "not slow"` skips them).
pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("THEMIS_HTTP_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=10000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TOKEN = "fuzz-token"


def _png() -> str:
    from PIL import Image

    return base64.b64encode(encode(Image.fromarray(photo_like(16, 12, 3)), "PNG")).decode()


PNG = _png()
ROUTES = [
    "/embed/text",
    "/v1/embeddings",
    "/search",
    "/index/items",
    "/embed/image",
    "/admin/reload",
    "/predict",
]

# JSON-ish values, including what JSON cannot hold: lone surrogates, NaN, huge integers.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["\ud83d", "\udc00x", "<script>", "$.a", 'a"b', "\x00"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    tmp = tmp_path_factory.mktemp("fuzz")
    app = create_app(
        ServerSettings(
            plugin_config=PluginConfig.from_dict({"model": {"path": str(tiny_model_dir)}}),
            index_path=str(tmp / "idx.db"),
            model_root=str(tmp),
            admin_token=TOKEN,
            max_body_bytes=200_000,
            warmup=False,
        )
    )
    with TestClient(app, raise_server_exceptions=False) as c:
        seed = {"items": [{"id": "seed", "image": PNG, "metadata": {"tag": "a"}}]}
        assert c.post("/index/items", json=seed).status_code == 200
        yield c
        # Teardown: after every fuzz test of the module, whatever their order or selection.
        still_searchable(c)


def check(r: Any) -> None:
    assert r.status_code < 500 or r.status_code in (503, 504), (r.status_code, r.text[:300])
    if r.status_code >= 400:
        body = r.json()
        assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body


def still_searchable(c: TestClient) -> None:
    for body in ({"text": "x", "k": 100}, {"text": "x", "filters": {"tag": "a"}}):
        r = c.post("/search", json=body)
        assert r.status_code == 200, r.text
        json.dumps(r.json(), allow_nan=False).encode("utf-8")  # what was stored reads back clean


def send(c: TestClient, route: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    text = json.dumps(body, allow_nan=True)  # NaN and lone surrogates go out as a client may send
    return c.post(
        route,
        content=text.encode("utf-8", "surrogatepass"),
        headers=headers or {"content-type": "application/json"},
    )


@FUZZ
@given(metadata=values, item_id=st.text(max_size=12))
@example(metadata={"n": float("nan")}, item_id="x")
@example(metadata={"s": "\ud83d"}, item_id="y")
@example(metadata={"\ud83d": 1}, item_id="z")
def test_metadata(client: TestClient, metadata: Any, item_id: str) -> None:
    check(
        send(
            client, "/index/items", {"items": [{"id": item_id, "image": PNG, "metadata": metadata}]}
        )
    )
    still_searchable(client)


@FUZZ
@given(filters=values, k=values)
def test_search_filters_and_k(client: TestClient, filters: Any, k: Any) -> None:
    check(send(client, "/search", {"text": "x", "filters": filters, "k": k}))
    check(send(client, "/search", {"vector": filters}))


@FUZZ
@given(route=st.sampled_from(ROUTES), body=values)
def test_any_body_on_any_route(client: TestClient, route: str, body: Any) -> None:
    check(send(client, route, body))
    check(
        send(
            client,
            route,
            body,
            {"content-type": "application/json", "authorization": f"Bearer {TOKEN}"},
        )
    )


@FUZZ
@given(
    route=st.sampled_from(ROUTES),
    raw=st.binary(max_size=300),
    content_type=st.sampled_from(
        [
            "application/json",
            "application/json; charset=latin-1",
            "text/plain",
            "multipart/form-data; boundary=x",
            "",
            "image/png",
        ]
    ),
)
def test_raw_bytes_and_content_types(
    client: TestClient, route: str, raw: bytes, content_type: str
) -> None:
    check(client.post(route, content=raw, headers={"content-type": content_type}))


header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


@FUZZ
@given(
    route=st.sampled_from(ROUTES),
    headers=st.dictionaries(
        st.sampled_from(
            [
                "authorization",
                "content-type",
                "content-encoding",
                "accept",
                "x-forwarded-for",
                "transfer-encoding",
                "expect",
                "range",
                "cookie",
                "x-anything",
            ]
        ),
        header_text,
        max_size=4,
    ),
)
def test_arbitrary_headers(client: TestClient, route: str, headers: dict[str, str]) -> None:
    body = json.dumps({"text": "x", "texts": None}).encode()
    check(client.post(route, content=body, headers=headers))
    check(client.get("/stats", headers=headers))
