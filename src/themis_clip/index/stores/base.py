"""What every store offers, and which store an index location names.

A location is a file path (SQLite, the embedded default) or a ``postgresql://`` URL
(PostgreSQL with pgvector, for several servers on one index or collections that outgrow a
file). Both stores keep the same items, metadata, thumbnails, vectors, model identity and
change tracking, and pass the same behavioural tests (``tests/integration/test_store_contract.py``).
A store only stores: how it is searched is a searcher's business (:mod:`..searchers`).

:class:`Store` is what every store must do; :class:`Lexical` (word search) and :class:`Facets`
(what the metadata holds) are capabilities a store may add, checked with ``isinstance``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from themis_clip.index.stores.rows import ItemRow, StoredItem
from themis_clip.index.where import Where

__all__ = ["Facets", "GraphFileStore", "Lexical", "Store", "StoreKind", "is_url"]

_SCHEMES = ("postgresql://", "postgres://")


def is_url(location: str | Path) -> bool:
    """Whether ``location`` names a PostgreSQL database rather than a file."""
    return isinstance(location, str) and location.startswith(_SCHEMES)


class StoreKind(StrEnum):
    """The stores there are (``stats()["store"]``)."""

    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"


class Store(Protocol):
    """What :class:`~themis_clip.index.search.VectorIndex`, its searchers and the indexer
    need of a store."""

    kind: StoreKind
    readonly: bool

    @property
    def path(self) -> Path | str:
        """Where the store is, fit for messages (a URL without its password)."""
        ...

    def close(self) -> None: ...
    def meta(self) -> dict[str, str]: ...
    def set_meta(self, values: Mapping[str, str | int]) -> None: ...
    @property
    def write_version(self) -> int: ...
    def upsert(self, rows: Sequence[ItemRow], *, dim: int) -> None: ...
    def expect_model(self, sha256: str) -> None:
        """Refuse later upserts if the index is then made by a model other than ``sha256``
        (another process migrated it); :meth:`VectorIndex.bind_model` sets it."""
        ...

    def delete_keys(self, keys: Iterable[str]) -> int: ...
    def rename(
        self, old_key: str, new_key: str, *, path: str, size: int, mtime_ns: int
    ) -> None: ...
    def get(self, key: str) -> StoredItem | None: ...
    def items_under(self, prefix: str) -> dict[str, StoredItem]: ...
    def by_sha256(self, digest: str) -> list[StoredItem]: ...
    def vector(self, key: str) -> npt.NDArray[np.float32] | None: ...
    def thumbnail(self, key: str) -> bytes | None: ...
    def count(self) -> int: ...
    def keys_by_id(self, ids: Sequence[int] | None = None) -> dict[int, str]: ...
    def load_vectors(self, dim: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def changes_since(
        self, version: int, dim: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64]]: ...
    def vectors_by_id(self, ids: Sequence[int], dim: int) -> npt.NDArray[np.float32]: ...
    def size_bytes(self) -> int: ...
    def items_by_id(self, ids: Sequence[int]) -> dict[int, StoredItem]: ...
    def ids_where(self, where: Where) -> set[int]: ...
    def timeline(self, where: Where | None) -> list[tuple[int, Any, Any, Any]]: ...
    def set_metadata(self, values: Mapping[str, Mapping[str, Any] | None]) -> int: ...
    def record_failures(self, rows: Sequence[tuple[str, int, int, str]]) -> None: ...
    def failures_under(self, prefix: str) -> dict[str, tuple[int, int, str]]: ...
    def delete_failures(self, paths: Iterable[str]) -> None: ...
    def integrity_ok(self) -> bool: ...


@runtime_checkable
class Lexical(Protocol):
    """A store that finds items by the words of their key, path and string metadata, and by
    the text read in them (OCR), which it keeps beside them."""

    def lexical(self, text: str, limit: int, where: Where | None) -> list[int]: ...
    def set_ocr(self, readings: Mapping[str, Mapping[str, Any]]) -> int: ...
    def ocr_readings(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]: ...
    def unread_under(self, prefix: str) -> dict[str, StoredItem]: ...


@runtime_checkable
class Facets(Protocol):
    """A store that tells which metadata keys and values it holds (filter pickers, and the
    error naming a filter key no item has)."""

    def metadata_keys_present(self, keys: Iterable[str]) -> set[str]: ...
    def metadata_facets(
        self, *, max_keys: int = 50, max_values: int = 20
    ) -> list[dict[str, Any]]: ...
    def photo_facets(self, *, max_makes: int = 50) -> dict[str, Any]: ...


class GraphFileStore(Store, Protocol):
    """A store beside which the index saves its own graph file (SQLite), tagged in its meta
    with the write version the graph matches."""

    def tag_graph(self, version: int) -> int: ...
