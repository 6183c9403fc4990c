"""The vector store and the search use cases (never imports model code: it speaks vectors).

What a library user needs, imported on first use (so ``import themis_clip.index`` loads neither
Pillow nor ONNX Runtime): :class:`VectorIndex` (open an index by path or ``postgresql://`` URL,
search it), its hits and pages, the ``where`` filter language, and the stores beneath it.
:class:`themis_clip.collection.Collection` puts a model on top (embed, index a folder, search
by text or image).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from themis_clip.index.indexer import IndexReport, index_folder
    from themis_clip.index.query import Page, QueryMode, combine, search_page
    from themis_clip.index.relevance import Cut, CutResult
    from themis_clip.index.search import MAX_K, Hit, VectorIndex
    from themis_clip.index.stores import (
        Facets,
        ItemRow,
        Lexical,
        Store,
        StoredItem,
        drop_store,
        open_store,
    )
    from themis_clip.index.where import Where, parse_where, with_filters

# Where each exported name lives (the imports above are for type checkers only).
_HOMES = {
    "indexer": "IndexReport index_folder",
    "query": "Page QueryMode combine search_page",
    "relevance": "Cut CutResult",
    "search": "MAX_K Hit VectorIndex",
    "stores": "Facets ItemRow Lexical Store StoredItem drop_store open_store",
    "where": "Where parse_where with_filters",
}
_HOME_OF = {
    name: f"{__name__}.{module}" for module, names in _HOMES.items() for name in names.split()
}

__all__ = [
    "MAX_K",
    "Cut",
    "CutResult",
    "Facets",
    "Hit",
    "IndexReport",
    "ItemRow",
    "Lexical",
    "Page",
    "QueryMode",
    "Store",
    "StoredItem",
    "VectorIndex",
    "Where",
    "combine",
    "drop_store",
    "index_folder",
    "open_store",
    "parse_where",
    "search_page",
    "with_filters",
]


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
