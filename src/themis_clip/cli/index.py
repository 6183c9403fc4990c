"""``index`` and ``search``: keep an index of a folder (or of embed-dataset output) and query it."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from themis_clip import jsonio
from themis_clip.cli.common import (
    CLIError,
    config_from,
    graph_settings,
    index_args,
    index_location,
    index_writer,
    model_args,
    progress_bar,
    shown,
    stamp_of,
    start_plugin,
)
from themis_clip.collection import SORTS, Collection, Query, browse, lexical
from themis_clip.errors import WhereError
from themis_clip.index.indexer import IndexReport
from themis_clip.index.search import Hit, VectorIndex
from themis_clip.index.stores.base import is_url
from themis_clip.index.where import Where, parse_where

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("index", help="index the images under a folder (incremental, resumable)")
    p.add_argument(
        "folder", help="the folder of photos (walked recursively; run again to add what changed)"
    )
    index_args(p)
    p.add_argument("--rebuild", action="store_true", help="delete the index first")
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip files and folders whose name or relative path matches (repeatable; NAS, "
        "system and trash files such as @eaDir, ._*, Thumbs.db are always skipped)",
    )
    p.add_argument(
        "--from-parquet", action="store_true", help="FOLDER holds embed-dataset Parquet output"
    )
    p.add_argument(
        "--ocr",
        action="store_true",
        help="also read the text in the pictures (signs, receipts, screens) for lexical and "
        "hybrid search; on an existing index, reads the items not read yet without embedding "
        "them again (the config's ocr.enabled does the same)",
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
        "--mode",
        choices=("vector", "lexical", "hybrid"),
        default="vector",
        help="vector (default: what the pictures show), lexical (the words of TEXT in file "
        "names, paths, metadata and the text read in the pictures, by substring; no model "
        "needed), hybrid (both, fused by rank)",
    )
    p.add_argument("--hybrid", action="store_true", help="the same as --mode hybrid")
    p.add_argument("-k", type=int, default=10, help="number of results (default 10)")
    p.add_argument(
        "--cut",
        metavar="auto|none|SCORE",
        help="end the results where relevance ends: auto (the default for text queries: the "
        "model's line for unrelated texts on this index, or a gap in the scores), none, or a "
        "score",
    )
    p.add_argument(
        "--sort",
        choices=SORTS,
        default="score",
        help="order of the results: score (default; with no query, newest first), taken / "
        "-taken (capture time, oldest / newest first; photos without one last in both), mtime "
        "(newest file first), name",
    )
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
    with index_writer(args.index):
        return _index(args, folder)


def _index(args: argparse.Namespace, folder: Path) -> int:
    if args.from_parquet:
        return _index_from_parquet(args, folder)
    settings = graph_settings(args)
    if args.rebuild:
        VectorIndex.remove(args.index)
    # An index this run creates is removed again if the model never opens (an empty file
    # with no model bound was left behind, which a later search called "open read-only").
    fresh = not is_url(args.index) and not Path(args.index).exists()
    config = config_from(args)
    collection = Collection.open(args.index, config, settings=settings)
    ocr_opened = False
    try:
        if args.ocr or config.ocr.enabled:
            collection.ocr  # noqa: B018 -- a bad OCR model fails before any work
        ocr_opened = True
        update, bar = progress_bar("indexing")
        with bar:
            report = collection.index_folder(
                folder, progress=update, exclude=args.exclude, ocr=True if args.ocr else None
            )
        _prepare_graph(collection.index)
    except BaseException:
        failed_to_open = not ocr_opened or _model_failed(collection)
        collection.close()
        if fresh and failed_to_open:
            VectorIndex.remove(args.index)
        raise
    collection.close()
    _print_report(report, args.index)
    return 1 if report.failed else 0  # the rest is indexed; exit 1 says some files were not


def _model_failed(collection: Collection) -> bool:
    try:
        collection.plugin  # noqa: B018 -- waits for the model to open
    except Exception:
        return True
    return False


def _print_report(report: IndexReport, index_path: str) -> None:
    print(
        f"{index_path}: {report.added} added, {report.updated} updated, "
        f"{report.unchanged} unchanged, "
        f"{report.renamed} renamed, {report.duplicates} duplicates, {report.removed} removed, "
        f"{len(report.failed)} unreadable ({report.seconds:.1f} s)"
    )
    for path, error in report.failed:
        print(f"  skipped {shown(path)}: {shown(error)}")
    if report.merged:
        print(f"  merged: {report.merged} RAW or Live video file(s) recorded beside their photo")
    if report.skipped:
        reasons = ", ".join(f"{shown(r)} {n}" for r, n in sorted(report.skipped.items()))
        print(f"  not walked: {sum(report.skipped.values())} ({reasons})")
    if report.read or report.unread:
        print(f"  text read in {report.read} picture(s), found in {report.with_text}")
    for path, error in report.unread:
        print(f"  text not read in {shown(path)}: {shown(error)}")


def _prepare_graph(index: VectorIndex) -> None:
    """Measure (and build) the search graph once here, so later searches never wait for one;
    a graph build shows a progress bar and says what it built (exact search says nothing)."""
    bars: list[Any] = []
    phases: list[str] = []

    def progress(phase: str, done: int, total: int) -> None:
        if not bars:
            bars.extend(progress_bar(phase, unit="vec"))
        update, bar = bars
        if not phases or phases[-1] != phase:
            phases.append(phase)
            bar.reset(total=total)
            bar.set_description(phase)
        update(done, total)

    index.progress = progress
    try:
        built = index.prepare_graph()
    finally:
        index.progress = None
        if bars:
            bars[1].close()
    plan = index.plan
    if plan is not None:
        what = "exact search" if plan.kind == "exact" else f"HNSW graph ({plan.dtype})"
        log.info("search: %s %s: %s", what, "built" if built else "kept", plan.reason)
        if built:
            print(f"search: {what} built and saved: {plan.reason}", file=sys.stderr)


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
    filtered = bool(args.filter) or args.where is not None or args.sort != "score"
    if args.query is None and args.image is None and not filtered:
        raise CLIError("give a text query, --image FILE, or both (or a filter and --sort)")
    if args.query is not None and not args.query.strip():
        raise CLIError("the text query is empty")
    flag = "--hybrid" if args.hybrid else f"--mode {args.mode}"
    if args.hybrid:
        args.mode = "hybrid"
    if args.mode != "vector" and not args.query:
        raise CLIError(f"{flag} needs a text query (its words are matched)")
    if args.mode == "lexical" and (args.image or args.add or args.subtract):
        raise CLIError("--mode lexical matches words: --image, --add and --subtract need a model")
    filters = _parse_filters(args.filter) or None
    location = index_location(args) or ""
    if args.query is None and args.image is None:  # a filter, no query: browse it
        with VectorIndex(location, readonly=True) as index:
            found = browse(index, k=args.k, filters=filters, where=args.where, sort=args.sort)
        _print_hits(found, as_json=args.json)
        return 0
    if args.mode == "lexical":
        with VectorIndex(location, readonly=True) as index:
            found = lexical(
                index, args.query, k=args.k, filters=filters, where=args.where, sort=args.sort
            )
        _print_hits(found, as_json=args.json)
        if not found:
            print(f"themis-clip: no item holds those words in {location}", file=sys.stderr)
        return 0
    query = Query(text=args.query, image=args.image, add=args.add, subtract=args.subtract)
    for value in [*(args.add or []), *(args.subtract or [])]:
        if Path(value).is_dir():  # "holiday": a word, though a folder here bears the name
            print(
                f"themis-clip: note: {value!r} is read as text; a folder of that name is here, "
                "but a part is one image file or a text",
                file=sys.stderr,
            )
    with Collection.open(location, config_from(args), readonly=True) as collection:
        matches = collection.search(
            query,
            k=args.k,
            filters=filters,
            where=args.where,
            hybrid=args.mode == "hybrid",
            cut=args.cut,
            sort=args.sort,
        )
    _print_hits(matches, as_json=args.json)
    if not matches and not matches.weaker:  # nothing was cut: nothing was found at all
        why = "no item matches --filter / --where" if filters or args.where else "no items"
        print(f"themis-clip: {why} in {location}", file=sys.stderr)
    elif matches.cut is not None and matches.cut.reason and (matches.weaker or not matches):
        print(
            f"themis-clip: {len(matches)} match{'es' if len(matches) != 1 else ''}; "
            f"{matches.weaker} weaker left out, cut {shown(matches.cut.reason)} "
            "(--cut none shows them)",
            file=sys.stderr,
        )
    if args.mode == "hybrid" and matches:
        print(
            "themis-clip: hybrid scores fuse two rankings (what the pictures show, and the words "
            "in names, captions and the pictures' text): about 0.016 is a first place; the order "
            "is what counts",
            file=sys.stderr,
        )
    return 0


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


def _print_hits(hits: Sequence[Hit], *, as_json: bool = False, indent: str = "") -> None:
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "key": h.key,
                        "score": round(h.score, 6),
                        "path": h.path,
                        "metadata": h.metadata,
                        **({"text_matches": list(h.text_matches)} if h.text_matches else {}),
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
        for line in h.text_matches:
            print(f"{indent}      text: {shown(str(line.get('text', '')))}")


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
