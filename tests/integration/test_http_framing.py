"""Hostile clients, round two, through the real ``themis-clip serve`` (issue 28, part 2).

Each failed before its fix: clients that never read held their connection and buffered answer
for ever (and locked everyone out under ``--max-connections``); stalled uploads were buffered
with no global cap; kept-alive requests waited out Nagle plus delayed ACK (~44 ms each: no
``TCP_NODELAY``); Content-Length with Transfer-Encoding kept the connection open and answered
the smuggled request; two ``Content-Type`` headers skipped the strict-JSON check; h11's framing
errors were plain-text 400s; ``Multipart/Form-Data`` was not recognised.
"""

from __future__ import annotations

import ctypes
import gzip
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.helpers import ServerProcess, encode, photo_like

# Each test starts real processes (a `themis-clip serve`, a Hub stand-in): the slower set.
pytestmark = pytest.mark.slow

HOST = b"Host: 127.0.0.1\r\n"


def port_of(server: ServerProcess) -> int:
    return int(server.base.rsplit(":", 1)[1])


def read_all(s: socket.socket, timeout_s: float = 20) -> bytes:
    """Everything until the server closes the connection (fails if it stays open)."""
    s.settimeout(timeout_s)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        raise AssertionError(f"the connection stayed open after {out[:300]!r}") from None
    except ConnectionResetError:
        pass
    return out


def one_response(s: socket.socket) -> bytes:
    """One Content-Length response from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk
        body += chunk
    return head + b"\r\n\r\n" + body


def json_error(reply: bytes, status: int) -> dict[str, str]:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), reply[:300]
    assert b"content-type: application/json" in head.lower(), head
    error: dict[str, str] = json.loads(body)["error"]
    return error


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with ServerProcess(["--model", str(tiny_model_dir), "--no-warmup"]) as s:
        yield s


def test_content_length_with_transfer_encoding_closes_and_answers_once(
    server: ServerProcess,
) -> None:
    smuggled = b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n"
    request = (
        b"POST /embed/text HTTP/1.1\r\n" + HOST + b"Content-Type: application/json\r\n"
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled
    )
    with socket.create_connection(("127.0.0.1", port_of(server))) as s:
        s.sendall(request)
        reply = read_all(s)  # RFC 9112 6.3: the server must close
    assert reply.count(b"HTTP/1.1 ") == 1, reply  # the smuggled request is never answered
    error = json_error(reply, 400)
    assert "Content-Length and Transfer-Encoding" in error["message"]


@pytest.mark.parametrize("name", ["Content-Type", "Content-Length", "Authorization", "Host"])
def test_a_single_valued_header_sent_twice_is_refused(server: ServerProcess, name: str) -> None:
    """Parsers disagree on which copy counts (the guard read the last Content-Type, FastAPI the
    first): ``application/json`` then ``text/plain`` let a NaN body past the strict check."""
    body = b'{"text":NaN}'
    values = {
        "Content-Type": ("application/json", "text/plain"),
        "Content-Length": (str(len(body)), str(len(body) + 1)),  # identical ones are one (RFC 9110)
        "Authorization": ("Bearer a", "Bearer b"),
        "Host": ("127.0.0.1", "127.0.0.1"),
    }[name]
    headers = {
        "Host": "127.0.0.1",
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
    }
    lines = [f"{k}: {v}" for k, v in headers.items() if k != name]
    lines += [f"{name}: {v}" for v in values]
    request = ("POST /embed/text HTTP/1.1\r\n" + "\r\n".join(lines) + "\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port_of(server))) as s:
        s.sendall(request + body)
        reply = read_all(s)  # and closed
    if name in ("Content-Length", "Host"):  # h11 refuses these: Hypercorn's bare 400
        assert reply.startswith(b"HTTP/1.1 400 "), reply[:300]
        return
    error = json_error(reply, 400)
    assert error["type"] == "BadRequest", error
    assert f"more than one {name}" in error["message"], error


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n",
        b"POST /embed/text HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /healthz HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
    ],
)
def test_framing_errors_are_refused_and_closed(server: ServerProcess, request_bytes: bytes) -> None:
    """What h11 cannot parse gets Hypercorn's own answer: 400, no body, connection closed."""
    with socket.create_connection(("127.0.0.1", port_of(server))) as s:
        s.sendall(request_bytes)
        reply = read_all(s)  # fails if the connection stays open
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:300]
    assert b"connection: close" in reply.lower()


def test_multipart_media_type_is_case_insensitive(server: ServerProcess) -> None:
    image = encode(Image.fromarray(photo_like(40, 32, 3)), "PNG")
    request = httpx.Request(
        "POST", f"{server.base}/embed/image", files={"file": ("a.png", image, "image/png")}
    )
    body = request.read()
    boundary = request.headers["content-type"].split("boundary=")[1]
    for media in ("Multipart/Form-Data", "MULTIPART/FORM-DATA"):
        r = httpx.post(
            f"{server.base}/embed/image",
            content=body,
            headers={"Content-Type": f"{media}; boundary={boundary}"},
        )
        assert r.status_code == 200, r.text
        assert len(r.json()["embedding"]) == 32


