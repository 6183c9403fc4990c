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
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.config import PluginConfig, SearchConfig
from themis_clip.errors import InputError, ModelError
from themis_clip.files import IMAGE_SUFFIXES
from themis_clip.index.indexer import IndexReport
from themis_clip.index.indexer import index_folder as _index_folder
from themis_clip.index.query import QueryMode, combine, search_page
from themis_clip.index.relevance import (
    Cut,
    CutResult,
    WeakLine,
    cut_ranked,
    measure_weak_line,
    random_texts,
)
from themis_clip.index.search import Hit, VectorIndex
from themis_clip.index.where import Where, with_filters
from themis_clip.loading import load_ocr
from themis_clip.ocr import OCREngine
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.preprocess.exif import read_exif
from themis_clip.vocabulary import ModelIdentity

__all__ = [
    "MAX_MEASURED_ITEMS",
    "METADATA_VERSION",
    "SORTS",
    "Collection",
    "Matches",
    "Query",
    "browse",
    "choose_cut",
    "cut_matches",
    "lexical",
    "sort_hits",
    "weak_line",
]

log = logging.getLogger(__name__)

#: What a folder index records of each file beyond its vector (bump to re-read it).
METADATA_VERSION = "files+exif+companions-3"

_Vector = npt.NDArray[np.float32]

#: Orders of a result set: by score, by capture time (oldest or newest first), by file time
#: (newest first), by file name.
SORTS = ("score", "taken", "-taken", "mtime", "name")
#: Above this many items no line is measured for the cut (loading every vector to sample them
#: would cost more than it tells); ``auto`` then keeps every hit.
MAX_MEASURED_ITEMS = 200_000


