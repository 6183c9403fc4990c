"""JSON request bodies: parsed once with orjson, validated by the route's pydantic model.

The one home of orjson. It reads RFC 8259 JSON: valid UTF-8, no ``NaN`` or ``Infinity``, at
most 1,024 levels deep (400 ``BadJSON`` naming the problem otherwise); a repeated key keeps its
last value and an integer beyond 64 bits becomes a float, as in JavaScript. Routes declare
their body with :func:`json_body` (FastAPI would parse it a second time with the standard
library, on the event loop) and show it in ``/docs`` with :func:`documented`.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import orjson
from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from themis_clip.server.errors import APIError

__all__ = ["OFF_LOOP_BYTES", "documented", "json_body", "json_text", "parse_json", "read_model"]

_M = TypeVar("_M", bound=BaseModel)

#: bodies from this size on are parsed in a worker thread (smaller ones take microseconds)
OFF_LOOP_BYTES = 1 << 16


def parse_json(body: bytes) -> Any:
    """The JSON value of ``body``.

    Raises:
        APIError: 400 ``BadJSON`` naming the problem.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise APIError(400, "BadJSON", _problem(exc)) from None


def json_text(value: Any) -> str:
    """``value`` as compact JSON text; a float32 array as the shortest decimals that read back
    to the same float32 values (what immich's service answers, and pgvector parses)."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def _problem(exc: orjson.JSONDecodeError) -> str:
    """orjson's message, with the name of what the client most likely sent."""
    found = exc.doc[exc.pos : exc.pos + 8] if isinstance(exc.doc, str) else ""
    constant = next((c for c in ("NaN", "Infinity") if found.startswith(c)), None)
    if constant is not None:
        return f"request body is not valid JSON: {constant} is not valid JSON (char {exc.pos})"
    if exc.msg.startswith("depth limit exceeded"):
        return "request body is nested deeper than the JSON parser allows (1,024 levels)"
    if "UTF-8" in exc.msg:
        return f"request body is not valid UTF-8 ({exc})"
    if "surrogate" in exc.msg:
        return f"request body is not valid Unicode: a lone surrogate escape ({exc})"
    return f"request body is not valid JSON: {exc}"


def _is_json(request: Request) -> bool:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _invalid(errors: list[Any]) -> RequestValidationError:
    return RequestValidationError([{**e, "loc": ("body", *e.get("loc", ()))} for e in errors])


async def read_model(request: Request, model: type[_M]) -> _M:
    """The request's JSON body as ``model``; large bodies are parsed in a worker thread.

    Raises:
        APIError: 400 ``BadJSON``.
        RequestValidationError: no JSON body, or one ``model`` refuses (422 naming the field).
    """
    body = await request.body()
    if not body:
        raise _invalid([{"type": "missing", "loc": (), "msg": "Field required", "input": None}])
    if not _is_json(request):
        raise _invalid(
            [{"type": "model_attributes_type", "loc": (), "msg": "Input should be a JSON object"}]
        )
    value = (
        parse_json(body)
        if len(body) < OFF_LOOP_BYTES
        else await asyncio.to_thread(parse_json, body)
    )
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise _invalid(list(exc.errors(include_url=False))) from None


def json_body(model: type[_M]) -> Any:
    """A route parameter's dependency: the body as ``model`` (see :func:`read_model`)."""

    async def parsed(request: Request) -> _M:
        return await read_model(request, model)

    return Depends(parsed)


def documented(model: type[BaseModel]) -> dict[str, Any]:
    """A route's ``openapi_extra``: ``model`` as its JSON request body in ``/docs``."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    content = {"application/json": {"schema": inline(schema)}}
    return {"requestBody": {"required": True, "content": content}}
