"""The float32 vectors a graph's candidates are re-scored with, kept beside the graph.

An i8 or f16 graph's top candidates are re-scored exactly from float32. Reading those from the
candidates' SQLite rows cost about as much as the graph search itself (0.15-0.3 ms a query for
30 blobs, 100k-1M items); here they come from a matrix file beside the graph,
``<index>.vectors``, memory-mapped (no load time, no private memory: pages the OS can drop),
its rows in store-id order and found by a binary search in its id array.

File layout (little endian)::

    b"THMSVEC1"  int64 version  int64 count  int64 dim     32 bytes
    int64 ids[count]                                       sorted, unique
    zero padding to a multiple of 64 bytes
    float32 vectors[count][dim]                            row i is ids[i]'s

``version`` is the store's ``write_version`` the rows reflect. The file is written to a
temporary name, flushed and renamed (readers never see half of one), after the graph file and
before the store's graph tag. The store stays the source of truth: the searcher uses a file only
when its version matches the graph's tag (:func:`matches_tag`) and it has a row per graph node
(:meth:`VectorTable.open`), checks a sample of its rows against the store, and applies every write
since the tag on top (:meth:`VectorTable.with_rows`: rows written later win). An id the table
does not hold is read from the store (:meth:`VectorTable.lookup` reports it missing).
"""

from __future__ import annotations

import functools
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["VECTORS_SUFFIX", "VectorTable", "matches_tag"]

log = logging.getLogger(__name__)

#: The vectors file lives beside the database as ``<index>`` + this suffix.
VECTORS_SUFFIX = ".vectors"

#: Rows of a vectors file checked against the store when it is opened.
CHECKED = 16

_MAGIC = b"THMSVEC1"
_HEADER = struct.Struct("<8sqqq")
_ALIGN = 64


