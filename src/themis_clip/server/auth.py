"""Access control: API keys with scopes, checked once at the edge.

The model (no web framework): :class:`Scope`, the keys file (:func:`create_key`,
:func:`revoke_key`, :func:`list_keys`) and :class:`KeyStore`, which the server asks
who a bearer key belongs to and re-reads the file when it changes.

The keys file is JSON written atomically with mode 0600::

    {"version": 1, "keys": [{"name": "...", "scopes": ["search"], "created": "...Z",
                             "sha256": "<hex digest of the key>"}]}

It holds only SHA-256 digests. A key is 256 random bits from :mod:`secrets`: a slow password
KDF (bcrypt, argon2) protects *guessable* secrets from a dictionary attack on a stolen file,
and a uniformly random 256-bit key has no dictionary; recovering it from its digest means
inverting SHA-256. A fast digest also keeps a per-request check at microseconds, where a KDF
tuned to 100 ms would make every request (and every wrong key an attacker sends) a CPU
burner. When each key was last used goes to a sidecar, ``FILE.used`` (digest -> time, written
at most once a minute per key), so that the server never rewrites the keys file itself. Both
files are read as regular files only (a FIFO put in their place would wait for a writer) and at
most :data:`MAX_KEYS_FILE_BYTES`; a file that is neither fails closed.

The edge (:class:`Authenticate`, pure ASGI, outside the request guard) decides before a byte
of the body is read: 401 (``WWW-Authenticate: Bearer``) without a key or with a wrong one,
403 for a key without the route's scope. A route's scope is declared once, on its router, with
``Security(authorize, scopes=[...])`` (:data:`SEARCH`, :data:`WRITE`, :data:`ADMIN`,
:data:`METRICS`; :data:`PUBLIC` marks the few open routes); the middleware reads those
declarations from the assembled app (:func:`route_scopes`), and :func:`authorize` re-checks
the principal the middleware recorded. A route with no declaration needs a valid key.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import json
import logging
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from themis_clip.errors import ConfigError
from themis_clip.files import file_lock, open_regular

__all__ = [
    "KEY_PREFIX",
    "MAX_KEYS_FILE_BYTES",
    "KeyRecord",
    "KeyStore",
    "Principal",
    "Scope",
    "create_key",
    "list_keys",
    "parse_scopes",
    "revoke_key",
]

log = logging.getLogger(__name__)

KEY_PREFIX = "tck_"  # recognisable by secret scanners; the random part is 256 bits
_VERSION = 1
_USED_EVERY_S = 60.0
MAX_KEYS_FILE_BYTES = 4 << 20  # some 20,000 keys; more is not a keys file


class Scope(enum.StrEnum):
    """What a key may do."""

    SEARCH = "search"  # search, embeddings, classify, rank, items, thumbnails, index info, /v1
    WRITE = "write"  # /index/items and any DELETE
    ADMIN = "admin"  # /admin/reload, /admin/stats
    METRICS = "metrics"  # /metrics, /stats


def parse_scopes(text: str) -> frozenset[Scope]:
    """``"search,write"`` -> scopes; a clear error naming an unknown one."""
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    if not names:
        raise ConfigError(f"no scope given; choose from {', '.join(s.value for s in Scope)}")
    unknown = [n for n in names if n not in {s.value for s in Scope}]
    if unknown:
        raise ConfigError(
            f"unknown scope {unknown[0]!r}; choose from {', '.join(s.value for s in Scope)}"
        )
    return frozenset(Scope(n) for n in names)


@dataclass(frozen=True, kw_only=True)
class KeyRecord:
    """One key as the file holds it (never the key itself)."""

    name: str
    scopes: frozenset[Scope]
    created: str
    sha256: str
    last_used: str | None = None


@dataclass(frozen=True, kw_only=True)
class Principal:
    """Who a request authenticated as."""

    name: str
    scopes: frozenset[Scope]


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read_json(path: Path) -> Any:
    """The JSON in a regular file of at most :data:`MAX_KEYS_FILE_BYTES`.

    Raises:
        OSError: missing, unreadable, or not a regular file (never waits on a FIFO).
        ValueError: too large, not UTF-8 or not JSON.
    """
    with open_regular(path) as f:
        data = f.read(MAX_KEYS_FILE_BYTES + 1)
    if len(data) > MAX_KEYS_FILE_BYTES:
        raise ValueError(f"larger than {MAX_KEYS_FILE_BYTES} bytes")
    return json.loads(data.decode("utf-8"))


def _read(path: Path) -> list[KeyRecord]:
    try:
        raw = _read_json(path)
    except FileNotFoundError:
        raise ConfigError(f"keys file {path} does not exist (themis-clip keys create)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"cannot read keys file {path}: {exc}") from None
    if not isinstance(raw, dict) or raw.get("version") != _VERSION:
        raise ConfigError(f"keys file {path} is not a version-{_VERSION} themis-clip keys file")
    out: list[KeyRecord] = []
    for i, entry in enumerate(raw.get("keys") or []):
        try:
            out.append(
                KeyRecord(
                    name=str(entry["name"]),
                    scopes=parse_scopes(",".join(entry["scopes"])),
                    created=str(entry["created"]),
                    sha256=str(entry["sha256"]),
                )
            )
        except (KeyError, TypeError, ConfigError) as exc:
            raise ConfigError(f"keys file {path}: entry {i} is malformed ({exc})") from None
    return out


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON next to ``path`` with mode 0600, then rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _locked(path: Path) -> contextlib.AbstractContextManager[None]:
    """Serialise writers of one keys file (two ``keys create`` at once both land)."""
    return file_lock(path.with_name(path.name + ".lock"))


def _dump(records: Iterable[KeyRecord]) -> dict[str, Any]:
    return {
        "version": _VERSION,
        "keys": [
            {
                "name": r.name,
                "scopes": sorted(s.value for s in r.scopes),
                "created": r.created,
                "sha256": r.sha256,
            }
            for r in records
        ],
    }


def create_key(path: Path, scopes: frozenset[Scope], name: str | None = None) -> tuple[str, str]:
    """Add a new random key to the keys file (created if missing). Returns (name, key)."""
    if name is not None and (not name.strip() or any(ord(c) < 32 for c in name)):
        raise ConfigError("--name must be non-empty, without control characters")
    with _locked(path):
        records = _read(path) if path.exists() else []
        taken = {r.name for r in records}
        if name is None:
            name = next(f"key-{i}" for i in range(1, len(taken) + 2) if f"key-{i}" not in taken)
        elif name in taken:
            raise ConfigError(f"a key named {name!r} exists already (revoke it first)")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        records.append(KeyRecord(name=name, scopes=scopes, created=_now(), sha256=digest(key)))
        _write_atomic(path, _dump(records))
    return name, key


def revoke_key(path: Path, name: str) -> None:
    """Remove the key called ``name``; a running server stops accepting it within seconds."""
    with _locked(path):
        records = _read(path)
        kept = [r for r in records if r.name != name]
        if len(kept) == len(records):
            known = ", ".join(r.name for r in records) or "none"
            raise ConfigError(f"no key named {name!r} in {path} (keys: {known})")
        _write_atomic(path, _dump(kept))


def _used_path(path: Path) -> Path:
    return path.with_name(path.name + ".used")


def list_keys(path: Path) -> list[KeyRecord]:
    """The keys in the file, each with when a server last saw it used (None: never)."""
    used: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError):
        loaded = _read_json(_used_path(path))
        if isinstance(loaded, dict):
            used = {str(k): str(v) for k, v in loaded.items()}
    return [
        KeyRecord(
            name=r.name,
            scopes=r.scopes,
            created=r.created,
            sha256=r.sha256,
            last_used=used.get(r.sha256),
        )
        for r in _read(path)
    ]


class KeyStore:
    """Answers "whose key is this?" for the server; re-reads the file when it changes.

    The file's identity (inode, size, mtime) is looked at no more than every
    ``check_every_s``; a changed file is re-read, so a revoked key stops working within about
    that long. A file that becomes unreadable or invalid fails closed: no key is accepted
    until it is fixed (and the problem is logged once).

    :meth:`authenticate` touches the disk only when :meth:`needs_io` says so (a due re-read,
    a key's first use in a minute): an event loop calls it in a worker thread then, and
    in place otherwise. It is safe to call from several threads at once.
    """

    def __init__(
        self,
        path: str | Path | None,
        *,
        admin_token: str | None = None,
        check_every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.admin_token = admin_token
        self.check_every_s, self.clock = check_every_s, clock
        self._by_digest: dict[str, KeyRecord] = {}
        self._signature: tuple[int, int, int] | None = None
        self._checked = -float("inf")
        self._used: dict[str, float] = {}
        self._lock = threading.Lock()
        if self.path is not None:
            self._load(initial=True)

    @property
    def enabled(self) -> bool:
        """Keys are required (a keys file was given)."""
        return self.path is not None

    def _stat(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _load(self, *, initial: bool = False) -> None:
        assert self.path is not None
        signature = self._stat()
        try:
            records = _read(self.path)
        except ConfigError as exc:
            if initial:
                raise
            if self._by_digest or self._signature != signature:
                log.error("keys file unusable, refusing every key until fixed: %s", exc)
            self._by_digest, self._signature = {}, signature
            return
        self._by_digest = {r.sha256: r for r in records}
        if not initial:
            log.info("keys file %s re-read: %d keys", self.path, len(records))
        self._signature = signature

    def needs_io(self, key: str) -> bool:
        """Whether :meth:`authenticate` of ``key`` would read or write a file now."""
        if self.path is None:
            return False
        now = self.clock()
        if now - self._checked >= self.check_every_s:
            return True
        sha = digest(key)
        return sha in self._by_digest and now - self._used.get(sha, -float("inf")) >= _USED_EVERY_S

    def refresh(self) -> None:
        """Re-read the file if it changed (at most every ``check_every_s``)."""
        # Checked before the lock too: a caller on the event loop never waits for a reader.
        if self.path is None or self.clock() - self._checked < self.check_every_s:
            return
        with self._lock:
            now = self.clock()
            if now - self._checked < self.check_every_s:
                return
            self._checked = now
            if self._stat() != self._signature:
                self._load()

    def authenticate(self, key: str) -> Principal | None:
        """The principal a bearer key belongs to, or None (unknown, revoked, malformed)."""
        if self.admin_token and hmac.compare_digest(
            key.encode("utf-8", "surrogatepass"), self.admin_token.encode()
        ):
            return Principal(name="THEMIS_ADMIN_TOKEN", scopes=frozenset({Scope.ADMIN}))
        if self.path is None:
            return None
        self.refresh()
        # A dict lookup by digest: its timing depends on the digest, which reveals nothing
        # usable about keys that hash elsewhere.
        record = self._by_digest.get(digest(key))
        if record is None:
            return None
        self._note_use(record.sha256)
        return Principal(name=record.name, scopes=record.scopes)

    def _note_use(self, sha: str) -> None:
        if self.clock() - self._used.get(sha, -float("inf")) < _USED_EVERY_S:
            return
        with self._lock:
            now = self.clock()
            if now - self._used.get(sha, -float("inf")) < _USED_EVERY_S:
                return
            self._used[sha] = now
            self._write_use(sha)

    def _write_use(self, sha: str) -> None:
        assert self.path is not None
        side = _used_path(self.path)
        try:
            try:
                used = _read_json(side)
                used = used if isinstance(used, dict) else {}
            except (OSError, ValueError):
                used = {}
            used[sha] = _now()
            used = {k: v for k, v in used.items() if k in self._by_digest}
            _write_atomic(side, used)
        except OSError as exc:  # last-used is bookkeeping: never fail a request for it
            log.warning("cannot record key use in %s: %s", side, exc)
