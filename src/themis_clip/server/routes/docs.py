"""``GET /docs``: the Swagger UI, served from the package, offline, under the page's CSP.

FastAPI's own ``/docs`` loads Swagger UI from a CDN (a blank page offline) and starts it with an
inline script (refused by a strict Content-Security-Policy). Here the page is static HTML, the
Swagger UI bundle and stylesheet (Swagger UI is Apache-2.0) come from ``fastapi-offline`` (MIT),
a maintained package that ships them, and the start-up is ``static/docs.js``: all from this
origin, under :data:`~themis_clip.server.page.SECURITY_HEADERS`. ``/redoc`` (FastAPI's usual
second viewer) redirects here: ReDoc injects inline styles and starts web workers from
``blob:`` URLs, which that policy refuses, and one viewer is enough.

The OpenAPI document groups the routes by :data:`TAGS`, and its descriptions (taken from
docstrings written in reStructuredText for the library's docs) are turned into the Markdown
Swagger UI renders (:func:`markdown_openapi`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse, Response

from themis_clip.server.access import PUBLIC
from themis_clip.server.bodies import JSONRoute
from themis_clip.server.errors import APIError
from themis_clip.server.page import SECURITY_HEADERS

# no key: the docs hold no indexed data
router = APIRouter(route_class=JSONRoute, dependencies=[PUBLIC])

_HTML = b"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>themis-clip API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
<script src="/docs/assets/swagger-ui-bundle.js" defer></script>
<script src="/docs/assets/docs.js" defer></script>
</head>
<body>
<main id="swagger-ui"></main>
</body>
</html>
"""

#: name → (package, media type): the only files ``/docs/assets/`` serves
_ASSETS = {
    "swagger-ui-bundle.js": ("fastapi_offline", "text/javascript; charset=utf-8"),
    "swagger-ui.css": ("fastapi_offline", "text/css; charset=utf-8"),
    "docs.js": ("themis_clip.server", "text/javascript; charset=utf-8"),
}


#: the route groups of ``/docs``, in this order
TAGS = [
    {"name": "embeddings", "description": "Image and text embeddings (OpenAI-compatible too)."},
    {"name": "index", "description": "The photo index: search, browse, items, duplicates."},
    {"name": "zero-shot", "description": "Classify an image, rank candidates."},
    {"name": "operations", "description": "Health, readiness and statistics."},
    {"name": "admin", "description": "Reload the model (admin token)."},
    {
        "name": "other services",
        "description": "Embedding APIs of immich's machine learning, Ollama, TEI and Cohere.",
    },
]

_ROLE = re.compile(r":[a-z]+:`~?(?:[^`<]*<)?([^`>]+)>?`")


def _markdown(text: str) -> str:
    """``code`` and :role:`~a.b.name` (reStructuredText) as `code` and `name` (Markdown)."""
    text = _ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    return text.replace("``", "`")


def _descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: _markdown(v) if k == "description" and isinstance(v, str) else _descriptions(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_descriptions(v) for v in node]
    return node


def markdown_openapi(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """``app.openapi`` with every description in Markdown (built once, as FastAPI's is)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _descriptions(build())
        return app.openapi_schema

    return openapi


@cache
def _read(package: str, name: str) -> bytes:
    return (resources.files(package) / "static" / name).read_bytes()


@router.get("/docs", include_in_schema=False)
async def docs_page() -> Response:
    return Response(
        _HTML,
        media_type="text/html; charset=utf-8",
        headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"},
    )


@router.get("/redoc", include_in_schema=False)
async def redoc() -> RedirectResponse:
    return RedirectResponse("/docs", status_code=307, headers=SECURITY_HEADERS)


@router.get("/docs/assets/{name}", include_in_schema=False)
async def docs_asset(name: str) -> Response:
    if name not in _ASSETS:
        raise APIError(404, "NotFound", f"no asset {name[:100]!r}")
    package, media_type = _ASSETS[name]
    try:
        data = _read(package, name)
    except (ModuleNotFoundError, FileNotFoundError):
        raise APIError(
            404,
            "NotFound",
            "the API page needs fastapi-offline: pip install 'themis-onnx-clip[server]' "
            "(the schema is at /openapi.json)",
        ) from None
    return Response(
        data, media_type=media_type, headers={**SECURITY_HEADERS, "Cache-Control": "max-age=3600"}
    )
