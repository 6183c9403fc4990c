"""Request bodies, parsed once from the bytes the request guard has read: JSON with orjson,
forms with python-multipart; JSON answers, written by orjson (:class:`JSONRoute`).

The one home of orjson and of python-multipart. JSON is read as RFC 8259: valid UTF-8, no
``NaN`` or ``Infinity``, at most 1,024 levels deep (400 ``BadJSON`` naming the problem
otherwise); a repeated key keeps its last value and an integer beyond 64 bits becomes a float,
as in JavaScript. Routes declare their body with :func:`json_body` (FastAPI would parse it a
second time with the standard library, on the event loop) and show it in ``/docs`` with
:func:`documented`. Forms (``multipart/form-data`` or urlencoded) are read with
:func:`read_form`: held in memory (the body already is), never spooled to disk, under
Starlette's limits, with errors that name the part.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import io
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from fastapi import Depends, Request, Response
from fastapi.datastructures import DefaultPlaceholder
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from python_multipart import FormParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import Field, File, parse_options_header

from themis_clip.server.errors import APIError

__all__ = [
    "MAX_FORM_FIELDS",
    "MAX_FORM_FIELD_BYTES",
    "MAX_FORM_FILES",
    "OFF_LOOP_BYTES",
    "Form",
    "FormPart",
    "JSONAnswer",
    "JSONRoute",
    "documented",
    "json_body",
    "json_text",
    "parse_form",
    "parse_json",
    "read_form",
    "read_model",
]

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


class JSONAnswer(Response):
    """A JSON answer written by orjson: compact UTF-8, numpy arrays as their values, NaN and
    infinities as ``null``; what orjson does not know (a path, a set, a pydantic model) as
    FastAPI's ``jsonable_encoder`` makes it."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=jsonable_encoder, option=orjson.OPT_SERIALIZE_NUMPY)


