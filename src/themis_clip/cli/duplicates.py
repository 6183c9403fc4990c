"""``themis-clip duplicates``: groups of near-duplicate items in an index, in tiers, each with
a suggested keeper (no model needed; nothing is deleted)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from themis_clip.cli.common import CLIError, index_args, index_location, model_args, shown
from themis_clip.files import companion_paths
from themis_clip.index.duplicates import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW_S,
    DuplicateGroup,
    find_duplicates,
)
from themis_clip.index.search import VectorIndex
from themis_clip.preprocess.image import same_pixels


def register(sub: Any) -> None:
    p = sub.add_parser(
        "duplicates", help="groups of near-duplicate images (re-encoded, resized copies)"
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"cosine similarity at or above which two items are duplicates "
        f"(default {DEFAULT_THRESHOLD}, immich's maximum distance 0.01)",
    )
    p.add_argument(
        "--window-s",
        type=float,
        default=DEFAULT_WINDOW_S,
        help=f"shots taken at most this many seconds apart may be a burst ('similar'); "
        f"further apart they are no duplicates (default {DEFAULT_WINDOW_S:g})",
    )
    p.add_argument("--json", action="store_true", help="print the JSON array only")
    p.add_argument(
        "--print0",
        action="store_true",
        help="print only the files that are not keepers, with their RAW and Live video "
        "companions, NUL-separated (for xargs -0)",
    )
    index_args(p)
    model_args(p)
    p.set_defaults(func=_cmd_duplicates)


def _files(item: dict[str, Any]) -> list[str]:
    """An item's file and the companions recorded beside it (its RAWs, its Live video)."""
    if not item["path"]:
        return []
    path = Path(item["path"])
    return [str(path), *map(str, companion_paths(path, item["metadata"] or {}))]


def _not_kept(groups: list[DuplicateGroup]) -> list[str]:
    """The files of every non-keeper with their companions, less any file a keeper owns (two
    stills of one stem share their RAW)."""
    kept = {
        f
        for g in groups
        for item in g.items
        if g.keeper and item["key"] == g.keeper.key
        for f in _files(item)
    }
    out = [f for g in groups for item in g.others for f in _files(item) if f not in kept]
    return list(dict.fromkeys(out))


def _cmd_duplicates(args: argparse.Namespace) -> int:
    if not -1.0 <= args.threshold <= 1.0:
        raise CLIError("--threshold must be a cosine similarity from -1 to 1")
    if not 0 <= args.window_s <= 86400:  # NaN fails this too
        raise CLIError("--window-s must be a number of seconds from 0 to 86400")
    with VectorIndex(index_location(args) or "", readonly=True) as index:
        groups = find_duplicates(
            index, threshold=args.threshold, window_s=args.window_s, same_pixels=same_pixels
        )
    if args.print0:
        sys.stdout.write("".join(f"{path}\0" for path in _not_kept(groups)))
        return 0
    if args.json:
        print(json.dumps([g.to_dict() for g in groups], ensure_ascii=False, indent=2))
        return 0
    for g in groups:
        keeper = g.keeper
        if keeper is not None:
            print(f"{g.tier} ({g.score:.4f}): keep {shown(keeper.key)}, {keeper.reason}")
        for item in g.others:
            print(f"  {shown(str(item['path'] or item['key']))}")
    tiers = Counter(str(g.tier) for g in groups)
    summary = ", ".join(f"{n} {t}" for t, n in sorted(tiers.items()))
    copies = sum(len(g.others) for g in groups)
    print(f"{len(groups)} group(s) ({summary or 'none'}); {copies} copies beside their keepers")
    return 0
