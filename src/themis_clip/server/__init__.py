"""The HTTP service (extra ``[server]``): FastAPI app factory, schemas, web page."""

from __future__ import annotations

from themis_clip.server.app import ServerSettings, create_app

__all__ = ["ServerSettings", "create_app"]