def _server_socket_nodelay(pid: int, server_port: int, client_port: int) -> int:
    """``TCP_NODELAY`` of the server's end of our connection, read from the server process."""
    wanted = None
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if (
                int(local.rsplit(":", 1)[1], 16) == server_port
                and int(remote.rsplit(":", 1)[1], 16) == client_port
            ):
                wanted = f"socket:[{fields[9]}]"
    assert wanted is not None, "the server's end of the connection is not in /proc"
    target = next(
        int(fd)
        for fd in os.listdir(f"/proc/{pid}/fd")
        if os.readlink(f"/proc/{pid}/fd/{fd}") == wanted
    )
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        dup = libc.syscall(438, pidfd, target, 0)  # pidfd_getfd(2): our copy of its socket
        if dup < 0:
            pytest.skip(f"pidfd_getfd refused: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(pidfd)
    with socket.socket(fileno=dup) as copy:
        return copy.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_kept_alive_requests_do_not_wait_for_delayed_acks(server: ServerProcess) -> None:
    """The accepted socket has ``TCP_NODELAY``, read from the server process itself.

    Without it every answer after the first waits for the client's delayed ACK (40 ms on
    Linux) before its body leaves (Nagle). The latency is a benchmark's figure, not an assert a
    loaded machine could tip: ``bench/bench_edge.py`` (44 ms before, 0.40 ms after).
    """
    port = port_of(server)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(20)
        for _ in range(3):  # kept alive: the same accepted socket answers each
            s.sendall(b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n")
            assert one_response(s).startswith(b"HTTP/1.1 200")
        nodelay = _server_socket_nodelay(server.proc.pid, port, s.getsockname()[1])
    assert nodelay != 0


BIG = {"texts": [f"text number {i}" for i in range(2048)]}  # a ~1.4 MB answer
PIPELINED = 7  # ~9 MB per client: more than the kernel's socket buffers (~4 MB on loopback)


def _stalled_clients(port: int, n: int, requests: int = PIPELINED) -> list[socket.socket]:
    """Clients that ask for big answers (pipelined) and never read them."""
    body = json.dumps(BIG).encode()
    request = (
        b"POST /embed/text HTTP/1.1\r\n" + HOST + b"Content-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: data piles up
        s.connect(("127.0.0.1", port))
        s.sendall(request * requests)
        out.append(s)
    return out


def _no_batch_for(base: str, quiet_s: float, timeout_s: float) -> None:
    """Poll ``/metrics`` until no text batch has run for ``quiet_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while True:
        text = httpx.get(f"{base}/metrics", timeout=5).text
        count = next(
            line.rsplit(" ", 1)[1]
            for line in text.splitlines()
            if line.startswith('themis_batch_size_count{modality="text"}')
        )
        now = time.monotonic()
        if count != last:
            last, since = count, now
        elif now - since >= quiet_s:
            return
        assert now < deadline, "the server kept making answers"
        time.sleep(0.2)


def _fresh_clients_served_within(base: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "stalled readers still lock everyone out"
        time.sleep(0.2)


@pytest.mark.slow
def test_clients_that_never_read_are_dropped(tiny_model_dir: Path) -> None:
    """``--send-timeout-s`` is the kernel's ``TCP_USER_TIMEOUT``: a connection whose answer
    bytes sit unsent behind a zero window that long is dropped, its buffers freed."""
    limits = ["--send-timeout-s", "2"]
    args = ["--model", str(tiny_model_dir), "--no-warmup", *limits]
    args += ["--max-queue", "65536"]  # all of their texts queue (no 429 answers them)
    with ServerProcess(args) as server:
        answer = len(httpx.post(f"{server.base}/embed/text", json=BIG, timeout=60).content)
        stalled = _stalled_clients(port_of(server), 3)
        try:
            _fresh_clients_served_within(server.base, 90)
            # Read only once the server has run no batch for longer than the send timeout:
            # every client left with answers to take has then been stalled that long. Reading
            # one whose answers were still being made (a loaded machine) drained it first.
            _no_batch_for(server.base, 3.0, 120)
            # A dropped client's answers never all arrive (the rest of them were discarded).
            received = [len(read_all(s, timeout_s=30)) for s in stalled]
            assert all(n < PIPELINED * answer for n in received), (received, answer)
        finally:
            for s in stalled:
                s.close()
        assert httpx.post(f"{server.base}/embed/text", json={"text": "ok"}).status_code == 200


def test_request_bodies_held_at_once_have_a_budget(tiny_model_dir: Path) -> None:
    args = ["--model", str(tiny_model_dir), "--no-warmup", "--max-bodies-mb", "1"]
    args += ["--max-body-mb", "1", "--body-idle-timeout-s", "60"]
    head = (
        b"POST /embed/image HTTP/1.1\r\n" + HOST + b"Content-Type: image/png\r\n"
        b"Content-Length: 700000\r\n\r\n"
    )
    with ServerProcess(args) as server:
        port = port_of(server)
        first = socket.create_connection(("127.0.0.1", port))
        first.sendall(head + b"\x89PNG")  # stalls holding 700,000 bytes of budget
        try:
            deadline = time.monotonic() + 30
            while True:  # the first reservation lands; a second body does not fit beside it
                with socket.create_connection(("127.0.0.1", port)) as s:
                    s.sendall(head)
                    reply = read_all(s)
                if b" 503 " in reply.split(b"\r\n", 1)[0]:
                    break
                assert time.monotonic() < deadline, reply[:300]
            error = json_error(reply, 503)
            assert error["type"] == "ServerBusy" and b"retry-after: 1" in reply.lower()
        finally:
            first.close()
        # The stalled upload is gone: the budget is free again.
        deadline = time.monotonic() + 30
        while True:
            r = httpx.post(
                f"{server.base}/embed/image",
                content=b"x" * 700_000,
                headers={"Content-Type": "image/png"},
            )
            if r.status_code != 503:
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert r.status_code in (413, 415, 422), r.text


def test_slow_bodies_hold_the_budget_by_what_they_sent_not_by_what_they_declare(
    tiny_model_dir: Path,
) -> None:
    """Clients that declare large bodies and send a trickle hold about 1 MiB each, not the
    size they declared: an upload beside them still fits in the budget (tryout: 14 clients
    declaring 19 MB at a byte a second refused every real upload for 30 s)."""
    args = ["--model", str(tiny_model_dir), "--no-warmup", "--max-bodies-mb", "8"]
    args += ["--max-body-mb", "8", "--body-idle-timeout-s", "60"]
    head = (
        b"POST /embed/image HTTP/1.1\r\n" + HOST + b"Content-Type: image/png\r\n"
        b"Content-Length: 7000000\r\n\r\n"
    )
    with ServerProcess(args) as server:
        port = port_of(server)
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        try:
            for s in slow:
                s.sendall(head + b"\x89PNG")  # 7 MB declared each: 21 MB against 8 MB
            # A 3 MB upload fits beside them (about 3 MiB held by the three).
            r = httpx.post(
                f"{server.base}/embed/image",
                content=b"x" * 3_000_000,
                headers={"Content-Type": "image/png"},
                timeout=60,
            )
            assert r.status_code in (413, 415, 422), r.text  # read whole; not a 503
            # Bytes that do arrive are held: 6 MB does not fit beside their ~3 MiB.
            r = httpx.post(
                f"{server.base}/embed/image",
                content=b"x" * 6_000_000,
                headers={"Content-Type": "image/png"},
                timeout=60,
            )
            assert r.status_code == 503 and r.json()["error"]["type"] == "ServerBusy", r.text
        finally:
            for s in slow:
                s.close()


def test_a_content_coding_is_refused_by_name(server: ServerProcess) -> None:
    """A gzip body read as plain JSON was a 400 'not valid UTF-8 (byte 1)'; a plain body
    claiming gzip was read as it is (tryout)."""
    body = gzip.compress(json.dumps({"text": "a red circle"}).encode())
    for coding in ("gzip", "br"):
        r = httpx.post(
            f"{server.base}/embed/text",
            content=body,
            headers={"Content-Type": "application/json", "Content-Encoding": coding},
        )
        assert r.status_code == 415, r.text
        assert coding in r.json()["error"]["message"]
    r = httpx.post(
        f"{server.base}/embed/text",
        json={"text": "a red circle"},
        headers={"Content-Encoding": "identity"},
    )
    assert r.status_code == 200, r.text


def test_admin_without_keys_refuses_before_the_body(server: ServerProcess) -> None:
    """The open loopback demo too: ``/admin/*`` answers at once and closes, the body unread.
    (Hypercorn sends its interim ``100`` as soon as the headers parse; the refusal follows.)"""
    head = (
        b"POST /admin/reload HTTP/1.1\r\n" + HOST + b"Content-Type: application/json\r\n"
        b"Expect: 100-continue\r\nContent-Length: " + str(19 * 2**20).encode() + b"\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port_of(server))) as s:
        s.sendall(head)
        reply = read_all(s)  # closed: the body is never read
    if reply.startswith(b"HTTP/1.1 100 "):
        reply = reply.partition(b"\r\n\r\n")[2]
    assert json_error(reply, 403)["type"] == "Forbidden"  # no admin token configured
