"""Embedding large collections on Ray Data (extra ``[ray]``): one plugin per actor.

:class:`ImageBatchEmbedder` and :class:`TextBatchEmbedder` are Ray Data callable classes for
``Dataset.map_batches(..., compute=ActorPoolStrategy(size=N))``: each actor builds one
:class:`OnnxClipPlugin` from the config it is given and embeds whole batches (paths or bytes;
texts). Every input row comes
back with ``ok``/``error``: failed items are recorded, never dropped. :func:`embed_dataset` is the
``themis-clip embed-dataset`` job: list the inputs, skip those already embedded in the output,
run the actor pool, and append Parquet files to the output folder.

Pointing the same job at a cluster is a matter of the address: ``ray://head:10001``, ``auto``
(a cluster this machine has joined) or ``RAY_ADDRESS`` in the environment (the CLI reads it).
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from themis_clip.config import PluginConfig
from themis_clip.index.indexer import IMAGE_SUFFIXES, walk_images
from themis_clip.plugin import OnnxClipPlugin

__all__ = [
    "DatasetReport",
    "ImageBatchEmbedder",
    "TextBatchEmbedder",
    "embed_dataset",
    "list_inputs",
]

log = logging.getLogger(__name__)


class _Embedder:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.plugin = OnnxClipPlugin()
        if not self.plugin.initialize(PluginConfig.from_dict(dict(config))):
            raise RuntimeError(f"cannot load the model on this actor: {self.plugin.last_error}")
        identity = self.plugin.model_identity
        assert identity is not None
        self.model_id = identity.model_id
        self.dim = identity.embedding_dim

    def _columns(self, batch: dict[str, Any], results: list[Any]) -> dict[str, Any]:
        vectors = np.full((len(results), self.dim), np.nan, dtype=np.float32)
        for i, r in enumerate(results):
            if r.ok:
                vectors[i] = r.embedding
        return {
            **batch,
            "embedding": vectors,
            "ok": np.array([r.ok for r in results], dtype=bool),
            "error": np.array([r.error or "" for r in results], dtype=object),
            "model_id": np.array([self.model_id] * len(results), dtype=object),
        }


class ImageBatchEmbedder(_Embedder):
    """Ray Data callable: ``path`` (or ``bytes``) column → plus embedding/ok/error/model_id."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        column = "bytes" if "bytes" in batch else "path"
        items = [bytes(x) if column == "bytes" else str(x) for x in batch[column]]
        return self._columns(batch, self.plugin.generate_embedding_batch(items))


class TextBatchEmbedder(_Embedder):
    """Ray Data callable: a batch with ``text`` → plus embedding/ok/error/model_id."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._columns(
            batch, self.plugin.generate_text_embedding_batch([str(t) for t in batch["text"]])
        )


def list_inputs(source: str) -> list[str]:
    """Image paths from a folder (recursive), a glob, or a Parquet/CSV with a ``path`` column."""
    path = Path(source)
    if path.is_dir():
        return [str(p) for p in walk_images(path.resolve())]
    if path.suffix.lower() in (".parquet", ".csv") and path.is_file():
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        table = pq.read_table(path) if path.suffix.lower() == ".parquet" else pacsv.read_csv(path)
        if "path" not in table.column_names:
            raise ValueError(
                f"{source} has no 'path' column (columns: {', '.join(table.column_names)})"
            )
        base = path.parent
        return [str(p if os.path.isabs(p) else base / p) for p in table.column("path").to_pylist()]
    matches = sorted(
        p for p in glob.glob(source, recursive=True) if Path(p).suffix.lower() in IMAGE_SUFFIXES
    )
    if not matches:
        raise ValueError(
            f"no images found for {source!r} (a folder, a glob, or a .parquet/.csv listing)"
        )
    return [str(Path(p).resolve()) for p in matches]


def done_paths(output: Path) -> set[str]:
    """Paths already recorded (embedded or failed) in the output folder's Parquet files."""
    if not output.is_dir() or not any(output.glob("*.parquet")):
        return set()
    import pyarrow.dataset as pads

    table = pads.dataset(str(output), format="parquet").to_table(columns=["path"])
    return set(table.column("path").to_pylist())


