"""The stores: one protocol and its optional capabilities (:mod:`.base`), an SQLite file
(:mod:`.sqlite`) and a PostgreSQL database with pgvector (:mod:`.postgres`), and which one an
index location names.

The two store packages never import each other (an import-linter contract keeps it so); what
both hold and check alike is in :mod:`.rows`.
"""

from __future__ import annotations

from pathlib import Path

from themis_clip.index.stores.base import Facets, GraphFileStore, Lexical, Store, StoreKind, is_url
from themis_clip.index.stores.rows import ItemRow, StoredItem

__all__ = [
    "Facets",
    "GraphFileStore",
    "ItemRow",
    "Lexical",
    "Store",
    "StoreKind",
    "StoredItem",
    "drop_store",
    "is_url",
    "open_store",
]


def open_store(location: str | Path, *, readonly: bool = False) -> Store:
    """The store at ``location``: a PostgreSQL URL or an SQLite file path."""
    if is_url(location):
        from themis_clip.index.stores.postgres import PgStore

        return PgStore(str(location), readonly=readonly)
    from themis_clip.index.stores.sqlite import SQLiteStore

    return SQLiteStore(location, readonly=readonly)


def drop_store(location: str | Path) -> None:
    """Delete the store at ``location`` (PostgreSQL: its tables; SQLite: the database file and
    SQLite's side files)."""
    if is_url(location):
        from themis_clip.index.stores.postgres import PgStore

        PgStore.drop(str(location))
        return
    for suffix in ("", "-wal", "-shm"):
        Path(str(location) + suffix).unlink(missing_ok=True)
