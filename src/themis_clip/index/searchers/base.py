"""What :class:`~themis_clip.index.search.VectorIndex` needs of a searcher.

A store stores; a searcher answers top-k queries over it. :class:`~.local.LocalSearcher`
searches a store's vectors in this process (exact numpy, or our HNSW graph);
:class:`~.postgres.PgSearcher` has PostgreSQL search itself (pgvector). ``VectorIndex`` picks
one when it opens a store, so a new store is one :class:`~..stores.base.Store` and, unless
the local searcher suits it, one searcher.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from themis_clip.index.settings import SearchKind
from themis_clip.index.where import Where

__all__ = ["Searcher"]


class Searcher(Protocol):
    """Top-k search over one store."""

    #: ``(phase, done, total)`` while a search structure is built.
    progress: Callable[[str, int, int], object] | None

    @property
    def mode(self) -> SearchKind:
        """How the next search runs."""
        ...

    @property
    def building(self) -> bool:
        """Whether a search structure is being built in the background."""
        ...

    def search(
        self,
        query: npt.NDArray[np.float32],
        k: int,
        dim: int,
        *,
        where: Where | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """The top ``k`` ``(store ids, cosine scores)`` of the items matching ``where``."""
        ...

    def prepare(self, dim: int) -> bool:
        """Build (and measure) the search structure now if it is missing or stale; True if
        one was built."""
        ...

    def stats(self) -> dict[str, Any]:
        """The searcher's own part of :meth:`VectorIndex.stats` (``graph``), or nothing."""
        ...

    def close(self) -> None:
        """Save what must outlive the process (the store is closed by its owner)."""
        ...
