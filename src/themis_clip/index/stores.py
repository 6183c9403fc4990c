"""Which store an index location names, and what every store offers.

A location is a file path (SQLite, the embedded default) or a ``postgresql://`` URL
(PostgreSQL with pgvector, for several servers on one index or collections that outgrow a
file). Both stores keep the same items, metadata, thumbnails, vectors, model identity and
change tracking, and pass the same behavioural tests (``tests/unit/test_store_contract.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from themis_clip.index.store import IndexStore, ItemRow, StoredItem

if TYPE_CHECKING:
    from themis_clip.index.tuning import GraphSettings

__all__ = ["GraphFileStore", "SearchingStore", "Store", "is_url", "open_store"]

_SCHEMES = ("postgresql://", "postgres://")


def is_url(location: str | Path) -> bool:
    """Whether ``location`` names a PostgreSQL database rather than a file."""
    return isinstance(location, str) and location.startswith(_SCHEMES)


class Store(Protocol):
    """What :class:`~themis_clip.index.search.VectorIndex` and the indexer need of a store."""

    kind: str
    searches_itself: bool
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
    def load_vectors(self, dim: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def changes_since(
        self, version: int, dim: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64]]: ...
    def vectors_by_id(self, ids: Sequence[int], dim: int) -> npt.NDArray[np.float32]: ...
    def size_bytes(self) -> int: ...
    def items_by_id(self, ids: Sequence[int]) -> dict[int, StoredItem]: ...
    def ids_matching(self, filters: Mapping[str, Any]) -> set[int]: ...
    def metadata_keys_present(self, keys: Iterable[str]) -> set[str]: ...
    def metadata_facets(
        self, *, max_keys: int = 50, max_values: int = 20
    ) -> list[dict[str, Any]]: ...
    def record_failures(self, rows: Sequence[tuple[str, int, int, str]]) -> None: ...
    def failures_under(self, prefix: str) -> dict[str, tuple[int, int, str]]: ...
    def delete_failures(self, paths: Iterable[str]) -> None: ...


class GraphFileStore(Store, Protocol):
    """A store beside which the index saves its own graph file (SQLite), tagged in its meta
    with the write version the graph matches."""

    def tag_graph(self, version: int) -> int: ...


class SearchingStore(Store, Protocol):
    """A store that searches itself (``searches_itself``: PostgreSQL with pgvector)."""

    def nearest(
        self, query: npt.NDArray[np.float32], k: int, filters: Mapping[str, Any] | None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def search_mode(self) -> str: ...
    def prepare(
        self,
        settings: GraphSettings,
        *,
        progress: Callable[[str, int, int], object] | None = None,
    ) -> bool: ...


def open_store(location: str | Path, *, readonly: bool = False) -> Store:
    """The store at ``location``: a PostgreSQL URL or an SQLite file path."""
    if is_url(location):
        from themis_clip.index.pgstore import PgStore

        return PgStore(str(location), readonly=readonly)
    return IndexStore(location, readonly=readonly)
