"""The edge's access decisions: trusted ``Host`` names, then keys and scopes (pure ASGI).

:class:`TrustedHosts` answers 421 to a ``Host`` the server is not reached by (a DNS-rebinding
page names its own domain). It follows Starlette's ``TrustedHostMiddleware`` but parses
``[::1]:8080`` (Starlette splits at the first colon) and answers with the documented JSON body.

:class:`Authenticate` decides every request before the request guard reads a byte of its body
(see :mod:`themis_clip.server.auth` for keys): which scope a route needs is declared once on its
router, ``dependencies=[SEARCH]`` and so on, and read here from the assembled app by
:func:`route_scopes`; :func:`authorize` (the dependency those declarations name) re-checks the
principal recorded here, so a route that somehow escaped the middleware still refuses.

Without a keys file (the loopback demo) every route is open as before, except ``/admin/*``,
which keeps its ``THEMIS_ADMIN_TOKEN`` rules (401 without a token, 403 with a wrong one).

A route whose router also declares :data:`BY_NETWORK` admits a request without a key when
it comes from one of the networks the server was given (``--immich-from``): immich's server
sends no credentials, and only its routes open that way, with the ``search`` scope alone. The
address is the connection's peer (behind a reverse proxy, the proxy's).
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterable
from typing import Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer, SecurityScopes
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from themis_clip.server.auth import KeyStore, Principal
from themis_clip.server.auth import Scope as KeyScope
from themis_clip.server.errors import APIError, error_response

__all__ = [
    "ADMIN",
    "BY_NETWORK",
    "METRICS",
    "PUBLIC",
    "SEARCH",
    "WRITE",
    "Authenticate",
    "TrustedHosts",
    "authorize",
    "route_scopes",
]

_bearer = HTTPBearer(auto_error=False, description="an API key: themis-clip keys create")
_PRINCIPAL = "themis.principal"
_OPEN = Principal(
    name="anonymous", scopes=frozenset({KeyScope.SEARCH, KeyScope.WRITE, KeyScope.METRICS})
)


async def authorize(
    security_scopes: SecurityScopes,
    request: Request,
    _credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),  # noqa: B008
) -> Principal:
    """The principal :class:`Authenticate` recorded, if it holds the scopes declared.

    This and the markers below are ``async``: FastAPI runs a plain function dependency in a
    worker thread, a thread hop per request for nothing that blocks."""
    principal = request.scope.get(_PRINCIPAL)
    if not isinstance(principal, Principal):
        raise APIError(401, "Unauthorized", "not authenticated", {"WWW-Authenticate": "Bearer"})
    missing = sorted(set(security_scopes.scopes) - principal.scopes)
    if missing:
        raise APIError(403, "Forbidden", f"this key lacks the '{missing[0]}' scope")
    return principal


async def public() -> None:
    """Marks a route that needs no key (health, readiness, the page and its assets)."""


async def by_network() -> None:
    """Marks a route that admits, without a key, requests from the allowed networks."""


SEARCH = Security(authorize, scopes=[KeyScope.SEARCH])
WRITE = Security(authorize, scopes=[KeyScope.WRITE])
ADMIN = Security(authorize, scopes=[KeyScope.ADMIN])
METRICS = Security(authorize, scopes=[KeyScope.METRICS])
PUBLIC = Depends(public)
BY_NETWORK = Depends(by_network)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: what a route needs: None (public) or a set of scopes (empty: any valid key)
Need = frozenset[KeyScope] | None


def route_scopes(
    routes: Iterable[BaseRoute], public_paths: Iterable[str]
) -> list[tuple[BaseRoute, Need]]:
    """Each route with what its router declared; undeclared routes need a valid key."""
    open_paths = set(public_paths)
    out: list[tuple[BaseRoute, Need]] = []
    for route in routes:
        if not isinstance(route, Route):  # an included router: its routes are listed too
            continue
        deps: list[Any] = list(getattr(route, "dependencies", None) or [])
        if getattr(route, "path", None) in open_paths or any(
            getattr(d, "dependency", None) is public for d in deps
        ):
            out.append((route, None))
            continue
        scopes = {KeyScope(s) for d in deps for s in (getattr(d, "scopes", None) or ())}
        out.append((route, frozenset(scopes)))
    return out


def network_routes(routes: Iterable[BaseRoute]) -> list[BaseRoute]:
    """The routes whose router declared :data:`BY_NETWORK`."""
    return [
        r
        for r in routes
        if isinstance(r, Route)
        and any(
            getattr(d, "dependency", None) is by_network
            for d in getattr(r, "dependencies", None) or []
        )
    ]


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """CIDR blocks (``172.16.0.0/12``, ``fd00::/8``) or single addresses; an IPv4-mapped IPv6
    block (``::ffff:10.0.0.0/104``) is its IPv4 block, as peers are compared.

    Raises:
        ValueError: one that is neither, has host bits set, or admits every address, named.
    """
    out: list[Network] = []
    for value in values:
        text = value.strip()
        try:
            network: Network = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            if "host bits set" in str(exc):
                loose = ipaddress.ip_network(text, strict=False)
                raise ValueError(f"{value!r} has host bits set; did you mean {loose}?") from None
            raise ValueError(f"{value!r} is not a network (CIDR) or an address") from None
        if isinstance(network, ipaddress.IPv6Network):
            mapped = network.network_address.ipv4_mapped
            if mapped is not None and network.prefixlen >= 96:
                network = ipaddress.IPv4Network(f"{mapped}/{network.prefixlen - 96}")
        if network.prefixlen == 0:
            raise ValueError(
                f"{value!r} admits every address; name immich's own network instead "
                "(e.g. 172.16.0.0/12 for Docker's, or its host's address)"
            )
        out.append(network)
    return tuple(out)


def _peer_in(scope: Scope, networks: tuple[Network, ...]) -> Network | None:
    client = scope.get("client")
    if not networks or not client:
        return None
    try:
        address = ipaddress.ip_address(str(client[0]).split("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack socket reports IPv4 peers so
    return next((n for n in networks if address in n), None)


def _unauthorized(message: str, close: bool) -> Any:
    headers = {"WWW-Authenticate": "Bearer"}
    if close:  # the unread body would otherwise have to be drained
        headers["Connection"] = "close"
    return error_response(401, "Unauthorized", message, headers)


class Authenticate:
    """401 / 403 before the body is read; records the :class:`Principal` for the routes."""

    def __init__(
        self,
        app: ASGIApp,
        keys: KeyStore,
        routes: list[tuple[BaseRoute, Need]],
        *,
        by_network: Iterable[BaseRoute] = (),
        networks: tuple[Network, ...] = (),
    ) -> None:
        self.app, self.keys, self.routes = app, keys, routes
        self.by_network, self.networks = list(by_network), networks

    def _need(self, scope: Scope) -> tuple[Need, BaseRoute | None]:
        partial: Need = frozenset()
        for route, need in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return need, route
            if match is Match.PARTIAL and need is not None:
                partial = need  # a wrong method: authenticate, then 405
        return partial, None

    def _network_principal(self, scope: Scope, route: BaseRoute | None) -> Principal | None:
        """The principal of a keyless request to a :data:`BY_NETWORK` route from an allowed
        network (the search scope only), else None."""
        if route is None or route not in self.by_network:
            return None
        network = _peer_in(scope, self.networks)
        if network is None:
            return None
        return Principal(name=f"network {network}", scopes=frozenset({KeyScope.SEARCH}))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        need, route = self._need(scope)
        if need is None:
            await self.app(scope, receive, send)
            return
        if scope.get("method") == "DELETE":
            need = need | {KeyScope.WRITE}
        headers = scope.get("headers") or []
        has_body = any(
            k == b"transfer-encoding" or (k == b"content-length" and v.strip() not in (b"", b"0"))
            for k, v in headers
        )
        auth = [v for k, v in headers if k == b"authorization"]
        scheme, _, given = (auth[0].decode("latin-1") if auth else "").partition(" ")
        key = given.strip() if scheme.lower() == "bearer" else ""
        refusal: Any = None
        by_network = None if key else self._network_principal(scope, route)
        if not self.keys.enabled and KeyScope.ADMIN not in need:
            principal: Principal | None = _OPEN
        elif by_network is not None:
            principal = by_network
        elif not self.keys.enabled and not self.keys.admin_token:
            principal = None
            refusal = error_response(
                403, "Forbidden", "admin endpoints are disabled (no admin token configured)"
            )
        elif not key:
            principal = None
            hint = (
                " or a request from a network given to --immich-from"
                if route is not None and route in self.by_network
                else ""
            )
            refusal = _unauthorized(
                "this endpoint needs 'Authorization: Bearer <key>' (themis-clip keys create)"
                + hint,
                has_body,
            )
        elif self.keys.needs_io(key):  # reading the keys file may be slow: off the loop
            principal = await asyncio.to_thread(self.keys.authenticate, key)
        else:
            principal = self.keys.authenticate(key)
            if principal is None and self.keys.enabled:
                refusal = _unauthorized("unknown or revoked key", has_body)
            elif principal is None:  # the admin token alone, and not this one
                refusal = error_response(403, "Forbidden", "wrong admin token")
        if principal is not None and refusal is None:
            missing = sorted(need - principal.scopes)
            if missing:
                refusal = error_response(
                    403, "Forbidden", f"this key lacks the '{missing[0]}' scope"
                )
        if refusal is not None:
            if has_body:
                refusal.headers["Connection"] = "close"
            await refusal(scope, receive, send)
            return
        scope[_PRINCIPAL] = principal
        await self.app(scope, receive, send)


def _split_host(value: str) -> str:
    """``example.com:8080`` -> ``example.com``; ``[::1]:8080`` -> ``[::1]``; lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[: end + 1] if end > 0 else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def host_name(address: str) -> str:
    """A bind address as it appears in a ``Host`` header (IPv6 in brackets)."""
    address = address.strip().lower()
    return f"[{address.strip('[]')}]" if ":" in address else address


class TrustedHosts:
    """421 JSON for a ``Host`` header not in ``allowed`` (``*.example.com`` wildcards work)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = [host_name(h) if h != "*" else h for h in allowed]

    def _ok(self, host: str) -> bool:
        for pattern in self.allowed:
            if pattern == "*" or host == pattern:
                return True
            if pattern.startswith("*.") and host.endswith(pattern[1:]):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [v for k, v in scope.get("headers") or [] if k == b"host"]
        host = _split_host(hosts[0].decode("latin-1")) if len(hosts) == 1 else ""
        if not self._ok(host):
            shown = host or "(none)"
            response = error_response(
                421,
                "MisdirectedRequest",
                f"this server does not answer for host {shown[:100]!r} (see --allowed-hosts)",
                {"Connection": "close"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
