"""The use cases, once: index a folder, turn a query into a vector, search.

A :class:`Collection` is an index and the model that fills and queries it. The command line
and the server parse their input, call these, and print or answer; a library user gets the
same behaviour (EXIF read at indexing, the model opened while the folder is walked, queries of
text, an image and added or subtracted parts) with the same calls::

    with Collection.open("photos.db", PluginConfig(model=ModelConfig(path=...))) as photos:
        photos.index_folder("~/Pictures")
        for hit in photos.search("a dog on a beach", k=5):
            print(hit.score, hit.path)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.budget import PixelBudget
from themis_clip.config import PluginConfig
from themis_clip.errors import InputError, ModelError
from themis_clip.feed import DecodeAhead
from themis_clip.files import IMAGE_SUFFIXES
from themis_clip.index.indexer import IndexReport
from themis_clip.index.indexer import index_folder as _index_folder
from themis_clip.index.query import QueryMode, combine, search_page
from themis_clip.index.search import Hit, VectorIndex
from themis_clip.index.settings import GraphSettings
from themis_clip.index.where import Where
from themis_clip.loading import declared_preprocessor
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.preprocess.exif import read_exif
from themis_clip.vocabulary import ModelIdentity

__all__ = ["METADATA_VERSION", "Collection", "Query"]

log = logging.getLogger(__name__)

#: What a folder index records of each file beyond its vector (bump to re-read it).
METADATA_VERSION = "files+exif+companions-2"

_Vector = npt.NDArray[np.float32]


@dataclass(frozen=True, kw_only=True)
class Query:
    """A search query: a text, an image (a path or its bytes), or both, plus parts added to
    or subtracted from it. A part is an image where it names an existing file, else a text; a
    part that looks like a path (a separator or an image suffix) but names no file is an error.
    """

    text: str | None = None
    image: str | Path | bytes | None = None
    add: Sequence[str] = field(default_factory=tuple)
    subtract: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.text is None and self.image is None:
            raise InputError("give a text query, an image, or both")
        if self.text is not None and not self.text.strip():
            raise InputError("the text query is empty")


def open_plugin(
    config: PluginConfig, *, plugin: OnnxClipPlugin | None = None, lazy_textual: bool = False
) -> OnnxClipPlugin:
    """``plugin`` (or a new one) initialised for ``config``; raises :class:`ModelError`."""
    plugin = plugin or OnnxClipPlugin(lazy_textual=lazy_textual)
    if not plugin.initialize(config):
        raise ModelError(f"cannot initialise the model: {plugin.last_error}")
    return plugin


class Collection:
    """An index and its model.

    Args:
        index: an open :class:`VectorIndex`.
        plugin: the model, or a callable giving it (it may wait while the model opens: the
            folder is walked and its first images decode meanwhile).
        config: the plugin's configuration, where the model is still opening (its declared
            preprocessing lets images decode before the model is open).
        budget: the plugin's decoded-pixel budget (:meth:`OnnxClipPlugin.decode_budget`),
            where the model is still opening.
    """

    def __init__(
        self,
        index: VectorIndex,
        plugin: OnnxClipPlugin | Callable[[], OnnxClipPlugin],
        *,
        config: PluginConfig | None = None,
        budget: PixelBudget | None = None,
    ) -> None:
        self.index = index
        self._plugin = plugin
        self._config = config
        self._budget = budget
        self._closers: list[Callable[[], None]] = []

    @classmethod
    def open(
        cls,
        index: str | Path,
        config: PluginConfig,
        *,
        readonly: bool = False,
        settings: GraphSettings | None = None,
    ) -> Collection:
        """Open ``index`` (an SQLite file or a ``postgresql://`` URL) and start the model of
        ``config`` in the background; :meth:`close` (or ``with``) closes both. The text tower
        opens on its first use (indexing never needs it)."""
        plugin = OnnxClipPlugin(lazy_textual=True)
        budget = plugin.decode_budget(config)  # the images decoded ahead count against it
        opener = ThreadPoolExecutor(1, thread_name_prefix="themis-open")
        opening: Future[OnnxClipPlugin] = opener.submit(open_plugin, config, plugin=plugin)
        opener.shutdown(wait=False)
        try:
            vector_index = VectorIndex(str(index), readonly=readonly, settings=settings)
        except BaseException:
            _shut_when_open(opening)
            raise
        collection = cls(vector_index, opening.result, config=config, budget=budget)
        collection._closers += [lambda: _shut_when_open(opening), vector_index.close]
        return collection

    @property
    def plugin(self) -> OnnxClipPlugin:
        """The model (waits for it to open; raises what opening it raised)."""
        return self._plugin if isinstance(self._plugin, OnnxClipPlugin) else self._plugin()

    @property
    def identity(self) -> ModelIdentity:
        identity = self.plugin.model_identity
        if identity is None:
            raise ModelError("the model is not initialised")
        return identity

    def index_folder(
        self,
        folder: str | Path,
        *,
        progress: Callable[[int, int], None] | None = None,
        exclude: Sequence[str] = (),
    ) -> IndexReport:
        """Bring the index up to date with the images under ``folder`` (recursive,
        incremental, resumable): each file's folder, name, size, modification time and EXIF
        (taken, camera, GPS, upright size) are recorded beside its vector. NAS, system and
        trash files are skipped, and what matches a glob of ``exclude``
        (``report.skipped`` counts them by reason)."""
        folder = Path(folder).expanduser()
        if not folder.is_dir():
            raise InputError(f"not a folder: {folder}")
        config = self._config or self.plugin.config
        feed = None
        if config is not None:
            # decodes ahead share a pixel budget of the plugin's size, as its own decodes do
            early = declared_preprocessor(
                config, budget=PixelBudget(config.preprocess.pixel_budget)
            )
            if early is not None:
                window = (config.prefetch_batches + 1) * config.max_batch_size
                feed = DecodeAhead(
                    early, lambda: self.plugin, workers=config.preprocess_workers, window=window
                )
        try:
            return _index_folder(
                self.index,
                folder,
                feed if feed is not None else self.plugin,
                stamp=lambda: self.identity,
                chunk=4 * (config.max_batch_size if config is not None else 32),
                progress=progress,
                metadata=read_exif,
                metadata_version=METADATA_VERSION,
                prefetch=feed.prefetch if feed is not None else None,
                exclude=exclude,
            )
        finally:
            if feed is not None:
                feed.close()

    def query_vector(self, query: Query) -> _Vector:
        """The unit vector of ``query``: its text and image parts plus ``add``, less
        ``subtract`` (each part embedded and normalised, then summed and normalised)."""
        plugin = self.plugin
        parts = [(self._embed(plugin, query.text, None), 1.0)] if query.text is not None else []
        if query.image is not None:
            parts.append((self._embed(plugin, None, query.image), 1.0))
        parts += [(self._part(plugin, p), 1.0) for p in query.add]
        parts += [(self._part(plugin, p), -1.0) for p in query.subtract]
        return combine(parts)

    def search(
        self,
        query: Query | str,
        *,
        k: int = 10,
        filters: dict[str, Any] | None = None,
        where: Where | None = None,
        hybrid: bool = False,
    ) -> list[Hit]:
        """The ``k`` items nearest ``query`` (a :class:`Query` or a text), best first.

        ``hybrid`` fuses the vector ranking with a word match of the query's text.
        Raises :class:`~themis_clip.errors.IndexModelMismatchError` for an index made by
        another model.
        """
        if k < 1:
            raise InputError("k must be >= 1")
        query = Query(text=query) if isinstance(query, str) else query
        if hybrid and not query.text:
            raise InputError("a hybrid search needs a text query (its words are matched)")
        self.index.bind_model(self.identity)
        vector = self.query_vector(query)
        if not hybrid:
            return self.index.search(vector, k, filters, where=where)
        return search_page(
            self.index,
            mode=QueryMode.HYBRID,
            k=k,
            identity={},
            vector=vector,
            text=query.text,
            filters=filters,
            where=where,
        ).hits

    def close(self) -> None:
        """Close what :meth:`open` opened (a collection built from parts leaves them open)."""
        while self._closers:
            self._closers.pop()()

    def __enter__(self) -> Collection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @staticmethod
    def _embed(
        plugin: OnnxClipPlugin, text: str | None, image: str | Path | bytes | None
    ) -> _Vector:
        result = (
            plugin.generate_text_embedding(text)
            if text is not None
            else plugin.generate_embedding(image)  # type: ignore[arg-type]
        )
        if not result.ok or result.embedding is None:
            raise InputError(f"cannot embed the query: {result.error}")
        return result.embedding

    @classmethod
    def _part(cls, plugin: OnnxClipPlugin, value: str) -> _Vector:
        if Path(value).is_file():
            return cls._embed(plugin, None, value)
        if "/" in value or "\\" in value or Path(value).suffix.lower() in IMAGE_SUFFIXES:
            raise InputError(f"no image file {value} (an added or subtracted text has no path)")
        return cls._embed(plugin, value, None)


def _shut_when_open(opening: Future[OnnxClipPlugin]) -> None:
    """Shut the plugin down once it has opened (a failed opening has nothing to shut)."""
    if opening.exception() is None:
        opening.result().shutdown()
