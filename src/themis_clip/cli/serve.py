"""``serve``: the HTTP service on a socket bound here (``--port 0`` picks a free one)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from typing import Any

from themis_clip.cli.common import CLIError, config_from, model_args


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the HTTP service")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    p.add_argument("--index", help="index file for /search and /index/items")
    p.add_argument("--model-root", help="folder that /admin/reload model paths must stay inside")
    p.add_argument("--max-queue", type=int, default=512, help="waiting items before 429")
    p.add_argument("--max-queue-delay-ms", type=float, default=5.0, help="batch fill wait")
    p.add_argument("--request-timeout-s", type=float, default=30.0, help="504 beyond this")
    p.add_argument("--max-body-mb", type=float, default=20.0, help="413 beyond this")
    p.add_argument("--no-warmup", action="store_true", help="ready without warming up")
    model_args(p)
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from themis_clip.server import ServerSettings, create_app
    except ImportError as exc:
        raise CLIError(
            f"serving needs the server extra ({exc.name} is missing): "
            "pip install 'themis-onnx-clip[server]'"
        ) from exc
    for name in ("max_queue", "max_queue_delay_ms", "request_timeout_s", "max_body_mb"):
        if getattr(args, name) <= 0:
            raise CLIError(f"--{name.replace('_', '-')} must be > 0")
    settings = ServerSettings(
        plugin_config=config_from(args),
        index_path=args.index,
        model_root=args.model_root,
        admin_token=os.environ.get("THEMIS_ADMIN_TOKEN") or None,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_queue=args.max_queue,
        max_queue_delay_ms=args.max_queue_delay_ms,
        request_timeout_s=args.request_timeout_s,
        warmup=not args.no_warmup,
    )
    # uvicorn drains in-flight requests on SIGTERM, restores the previous handler and re-raises
    # the signal; a no-op handler makes that graceful stop end with exit code 0, not -15.
    signal.signal(signal.SIGTERM, lambda *_: None)
    # Bind here, so that --port 0 picks a free port and the line below says which (tests and
    # supervisors read it; nothing races for a port between choosing and binding it).
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        sock.close()
        raise CLIError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            log_level="info" if args.verbose else "warning",
            timeout_graceful_shutdown=int(args.request_timeout_s) + 5,
        )
    )
    host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    print(f"themis-clip: listening on http://{host}:{sock.getsockname()[1]}", file=sys.stderr)
    sys.stderr.flush()
    server.run(sockets=[sock])
    return 0
