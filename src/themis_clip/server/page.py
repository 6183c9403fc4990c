"""The search page: static HTML, CSS and JavaScript shipped in the package, no build step.

``GET /`` serves ``static/index.html`` under a strict Content-Security-Policy (scripts and styles
from this origin only, no inline code, images from this origin or the page's own blob/data URLs,
no framing); ``GET /static/{name}`` serves the page's two assets. The files are read from the
package on first use (nothing at import time) and kept in memory.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["ASSETS", "CSP", "SECURITY_HEADERS", "asset", "index_html"]

#: the only files ``/static/`` serves, and their media types
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


@cache
def _read(name: str) -> bytes:
    return (resources.files("themis_clip.server") / "static" / name).read_bytes()


def index_html() -> bytes:
    return _read("index.html")


def asset(name: str) -> bytes | None:
    """An asset's bytes, or None for any name that is not one of :data:`ASSETS`."""
    return _read(name) if name in ASSETS else None