@dataclass(frozen=True, kw_only=True)
class Matches(Sequence[Hit]):
    """The hits of a search (a sequence of :class:`Hit`), where the ranking was cut and why,
    and how many weaker hits the cut left out."""

    hits: list[Hit]
    weaker: int = 0
    cut: CutResult | None = None

    def __len__(self) -> int:
        return len(self.hits)

    def __getitem__(self, i: Any) -> Any:
        return self.hits[i]


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
        plugin: the model, initialised or opening in another thread for ``config``.
        config: the configuration ``plugin`` is opening with; its declared preprocessing lets
            the folder's images decode while the model still opens.
        ready: waits until ``plugin`` is open and raises what opening it raised.
    """

    def __init__(
        self,
        index: VectorIndex,
        plugin: OnnxClipPlugin,
        *,
        config: PluginConfig | None = None,
        ready: Callable[[], object] | None = None,
    ) -> None:
        self.index = index
        self._plugin = plugin
        self._config = config
        self._ready = ready
        self._closers: list[Callable[[], None]] = []
        self._lines: dict[tuple[str, int], WeakLine | None] = {}
        self._ocr: OCREngine | None = None

    @classmethod
    def open(
        cls,
        index: str | Path,
        config: PluginConfig,
        *,
        readonly: bool = False,
        settings: SearchConfig | None = None,
    ) -> Collection:
        """Open ``index`` (an SQLite file or a ``postgresql://`` URL) and start the model of
        ``config`` in the background; :meth:`close` (or ``with``) closes both. The text tower
        opens on its first use (indexing never needs it)."""
        plugin = OnnxClipPlugin(lazy_textual=True)
        opener = ThreadPoolExecutor(1, thread_name_prefix="themis-open")
        opening: Future[OnnxClipPlugin] = opener.submit(open_plugin, config, plugin=plugin)
        opener.shutdown(wait=False)
        try:
            vector_index = VectorIndex(str(index), readonly=readonly, settings=settings)
        except BaseException:
            _shut_when_open(opening)
            raise
        collection = cls(vector_index, plugin, config=config, ready=opening.result)
        collection._closers += [lambda: _shut_when_open(opening), vector_index.close]
        return collection

    @property
    def plugin(self) -> OnnxClipPlugin:
        """The model (waits for it to open; raises what opening it raised)."""
        if self._ready is not None:
            self._ready()
        return self._plugin

    @property
    def identity(self) -> ModelIdentity:
        identity = self.plugin.model_identity
        if identity is None:
            raise ModelError("the model is not initialised")
        return identity

    @property
    def ocr(self) -> OCREngine:
        """The OCR engine of the configuration's ``ocr`` section, opened on first use on the
        model's backend (closed with the collection)."""
        if self._ocr is None:
            config = self._config or self.plugin.config
            if config is None:
                raise ModelError("the model is not initialised")
            self._ocr = load_ocr(config)
            self._closers.insert(0, self._ocr.close)
        return self._ocr

    def index_folder(
        self,
        folder: str | Path,
        *,
        progress: Callable[[int, int], None] | None = None,
        exclude: Sequence[str] = (),
        ocr: bool | None = None,
    ) -> IndexReport:
        """Bring the index up to date with the images under ``folder`` (recursive,
        incremental, resumable): each file's folder, name, size, modification time and EXIF
        (taken, camera, GPS, upright size) are recorded beside its vector. NAS, system and
        trash files are skipped, and what matches a glob of ``exclude``
        (``report.skipped`` counts them by reason).

        ``ocr`` (None: the configuration's ``ocr.enabled``) also reads the text in every
        item under ``folder`` that has none read yet (new and changed files, and on an index
        built without it all of them, with no embedding again); lexical search finds it."""
        folder = Path(folder).expanduser()
        if not folder.is_dir():
            raise InputError(f"not a folder: {folder}")
        config = self._config or self.plugin.config
        reader = None
        if ocr if ocr is not None else (config is not None and config.ocr.enabled):
            engine = self.ocr  # opened before the walk: a missing model fails first

            def reader(path: Path) -> dict[str, Any]:
                return engine.read_text(path).to_json()

        try:
            return _index_folder(
                self.index,
                folder,
                self._plugin,  # its batch calls come after stamp(), which waits for it
                stamp=lambda: self.identity,
                chunk=4 * (config.max_batch_size if config is not None else 32),
                progress=progress,
                metadata=read_exif,
                metadata_version=METADATA_VERSION,
                prefetch=lambda paths: self._plugin.prefetch(paths, config),
                exclude=exclude,
                read_text=reader,
            )
        finally:
            self._plugin.prefetch(())

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
        cut: Cut | str | float | None = None,
        sort: str = "score",
    ) -> Matches:
        """The ``k`` items nearest ``query`` (a :class:`Query` or a text), best first.

        ``hybrid`` fuses the vector ranking with a word match of the query's text. ``cut``
        ends the ranking where relevance ends (:func:`choose_cut`): ``auto`` (the default for
        a query made of texts only, not hybrid), ``none`` (the default otherwise) or a score.
        ``sort`` orders the matches: ``score``, ``taken`` / ``-taken`` (capture time, oldest /
        newest first; undated last), ``mtime`` (newest file first) or ``name``. ``filters``
        (each top-level key equal to its JSON value) are sugar for ``where``: both must hold.
        Raises :class:`~themis_clip.errors.IndexModelMismatchError` for an index made by
        another model.
        """
        if k < 1:
            raise InputError("k must be >= 1")
        if sort not in SORTS:
            raise InputError(f"sort {sort!r}: one of {', '.join(SORTS)}")
        query = Query(text=query) if isinstance(query, str) else query
        if hybrid and not query.text:
            raise InputError("a hybrid search needs a text query (its words are matched)")
        texts_only = query.image is None and not any(
            Path(p).is_file() for p in (*query.add, *query.subtract)
        )
        chosen = choose_cut(cut, texts_only=texts_only and not hybrid)
        where = with_filters(filters, where)
        self.index.bind_model(self.identity)
        vector = self.query_vector(query)
        if hybrid:
            hits = search_page(
                self.index,
                mode=QueryMode.HYBRID,
                k=k,
                identity={},
                vector=vector,
                text=query.text,
                where=where,
            ).hits
        else:
            hits = self.index.search(vector, k, where=where)
        return cut_matches(hits, chosen, self.line() if chosen.auto else None, sort=sort)

    def browse(
        self,
        *,
        k: int = 100,
        filters: dict[str, Any] | None = None,
        where: Where | None = None,
        sort: str = "score",
    ) -> Matches:
        """:func:`browse` of this collection's index (no model needed)."""
        return browse(self.index, k=k, filters=filters, where=where, sort=sort)

    def line(self) -> WeakLine | None:
        """Where matches end for this model on this index (random texts' 99th percentile),
        measured once per model and index version; None for an empty or very large index."""
        identity = self.identity
        key = (identity.model_id, self.index.store.write_version)
        if key not in self._lines:
            self._lines.clear()
            self._lines[key] = self._measure_line(identity)
        return self._lines[key]

    def _measure_line(self, identity: ModelIdentity) -> WeakLine | None:
        if not 0 < self.index.store.count() <= MAX_MEASURED_ITEMS:
            return None  # before embedding the texts: the line would not be measured
        results = self.plugin.generate_text_embedding_batch(random_texts())
        vectors = [r.embedding for r in results if r.ok and r.embedding is not None]
        if len(vectors) != len(results):
            return None
        return weak_line(self.index, np.stack(vectors), identity.dim)

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
            if Path(value).is_dir():
                raise InputError(
                    f"{value} is a folder, not an image file: an added or subtracted part is "
                    "one image file or a text"
                )
            raise InputError(f"no image file {value} (an added or subtracted text has no path)")
        return cls._embed(plugin, value, None)


