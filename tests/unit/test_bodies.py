"""Request bodies: JSON (orjson) and forms (python-multipart), with named refusals, large
bodies off the loop."""

from __future__ import annotations

import json
import threading
from typing import Annotated, Any

import httpx
import numpy as np
import pytest
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import PlainTextResponse
from fastapi.testclient import TestClient
from pydantic import BaseModel

from themis_clip.server import bodies
from themis_clip.server.bodies import (
    MAX_FORM_FIELD_BYTES,
    MAX_FORM_FIELDS,
    MAX_FORM_FILES,
    OFF_LOOP_BYTES,
    FormPart,
    JSONRoute,
    documented,
    json_body,
    parse_form,
    parse_json,
)
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


# Forms --------------------------------------------------------------------------------------


def encoded(**kw: Any) -> tuple[bytes, str]:
    """A form body and its Content-Type as httpx (an independent encoder) sends them."""
    request = httpx.Request("POST", "http://x/", **kw)
    return request.read(), request.headers["content-type"]


def refused(body: bytes, content_type: str) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_form(body, content_type)
    return caught.value


def test_a_form_reads_as_its_encoder_wrote_it() -> None:
    fields = [("entries", (None, '{"clip": {}}')), ("text", (None, "été 🌅\r\n"))]
    files = [("image", ("blob", b"\x00\xff" * 500, "image/jpeg")), ("text", ("été.txt", b"x"))]
    form = parse_form(*encoded(files=[*fields, *files]))
    assert form["entries"] == [FormPart(name="entries", data=b'{"clip": {}}')]
    assert [p.text() for p in form["text"]] == ["été 🌅\r\n", "x"]  # order kept
    assert [p.filename for p in form["text"]] == [None, "été.txt"]
    assert form["image"] == [FormPart(name="image", data=b"\x00\xff" * 500, filename="blob")]
    urlencoded = parse_form(*encoded(data={"a": "1 + é&=", "b": ["", "two"]}))
    assert urlencoded["a"][0].text() == "1 + é&=" and urlencoded["a"][0].filename is None
    assert [p.text() for p in urlencoded["b"]] == ["", "two"]
    assert parse_form(b"", "multipart/form-data; boundary=x") == {}  # the route names the part


@pytest.mark.parametrize("kind", ["multipart", "urlencoded"])
def test_a_field_over_the_limit_is_a_413_naming_it(kind: str) -> None:
    at_limit = "a" * MAX_FORM_FIELD_BYTES
    over = at_limit + "a"
    if kind == "multipart":
        assert parse_form(*encoded(files={"text": (None, at_limit)}))["text"][0].data
        body, content_type = encoded(files={"entries": (None, "{}"), "text": (None, over)})
    else:
        assert parse_form(*encoded(data={"text": at_limit}))["text"][0].data
        body, content_type = encoded(data={"entries": "{}", "text": over})
    error = refused(body, content_type)
    assert (error.status, error.error_type) == (413, "PayloadTooLarge")
    assert error.message.startswith("text: a form field over 1048576 bytes")
    # a file part is bounded by the body's limit only
    big = parse_form(*encoded(files={"image": ("blob", over.encode())}))
    assert len(big["image"][0].data) == MAX_FORM_FIELD_BYTES + 1


def test_too_many_parts_are_a_413() -> None:
    fields = [(f"f{i}", (None, "x")) for i in range(MAX_FORM_FIELDS + 1)]
    files = [(f"f{i}", ("n", b"x")) for i in range(MAX_FORM_FILES + 1)]
    assert len(parse_form(*encoded(files=fields[:-1]))) == MAX_FORM_FIELDS
    assert "1000 fields" in refused(*encoded(files=fields)).message
    assert "1000 files" in refused(*encoded(files=files)).message
    urlencoded = refused(*encoded(data={f"f{i}": "x" for i in range(MAX_FORM_FIELDS + 1)}))
    assert urlencoded.status == 413 and "1000 fields" in urlencoded.message