def _data_offset(count: int) -> int:
    end = _HEADER.size + 8 * count
    return -(-end // _ALIGN) * _ALIGN


def matches_tag(file_version: int, tag: int) -> bool:
    """Whether a vectors file written at store ``file_version`` belongs to the graph tagged
    ``tag``: tagging is a write of its own, so the tag is the file's version or the next one."""
    return tag - 1 <= file_version <= tag


@dataclass(frozen=True, kw_only=True)
class VectorTable:
    """float32 vectors by store id: a sorted id array with its rows (memory-mapped from a file,
    or in memory), and rows written since on top (``newer_ids``, sorted; they win)."""

    ids: npt.NDArray[np.int64]
    matrix: npt.NDArray[np.float32]
    newer_ids: npt.NDArray[np.int64]
    newer: npt.NDArray[np.float32]

    @classmethod
    def of(cls, ids: npt.NDArray[np.int64], matrix: npt.NDArray[np.float32]) -> VectorTable:
        """A table over ``ids`` (unique) and their rows, sorted by id if they are not."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            order = np.argsort(ids, kind="stable")
            ids, matrix = ids[order], matrix[order]
        dim = matrix.shape[1] if matrix.ndim == 2 else 0
        return cls(
            ids=ids,
            matrix=matrix,
            newer_ids=np.empty(0, np.int64),
            newer=np.empty((0, dim), np.float32),
        )

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])

    def __len__(self) -> int:
        """Rows held (an id in both parts counts twice)."""
        return len(self.ids) + len(self.newer_ids)

    def lookup(
        self, ids: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """``(vectors [len(ids), dim], found)``: the rows of ``ids`` in that order; a row
        whose id the table does not hold is zero and not ``found``."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(self.newer_ids) and len(self.ids):  # the common case, in fewer steps
            pos = self._rows_of(ids)
            found = self.ids[pos] == ids
            rows = self.matrix[pos]
            if not found.all():
                rows[~found] = 0
            return rows, found
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        found = np.zeros(len(ids), dtype=bool)
        if len(self.newer_ids):  # rows written since the file win
            pos = np.minimum(np.searchsorted(self.newer_ids, ids), len(self.newer_ids) - 1)
            found = self.newer_ids[pos] == ids
            out[found] = self.newer[pos[found]]
        todo = np.flatnonzero(~found)
        if len(todo) and len(self.ids):
            want = ids[todo]
            pos = self._rows_of(want)
            hit = self.ids[pos] == want
            out[todo[hit]] = self.matrix[pos[hit]]
            found[todo[hit]] = True
        return out, found

    @functools.cached_property
    def _row_map(self) -> tuple[int, npt.NDArray[np.int32]] | None:
        """``(lowest id, row of each id from it)``, -1 for a hole, when the ids are dense
        enough (a span at most twice their count: SQLite's ids, bar mass deletions); a
        lookup is then one read where a binary search over a memory-mapped million ids
        touched ~20 scattered cache lines per id."""
        if not len(self.ids) or len(self.ids) >= 2**31:
            return None
        low, span = int(self.ids[0]), int(self.ids[-1]) - int(self.ids[0]) + 1
        if span > 2 * len(self.ids):
            return None
        rows = np.full(span, -1, dtype=np.int32)
        rows[self.ids - low] = np.arange(len(self.ids), dtype=np.int32)
        return low, rows

    def _rows_of(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
        """Each id's row in ``ids``/``matrix``, or some row whose id differs (the caller
        compares)."""
        mapped = self._row_map
        if mapped is None:
            pos = np.searchsorted(self.ids, ids)
            return np.minimum(pos, len(self.ids) - 1)
        low, rows = mapped
        offset = np.clip(ids - low, 0, len(rows) - 1)
        return np.maximum(rows[offset], 0).astype(np.intp)

    def with_rows(
        self, ids: npt.NDArray[np.int64], vectors: npt.NDArray[np.float32]
    ) -> VectorTable:
        """This table with ``ids``' rows replaced (or added) by ``vectors``; a new table, so
        searches holding this one are undisturbed."""
        if not len(ids):
            return self
        ids = np.asarray(ids, dtype=np.int64)
        vectors = np.asarray(vectors, dtype=np.float32).reshape(len(ids), self.dim)
        keep = ~np.isin(self.newer_ids, ids)
        merged_ids = np.concatenate([self.newer_ids[keep], ids])
        merged = np.concatenate([self.newer[keep], vectors])
        order = np.argsort(merged_ids, kind="stable")
        table = VectorTable(
            ids=self.ids, matrix=self.matrix, newer_ids=merged_ids[order], newer=merged[order]
        )
        if "_row_map" in self.__dict__:  # the file's part is the same: keep its map
            table.__dict__["_row_map"] = self.__dict__["_row_map"]
        return table

    @staticmethod
    def save(
        path: Path,
        ids: npt.NDArray[np.int64],
        vectors: npt.NDArray[np.float32],
        *,
        version: int,
    ) -> None:
        """Write ``ids`` (sorted, unique) and their rows as the vectors file at store
        ``version``, atomically."""
        ids = np.ascontiguousarray(ids, dtype="<i8")
        vectors = np.ascontiguousarray(vectors, dtype="<f4")
        count, dim = vectors.shape
        if len(ids) != count:
            raise ValueError(f"{len(ids)} ids for {count} vectors")
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(_HEADER.pack(_MAGIC, int(version), count, dim))
            f.write(ids.tobytes())
            f.write(b"\0" * (_data_offset(count) - _HEADER.size - 8 * count))
            for start in range(0, count, 65_536):  # bounded temporary copies
                f.write(vectors[start : start + 65_536].tobytes())
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)  # readers never see a half-written file

    @classmethod
    def open(cls, path: Path, *, dim: int, count: int) -> tuple[VectorTable, int] | None:
        """``(table, version)`` memory-mapped from ``path``; None when it is missing, not
        a vectors file, not ``dim``-dimensional, or does not hold ``count`` rows."""
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(_HEADER.size)
            if len(head) < _HEADER.size:
                return None
            magic, version, rows, width = _HEADER.unpack(head)
            offset = _data_offset(rows)
            if magic != _MAGIC or width != dim or rows != count:
                return None
            if size != offset + 4 * rows * width:
                return None  # truncated or padded: not a file this module wrote
            if not rows:
                return cls.of(np.empty(0, np.int64), np.empty((0, dim), np.float32)), version
            ids = np.memmap(path, dtype="<i8", mode="r", offset=_HEADER.size, shape=(rows,))
            matrix = np.memmap(path, dtype="<f4", mode="r", offset=offset, shape=(rows, width))
        except (OSError, ValueError, struct.error):
            return None
        table = cls(
            ids=np.asarray(ids),
            matrix=np.asarray(matrix),
            newer_ids=np.empty(0, np.int64),
            newer=np.empty((0, dim), np.float32),
        )
        return table, int(version)

    @classmethod
    def open_current(
        cls,
        path: Path,
        *,
        dim: int,
        count: int,
        tag: int,
        stored: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float32]],
    ) -> VectorTable | None:
        """The vectors file at ``path`` if it belongs to the graph of ``count`` nodes tagged
        ``tag`` (:func:`matches_tag`) and :data:`CHECKED` of its rows, spread over it, equal
        the store's (``stored(ids)``: zero rows for ids deleted since); None otherwise."""
        opened = cls.open(path, dim=dim, count=count)
        if opened is None or not matches_tag(opened[1], tag):
            log.info("%s: no current vectors file; re-scoring from the store", path)
            return None
        table = opened[0]
        picks = np.linspace(0, len(table.ids) - 1, min(CHECKED, len(table.ids))).astype(int)
        sample = np.unique(table.ids[picks])
        rows = stored(sample)
        live = np.any(rows != 0, axis=1)
        if not np.array_equal(table.matrix[np.searchsorted(table.ids, sample)][live], rows[live]):
            log.warning("%s disagrees with the store; re-scoring from the store", path)
            return None
        return table

    def save_for(
        self, path: Path, keys: npt.NDArray[np.int64], *, version: int
    ) -> VectorTable | None:
        """Save the rows of graph node ``keys`` as the vectors file at store ``version`` and
        return it memory-mapped (file pages, not private memory); a key this table lacks is
        left out (the file then does not match the graph and is not used)."""
        keys = np.sort(np.asarray(keys, dtype=np.int64))
        rows, found = self.lookup(keys)
        if not found.all():
            keys, rows = keys[found], rows[found]
        self.save(path, keys, rows, version=version)
        del rows
        opened = self.open(path, dim=self.dim, count=len(keys))
        return opened[0] if opened is not None else None