def browse(
    index: VectorIndex,
    *,
    k: int = 100,
    filters: dict[str, Any] | None = None,
    where: Where | None = None,
    sort: str = "score",
) -> Matches:
    """The items of ``index`` that match ``filters`` and ``where`` (no query), in ``sort``
    order: ``score`` (the default: the library newest first, by capture time, else file time),
    ``-taken`` / ``taken`` (capture time newest / oldest first; items without one last in
    both), ``mtime`` (newest file first) or ``name``."""
    page = search_page(
        index,
        mode=QueryMode.BROWSE,
        k=k,
        identity={},
        where=with_filters(filters, where),
        order="newest" if sort == "score" else sort,
    )
    return Matches(hits=page.hits)


def lexical(
    index: VectorIndex,
    text: str,
    *,
    k: int = 10,
    filters: dict[str, Any] | None = None,
    where: Where | None = None,
    sort: str = "score",
) -> Matches:
    """The items of ``index`` whose file name, path, string metadata or text read in the
    picture (OCR, by substring: ``bucks`` finds ``STARBUCKS``) hold every word of ``text``,
    best first, each with the OCR lines that matched (no model needed)."""
    if k < 1:
        raise InputError("k must be >= 1")
    if sort not in SORTS:
        raise InputError(f"sort {sort!r}: one of {', '.join(SORTS)}")
    page = search_page(
        index,
        mode=QueryMode.LEXICAL,
        k=k,
        identity={},
        text=text,
        where=with_filters(filters, where),
    )
    return Matches(hits=sort_hits(page.hits, sort))


def choose_cut(
    cut: Cut | str | float | None,
    *,
    texts_only: bool,
    line: WeakLine | None = None,
    later_page: bool = False,
) -> Cut:
    """The cut a search applies: ``cut`` as given (a :class:`Cut`, ``auto``, ``none`` or a
    score); when none is given, ``auto`` for a vector search made of texts only (the line is
    measured with texts) and ``none`` otherwise (images, fused ranks, browsing). A later page
    of an ``auto`` search ends at the ``line`` only: its first page ended at no gap."""
    chosen = cut if isinstance(cut, Cut) else Cut.parse(cut)
    if cut is None and not texts_only:
        chosen = Cut(auto=False)
    if later_page and chosen.auto:
        chosen = Cut(auto=False, score=line.score) if line is not None else Cut(auto=False)
    return chosen


def cut_matches(
    hits: list[Hit], cut: Cut, line: WeakLine | None, *, sort: str = "score"
) -> Matches:
    """The matches of ``hits`` (best first) under ``cut`` and this index's ``line``, in
    ``sort`` order (:func:`sort_hits`)."""
    result = cut_ranked([h.score for h in hits], cut, line)
    kept = hits[: result.kept]
    return Matches(hits=sort_hits(kept, sort), weaker=len(hits) - len(kept), cut=result)


def weak_line(index: VectorIndex, texts: npt.NDArray[np.float32], dim: int) -> WeakLine | None:
    """Where matches end on ``index`` for the model whose embeddings of
    :func:`~themis_clip.index.relevance.random_texts` are ``texts`` (``dim`` wide); None for
    an empty index or one of more than :data:`MAX_MEASURED_ITEMS`."""
    if not 0 < index.store.count() <= MAX_MEASURED_ITEMS:
        return None
    _, images = index.store.load_vectors(dim)
    return measure_weak_line(texts, images)


def sort_hits(hits: list[Hit], sort: str) -> list[Hit]:
    """``hits`` in the order ``sort`` names (stable: equal keys keep their rank)."""
    if sort == "score":
        return hits

    def meta(hit: Hit, key: str) -> Any:
        return (hit.metadata or {}).get(key)

    if sort in ("taken", "-taken"):
        dated = [h for h in hits if isinstance(meta(h, "taken"), str)]
        undated = [h for h in hits if not isinstance(meta(h, "taken"), str)]
        dated.sort(key=lambda h: str(meta(h, "taken"))[:19], reverse=sort == "-taken")
        return dated + undated
    if sort == "mtime":
        return sorted(hits, key=lambda h: -_timestamp(meta(h, "mtime")))
    return sorted(hits, key=lambda h: (str(meta(h, "name") or h.path or h.key).lower(), h.key))


def _timestamp(value: Any) -> float:
    """Seconds of a metadata time (ISO text or a number); 0 where there is none."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        stamp = datetime.fromisoformat(str(value))
    except ValueError:
        return 0.0
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


def _shut_when_open(opening: Future[OnnxClipPlugin]) -> None:
    """Shut the plugin down once it has opened (a failed opening has nothing to shut)."""
    if opening.exception() is None:
        opening.result().shutdown()
