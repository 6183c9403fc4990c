"""JSON request bodies: one parser (orjson) with named refusals, large bodies off the loop."""

from __future__ import annotations

import json
import threading
from typing import Annotated, Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from themis_clip.server import bodies
from themis_clip.server.bodies import OFF_LOOP_BYTES, documented, json_body, parse_json
from themis_clip.server.errors import APIError


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b'{"n": NaN}', "NaN is not valid JSON"),
        (b'{"n": Infinity}', "Infinity is not valid JSON"),
        (b'{"n": -Infinity}', "Infinity is not valid JSON"),
        (b'{"n": 1e400}', "infinity"),
        (b'{"s": "\xff"}', "UTF-8"),
        (b'{"s": "\xed\xa0\x80"}', "UTF-8"),  # a surrogate encoded in UTF-8 is not UTF-8
        (b'{"s": "\\ud800"}', "not valid Unicode"),  # a lone surrogate would fail on output
        (b'{"s": "a"', "not valid JSON"),
        (b'{"s": "a"} trailing', "not valid JSON"),
        (b"[" * 5000 + b"]" * 5000, "nested deeper"),
    ],
    ids=["nan", "inf", "-inf", "overflow", "utf8", "surrogate-utf8", "lone", "cut", "tail", "deep"],
)
def test_what_is_not_json_is_a_400_naming_the_problem(body: bytes, named: str) -> None:
    with pytest.raises(APIError) as caught:
        parse_json(body)
    assert caught.value.status == 400 and caught.value.error_type == "BadJSON"
    assert named in caught.value.message


def test_json_parses_as_json_does() -> None:
    body = b'{"u": "\\u00e9\\ud83d\\ude00", "e": 1.5e300, "n": [1, -2, 0.5, true, null], "o": {}}'
    assert parse_json(body) == json.loads(body)


class Item(BaseModel):
    name: str
    tags: list[str] = []


class Body(BaseModel):
    items: list[Item]


def client() -> TestClient:
    app = FastAPI()

    @app.post("/items", openapi_extra=documented(Body))
    async def items(body: Annotated[Body, json_body(Body)]) -> dict[str, Any]:
        return {"n": len(body.items), "loop": threading.current_thread().name}

    return TestClient(app)


def test_a_large_body_is_parsed_in_a_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed_in: list[str] = []
    parse = bodies.parse_json

    def spy(body: bytes) -> Any:
        parsed_in.append(threading.current_thread().name)
        return parse(body)

    monkeypatch.setattr(bodies, "parse_json", spy)
    with client() as c:
        small = c.post("/items", json={"items": [{"name": "a"}]}).json()
        large = c.post("/items", json={"items": [{"name": "x" * OFF_LOOP_BYTES}, {"name": "z"}]})
    assert small["n"] == 1 and parsed_in[0] == small["loop"]  # on the loop: microseconds
    assert large.json()["n"] == 2 and parsed_in[1] != large.json()["loop"]


def test_the_model_refuses_by_field_and_the_schema_shows_in_openapi() -> None:
    with client() as c:
        r = c.post("/items", json={"items": [{"name": 1}]})
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "items", 0, "name"]
        assert c.post("/items", content=b"").status_code == 422  # no body: the field is missing
        r = c.post("/items", content=b'{"items": []}', headers={"content-type": "text/plain"})
        assert r.status_code == 422  # a JSON body needs a JSON media type
        schema = c.get("/openapi.json").json()["paths"]["/items"]["post"]["requestBody"]
    body = schema["content"]["application/json"]["schema"]
    assert body["properties"]["items"]["items"]["properties"]["name"]["type"] == "string"
