"""Load precomputed embeddings (``(path, model_id, vector)`` rows) into an index."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from themis_clip.errors import IndexModelMismatchError
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow
from themis_clip.vocabulary import ModelIdentity

__all__ = ["check_origin", "import_embeddings"]

_CHUNK = 10_000


def check_origin(
    rows: Sequence[tuple[str, str, npt.NDArray[np.float32]]],
    stamp: ModelIdentity,
    *,
    source: str = "the input",
) -> None:
    """Raise :class:`IndexModelMismatchError` unless every row was made by ``stamp``'s model."""
    foreign = {m for _, m, _ in rows if m != stamp.model_id}
    if foreign:
        raise IndexModelMismatchError(
            f"{source} holds embeddings of {', '.join(sorted(foreign))}, not of "
            f"{stamp.model_id}: load the same model with --model, or re-embed"
        )


def import_embeddings(
    index: VectorIndex,
    rows: Sequence[tuple[str, str, npt.NDArray[np.float32]]],
    stamp: ModelIdentity,
    *,
    source: str = "the input",
) -> int:
    """Store ``rows`` made by the model ``stamp`` names; return how many were stored.

    Rows keep their file's size and mtime when the file exists, so a later folder run sees
    them as unchanged. One transaction per 10,000 rows.

    Raises:
        IndexModelMismatchError: a row was made by another model, or the index holds another
            model's vectors. Nothing is written then.
    """
    check_origin(rows, stamp, source=source)
    index.bind_model(stamp)
    items = []
    for path, _, vector in rows:
        st = Path(path).stat() if Path(path).exists() else None
        items.append(
            ItemRow(
                key=path,
                path=path,
                vector=vector,
                size=st.st_size if st else None,
                mtime_ns=st.st_mtime_ns if st else None,
            )
        )
    for start in range(0, len(items), _CHUNK):
        index.store.upsert(items[start : start + _CHUNK], dim=stamp.dim)
    return len(items)
