"""Access control through the real ``themis-clip serve`` and ``themis-clip keys`` (issue 28.1).

Before it, anyone who reached the port could search, read every thumbnail and write items, any
``Host`` was served (DNS rebinding), a non-loopback bind started open, and there was no TLS.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.helpers import ServerProcess, encode, new_key, photo_like

# Each test starts real processes (a `themis-clip serve`, a Hub stand-in): the slower set.
pytestmark = pytest.mark.slow

ADMIN_TOKEN = "admin-token-for-tests"
EXE = str(Path(sys.executable).parent / "themis-clip")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=120)


def png(seed: int = 0) -> bytes:
    return encode(Image.fromarray(photo_like(40, 32, seed)), "PNG")


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def error_type(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, (r.request.url, r.status_code, r.text[:300])
    return str(r.json()["error"]["type"])  # the documented JSON body, always


@dataclass
class Served:
    base: str
    port: int
    keys_file: Path
    keys: dict[str, str]


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("auth")
    keys_file = tmp / "keys.json"
    keys = {s: new_key(keys_file, s, f"{s}-key") for s in ("search", "write", "admin", "metrics")}
    args = ["--model", str(tiny_model_dir), "--index", str(tmp / "idx.db"), "--new-index"]
    args.append("--no-warmup")
    args += ["--keys", str(keys_file), "--body-idle-timeout-s", "60"]
    with ServerProcess(args, env={"THEMIS_ADMIN_TOKEN": ADMIN_TOKEN}) as server:
        port = int(server.base.rsplit(":", 1)[1])
        r = httpx.post(
            f"{server.base}/index/items",
            json={"items": [{"id": "cat.png", "image": data_url(png(1))}]},
            headers=bearer(keys["write"]),
            timeout=60,
        )
        assert r.status_code == 200, r.text
        yield Served(server.base, port, keys_file, keys)


def test_keys_cli_prints_a_key_once_and_keeps_only_digests(tmp_path: Path) -> None:
    keys = tmp_path / "sub" / "keys.json"
    done = cli("keys", "create", "--keys", str(keys), "--scope", "search,write", "--name", "app")
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip().splitlines()[-1]
    assert key.startswith("tck_") and len(base64.urlsafe_b64decode(key[4:] + "=")) >= 16
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    text = keys.read_text()
    assert key not in text and key[4:] not in text
    assert json.loads(text)["keys"][0]["scopes"] == ["search", "write"]
    other = new_key(keys, "metrics", "scraper")
    assert other != key
    listing = cli("keys", "list", "--keys", str(keys))
    assert listing.returncode == 0
    assert "app" in listing.stdout and "search,write" in listing.stdout
    assert "scraper" in listing.stdout and "never" in listing.stdout
    assert key not in listing.stdout and other not in listing.stdout
    for bad, needle in (
        (["create", "--keys", str(keys), "--scope", "app", "--name", "x"], "unknown scope"),
        (["create", "--keys", str(keys), "--scope", "search", "--name", "app"], "exists"),
        (["revoke", "nobody", "--keys", str(keys)], "no key named"),
        (["list", "--keys", str(tmp_path / "missing.json")], "does not exist"),
    ):
        failed = cli("keys", *bad)
        assert failed.returncode == 2 and needle in failed.stderr, failed.stderr
    assert cli("keys", "revoke", "app", "--keys", str(keys)).returncode == 0
    assert "app" not in cli("keys", "list", "--keys", str(keys)).stdout
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600


ROUTES = [  # (method, path, JSON body, scope)
    ("POST", "/search", {"item": "cat.png", "k": 1}, "search"),
    ("POST", "/embed/text", {"text": "a cat"}, "search"),
    ("GET", "/v1/models", None, "search"),
    ("GET", "/index/info", None, "search"),
    ("GET", "/index/filters", None, "search"),
    ("GET", "/items/cat.png", None, "search"),
    ("GET", "/items/cat.png/thumbnail", None, "search"),
    ("GET", "/items/cat.png/preview", None, "search"),
    ("POST", "/index/items", {"items": [{"id": "dog.png", "image": data_url(png(2))}]}, "write"),
    ("GET", "/admin/stats", None, "admin"),
    ("GET", "/metrics", None, "metrics"),
    ("GET", "/stats", None, "metrics"),
]


@pytest.mark.parametrize(("method", "path", "body", "scope"), ROUTES)
def test_every_route_needs_a_key_with_its_scope(
    served: Served, method: str, path: str, body: object, scope: str
) -> None:
    def call(headers: dict[str, str]) -> httpx.Response:
        return httpx.request(method, served.base + path, json=body, headers=headers, timeout=60)

    for headers in (
        {},
        bearer("tck_wrong"),
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer"},
    ):
        r = call(headers)
        assert error_type(r, 401) == "Unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
    for other, key in served.keys.items():
        if other != scope:
            r = call(bearer(key))
            assert error_type(r, 403) == "Forbidden" and scope in r.json()["error"]["message"]
    assert call(bearer(served.keys[scope])).status_code == 200


def test_health_readiness_and_the_page_need_no_key(served: Served) -> None:
    for path in ("/healthz", "/readyz", "/", "/static/app.js", "/openapi.json", "/docs"):
        assert httpx.get(served.base + path).status_code == 200, path
    assert error_type(httpx.get(served.base + "/no/such/route"), 401) == "Unauthorized"


def test_admin_token_is_an_admin_key(served: Served) -> None:
    assert httpx.get(f"{served.base}/admin/stats", headers=bearer(ADMIN_TOKEN)).status_code == 200
    r = httpx.get(f"{served.base}/index/info", headers=bearer(ADMIN_TOKEN))
    assert error_type(r, 403) == "Forbidden"


@pytest.mark.parametrize("path", ["/admin/reload", "/index/items", "/search"])
def test_refused_before_the_body_is_read(served: Served, path: str) -> None:
    """No wait for the 19 MiB body: an immediate 401, then close (after Hypercorn's interim
    ``100``, which it sends as soon as the headers parse)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Expect: 100-continue\r\nContent-Length: {19 * 2**20}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", served.port), timeout=20) as s:
        s.sendall(head)
        reply = b""
        while chunk := s.recv(65536):  # the server closes: it will not read the body
            reply += chunk
    if reply.startswith(b"HTTP/1.1 100 "):
        reply = reply.partition(b"\r\n\r\n")[2]
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b'"Unauthorized"' in reply