@dataclass(frozen=True, kw_only=True)
class DatasetReport:
    listed: int
    skipped: int
    embedded: int
    failed: int
    seconds: float
    actors: int

    @property
    def rate(self) -> float:
        return (self.embedded + self.failed) / self.seconds if self.seconds else 0.0


def embed_dataset(
    source: str,
    output: Path,
    config: Mapping[str, Any],
    *,
    address: str | None = None,
    actors: int = 1,
    batch_size: int = 64,
    num_cpus_per_actor: float = 1.0,
    num_gpus_per_actor: float = 0.0,
) -> DatasetReport:
    """Embed the images of ``source`` into Parquet files under ``output`` on Ray.

    Args:
        source: a folder, a glob, or a Parquet/CSV listing with a ``path`` column.
        output: folder of Parquet files; items already recorded there (embedded or failed) are
            skipped, so an interrupted or repeated run only does what is left.
        config: the plugin config as a JSON-like mapping (shipped to every actor).
        address: ``None``/``"local"`` starts a local Ray; ``"auto"`` or ``ray://host:port``
            joins a cluster.
        actors: actor pool size (one plugin each).
        batch_size: items per ``map_batches`` call (and per model call on the actor).
        num_cpus_per_actor, num_gpus_per_actor: resources each actor reserves.
    """
    import ray

    t0 = time.perf_counter()
    paths = list_inputs(source)
    done = done_paths(output)
    todo = [p for p in paths if p not in done]
    listed, skipped = len(paths), len(paths) - len(todo)
    if not todo:
        return DatasetReport(
            listed=listed,
            skipped=skipped,
            embedded=0,
            failed=0,
            seconds=time.perf_counter() - t0,
            actors=actors,
        )
    started_here = not ray.is_initialized()
    if started_here:
        if address in (None, "local"):
            ray.init(
                num_cpus=max(int(actors * num_cpus_per_actor), 1),
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        blocks = max(actors * 4, len(todo) // max(batch_size, 1))
        items = ray.data.from_items([{"path": p} for p in todo], override_num_blocks=blocks)
        embedded = items.map_batches(
            ImageBatchEmbedder,
            fn_constructor_kwargs={"config": dict(config)},
            batch_size=batch_size,
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=num_cpus_per_actor,
            num_gpus=num_gpus_per_actor,
            batch_format="numpy",
        )
        output.mkdir(parents=True, exist_ok=True)
        embedded.map_batches(_to_lists, batch_format="pyarrow").write_parquet(str(output))
    finally:
        if started_here:
            ray.shutdown()
    import pyarrow.dataset as pads

    table = pads.dataset(str(output), format="parquet").to_table(columns=["path", "ok"])
    status = dict(
        zip(table.column("path").to_pylist(), table.column("ok").to_pylist(), strict=True)
    )
    ok = sum(1 for p in todo if status.get(p))
    return DatasetReport(
        listed=listed,
        skipped=skipped,
        embedded=ok,
        failed=len(todo) - ok,
        seconds=time.perf_counter() - t0,
        actors=actors,
    )


def _to_lists(table: Any) -> Any:
    """Store embeddings as a float32 list column (NaN rows become nulls)."""
    import pyarrow as pa

    vectors = table.column("embedding").to_numpy(zero_copy_only=False)
    rows = [
        None
        if not np.isfinite(np.asarray(v, dtype=np.float32)).all()
        else np.asarray(v, np.float32)
        for v in vectors
    ]
    column = pa.array(
        [r.tolist() if r is not None else None for r in rows], type=pa.list_(pa.float32())
    )
    return table.set_column(table.column_names.index("embedding"), "embedding", column)


def read_embeddings(output: Path) -> list[tuple[str, str, np.ndarray]]:
    """``(path, model_id, embedding)`` of every successfully embedded row in ``output``."""
    import pyarrow.dataset as pads

    if not output.exists():
        raise FileNotFoundError(f"no embeddings at {output}")
    table = pads.dataset(str(output), format="parquet").to_table(
        columns=["path", "model_id", "embedding", "ok"]
    )
    rows = []
    for path, model_id, vector, ok in zip(
        *(table.column(c).to_pylist() for c in ("path", "model_id", "embedding", "ok")), strict=True
    ):
        if ok and vector is not None:
            rows.append((path, model_id, np.asarray(vector, dtype=np.float32)))
    return rows
