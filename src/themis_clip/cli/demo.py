"""``demo``: the main job on the embedded defaults (a generated gallery, indexed, searched)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from themis_clip.cli.common import CLIError, model_args, shown, stamp_of, start_plugin
from themis_clip.cli.index import _print_hits, _print_report, _query_vector
from themis_clip.demo.queries import demo_queries
from themis_clip.index.indexer import index_folder
from themis_clip.index.search import VectorIndex
from themis_clip.preprocess.exif import read_exif


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="the main job on the embedded defaults: embed a generated gallery"
    )
    p.add_argument(
        "--gallery", default=".cache/demo-gallery", help="where to write the generated images"
    )
    p.add_argument("--count", type=int, default=60, help="number of gallery images")
    p.add_argument(
        "--index", default=".cache/demo-index.db", help="the demo's index (an SQLite file)"
    )
    model_args(p)
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from themis_clip.demo.scenes import write_gallery

    gallery_dir = Path(args.gallery)
    foreign = sorted(
        p.name
        for p in (gallery_dir.iterdir() if gallery_dir.is_dir() else ())
        if not re.fullmatch(r"\d{3}-[a-z0-9-]+\.jpg", p.name)
    )
    if foreign:
        raise CLIError(
            f"{gallery_dir} holds files the demo did not write ({shown(foreign[0])}"
            f"{', ...' if len(foreign) > 1 else ''}): give --gallery a new or empty folder"
        )
    gallery = write_gallery(gallery_dir, args.count)
    plugin = start_plugin(args)
    try:
        stats = plugin.get_statistics()
        print(
            f"model {stats['model_id']} on {stats['backend']} "
            f"({stats['embedding_dim']}-d embeddings)"
        )
        if stats["model_variant"] == "themis-demo-shapes":
            print("note: the demo model knows generated shapes only; use --model for real CLIP.")
        index_path = args.index
        with VectorIndex(index_path) as index:
            report = index_folder(
                index,
                gallery_dir,
                plugin,
                stamp=stamp_of(plugin),
                progress=False,
                metadata=read_exif,
            )
            _print_report(report, index_path)
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
                hits = index.search(_query_vector(plugin, query.text, None), 3)
                _print_hits(hits, indent="  ")
                top = truth.get(str(Path(hits[0].path or "").resolve())) if hits else None
                ok = top is not None and query.matches(top)
                right += ok
                print(f"  top hit: {'right' if ok else 'WRONG'}")
            print(f"\n{right} of {len(queries)} top hits right")
            probe = gallery[0][0]
            print(f"\nImage -> image, query {probe.name}:")
            _print_hits(index.search(_query_vector(plugin, None, str(probe)), 4), indent="  ")
        s = plugin.get_statistics()
        print(
            f"\n{s['images']} images and {s['texts']} texts embedded, "
            f"p50 {s['p50_latency_ms']:.1f} ms a call"
        )
    finally:
        plugin.shutdown()
    return 0
