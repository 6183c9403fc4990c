"""Search plans: what the tuners measured (what they are asked for is
:class:`~themis_clip.config.SearchConfig`).

A leaf module (the standard library and the package's leaves only: errors, jsonio,
vocabulary): the stores, the searchers, the tuners, the CLI and the server all read these
types, and none of them is imported here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from themis_clip.jsonio import loads
from themis_clip.vocabulary import GraphDType

__all__ = ["GraphDType", "SearchKind", "SearchPlan"]


class SearchKind(StrEnum):
    """How a search runs: exactly, on our HNSW graph, or on pgvector's HNSW index."""

    EXACT = "exact"
    HNSW = "hnsw"
    PGVECTOR = "pgvector"


@dataclass(frozen=True, kw_only=True)
class SearchPlan:
    """What a tuner measured and chose for a collection of ``items`` vectors."""

    kind: SearchKind
    items: int
    reason: str
    exact_p50_ms: float | None = None
    dtype: GraphDType | None = None
    connectivity: int | None = None
    expansion_add: int | None = None
    expansion_search: int | None = None
    recall_at_10: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    graph_bytes_per_item: float | None = None
    target_recall: float = 0.98
    tuning_s: float = 0.0
    steps: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", SearchKind(self.kind))  # ValueError: not a plan
        if self.dtype is not None:
            object.__setattr__(self, "dtype", GraphDType(self.dtype))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> SearchPlan | None:
        """The plan recorded as ``text``; None when there is none, or it is from another
        version (the tuner then measures again)."""
        if not text:
            return None
        try:
            data = loads(text)
            return cls(**data) if isinstance(data, dict) else None
        except (ValueError, TypeError):
            return None
