"""``serve``: the HTTP service on a socket bound here (``--port 0`` picks a free one).

Access: ``--keys FILE`` requires an API key (``themis-clip keys``) on every route but health,
readiness and the page. Without it a loopback bind stays open (the demo); any other bind
refuses to start unless ``--no-auth`` says so. ``--allowed-hosts`` lists the ``Host`` names
served (default: loopback names and the bound address); ``--ssl-certfile``/``--ssl-keyfile``
turn on TLS.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import shlex
import signal
import socket
import ssl
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

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
from themis_clip.loading import load_ocr


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
    p.add_argument(
        "--max-body-mb", type=float, default=20.0, help="413 beyond this (a raw or multipart image)"
    )
    p.add_argument(
        "--max-json-mb",
        type=float,
        default=16.0,
        help="413 for a larger JSON body (four 12 MP photos as data URLs: 15 MiB)",
    )
    p.add_argument(
        "--header-timeout-s",
        type=float,
        default=10.0,
        help="close a connection that sends no complete request headers this long "
        "(new or kept alive)",
    )
    p.add_argument(
        "--body-idle-timeout-s", type=float, default=10.0, help="408 after this much silence"
    )
    p.add_argument(
        "--max-labels", type=int, default=1024, help="labels per /v1/classify, candidates per /rank"
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=1000,
        help="requests in progress at once (JSON 503 beyond)",
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
        help="drop a client that takes no answer bytes this long (TCP_USER_TIMEOUT)",
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
    a.add_argument(
        "--immich-from",
        metavar="NETWORKS",
        help="comma-separated networks (CIDR) or addresses whose requests to immich's /predict "
        "need no key (immich's server sends none); other routes still need one",
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
    # A missing server extra: one message at the CLI edge (cli/extras.py).
    from hypercorn.asyncio import serve
    from hypercorn.config import Config
    from hypercorn.typing import ASGIFramework

    from themis_clip.server import ServerSettings, create_app

    positive = (
        "max_queue",
        "max_queue_delay_ms",
        "request_timeout_s",
        "max_body_mb",
        "max_json_mb",
        "header_timeout_s",
        "body_idle_timeout_s",
        "max_connections",
        "max_labels",
        "send_timeout_s",
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
    # Start-up work that can fail happens here, before the server starts: a failure inside its
    # lifespan is a traceback; here it is one message and exit code 2.
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
        immich_from=_immich_from(args),
        allowed_hosts=_allowed_hosts(args),
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_json_bytes=int(args.max_json_mb * 2**20),
        max_bodies_in_flight_bytes=int(args.max_bodies_mb * 2**20),
        max_queue=args.max_queue,
        max_queue_delay_ms=args.max_queue_delay_ms,
        request_timeout_s=args.request_timeout_s,
        body_idle_timeout_s=args.body_idle_timeout_s,
        max_requests=args.max_connections,
        max_labels=args.max_labels,
        warmup=not args.no_warmup,
    )
    plugin = start_plugin(args, settings.plugin_config)
    ocr = None
    if index_path and config.ocr.enabled:  # items added over HTTP are read
        ocr = load_ocr(settings.plugin_config, budget=plugin.pixel_budget)
    # Bind here, so that --port 0 picks a free port and the line below says which (tests and
    # supervisors read it; nothing races for a port between choosing and binding it).
    sock = listening_socket(args.host, args.port, send_timeout_s=args.send_timeout_s)
    host = f"[{args.host}]" if sock.family == socket.AF_INET6 else args.host
    port = sock.getsockname()[1]
    server = Config()
    server.bind = [f"fd://{sock.detach()}"]  # Hypercorn owns the socket from here
    # Hypercorn's one idle timer runs from a connection's start and from each answer until the
    # next request's headers are complete: it is the header timeout and the keep-alive timeout.
    server.keep_alive_timeout = args.header_timeout_s
    server.graceful_timeout = args.request_timeout_s + 5  # in-flight requests finish on SIGTERM
    server.include_server_header = False
    server.alpn_protocols = ["http/1.1"]  # HTTP/2 is not offered over TLS (one tested path)
    server.backlog = 2048
    server.loglevel = "INFO" if args.verbose else "WARNING"
    server.accesslog = "-" if args.verbose else None
    if tls:
        server.certfile, server.keyfile = tls
    scheme = "https" if tls else "http"
    print(f"themis-clip: listening on {scheme}://{host}:{port}", file=sys.stderr)
    sys.stderr.flush()
    # SIGINT and SIGTERM stop it gracefully: requests in flight get DRAIN_S to finish, then
    # the model stops the runs still going (an endless or very slow model cannot hold the
    # process), and the server closes; exit code 0.
    app = cast(
        "ASGIFramework", create_app(settings, plugin=plugin, ocr=ocr)
    )  # Starlette's ASGI types
    asyncio.run(serve(app, server, mode="asgi", shutdown_trigger=_stopping(plugin)))
    print("themis-clip: stopped", file=sys.stderr)
    return 0


#: What requests in flight get after SIGTERM before the model stops their runs.
DRAIN_S = 10.0


def _stopping(plugin: Any) -> Any:
    """Hypercorn's shutdown trigger: returns at SIGINT or SIGTERM, having said so and begun
    the model's drain (in a thread: it waits at most :data:`DRAIN_S`)."""

    async def trigger() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        print("themis-clip: stopping: finishing the requests in flight", file=sys.stderr)
        late = threading.Timer(DRAIN_S, plugin.stop_runs, args=("the server is stopping",))
        late.daemon = True
        late.start()

    return trigger


def listening_socket(host: str, port: int, *, send_timeout_s: float = 30.0) -> socket.socket:
    """A bound, listening TCP socket whose accepted connections inherit its options.

    ``TCP_NODELAY``: asyncio sets it on an accepted socket only when its ``proto`` is
    ``IPPROTO_TCP``; ``socket.socket(family, SOCK_STREAM)`` leaves it 0, and every keep-alive
    answer then waits out Nagle plus the client's delayed ACK (about 40 ms).
    ``TCP_USER_TIMEOUT`` (Linux): the kernel drops a connection whose sent bytes stay
    unacknowledged, or unsent behind a zero window (a client that never reads), for
    ``send_timeout_s``, which frees what the server buffered for it.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, round(send_timeout_s * 1000))
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


def _immich_from(args: argparse.Namespace) -> tuple[str, ...]:
    from themis_clip.server.access import parse_networks

    names = tuple(n.strip() for n in (args.immich_from or "").split(",") if n.strip())
    try:
        parse_networks(names)
    except ValueError as exc:
        raise CLIError(f"--immich-from: {exc}") from None
    return names


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
    try:  # fail here, with a message, rather than inside the server's startup
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise CLIError(f"cannot use the TLS certificate/key: {exc}") from exc
    return cert, key