class JSONRoute(APIRoute):
    """A route whose answers of plain data (no response model or class of its own) are
    written by orjson in one step. FastAPI walks such an answer with ``jsonable_encoder`` and
    writes it with the standard library: 1.7 ms for one 512-d embedding, 34 ms for 32, against
    0.03 and 0.7 ms (``bench/bench_json_answers.py``). The route's ``status_code`` and what
    the endpoint sets on an injected ``Response`` (status, headers) are kept; an endpoint that
    returns a ``Response`` is answered by it, as before."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        own_class = not isinstance(kwargs.get("response_class"), DefaultPlaceholder | None)
        if kwargs.get("response_model") is None and not own_class:
            endpoint = _answered_by_orjson(endpoint, kwargs.get("status_code"))
        super().__init__(path, endpoint, **kwargs)


_ANSWER = "themis_answer"  # the injected Response of an endpoint that takes none itself


def _answered_by_orjson(endpoint: Callable[..., Any], status: int | None) -> Callable[..., Any]:
    if getattr(endpoint, "_answered_by_orjson", False):
        return endpoint  # a router's route added again to the app
    signature = inspect.signature(endpoint)
    named = [n for n, p in signature.parameters.items() if p.annotation in (Response, "Response")]
    name = named[0] if named else _ANSWER
    params = list(signature.parameters.values())
    if not named:
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Response))

    async def answered(**values: Any) -> Any:
        injected: Response = values[name]
        if not named:
            del values[name]
        if inspect.iscoroutinefunction(endpoint):
            content = await endpoint(**values)
        else:
            content = await asyncio.to_thread(endpoint, **values)
        if isinstance(content, Response):
            return content
        code = injected.status_code or status or 200
        answer = JSONAnswer(content, status_code=code)
        if code in (204, 304) or code < 200:
            answer.body = b""  # such answers have no body (nor a Content-Length)
        answer.headers.raw.extend((k, v) for k, v in injected.headers.raw if k != b"content-length")
        return answer

    functools.update_wrapper(answered, endpoint)
    answered.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    answered._answered_by_orjson = True  # type: ignore[attr-defined]
    return answered


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


#: a form's limits, Starlette's: a field (a part without a file name) holds at most
#: MAX_FORM_FIELD_BYTES, a form at most MAX_FORM_FIELDS fields and MAX_FORM_FILES files; a
#: file part is bounded by the body's own limit.
MAX_FORM_FIELD_BYTES = 1 << 20
MAX_FORM_FIELDS = 1000
MAX_FORM_FILES = 1000

_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


@dataclass(frozen=True, kw_only=True)
class FormPart:
    """One part of a form: a field, or a file when it came with a file name."""

    name: str
    data: bytes
    filename: str | None = None

    def text(self) -> str:
        """The part as UTF-8 text.

        Raises:
            APIError: 422 naming the part when it is not UTF-8.
        """
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise APIError(
                422,
                "ValidationError",
                f"{_shown(self.name)}: not valid UTF-8 (byte {exc.start})",
            ) from None


#: a form's parts by name, each name's in the order sent
Form = dict[str, list[FormPart]]


def _shown(name: str) -> str:
    return name[:64] if name.isprintable() else repr(name[:64])


def _field_too_large(name: str) -> APIError:
    return APIError(
        413,
        "PayloadTooLarge",
        f"{_shown(name)}: a form field over {MAX_FORM_FIELD_BYTES} bytes "
        "(send large data as a file part, with a file name)",
    )


def _bad_form(problem: str) -> APIError:
    return APIError(400, "BadForm", f"request body is not a valid form: {problem}")


def parse_form(body: bytes, content_type: str) -> Form:
    """The form in ``body``, whose ``Content-Type`` header is ``content_type``.

    Raises:
        APIError: 415 for a body that is not a form; 400 ``BadForm`` naming what is malformed;
            413 ``PayloadTooLarge`` naming a field over :data:`MAX_FORM_FIELD_BYTES`, or for
            a form of too many parts.
    """
    media, options = parse_options_header(content_type)
    if media.decode("latin-1") not in _FORM_TYPES:
        shown = repr(media.decode("latin-1")[:60]) if media else "none"
        raise APIError(
            415,
            "UnsupportedMediaType",
            f"this route takes a form body (multipart/form-data); the request's Content-Type "
            f"is {shown}",
        )
    form: Form = {}
    if media == b"application/x-www-form-urlencoded":
        try:  # latin-1 both ways keeps the bytes as sent; FormPart.text reads them as UTF-8
            pairs = urllib.parse.parse_qsl(
                body.decode("latin-1"),
                keep_blank_values=True,
                encoding="latin-1",
                max_num_fields=MAX_FORM_FIELDS,
            )
        except ValueError:
            raise APIError(
                413, "PayloadTooLarge", f"a form of more than {MAX_FORM_FIELDS} fields"
            ) from None
        for name, value in pairs:
            if len(value) > MAX_FORM_FIELD_BYTES:
                raise _field_too_large(name)
            form.setdefault(name, []).append(FormPart(name=name, data=value.encode("latin-1")))
        return form
    boundary = options.get(b"boundary")
    if not body:  # no parts: the route names the part it needs
        return form
    if not boundary:
        raise _bad_form("multipart/form-data needs a boundary parameter in its Content-Type")
    counts = {"fields": 0, "files": 0}
    ended = False

    def on_part(part: Field | File) -> None:
        name = (part.field_name or b"").decode("utf-8", "replace")
        if isinstance(part, File):
            counts["files"] += 1
            if counts["files"] > MAX_FORM_FILES:
                raise APIError(
                    413, "PayloadTooLarge", f"a form of more than {MAX_FORM_FILES} files"
                )
            stream = part.file_object
            assert isinstance(stream, io.BytesIO)  # kept in memory: MAX_MEMORY_FILE_SIZE
            filename = (part.file_name or b"").decode("utf-8", "replace")
            found = FormPart(name=name, data=stream.getvalue(), filename=filename)
        else:
            counts["fields"] += 1
            if counts["fields"] > MAX_FORM_FIELDS:
                raise APIError(
                    413, "PayloadTooLarge", f"a form of more than {MAX_FORM_FIELDS} fields"
                )
            data = part.value or b""
            if len(data) > MAX_FORM_FIELD_BYTES:
                raise _field_too_large(name)
            found = FormPart(name=name, data=data)
        form.setdefault(name, []).append(found)

    def on_end() -> None:
        nonlocal ended
        ended = True

    try:
        parser = FormParser(
            "multipart/form-data",
            on_part,
            on_part,
            on_end=on_end,
            boundary=boundary,
            config={"MAX_MEMORY_FILE_SIZE": float("inf")},  # the body is in memory already
        )
        parser.write(body)
        parser.finalize()
    except FormParserError as exc:
        raise _bad_form(str(exc)) from None
    if not ended:
        raise _bad_form("the body ends before the closing boundary")
    return form


async def read_form(request: Request) -> Form:
    """The request's form body (see :func:`parse_form`); large bodies are parsed in a worker
    thread, small ones on the event loop (a thread hop would cost more than the parse)."""
    body = bytes(await request.body())
    content_type = request.headers.get("content-type", "")
    if len(body) < OFF_LOOP_BYTES:
        return parse_form(body, content_type)
    return await asyncio.to_thread(parse_form, body, content_type)
