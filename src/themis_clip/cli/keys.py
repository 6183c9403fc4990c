"""``keys``: create, list and revoke the API keys ``serve --keys FILE`` accepts.

``keys create`` prints the new key once, alone on the last line of stdout (the file keeps only
its SHA-256 digest: see :mod:`themis_clip.server.auth`); ``keys list`` never shows a key.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from themis_clip.cli.common import CLIError


def register(sub: Any) -> None:
    p = sub.add_parser("keys", help="manage API keys for 'serve --keys'")
    ks = p.add_subparsers(dest="keys_command", required=True)
    c = ks.add_parser("create", help="add a key; prints it once (last line of stdout)")
    c.add_argument("--keys", required=True, metavar="FILE", help="keys file (created if missing)")
    c.add_argument("--scope", required=True, help="comma-separated: search, write, admin, metrics")
    c.add_argument("--name", help="a name to list and revoke it by (default: key-N)")
    c.set_defaults(func=_create)
    ls = ks.add_parser("list", help="names, scopes, created, last used (never a key)")
    ls.add_argument("--keys", required=True, metavar="FILE")
    ls.set_defaults(func=_list)
    r = ks.add_parser("revoke", help="remove a key; a running server drops it within seconds")
    r.add_argument("name")
    r.add_argument("--keys", required=True, metavar="FILE")
    r.set_defaults(func=_revoke)


def _auth() -> Any:
    try:
        from themis_clip.server import auth
    except ImportError as exc:
        raise CLIError(
            f"keys need the server extra ({exc.name} is missing): "
            "pip install 'themis-onnx-clip[server]'"
        ) from exc
    return auth


def _create(args: argparse.Namespace) -> int:
    auth = _auth()
    scopes = auth.parse_scopes(args.scope)
    name, key = auth.create_key(Path(args.keys), scopes, args.name)
    shown = ",".join(sorted(scopes))
    print(f"themis-clip: key {name!r} ({shown}) added to {args.keys}; shown once:", file=sys.stderr)
    print(key)
    return 0


def _list(args: argparse.Namespace) -> int:
    records = _auth().list_keys(Path(args.keys))
    rows = [("NAME", "SCOPES", "CREATED", "LAST USED")] + [
        (r.name, ",".join(sorted(r.scopes)), r.created, r.last_used or "never") for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[3]]))
    return 0


def _revoke(args: argparse.Namespace) -> int:
    _auth().revoke_key(Path(args.keys), args.name)
    print(f"themis-clip: key {args.name!r} revoked", file=sys.stderr)
    return 0
