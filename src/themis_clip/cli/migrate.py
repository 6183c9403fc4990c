"""``migrate``: move an index to another model (a shadow built beside it, then a cut-over),
or roll a migration back."""

from __future__ import annotations

import argparse
import os
from typing import Any

from themis_clip.cli.common import (
    DEFAULT_INDEX,
    CLIError,
    index_writer,
    progress_bar,
    shown,
    stamp_of,
    start_plugin,
)
from themis_clip.config import ModelConfig, PluginConfig
from themis_clip.index.stores import is_url
from themis_clip.migration import MigrationReport, migrate_index, rollback

#: Items listed by name in a report before "and N more".
_LISTED = 20


def register(sub: Any) -> None:
    p = sub.add_parser(
        "migrate",
        help="move an index to another model (resumable; the old index kept for --rollback)",
    )
    p.add_argument(
        "--index",
        default=DEFAULT_INDEX,
        help=f"the index: an SQLite file or a postgresql:// URL (default {DEFAULT_INDEX})",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--to",
        metavar="MODEL",
        help="the new model: directory, image-tower .onnx, Hub repo id or catalogue name",
    )
    what.add_argument(
        "--rollback",
        action="store_true",
        help="put back the index the last migration replaced",
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="cores the new model uses (default: half of them, leaving the rest to serving)",
    )
    p.add_argument("--batch-size", type=int, metavar="N", help="images per model run (32)")
    p.add_argument(
        "--no-cut-over",
        action="store_true",
        help="build the shadow only; run again without this flag to switch",
    )
    p.add_argument(
        "--drop-missing",
        action="store_true",
        help="cut over even when some items cannot be re-embedded (they stay in the old index)",
    )
    p.set_defaults(func=_cmd_migrate)


def _cmd_migrate(args: argparse.Namespace) -> int:
    with index_writer(args.index):
        return _rollback(args) if args.rollback else _migrate(args)


def _migrate(args: argparse.Namespace) -> int:
    threads = args.threads if args.threads is not None else max(1, (os.cpu_count() or 2) // 2)
    cores = os.cpu_count() or 1
    if not 1 <= threads <= cores:
        raise CLIError(f"--threads must be between 1 and {cores} (the cores here), got {threads}")
    if args.batch_size is not None and args.batch_size < 1:
        raise CLIError("--batch-size must be >= 1")
    batch = args.batch_size or 32
    config = PluginConfig(
        model=ModelConfig(path=args.to),
        max_batch_size=batch,
        intra_op_threads=threads,
        preprocess_workers=threads,
    )
    plugin = start_plugin(args, config, lazy_textual=True)
    try:
        update, bar = progress_bar("migrating")
        with bar:
            report = migrate_index(
                args.index,
                plugin,
                stamp_of(plugin),
                chunk=4 * batch,
                progress=update,
                cut_over=not args.no_cut_over,
                drop_missing=args.drop_missing,
            )
    finally:
        plugin.shutdown()
    _print_report(report, args)
    return 1 if report.missing else 0


def _print_report(report: MigrationReport, args: argparse.Namespace) -> None:
    print(
        f"migrated {report.total - len(report.missing)} of {report.total} items to "
        f"{report.model_id} ({report.embedded} embedded now, {len(report.from_previews)} "
        f"from their previews, {report.removed} removed) in {report.seconds:.1f} s"
    )
    if report.from_previews:
        print(
            f"re-embedded from their stored preview (no file, lower quality): "
            f"{_listed(report.from_previews)}"
        )
    for key, reason in report.missing[:_LISTED]:
        print(f"cannot re-embed {shown(key)}: {shown(reason)}")
    if len(report.missing) > _LISTED:
        print(f"... and {len(report.missing) - _LISTED} more that cannot be re-embedded")
    if report.before is not None:
        print(f"live: {_where(args)} (the previous index kept as {report.before})")
    elif args.no_cut_over:
        print(f"shadow ready: {report.shadow}; run again without --no-cut-over to switch")
    else:
        print(
            f"not cut over: {len(report.missing)} item(s) cannot be re-embedded; restore their "
            f"files and run again, or run with --drop-missing (shadow kept: {report.shadow})"
        )


def _rollback(args: argparse.Namespace) -> int:
    report = rollback(args.index)
    print(f"rolled back: {_where(args)} is {report.model_id} again (from {report.restored})")
    print(f"the replaced index is kept as {report.shadow} (migrate again to resume from it)")
    if report.written_since:
        print(
            f"warning: {report.written_since} item(s) written or deleted after the cut-over are "
            "not in the restored index"
        )
    return 0


def _where(args: argparse.Namespace) -> str:
    """The index, fit to print (a URL without its password)."""
    if is_url(args.index):
        from themis_clip.index.stores.postgres import redact

        return redact(args.index)
    return str(args.index)


def _listed(keys: tuple[str, ...]) -> str:
    more = f" and {len(keys) - _LISTED} more" if len(keys) > _LISTED else ""
    return ", ".join(shown(k) for k in keys[:_LISTED]) + more
