"""``serve``: the HTTP service on a socket bound here (``--port 0`` picks a free one).

Access: ``--keys FILE`` requires an API key (``themis-clip keys``) on every route but health,
readiness and the page. Without it a loopback bind stays open (the demo); any other bind
refuses to start unless ``--no-auth`` says so. ``--allowed-hosts`` lists the ``Host`` names
served (default: loopback names and the bound address); ``--ssl-certfile``/``--ssl-keyfile``
turn on TLS.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import signal
import socket
import ssl
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
    p.add_argument(
        "--new-index",
        action="store_true",
        help="serve an --index file that does not exist yet, empty (filled over HTTP)",
    )
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
    p.add_argument(
        "--send-timeout-s",
        type=float,
        default=30.0,
        help="drop a client that leaves its answer undrained this long",
    )
    p.add_argument(
        "--max-buffered-mb",
        type=float,
        default=256.0,
        help="answer bytes all connections may hold unsent (stalled ones dropped beyond)",
    )
    p.add_argument(
        "--max-bodies-mb",
        type=float,
        default=256.0,
        help="request-body bytes all requests may hold at once (503 beyond)",
    )
    a = p.add_argument_group("access")
    a.add_argument("--keys", metavar="FILE", help="require API keys from FILE (themis-clip keys)")
    a.add_argument(
        "--no-auth",
        action="store_true",
        help="serve a non-loopback --host without keys (anyone who reaches it can read all)",
    )
    a.add_argument(
        "--allowed-hosts",
        metavar="NAMES",
        help="comma-separated Host names to answer for (*.example.com, *; default: "
        "localhost, 127.0.0.1, [::1] and --host); others get 421",
    )
    a.add_argument("--ssl-certfile", help="TLS certificate chain (PEM); needs --ssl-keyfile")
    a.add_argument("--ssl-keyfile", help="TLS private key (PEM)")
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
        "send_timeout_s",
        "max_buffered_mb",
        "max_bodies_mb",
    )
    for name in positive:
        if getattr(args, name) <= 0:
            raise CLIError(f"--{name.replace('_', '-')} must be > 0")
    _check_exposure(args)
    tls = _tls(args)
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
        local = not index_path.startswith(("postgresql://", "postgres://"))
        if local and not args.new_index and not Path(index_path).exists():
            raise CLIError(
                f"no index at {index_path}: build one with `themis-clip index DIR --index "
                f"{shlex.quote(index_path)}`, or add --new-index to serve it empty"
            )
        VectorIndex(index_path, settings=search_settings).close()
    settings = ServerSettings(
        plugin_config=config,
        index_path=index_path,
        search_settings=search_settings,
        model_root=args.model_root,
        allow_pull=args.allow_pull,
        admin_token=os.environ.get("THEMIS_ADMIN_TOKEN") or None,
        keys_file=args.keys,
        allowed_hosts=_allowed_hosts(args),
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_bodies_in_flight_bytes=int(args.max_bodies_mb * 2**20),
        send_timeout_s=args.send_timeout_s,
        max_buffered_response_bytes=int(args.max_buffered_mb * 2**20),
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
    plugin = start_plugin(args, settings.plugin_config)
    # uvicorn drains in-flight requests on SIGTERM, restores the previous handler and re-raises
    # the signal; a no-op handler makes that graceful stop end with exit code 0, not -15.
    signal.signal(signal.SIGTERM, lambda *_: None)
    # Bind here, so that --port 0 picks a free port and the line below says which (tests and
    # supervisors read it; nothing races for a port between choosing and binding it).
    sock = listening_socket(args.host, args.port)
    family = sock.family
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, plugin=plugin),
            log_level="info" if args.verbose else "warning",
            timeout_graceful_shutdown=int(args.request_timeout_s) + 5,
            http=guarded_h11(
                settings.header_timeout_s,
                settings.max_connections,
                send_timeout_s=settings.send_timeout_s,
                max_buffered_bytes=settings.max_buffered_response_bytes,
            ),
            timeout_keep_alive=max(1, round(settings.keep_alive_s)),
            ssl_certfile=tls[0] if tls else None,
            ssl_keyfile=tls[1] if tls else None,
        )
    )
    host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    scheme = "https" if tls else "http"
    print(f"themis-clip: listening on {scheme}://{host}:{sock.getsockname()[1]}", file=sys.stderr)
    sys.stderr.flush()
    server.run(sockets=[sock])
    return 0


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket whose accepted connections get ``TCP_NODELAY``.

    asyncio sets ``TCP_NODELAY`` on an accepted socket only when its ``proto`` is
    ``IPPROTO_TCP``; ``socket.socket(family, SOCK_STREAM)`` leaves it 0, and every keep-alive
    answer then waits out Nagle plus the client's delayed ACK (about 40 ms).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CLIError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    return sock


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def _check_exposure(args: argparse.Namespace) -> None:
    if args.keys and args.no_auth:
        raise CLIError("--keys and --no-auth contradict each other; give one")
    if not args.keys and not args.no_auth and not is_loopback(args.host):
        raise CLIError(
            f"refusing to serve {args.host} without access control: anyone who reaches it "
            "could search and read every indexed photo. Give --keys FILE (themis-clip keys "
            "create), or --no-auth to serve it open anyway"
        )


def _allowed_hosts(args: argparse.Namespace) -> tuple[str, ...]:
    if args.allowed_hosts:
        names = tuple(n.strip() for n in args.allowed_hosts.split(",") if n.strip())
        if not names:
            raise CLIError("--allowed-hosts needs at least one name")
        return names
    bound = args.host.strip("[]")
    if bound in ("0.0.0.0", "::", ""):  # noqa: S104 - detecting a wildcard, not binding one
        print(
            f"themis-clip: note: serving {args.host} answers only Host names localhost, "
            "127.0.0.1 and [::1]; list the names clients use with --allowed-hosts",
            file=sys.stderr,
        )
    return ("localhost", "127.0.0.1", "[::1]", f"[{bound}]" if ":" in bound else bound)


def _tls(args: argparse.Namespace) -> tuple[str, str] | None:
    cert, key = args.ssl_certfile, args.ssl_keyfile
    if not cert and not key:
        return None
    if not (cert and key):
        raise CLIError("TLS needs both --ssl-certfile and --ssl-keyfile")
    try:  # fail here, with a message, rather than inside uvicorn's startup
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise CLIError(f"cannot use the TLS certificate/key: {exc}") from exc
    return cert, key
