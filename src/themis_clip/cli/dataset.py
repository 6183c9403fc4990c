"""``embed-dataset``: a large collection on Ray, into resumable Parquet."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from themis_clip.cli.common import CLIError, config_from, model_args


def register(sub: Any) -> None:
    p = sub.add_parser("embed-dataset", help="embed a large collection on Ray into Parquet")
    p.add_argument(
        "input", help="a folder, a glob, or a .parquet/.csv listing with a 'path' column"
    )
    p.add_argument("output", help="folder of Parquet files (re-runs skip what it holds)")
    p.add_argument(
        "--ray-address", help="local (default), auto, or ray://host:port; or RAY_ADDRESS"
    )
    p.add_argument("--actors", type=int, default=1, help="actor pool size, one plugin each")
    p.add_argument("--gpus-per-actor", type=float, default=0.0)
    model_args(p)
    p.set_defaults(func=_cmd_embed_dataset)


def _cmd_embed_dataset(args: argparse.Namespace) -> int:
    import ray  # noqa: F401 - a missing ray extra: one message at the CLI edge, before any work

    from themis_clip.distributed import embed_dataset

    if args.actors < 1:
        raise CLIError("--actors must be >= 1")
    config = config_from(args)
    raw = config.raw()  # the whole configuration, losslessly, to every actor
    address = args.ray_address or os.environ.get("RAY_ADDRESS") or None
    try:
        report = embed_dataset(
            args.input,
            Path(args.output),
            raw,
            address=address,
            actors=args.actors,
            batch_size=config.max_batch_size,
            num_gpus_per_actor=args.gpus_per_actor,
        )
    except (ValueError, FileNotFoundError) as exc:
        raise CLIError(str(exc)) from exc
    print(
        f"{args.output}: {report.listed} listed, {report.skipped} already there, "
        f"{report.embedded} embedded, {report.failed} failed ({report.seconds:.1f} s, "
        f"{report.rate:.1f} items/s, {report.actors} actors)"
    )
    return 0
