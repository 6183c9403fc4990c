"""The PostgreSQL store (pgvector): the store (:mod:`.store`), its schema and migrations
(:mod:`.schema`) and its reads as functions of a connection (:mod:`.queries`)."""

from themis_clip.index.stores.postgres.schema import PG_SCHEMA_VERSION, redact
from themis_clip.index.stores.postgres.store import PgStore, writer_lock

__all__ = ["PG_SCHEMA_VERSION", "PgStore", "redact", "writer_lock"]