@pytest.mark.parametrize(
    ("body", "content_type", "named"),
    [
        (b"--x\r\nContent-Disposition: form-data\r\n\r\nv\r\n--x--\r\n", "b", "Field name"),
        (b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\nv\r\n', "b", "closing"),
        (b"not a form", "b", "boundary character"),
        (b"--x--\r\n", "", "needs a boundary"),
    ],
    ids=["no-name", "cut", "garbage", "no-boundary"],
)
def test_a_malformed_form_is_a_400_naming_the_problem(
    body: bytes, content_type: str, named: str
) -> None:
    error = refused(body, "multipart/form-data" + ("; boundary=x" if content_type else ""))
    assert (error.status, error.error_type) == (400, "BadForm")
    assert named in error.message


def test_a_large_form_is_parsed_in_a_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed_in: list[str] = []
    parse = bodies.parse_form

    def spy(body: bytes, content_type: str) -> bodies.Form:
        parsed_in.append(threading.current_thread().name)
        return parse(body, content_type)

    monkeypatch.setattr(bodies, "parse_form", spy)
    app = FastAPI()

    @app.post("/form")
    async def form(request: Request) -> dict[str, Any]:
        parts = await bodies.read_form(request)
        return {"n": len(parts["f"][0].data), "loop": threading.current_thread().name}

    with TestClient(app) as c:
        small = c.post("/form", files={"f": ("a", b"x")}).json()
        large = c.post("/form", files={"f": ("a", b"x" * OFF_LOOP_BYTES)}).json()
    assert small["n"] == 1 and parsed_in[0] == small["loop"]  # on the loop: microseconds
    assert large["n"] == OFF_LOOP_BYTES and parsed_in[1] != large["loop"]


def test_what_is_not_a_form_or_not_text_is_refused_by_name() -> None:
    error = refused(b"{}", "application/json")
    assert (error.status, error.error_type) == (415, "UnsupportedMediaType")
    assert "'application/json'" in error.message
    with pytest.raises(APIError) as caught:
        FormPart(name="text", data=b"caf\xe9").text()  # latin-1, not UTF-8
    assert caught.value.status == 422 and caught.value.message.startswith("text: not valid UTF-8")


def _answering_app() -> FastAPI:
    router = APIRouter(route_class=JSONRoute)

    @router.get("/vector", response_model=None)
    async def vector(n: int = 4) -> dict[str, Any]:
        return {"v": np.arange(n, dtype=np.float32) / 3, "floats": [0.1, 1e-7], "t": ("a", 1)}

    @router.post("/made", status_code=202, response_model=None)
    def made(response: Response) -> dict[str, Any]:  # a plain function: run off the loop
        response.headers["X-Told"] = "yes"
        return {"thread": threading.current_thread() is not threading.main_thread()}

    @router.get("/status", response_model=None)
    async def status(response: Response) -> dict[str, Any]:
        response.status_code = 503
        return {"ready": False}

    @router.get("/own", response_model=None)
    async def own() -> Response:
        return PlainTextResponse("mine", status_code=418)

    @router.get("/text", response_class=PlainTextResponse)
    async def text() -> str:
        return "plain"

    app = FastAPI()
    app.include_router(router)
    return app


def test_plain_answers_are_written_by_orjson_with_status_and_headers_kept() -> None:
    """Answers of plain data are written by orjson (FastAPI's encoder cannot write a numpy
    array: a 500), with the route's status code and what the endpoint set on its Response."""
    client = TestClient(_answering_app())
    r = client.get("/vector", params={"n": 3})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.content == b'{"v":[0.0,0.33333334,0.6666667],"floats":[0.1,1e-7],"t":["a",1]}'
    assert json.loads(r.content)["floats"] == [0.1, 1e-7]  # float64 values keep every digit
    r = client.post("/made")
    assert (r.status_code, r.headers["x-told"], r.json()) == (202, "yes", {"thread": True})
    assert client.get("/status").status_code == 503
    r = client.get("/own")
    assert (r.status_code, r.text) == (418, "mine")  # a Response of its own is the answer
    assert client.get("/text").text == "plain"  # a route with its own response class


def test_answered_routes_show_their_own_parameters_only() -> None:
    """The Response the answer is built around is injected, never a parameter a client sees
    (the routes are added again by include_router: wrapped once)."""
    schema = TestClient(_answering_app()).get("/openapi.json").json()
    params = [p["name"] for p in schema["paths"]["/vector"]["get"].get("parameters", [])]
    assert params == ["n"]
    assert "parameters" not in schema["paths"]["/made"]["post"]
    assert "themis_answer" not in json.dumps(schema)
