"""``serve``: the HTTP service on a socket bound here (``--port 0`` picks a free one)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from themis_clip.cli.common import (
    DEFAULT_INDEX,
    CLIError,
    config_from,
    graph_settings,
    index_args,
    index_location,
    model_args,
    start_plugin,
)
from themis_clip.errors import ConfigError
from themis_clip.index.search import VectorIndex


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the HTTP service")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    index_args(p)
    p.add_argument("--model-root", help="folder that /admin/reload model paths must stay inside")
    p.add_argument(
        "--allow-pull",
        action="store_true",
        help='/admin/reload {"model": NAME} may download an uncached model (in the background)',
    )
    p.add_argument(
        "--max-queue", type=int, default=4096, help="waiting items before 429 (413 beyond it)"
    )
    p.add_argument("--max-queue-delay-ms", type=float, default=5.0, help="batch fill wait")
    p.add_argument("--request-timeout-s", type=float, default=30.0, help="504 beyond this")
    p.add_argument("--max-body-mb", type=float, default=20.0, help="413 beyond this")
    p.add_argument(
        "--header-timeout-s", type=float, default=10.0, help="close connections slower than this"
    )
    p.add_argument(
        "--body-idle-timeout-s", type=float, default=10.0, help="408 after this much silence"
    )
    p.add_argument("--keep-alive-s", type=float, default=5.0, help="idle keep-alive connections")
    p.add_argument(
        "--max-labels", type=int, default=1024, help="labels per /v1/classify, candidates per /rank"
    )
    p.add_argument(
        "--max-connections", type=int, default=1000, help="connections at once (503 beyond)"
    )
    p.add_argument(
        "--max-image-pixels", type=int, help="refuse larger images (default 178,956,970)"
    )
    p.add_argument(
        "--max-pixels-in-flight",
        type=int,
        help="decoded pixels all requests may hold at once (default 200,000,000)",
    )
    p.add_argument("--no-warmup", action="store_true", help="ready without warming up")
    model_args(p)
    p.set_defaults(func=_cmd_serve)


def _index_path(args: argparse.Namespace) -> str | None:
    """``index`` and ``search``'s default: ``--index``, the config's ``search.index``, else
    ``themis-index.db`` where it exists (serving with no index is no error)."""
    location = index_location(args, default=None)
    if location is None and Path(DEFAULT_INDEX).is_file():
        location = DEFAULT_INDEX
    return location


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn  # a missing server extra: one message at the CLI edge (cli/extras.py)

    from themis_clip.server import ServerSettings, create_app
    from themis_clip.server.protocol import guarded_h11

    positive = (
        "max_queue",
        "max_queue_delay_ms",
        "request_timeout_s",
        "max_body_mb",
        "header_timeout_s",
        "body_idle_timeout_s",
        "keep_alive_s",
        "max_connections",
        "max_labels",
    )
    for name in positive:
        if getattr(args, name) <= 0:
            raise CLIError(f"--{name.replace('_', '-')} must be > 0")
    config = config_from(args)
    pixels = {
        k: getattr(args, k)
        for k in ("max_image_pixels", "max_pixels_in_flight")
        if getattr(args, k) is not None
    }
    if pixels:
        try:
            config = replace(config, preprocess=replace(config.preprocess, **pixels))
        except ConfigError as exc:
            raise CLIError(str(exc).replace("preprocess.", "--").replace("_", "-")) from exc
    index_path = _index_path(args)
    search_settings = graph_settings(args)
    # Start-up work that can fail happens here, before uvicorn: a failure inside its lifespan
    # is a traceback; here it is one message and exit code 2.
    if index_path:
        VectorIndex(index_path, settings=search_settings).close()
    plugin = start_plugin(args, config)
    settings = ServerSettings(
        plugin_config=config,
        index_path=index_path,
        search_settings=search_settings,
        model_root=args.model_root,
        allow_pull=args.allow_pull,
        admin_token=os.environ.get("THEMIS_ADMIN_TOKEN") or None,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_queue=args.max_queue,
        max_queue_delay_ms=args.max_queue_delay_ms,
        request_timeout_s=args.request_timeout_s,
        body_idle_timeout_s=args.body_idle_timeout_s,
        header_timeout_s=args.header_timeout_s,
        keep_alive_s=args.keep_alive_s,
        max_connections=args.max_connections,
        max_labels=args.max_labels,
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
        plugin.shutdown()
        raise CLIError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, plugin=plugin),
            log_level="info" if args.verbose else "warning",
            timeout_graceful_shutdown=int(args.request_timeout_s) + 5,
            http=guarded_h11(settings.header_timeout_s, settings.max_connections),
            timeout_keep_alive=max(1, round(settings.keep_alive_s)),
        )
    )
    host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    print(f"themis-clip: listening on http://{host}:{sock.getsockname()[1]}", file=sys.stderr)
    sys.stderr.flush()
    server.run(sockets=[sock])
    return 0