def test_a_revoked_key_stops_working_within_seconds(served: Served) -> None:
    key = new_key(served.keys_file, "search", "short-lived")
    url = f"{served.base}/index/info"

    def status_within(expected: int, timeout_s: float = 15) -> None:
        deadline = time.monotonic() + timeout_s
        while (status := httpx.get(url, headers=bearer(key)).status_code) != expected:
            assert time.monotonic() < deadline, f"still {status}"
            time.sleep(0.2)

    status_within(200)  # a key added while the server runs is taken up, no restart
    listing = cli("keys", "list", "--keys", str(served.keys_file)).stdout
    line = next(x for x in listing.splitlines() if x.startswith("short-lived"))
    assert "never" not in line  # its use was recorded
    assert cli("keys", "revoke", "short-lived", "--keys", str(served.keys_file)).returncode == 0
    status_within(401)
    assert httpx.get(url, headers=bearer(served.keys["search"])).status_code == 200


def test_the_openai_client_authenticates_with_its_api_key(served: Served) -> None:
    openai = pytest.importorskip("openai")
    good = openai.OpenAI(base_url=f"{served.base}/v1", api_key=served.keys["search"])
    model = good.models.list().data[0].id
    out = good.embeddings.create(model=model, input=["a cat"])
    assert len(out.data[0].embedding) > 0
    bad = openai.OpenAI(base_url=f"{served.base}/v1", api_key="tck_nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.embeddings.create(model=model, input=["a cat"])


def test_foreign_host_headers_get_421(served: Served) -> None:
    """A DNS-rebinding page's requests carry its own name: not served, even with a key."""
    key = bearer(served.keys["search"])
    for host in ("attacker.example", "attacker.example:8080", "127.0.0.1.attacker.example"):
        r = httpx.post(
            f"{served.base}/search", json={"item": "cat.png"}, headers={**key, "Host": host}
        )
        assert error_type(r, 421) == "MisdirectedRequest"
        write = {**bearer(served.keys["write"]), "Host": host}
        r = httpx.post(f"{served.base}/index/items", json={"items": []}, headers=write)
        assert error_type(r, 421) == "MisdirectedRequest"
    for host in (f"127.0.0.1:{served.port}", "localhost", f"LOCALHOST:{served.port}"):
        r = httpx.get(f"{served.base}/index/info", headers={**key, "Host": host})
        assert r.status_code == 200, host


def test_a_public_bind_refuses_to_start_open(tiny_model_dir: Path) -> None:
    base = ["serve", "--port", "0", "--model", str(tiny_model_dir), "--no-warmup"]
    for host in ("0.0.0.0", "::", "photos.example"):
        done = cli(*base, "--host", host)
        assert done.returncode == 2, done.stderr
        assert "--keys" in done.stderr and "--no-auth" in done.stderr
    done = cli(*base, "--host", "0.0.0.0", "--keys", "k.json", "--no-auth")
    assert done.returncode == 2 and "contradict" in done.stderr


def test_no_auth_serves_open_and_allowed_hosts_replace_the_defaults(tiny_model_dir: Path) -> None:
    args = ["--host", "0.0.0.0", "--no-auth", "--model", str(tiny_model_dir), "--no-warmup"]
    with ServerProcess([*args, "--allowed-hosts", "photos.example,*.lan"], ready=False) as server:
        base = server.base.replace("0.0.0.0", "127.0.0.1")
        deadline = time.monotonic() + 60
        while True:
            r = httpx.get(f"{base}/readyz", headers={"Host": "photos.example"})
            if r.status_code == 200:
                break
            assert time.monotonic() < deadline and server.proc.poll() is None
            time.sleep(0.2)
        for host, status in (("photos.example", 200), ("nas.lan:80", 200), ("127.0.0.1", 421)):
            r = httpx.get(f"{base}/v1/models", headers={"Host": host})  # open: no key
            assert r.status_code == status, (host, r.text)


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(key_path, 0o600)
    return cert_path, key_path


def test_tls_with_a_self_signed_pair(tiny_model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    cert, key_file = _self_signed(tmp_path)
    keys = tmp_path / "keys.json"
    key = new_key(keys, "search", "tls")
    args = ["--model", str(tiny_model_dir), "--no-warmup", "--keys", str(keys)]
    args += ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key_file)]
    with ServerProcess(args, ready=False) as server:
        assert server.base.startswith("https://127.0.0.1:"), server.base
        trust = ssl.create_default_context(cafile=str(cert))
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{server.base}/readyz", verify=trust).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.proc.poll() is None
            time.sleep(0.2)
        r = httpx.get(f"{server.base}/v1/models", headers=bearer(key), verify=trust)
        assert r.status_code == 200
        assert httpx.get(f"{server.base}/v1/models", verify=trust).status_code == 401
        with pytest.raises(httpx.TransportError):  # an untrusted certificate is refused
            httpx.get(f"{server.base}/healthz")
        with pytest.raises(httpx.TransportError):  # plain HTTP is not spoken
            httpx.get(server.base.replace("https:", "http:") + "/healthz")
    bad = cli("serve", "--port", "0", "--model", str(tiny_model_dir), "--ssl-certfile", str(cert))
    assert bad.returncode == 2 and "--ssl-keyfile" in bad.stderr


