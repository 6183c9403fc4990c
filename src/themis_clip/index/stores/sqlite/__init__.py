"""The SQLite store (the embedded default): the store (:mod:`.store`), its schema and
migrations (:mod:`.schema`), and its reads as functions of a connection (:mod:`.queries`)."""

from themis_clip.index.stores.sqlite.store import SCHEMA_VERSION, SQLiteStore

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]
