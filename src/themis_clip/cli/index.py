"""``index`` and ``search``: keep an index of a folder (or of embed-dataset output) and query it."""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from themis_clip import jsonio
from themis_clip.budget import PixelBudget
from themis_clip.cli.common import (
    CLIError,
    config_from,
    graph_settings,
    index_args,
    index_location,
    model_args,
    progress_bar,
    shown,
    stamp_of,
    start_plugin,
)
from themis_clip.errors import WhereError
from themis_clip.feed import DecodeAhead
from themis_clip.files import file_lock
from themis_clip.index.indexer import IndexReport, index_folder
from themis_clip.index.query import QueryMode, combine, search_page
from themis_clip.index.search import Hit, VectorIndex
from themis_clip.index.stores.base import is_url
from themis_clip.index.where import Where, parse_where
from themis_clip.loading import declared_preprocessor
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.preprocess.exif import read_exif


def register(sub: Any) -> None:
    p = sub.add_parser("index", help="index the images under a folder (incremental, resumable)")
    p.add_argument("folder")
    index_args(p)
    p.add_argument("--rebuild", action="store_true", help="delete the index first")
    p.add_argument(
        "--from-parquet", action="store_true", help="FOLDER holds embed-dataset Parquet output"
    )
    model_args(p)
    p.set_defaults(func=_cmd_index)

    p = sub.add_parser("search", help="search an index by text or by image")
    p.add_argument("query", nargs="?", help="text query")
    p.add_argument("--image", help="image file query (image -> image)")
    p.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="TEXT",
        help="add a text (or an image file) to the query",
    )
    p.add_argument(
        "--subtract",
        action="append",
        default=[],
        metavar="TEXT",
        help="subtract a text (or an image file) from the query (weight -1)",
    )
    p.add_argument(
        "--hybrid",
        action="store_true",
        help="also match the words of TEXT in file names, paths and metadata (fused by rank)",
    )
    p.add_argument("-k", type=int, default=10, help="number of results (default 10)")
    p.add_argument("--filter", action="append", default=[], help="metadata KEY=VALUE (JSON value)")
    p.add_argument(
        "--where",
        type=where_arg,
        action=_Once,
        help='a filter in the where language, e.g. \'{"taken": {"$gte": "2023-07-01"}}\'',
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    index_args(p)
    model_args(p)
    p.set_defaults(func=_cmd_search)


def _cmd_index(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    if not folder.is_dir():
        raise CLIError(f"not a folder: {folder}")
    args.index = index_location(args)
    with ExitStack() as held:
        if not is_url(args.index):
            # One writer per index file: a second run would embed every new file again beside
            # the first (and, on a new index, race it for the schema).
            try:
                held.enter_context(file_lock(Path(args.index + ".lock"), timeout_s=0))
            except TimeoutError:
                raise CLIError(
                    f"another `themis-clip index` is updating {args.index}; "
                    "run this one when it ends"
                ) from None
        return _index(args, folder)


def _index(args: argparse.Namespace, folder: Path) -> int:
    if args.from_parquet:
        return _index_from_parquet(args, folder)
    settings = graph_settings(args)
    if args.rebuild:
        VectorIndex.remove(args.index)
    config = config_from(args)
    # An index this run creates is removed again if the model never opens (an empty file
    # with no model bound was left behind, which a later search called "open read-only").
    fresh = not is_url(args.index) and not Path(args.index).exists()
    # decodes ahead share a pixel budget of the plugin's size, as the plugin's own decodes do
    early = declared_preprocessor(config, budget=PixelBudget(config.preprocess.pixel_budget))
    # The session opens (image tower only) in a thread while the folder is walked and hashed
    # and, where the model declares its preprocessing, its first images decode.
    with ThreadPoolExecutor(1, thread_name_prefix="themis-open") as opener:
        opening = opener.submit(start_plugin, args, config, lazy_textual=True)
        feed = None
        if early is None:  # nothing to decode before the model: open it first, as before
            opening.result()
        else:
            batch = config.max_batch_size
            window = (config.prefetch_batches + 1) * batch
            feed = DecodeAhead(
                early, opening.result, workers=config.preprocess_workers, window=window
            )
        try:
            with VectorIndex(args.index, settings=settings) as index:
                update, bar = progress_bar("indexing")
                with bar:
                    report = index_folder(
                        index,
                        folder,
                        feed if feed is not None else opening.result(),
                        stamp=lambda: stamp_of(opening.result()),
                        chunk=4 * config.max_batch_size,
                        progress=update,
                        metadata=read_exif,  # taken, camera, gps, upright width/height
                        metadata_version="files+exif-1",
                        prefetch=feed.prefetch if feed is not None else None,
                    )
                _prepare_graph(index)
        except BaseException:
            if fresh and opening.done() and opening.exception() is not None:
                VectorIndex.remove(args.index)
            raise
        finally:
            if feed is not None:
                feed.close()
            if opening.exception() is None:
                opening.result().shutdown()
    _print_report(report, args.index)
    return 1 if report.failed else 0  # the rest is indexed; exit 1 says some files were not


def _print_report(report: IndexReport, index_path: str) -> None:
    print(
        f"{index_path}: {report.added} added, {report.updated} updated, "
        f"{report.unchanged} unchanged, "
        f"{report.renamed} renamed, {report.duplicates} duplicates, {report.removed} removed, "
        f"{len(report.failed)} unreadable ({report.seconds:.1f} s)"
    )
    for path, error in report.failed:
        print(f"  skipped {shown(path)}: {shown(error)}")


def _prepare_graph(index: VectorIndex) -> None:
    """Measure (and build) the search graph once here, so later searches never wait for one;
    a progress bar follows each graph build, and the measured plan is printed."""
    update, bar = progress_bar("search graph", unit="vec")
    phases: list[str] = []

    def progress(phase: str, done: int, total: int) -> None:
        if not phases or phases[-1] != phase:
            phases.append(phase)
            bar.reset(total=total)
            bar.set_description(phase)
        update(done, total)

    index.progress = progress
    try:
        with bar:
            built = index.prepare_graph()
    finally:
        index.progress = None
    plan = index.plan
    if plan is not None:
        verb = "built and saved" if built else "kept"
        what = "exact search" if plan.kind == "exact" else f"HNSW graph ({plan.dtype})"
        print(f"search: {what} {verb}: {plan.reason}", file=sys.stderr)


def _index_from_parquet(args: argparse.Namespace, folder: Path) -> int:
    from themis_clip.distributed import read_embeddings
    from themis_clip.index.importer import check_origin, import_embeddings

    rows = read_embeddings(folder)
    # the model whose identity the index records, and must match
    plugin = start_plugin(args, lazy_textual=True)
    try:
        stamp = stamp_of(plugin)
    finally:
        plugin.shutdown()
    check_origin(rows, stamp, source=str(folder))  # before anything is removed or written
    settings = graph_settings(args)
    if args.rebuild:
        VectorIndex.remove(args.index)
    with VectorIndex(args.index, settings=settings) as index:
        loaded = import_embeddings(index, rows, stamp, source=str(folder))
        _prepare_graph(index)
        total = index.store.count()
    print(f"{args.index}: {loaded} embeddings loaded from {folder} ({total} items in the index)")
    return 0


def _cmd_search(args: argparse.Namespace) -> int:
    if args.k < 1:
        raise CLIError("-k must be >= 1")
    if args.query is None and args.image is None:
        raise CLIError("give a text query, --image FILE, or both")
    if args.query is not None and not args.query.strip():
        raise CLIError("the text query is empty")
    if args.hybrid and not args.query:
        raise CLIError("--hybrid needs a text query (its words are matched)")
    filters = _parse_filters(args.filter) or None
    with VectorIndex(index_location(args) or "", readonly=True) as index:
        plugin = start_plugin(args, lazy_textual=True)
        try:
            index.bind_model(stamp_of(plugin))  # refuses an index made by another model
            parts = [  # TEXT and --image together: both parts of one query (rclip's --add)
                (_query_vector(plugin, text, image), 1.0)
                for text, image in ((args.query, None), (None, args.image))
                if text is not None or image is not None
            ]
            parts += [(_part_vector(plugin, t), 1.0) for t in args.add]
            parts += [(_part_vector(plugin, t), -1.0) for t in args.subtract]
        finally:
            plugin.shutdown()
        vector = combine(parts)
        if args.hybrid:
            hits = search_page(
                index,
                mode=QueryMode.HYBRID,
                k=args.k,
                identity={},
                vector=vector,
                text=args.query,
                filters=filters,
                where=args.where,
            ).hits
        else:
            hits = index.search(vector, args.k, filters, where=args.where)
    _print_hits(hits, as_json=args.json)
    return 0


def _part_vector(plugin: OnnxClipPlugin, value: str) -> np.ndarray:
    """An --add/--subtract part: an existing file is an image (as rclip reads it), else text."""
    is_file = Path(value).is_file()
    return _query_vector(plugin, None if is_file else value, value if is_file else None)


def _query_vector(plugin: OnnxClipPlugin, text: str | None, image: str | None) -> np.ndarray:
    if (text is None) == (image is None):
        raise CLIError("give either a text query or --image FILE")
    result = (
        plugin.generate_embedding(image) if image else plugin.generate_text_embedding(text or "")
    )
    if not result.ok or result.embedding is None:
        raise CLIError(f"cannot embed the query: {result.error}")
    return result.embedding


def _parse_filters(raw: list[str]) -> dict[str, Any]:
    filters: dict[str, Any] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CLIError(f"--filter needs KEY=VALUE, got {item!r}")
        try:
            filters[key] = json.loads(value)
        except ValueError:
            filters[key] = value
    return filters


def _print_hits(hits: list[Hit], *, as_json: bool = False, indent: str = "") -> None:
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "key": h.key,
                        "score": round(h.score, 6),
                        "path": h.path,
                        "metadata": h.metadata,
                    }
                    for h in hits
                ],
                indent=1,
            )
        )
        return
    if not hits:
        print(f"{indent}(no results)")
    for rank, h in enumerate(hits, 1):
        print(f"{indent}{rank:2d}. {h.score:+.3f}  {shown(h.path or h.key)}")


class _Once(argparse.Action):
    """An option that may be given once (a second ``--where`` is not silently dropped)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} given twice: combine the filters with $and")
        setattr(namespace, self.dest, values)


def where_arg(text: str) -> Where:
    """``--where JSON``: a filter in the where language (:mod:`themis_clip.index.where`),
    checked before any model loads (a usage error naming the path)."""
    try:
        value = jsonio.loads(text)  # no NaN, no duplicate keys
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
    except RecursionError:
        raise argparse.ArgumentTypeError("nested deeper than the JSON parser allows") from None
    try:
        return parse_where(value)
    except WhereError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
