"""``demo``: the main job on the embedded defaults (a generated gallery, indexed, searched)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from themis_clip.cli.common import CLIError, config_from, model_args, shown
from themis_clip.cli.index import _print_hits, _print_report
from themis_clip.collection import Collection, Query
from themis_clip.demo.queries import demo_queries

_GALLERY = ".cache/demo-gallery"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="the main job on the embedded defaults: embed a generated gallery"
    )
    p.add_argument("--gallery", default=_GALLERY, help="where to write the generated images")
    p.add_argument("--count", type=int, default=60, help="number of gallery images")
    p.add_argument(
        "--index",
        help="the demo's index, an SQLite file (default: .cache/demo-index.db, or "
        "demo-index.db inside a --gallery folder)",
    )
    model_args(p)
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from themis_clip.demo.scenes import write_gallery

    gallery_dir = Path(args.gallery)
    foreign = sorted(
        p.name
        for p in (gallery_dir.iterdir() if gallery_dir.is_dir() else ())
        if not re.fullmatch(r"\d{3}-[a-z0-9-]+\.jpg|demo-index\.db(-wal|-shm)?", p.name)
    )
    if foreign:
        raise CLIError(
            f"{gallery_dir} holds files the demo did not write ({shown(foreign[0])}"
            f"{', ...' if len(foreign) > 1 else ''}): give --gallery a new or empty folder"
        )
    gallery = write_gallery(gallery_dir, args.count)
    if args.index is None:
        default = gallery_dir == Path(_GALLERY)
        args.index = ".cache/demo-index.db" if default else str(gallery_dir / "demo-index.db")
    with Collection.open(args.index, config_from(args)) as photos:
        plugin = photos.plugin
        stats = plugin.get_statistics()
        print(
            f"model {stats['model_id']} on {stats['backend']} "
            f"({stats['embedding_dim']}-d embeddings)"
        )
        if stats["model_variant"] == "themis-demo-shapes":
            print("note: the demo model knows generated shapes only; use --model for real CLIP.")
        report = photos.index_folder(gallery_dir)
        _print_report(report, args.index)
        truth = {str(path.resolve()): scene for path, scene in gallery}
        queries = demo_queries([scene for _, scene in gallery])
        print(
            "\nText -> image (file names carry the truth: colour-shape-size-position; "
            "each query has right answers in this gallery):"
        )
        right = 0
        for query in queries:
            answers = sum(query.matches(scene) for _, scene in gallery)
            print(
                f"\n  {query.text!r}  ({answers} right answer{'s' if answers != 1 else ''} "
                "in the gallery)"
            )
            hits = photos.search(query.text, k=3)
            _print_hits(hits, indent="  ")
            top = truth.get(str(Path(hits[0].path or "").resolve())) if hits else None
            ok = top is not None and query.matches(top)
            right += ok
            print(f"  top hit: {'right' if ok else 'WRONG'}")
        print(f"\n{right} of {len(queries)} top hits right")
        probe = gallery[0][0]
        print(f"\nImage -> image, query {probe.name}:")
        _print_hits(photos.search(Query(image=str(probe)), k=4), indent="  ")
        s = plugin.get_statistics()
        print(
            f"\n{photos.index.store.count()} images in the index "
            f"({report.added + report.updated} embedded this run); {s['images']} image and "
            f"{s['texts']} text queries embedded, p50 {s['p50_latency_ms']:.1f} ms a call"
        )
    return 0
