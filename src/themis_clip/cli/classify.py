"""``classify``: zero-shot labels for image files (``--labels cat,dog,car``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from themis_clip.cli.common import CLIError, model_args, shown, start_plugin
from themis_clip.errors import InputError
from themis_clip.zeroshot import DEFAULT_TEMPLATE


def register(sub: Any) -> None:
    p = sub.add_parser("classify", help="zero-shot classification of images against labels")
    p.add_argument("images", nargs="+", help="image files")
    p.add_argument("--labels", required=True, help="comma-separated labels: cat,dog,car")
    p.add_argument(
        "--template",
        default=DEFAULT_TEMPLATE,
        help=f"prompt per label (default {DEFAULT_TEMPLATE!r})",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per image")
    p.add_argument("--top", type=int, default=0, help="only the N most probable labels")
    model_args(p)
    p.set_defaults(func=_cmd_classify)


def _cmd_classify(args: argparse.Namespace) -> int:
    labels = [label.strip() for label in args.labels.split(",") if label.strip()]
    if not labels:
        raise CLIError("--labels: give at least one label (comma-separated)")
    if args.top < 0:
        raise CLIError("--top must be >= 0")
    plugin = start_plugin(args)
    failed = 0
    shown_any = False
    try:
        for image in args.images:
            try:
                scores = plugin.classify(image, labels, template=args.template)
            except InputError as exc:
                failed += 1
                print(f"themis-clip: {shown(image)}: {shown(str(exc))}", file=sys.stderr)
                continue
            shown_any = True
            ranked = sorted(scores, key=lambda s: -s.probability)
            if args.top:
                ranked = ranked[: args.top]
            if args.json:
                print(
                    json.dumps(
                        {
                            "image": image,
                            "labels": [
                                {"label": s.label, "probability": s.probability, "cosine": s.cosine}
                                for s in ranked
                            ],
                        }
                    )
                )
            else:
                print(shown(image))
                for s in ranked:
                    print(f"  {100 * s.probability:6.2f}%  cosine {s.cosine:+.3f}  {s.label}")
        if shown_any and not args.json:  # what the two numbers mean, once
            print(
                "(probabilities are shared out among these labels only, so one always looks likely"
                if plugin.scoring["logit_bias"] is None
                else "(each label is scored on its own"
            )
            print("  the cosine is the raw match: low for every label means none fits)")
    finally:
        plugin.shutdown()
    return 1 if failed else 0
