"""A Hugging Face Hub stand-in on loopback, for ``huggingface_hub`` pointed at it by ``HF_ENDPOINT``.

It serves the endpoints the client uses to pull a model: repo info
(``/api/models/{repo}/revision/{rev}``), the recursive tree listing with each LFS file's SHA-256
(``/api/models/{repo}/tree/{rev}``), and ``/{repo}/resolve/{rev}/{file}`` with HEAD metadata
(``X-Repo-Commit``, ``ETag`` / ``X-Linked-Etag``, ``X-Linked-Size``) and ``Range``. Repos are
folders the tests build; files over :data:`LFS_THRESHOLD` bytes are listed as LFS files, as the
Hub does for weights. Faults are switches: serve a file with one byte flipped (the listing keeps
the true digest), drop the connection once mid-file, answer 401/403 for a gated repo. Every
request is counted.

Hostile answers (what a mirror, a proxy or anyone on plain HTTP could send) are switches too:
another commit in the repo info (``../x``, an absolute path, ``main``), other ``X-Repo-Commit``
or ``ETag`` headers on file answers, extra listing entries (traversal names, absurd sizes), and
file bodies longer than their listing (the listing and HEAD keep the true size).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_THRESHOLD = 1024


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data, usedforsecurity=False).hexdigest()


@dataclass
class Repo:
    folder: Path
    commit: str
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag → commit
    gated: int | None = None  # 401 or 403

    def files(self) -> dict[str, bytes]:
        return {
            p.relative_to(self.folder).as_posix(): p.read_bytes()
            for p in sorted(self.folder.rglob("*"))
            if p.is_file()
        }


class FakeHub:
    """The server; ``with FakeHub() as hub: hub.add(...)``; ``hub.url`` for ``HF_ENDPOINT``."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: Counter[str] = Counter()  # "METHOD kind" → count
        self.downloads: Counter[str] = Counter()  # "repo/file" → full or partial GET bodies sent
        self.flip: set[tuple[str, str]] = set()  # (repo, file) served with one byte flipped
        self.drop_once: set[tuple[str, str]] = set()  # (repo, file) cut mid-body once
        self.block = threading.Event()  # set: hold every file body until cleared
        self.block.set()
        self.answer_commit: dict[str, str] = {}  # repo → the commit its info answers with
        self.header_commit: dict[str, str] = {}  # repo → X-Repo-Commit on its file answers
        self.header_etag: dict[str, str] = {}  # repo → ETag on its file answers
        self.extra_listing: dict[str, list[dict[str, object]]] = {}  # repo → entries added
        self.padding: dict[tuple[str, str], int] = {}  # (repo, file) → bytes sent past its end
        self.body_bytes: Counter[str] = Counter()  # "repo/file" → body bytes written
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, repo: str, folder: Path, *, gated: int | None = None) -> str:
        """Serve ``folder`` as ``repo`` at branch ``main`` and tag ``v1``; returns the commit."""
        digest = hashlib.sha1(repo.encode(), usedforsecurity=False)
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                digest.update(p.relative_to(folder).as_posix().encode() + p.read_bytes())
        commit = digest.hexdigest()
        self.repos[repo] = Repo(folder, commit, {"main": commit, "v1": commit}, gated)
        return commit

    def total(self) -> int:
        return sum(self.requests.values())

    # --- HTTP ------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, head=True)

            def do_GET(self) -> None:
                hub._serve(self, head=False)

        return Handler

    def _count(self, key: str) -> None:
        with self._lock:
            self.requests[key] += 1

    def _json(self, h: BaseHTTPRequestHandler, body: object, status: int = 200) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, head: bool) -> None:
        data = b"" if head else json.dumps({"error": code}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _find(self, name: str) -> tuple[str, Repo] | None:
        repo = self.repos.get(name)
        return (name, repo) if repo is not None else None

    def _commit(self, repo: Repo, rev: str) -> str | None:
        if rev == repo.commit or rev in self.answer_commit.values():
            return repo.commit  # a hostile commit is answered as if it were the true one
        return repo.refs.get(rev)

    def _serve(self, h: BaseHTTPRequestHandler, *, head: bool) -> None:
        raw = urlparse(h.path).path  # matched quoted: a revision may hold "/" ("%2F")
        path = unquote(raw)
        method = "HEAD" if head else "GET"
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", raw)
        if m:
            self._count(f"{method} info")
            return self._info(h, unquote(m.group(1)), unquote(m.group(2)), head)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", raw)
        if m:
            self._count(f"{method} tree")
            return self._tree(h, unquote(m.group(1)), unquote(m.group(2)), head)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", raw)
        if m:
            self._count(f"{method} resolve")
            name, rev, rel = (unquote(g) for g in m.groups())
            return self._file(h, name, rev, rel, head)
        self._count(f"{method} other {path}")
        self._error(h, 404, "EntryNotFound", head)

    def _gate(self, h: BaseHTTPRequestHandler, name: str, head: bool) -> Repo | None:
        found = self._find(name)
        if found is None:
            self._error(h, 404, "RepoNotFound", head)
            return None
        repo = found[1]
        if repo.gated is not None:
            self._error(h, repo.gated, "GatedRepo", head)
            return None
        return repo

    def _info(self, h: BaseHTTPRequestHandler, name: str, rev: str, head: bool) -> None:
        repo = self._gate(h, name, head)
        if repo is None:
            return
        commit = self._commit(repo, rev)
        if commit is None:
            return self._error(h, 404, "RevisionNotFound", head)
        siblings = [{"rfilename": f} for f in repo.files()]
        sha = self.answer_commit.get(name, commit)
        self._json(h, {"id": name, "modelId": name, "sha": sha, "siblings": siblings})

    def _tree(self, h: BaseHTTPRequestHandler, name: str, rev: str, head: bool) -> None:
        repo = self._gate(h, name, head)
        if repo is None:
            return
        if self._commit(repo, rev) is None:
            return self._error(h, 404, "RevisionNotFound", head)
        entries: list[dict[str, object]] = []
        folders: set[str] = set()
        for rel, data in repo.files().items():
            parts = rel.split("/")[:-1]
            for i in range(len(parts)):
                folders.add("/".join(parts[: i + 1]))
            entry: dict[str, object] = {
                "type": "file",
                "oid": _git_blob_sha1(data),
                "size": len(data),
                "path": rel,
            }
            if len(data) > LFS_THRESHOLD:
                entry["lfs"] = {
                    "oid": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                    "pointerSize": 134,
                }
            entries.append(entry)
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in folders]
        entries += self.extra_listing.get(name, [])
        self._json(h, entries)

    def _file(self, h: BaseHTTPRequestHandler, name: str, rev: str, rel: str, head: bool) -> None:
        repo = self._gate(h, name, head)
        if repo is None:
            return
        commit = self._commit(repo, rev)
        if commit is None:
            return self._error(h, 404, "RevisionNotFound", head)
        files = repo.files()
        if rel not in files:
            return self._error(h, 404, "EntryNotFound", head)
        data = files[rel]
        lfs = len(data) > LFS_THRESHOLD
        etag = hashlib.sha256(data).hexdigest() if lfs else _git_blob_sha1(data)
        if (name, rel) in self.flip:
            data = bytearray(data)
            data[len(data) // 2] ^= 0x01
            data = bytes(data)
        start, status = 0, 200
        rng = h.headers.get("Range")
        if rng and not head:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if m:
                start, status = int(m.group(1)), 206
        body = data[start:]
        pad = 0 if head else self.padding.get((name, rel), 0)
        h.send_response(status)
        h.send_header("X-Repo-Commit", self.header_commit.get(name, commit))
        etag = self.header_etag.get(name, etag)
        h.send_header("ETag", f'"{etag}"')
        if lfs:
            h.send_header("X-Linked-Etag", f'"{etag}"')
            h.send_header("X-Linked-Size", str(len(data)))
        h.send_header("Accept-Ranges", "bytes")
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        if pad:  # no length to check against: the body ends when the connection closes
            h.send_header("Connection", "close")
            h.close_connection = True
        else:
            h.send_header("Content-Length", str(len(data) if head else len(body)))
        h.send_header("Content-Type", "application/octet-stream")
        h.end_headers()
        if head:
            return
        self.block.wait(30)
        with self._lock:
            self.downloads[f"{name}/{rel}"] += 1
            drop = (name, rel) in self.drop_once and start == 0
            if drop:
                self.drop_once.discard((name, rel))
        if drop:  # half the body, then the connection goes away
            h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return
        h.wfile.write(body)
        self._count_body(name, rel, len(body))
        chunk = b"\0" * (1 << 20)
        try:
            while pad > 0:  # a body longer than its listing, sent until the client gives up
                h.wfile.write(chunk[:pad])
                self._count_body(name, rel, min(pad, len(chunk)))
                pad -= len(chunk)
        except OSError:
            h.close_connection = True

    def _count_body(self, name: str, rel: str, n: int) -> None:
        with self._lock:
            self.body_bytes[f"{name}/{rel}"] += n