def test_serve_refuses_a_broken_keys_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "keys.json"
    bad.write_text("{not json")
    args = ["serve", "--port", "0", "--model", str(tiny_model_dir), "--no-warmup"]
    done = cli(*args, "--keys", str(bad))
    assert done.returncode == 2 and "keys file" in done.stderr, done.stderr
    done = cli(*args, "--keys", str(tmp_path / "absent.json"))
    assert done.returncode == 2 and "does not exist" in done.stderr, done.stderr


@pytest.mark.parametrize("which", ["keys.json", "keys.json.used"])
def test_a_fifo_in_place_of_the_keys_files_fails_closed_without_blocking(
    tiny_model_dir: Path, tmp_path: Path, which: str
) -> None:
    # A reader of a FIFO waits for a writer; on the event loop that was every request,
    # /healthz too. The keys file and its last-use sidecar are read as regular files only.
    keys_file = tmp_path / "keys.json"
    key = new_key(keys_file, "search", "reader")
    args = ["--model", str(tiny_model_dir), "--no-warmup", "--keys", str(keys_file)]
    with ServerProcess(args) as server:
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        os.replace(fifo, tmp_path / which)
        # The keys file is looked at again within a second of a request, the sidecar at a
        # key's first use: until then (and after) every request is answered.
        path = tmp_path / which
        deadline = time.monotonic() + 15
        while True:
            r = httpx.get(f"{server.base}/index/info", headers=bearer(key), timeout=5)
            assert httpx.get(f"{server.base}/healthz", timeout=5).status_code == 200
            if which == "keys.json" and r.status_code == 401:
                break  # an unusable keys file accepts no key
            if which != "keys.json" and stat.S_ISREG(path.stat().st_mode):
                assert r.status_code != 401, r.text  # the use was recorded over the FIFO
                break
            assert time.monotonic() < deadline, (r.status_code, r.text)
            time.sleep(0.1)
        if which == "keys.json":
            assert any("keys file unusable" in line for line in server.log)
