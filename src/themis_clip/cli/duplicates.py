"""``themis-clip duplicates``: groups of near-duplicate items in an index (no model needed)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from themis_clip.cli.common import CLIError, index_args, index_location, model_args
from themis_clip.index.duplicates import DEFAULT_THRESHOLD, find_duplicates
from themis_clip.index.search import VectorIndex


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
    p.add_argument("--json", action="store_true", help="print the JSON array only")
    index_args(p)
    model_args(p)
    p.set_defaults(func=_cmd_duplicates)


def _cmd_duplicates(args: argparse.Namespace) -> int:
    if not -1.0 <= args.threshold <= 1.0:
        raise CLIError("--threshold must be a cosine similarity from -1 to 1")
    with VectorIndex(index_location(args) or "", readonly=True) as index:
        groups = find_duplicates(index, threshold=args.threshold)
    out = [g.to_dict() for g in groups]
    if args.json:
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return 0
    print(json.dumps(out, ensure_ascii=False, indent=2))
    copies = sum(len(g.items) for g in groups)
    print(f"{len(groups)} group(s), {copies} item(s)", file=sys.stderr)
    return 0
