"""A public bind behind the shipped reverse-proxy configuration (``deploy/nginx.conf``): a real
nginx in front of a real ``themis-clip serve`` (Debian's ``nginx``; skipped only where it is
not installed)."""

from __future__ import annotations

import getpass
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import ServerProcess, new_key

pytestmark = pytest.mark.slow

CONF = Path(__file__).resolve().parents[2] / "deploy" / "nginx.conf"
NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def proxied(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """nginx's base URL and a search key: nginx, configured by ``deploy/nginx.conf``, in front of the server."""
    if NGINX is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light)")
    tmp = tmp_path_factory.mktemp("proxy")
    keys = tmp / "keys"
    key = new_key(keys, "search", "proxy-test")
    args = ["--model", str(tiny_model_dir), "--no-warmup", "--keys", str(keys)]
    with ServerProcess(args) as server:
        upstream = server.base.rsplit(":", 1)[1]
        port = free_port()
        conf = CONF.read_text()
        conf = conf.replace("server 127.0.0.1:8080;", f"server 127.0.0.1:{upstream};")
        conf = re.sub(r"listen 80;", f"listen 127.0.0.1:{port};", conf)
        conf = conf.replace("server_name photos.example.com;", "server_name 127.0.0.1;")
        (tmp / "nginx.conf").write_text(conf)
        (tmp / "logs").mkdir()
        globals_ = f"daemon off; pid {tmp}/nginx.pid; user {getpass.getuser()};"
        proc = subprocess.Popen(
            [NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", "stderr", "-g", globals_],
            stderr=subprocess.PIPE,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(f"{base}/healthz", timeout=5)
                    break
                except httpx.TransportError:
                    assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
                    assert time.monotonic() < deadline, "nginx did not start"
                    time.sleep(0.1)
            yield base, key
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_keys_and_answers_pass_through_the_proxy(proxied: tuple[str, str]) -> None:
    base, key = proxied
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
    r = httpx.post(f"{base}/embed/text", json={"text": "a red circle"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "Unauthorized"
    auth = {"Authorization": f"Bearer {key}"}
    r = httpx.post(f"{base}/embed/text", json={"text": "a red circle"}, headers=auth)
    assert r.status_code == 200 and len(r.json()["embeddings"][0]) == 32
    r = httpx.post(  # the Host allow-list still applies behind the proxy
        f"{base}/embed/text", json={"text": "x"}, headers={**auth, "Host": "attacker.example"}
    )
    assert r.status_code in (421, 404), r.text  # nginx's default server or themis-clip's 421


def test_the_proxy_refuses_oversized_bodies_and_drops_silent_clients(
    proxied: tuple[str, str],
) -> None:
    base, _ = proxied
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            b"POST /embed/image HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Content-Length: {21 * 2**20}\r\n\r\n".encode()
        )
        assert s.recv(4096).startswith(b"HTTP/1.1 413")  # client_max_body_size, body unread
    silent = socket.create_connection(("127.0.0.1", port))
    silent.settimeout(30)
    t0 = time.monotonic()
    assert silent.recv(1024) == b""  # closed by nginx's client_header_timeout (10 s)
    assert time.monotonic() - t0 < 20
    silent.close()
