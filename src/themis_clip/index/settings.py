"""Search settings and plans: what the tuners are asked for and what they measured.

A leaf module (the standard library and the package's leaves only: errors, jsonio,
vocabulary): the stores, the searchers, the tuners, the CLI and the server all read these
types, and none of them is imported here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from themis_clip.errors import ConfigError
from themis_clip.jsonio import loads
from themis_clip.vocabulary import GraphDType

__all__ = ["GraphDType", "GraphSettings", "SearchKind", "SearchPlan"]


class SearchKind(StrEnum):
    """How a search runs: exactly, on our HNSW graph, or on pgvector's HNSW index."""

    EXACT = "exact"
    HNSW = "hnsw"
    PGVECTOR = "pgvector"


@dataclass(frozen=True, kw_only=True)
class GraphSettings:
    """How the tuner searches (``search`` section of the config; the defaults suit embeddings).

    Attributes:
        target_recall: recall@10 against exact search that a graph must reach.
        dtype: the graph's vector type, ``i8`` (default), ``f16`` or ``f32``. With i8 and f16 the
            top candidates are re-scored exactly from the stored float32 vectors. i8 is the
            default because it is the smallest and, re-scored, as accurate per breadth and the
            fastest (1M embedding-like vectors: 661 vs 1,173 B/item, 2.2 vs 3.7 ms at recall
            0.985-0.987; 768- and 1152-d alike; bench/RESULTS.md).
        rescore: candidates fetched per requested result and re-scored (f16, i8).
        sample: index members held out of the graph as tuning queries (at most a fifth).
        exact_fast_ms: exact search at or below this latency is kept without building a graph.

    Raises:
        ConfigError: a value out of range, or a dtype that is not one of :class:`GraphDType`.
    """

    target_recall: float = 0.98
    dtype: GraphDType = GraphDType.I8
    rescore: int = 3
    sample: int = 1000
    exact_fast_ms: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.target_recall <= 1:
            raise ConfigError(
                f"{self.target_recall}: expected 0 < r <= 1", key="search.target_recall"
            )
        try:
            object.__setattr__(self, "dtype", GraphDType(self.dtype))
        except ValueError:
            raise ConfigError(
                f"graph dtype {self.dtype!r}: expected one of {', '.join(GraphDType)}",
                key="search.graph_dtype",
            ) from None
        if self.rescore < 1 or self.sample < 10:
            raise ConfigError("rescore >= 1 and sample >= 10 are required")

    def fetch(self, k: int, dtype: str) -> int:
        """Candidates to ask the graph for, for ``k`` results."""
        return k if dtype == GraphDType.F32 else k * self.rescore


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
