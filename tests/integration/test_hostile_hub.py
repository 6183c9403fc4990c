"""A hostile Hub: every value it returns is untrusted (commits, names, sizes, manifests, configs).

``themis-clip`` runs as a subprocess against :class:`tests.hub_server.FakeHub` serving hostile
answers (as a mirror, a proxy or anyone on plain HTTP could); each one must end in a message and
exit 2 (``run`` asserts no traceback), with nothing written outside the cache and nothing
unverified loaded.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from tests.hub_server import FakeHub
from tests.hubtools import IMMICH, TOKEN, run, serve

pytestmark = pytest.mark.slow

HEX = "0123456789abcdef" * 2 + "01234567"  # 40 lowercase hex characters


def outside_cache(tmp_path: Path) -> set[str]:
    """Every file under the test's folder except the cache and the photos."""
    return {
        p.relative_to(tmp_path).as_posix()
        for p in tmp_path.rglob("*")
        if p.is_file() and p.relative_to(tmp_path).parts[0] not in ("hf-cache", "photos")
    }


@pytest.mark.parametrize(
    "commit",
    ["../../../victim", "ABS", f"x/../{HEX}", "main", HEX.upper()],
    ids=["relative", "absolute", "dotted", "branch", "uppercase"],
)
def test_a_commit_that_is_not_40_hex_is_refused_before_any_write(
    env: dict[str, str], hub: FakeHub, tmp_path: Path, commit: str
) -> None:
    commit = str(tmp_path / "victim") if commit == "ABS" else commit
    hub.answer_commit[IMMICH] = commit
    before = outside_cache(tmp_path)
    out = run(env, "models", "pull", "ViT-B-32__openai")
    assert out.returncode == 2, out.stderr
    assert "40 lowercase hex" in out.stderr, out.stderr
    assert outside_cache(tmp_path) == before  # no trees/<commit>.json anywhere
    cache = Path(env["HF_HUB_CACHE"])
    assert not list(cache.rglob("trees")) and not list(cache.rglob("themis/*.json"))
    assert not hub.downloads


@pytest.mark.parametrize("header", ["commit", "etag"])
def test_file_answers_with_path_like_headers_are_refused(
    env: dict[str, str], hub: FakeHub, tmp_path: Path, header: str
) -> None:
    # The client builds snapshots/<X-Repo-Commit>/ and blobs/<ETag> from these headers.
    table = hub.header_commit if header == "commit" else hub.header_etag
    table[IMMICH] = "../../../victim"
    before = outside_cache(tmp_path)
    out = run(env, "models", "pull", "ViT-B-32__openai")
    assert out.returncode == 2, out.stderr
    assert ("commit" if header == "commit" else "ETag") in out.stderr, out.stderr
    assert outside_cache(tmp_path) == before
    assert not hub.downloads


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"path": "../../../evil.onnx", "size": 10}, "file name we refuse"),
        ({"path": "/tmp/evil.onnx", "size": 10}, "file name we refuse"),
        ({"path": "visual/../../evil.json", "size": 10}, "file name we refuse"),
        ({"path": "big.onnx", "size": 10**13}, "size we refuse"),
        ({"path": "neg.json", "size": -1}, "size we refuse"),
        ({"path": "str.json", "size": "12"}, "size we refuse"),
        (
            {"path": "w.onnx", "size": 10, "lfs": {"size": 10, "pointerSize": 134}},
            f"listed 'w.onnx' in {IMMICH}@main with a malformed LFS entry: no 'oid' in it",
        ),
        ({"path": "w.onnx", "size": 10, "lfs": "oops"}, "'w.onnx' in"),
    ],
)
def test_a_listing_with_traversal_names_or_absurd_sizes_is_refused(
    env: dict[str, str], hub: FakeHub, tmp_path: Path, entry: dict[str, Any], needle: str
) -> None:
    hub.extra_listing[IMMICH] = [{"type": "file", "oid": HEX, **entry}]
    before = outside_cache(tmp_path)
    out = run(env, "models", "pull", "ViT-B-32__openai")
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr, out.stderr
    assert outside_cache(tmp_path) == before
    assert not hub.downloads


def test_a_body_longer_than_its_listing_is_cut_while_downloading(
    env: dict[str, str], hub: FakeHub, repos: dict[str, Path]
) -> None:
    listed = (repos["immich"] / "visual" / "model.onnx").stat().st_size
    hub.padding[(IMMICH, "visual/model.onnx")] = 200 * 1024**2
    out = run(env, "models", "pull", "ViT-B-32__openai")
    assert out.returncode == 2, out.stderr
    assert f"listed at {listed} bytes" in out.stderr, out.stderr
    # Refused at the first chunk past the listing, not after 200 MiB (socket buffers aside).
    assert hub.body_bytes[f"{IMMICH}/visual/model.onnx"] < 40 * 1024**2
    cache = Path(env["HF_HUB_CACHE"])
    assert not [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size > 10 * 1024**2]
    hub.padding.clear()  # a clean pull afterwards works
    assert run(env, "models", "pull", "ViT-B-32__openai").returncode == 0


def test_a_repo_id_over_96_characters_is_a_message(env: dict[str, str], hub: FakeHub) -> None:
    out = run(env, "models", "pull", "org/" + "x" * 100)
    assert out.returncode == 2, out.stderr
    assert "at most 96 characters" in out.stderr
    assert not hub.total()


def test_verify_refuses_a_snapshot_file_linked_out_of_the_cache(
    env: dict[str, str], hub: FakeHub, tmp_path: Path, photos: Path
) -> None:
    # The same bytes outside the cache pass a hash check: the link itself is the problem, as
    # anyone who can write the cache could later swap the file it leads to.
    assert run(env, "models", "pull", "ViT-B-32__openai").returncode == 0
    snapshot = next(Path(env["HF_HUB_CACHE"]).glob("models--immich-app--*/snapshots/*"))
    outside = tmp_path / "elsewhere" / "config.json"
    outside.parent.mkdir()
    shutil.copy(snapshot / "config.json", outside)
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(outside)
    out = run(env, "models", "verify", "ViT-B-32__openai")
    assert out.returncode == 2, out.stderr
    assert "config.json (a link out of the cache" in out.stderr, out.stderr
    out = run(env, "embed", str(photos), "--model", "ViT-B-32__openai", offline=True)
    assert out.returncode == 2 and "leaves the model folder" in out.stderr, out.stderr


def manifest_repo(folder: Path, source: Path, **changes: Any) -> Path:
    shutil.copytree(source, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    for key, value in changes.items():
        section, _, field = key.partition("__")
        manifest[section][field] = value
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize(
    "change",
    [
        {"visual__file": "/etc/passwd"},
        {"visual__file": "../../../../../../../../etc/passwd"},
        {"textual__tokenizer": "/etc/passwd"},
        {"textual__file": "sub/../../other/textual.onnx"},
    ],
    ids=["absolute-tower", "relative-tower", "absolute-tokenizer", "dotted-tower"],
)
def test_a_manifest_naming_files_outside_the_model_is_refused(
    env: dict[str, str],
    hub: FakeHub,
    repos: dict[str, Path],
    tmp_path: Path,
    photos: Path,
    change: dict[str, str],
) -> None:
    hub.add("someone/evil", manifest_repo(tmp_path / "evil", repos["ours"], **change))
    out = run(env, "embed", str(photos), "--text", "a cat", "--model", "someone/evil")
    assert out.returncode == 2, out.stderr
    assert "leaves the model folder" in out.stderr, out.stderr


def test_a_swapped_tower_outside_the_record_never_loads(
    env: dict[str, str], hub: FakeHub, repos: dict[str, Path], tmp_path: Path, photos: Path
) -> None:
    # A tower named by a path outside the snapshot used to load, unlisted and unhashed; swapped
    # later for another model's, it loaded under the same model id and `models verify` was happy.
    outside = tmp_path / "elsewhere" / "visual.onnx"
    outside.parent.mkdir()
    shutil.copy(repos["ours"] / "visual.onnx", outside)
    hub.add(
        "someone/evil", manifest_repo(tmp_path / "evil", repos["ours"], visual__file=str(outside))
    )
    out = run(env, "models", "pull", "someone/evil")
    assert out.returncode == 0, out.stderr  # the repo's own files are fine...
    out = run(env, "embed", str(photos), "--model", "someone/evil", offline=True)
    assert out.returncode == 2 and "leaves the model folder" in out.stderr, out.stderr


def safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in tensors.items():
        size = 4
        for d in shape:
            size *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def tiny_checkpoint(folder: Path, *, layers: int = 2) -> Path:
    folder.mkdir()
    tensors = {f"vision_model.encoder.layers.{i}.mlp.fc1.weight": [16, 8] for i in range(2)}
    tensors |= {f"text_model.encoder.layers.{i}.mlp.fc1.weight": [16, 8] for i in range(2)}
    safetensors(folder / "model.safetensors", tensors)
    config = {
        "model_type": "clip",
        "vision_config": {"num_hidden_layers": layers, "hidden_size": 8, "intermediate_size": 16},
        "text_config": {"num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16},
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_config_bomb_is_refused_before_anything_is_built(
    env: dict[str, str], hub: FakeHub, tmp_path: Path
) -> None:
    pytest.importorskip("torch")  # the export extra: without it the pull stops earlier
    hub.add("someone/bomb", tiny_checkpoint(tmp_path / "bomb", layers=1_000_000))
    started = time.monotonic()
    out = run(env, "models", "pull", "someone/bomb")
    assert out.returncode == 2, out.stderr
    assert "num_hidden_layers is 1000000" in out.stderr and "holds 2" in out.stderr, out.stderr
    assert time.monotonic() - started < 60  # the attack run's exporter grew to 5 GB in 152 s


def test_a_pickled_checkpoint_is_refused_as_holding_code(
    env: dict[str, str], hub: FakeHub, tmp_path: Path
) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "clip"}))
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04c__builtin__\neval\n" + b"\0" * 2000)
    hub.add("someone/pickled", folder)
    out = run(env, "models", "pull", "someone/pickled")
    assert out.returncode == 2, out.stderr
    assert "holds code" in out.stderr, out.stderr
    assert "weights_only" not in out.stderr
    assert not hub.downloads  # refused from the listing: the pickle never reaches the disk


def test_a_failed_background_pull_can_be_retried(
    env: dict[str, str], hub: FakeHub, tmp_path: Path
) -> None:
    import httpx

    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "clip"}))
    (folder / "pytorch_model.bin").write_bytes(b"\0" * 2000)
    hub.add("someone/pickled", folder)
    hub.add("someone/odd-commit", hub.repos[IMMICH].folder)
    hub.answer_commit["someone/odd-commit"] = "../../x"
    with serve(env, "--model", str(hub.repos[IMMICH].folder), "--allow-pull") as server:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=server.base, timeout=60, headers=auth) as admin:
            for name, needle in (
                ("someone/odd-commit", "40 lowercase hex"),
                ("someone/pickled", "holds code"),
            ):
                for _ in range(2):  # failed with its reason, then retried: never stuck
                    r = admin.post("/admin/reload", json={"model": name})
                    assert r.status_code == 202, r.text
                    state = pull_state(admin, name)
                    assert state["state"] == "failed" and needle in state["error"], state


def pull_state(admin: Any, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        state: dict[str, Any] = admin.get("/admin/stats").json()["pulls"][name]
        if state["state"] != "pulling":
            return state
        assert time.monotonic() < deadline, f"{name} stayed pulling"
        time.sleep(0.05)


class Panic(BaseException):
    """Like pyo3's PanicException: not an Exception."""


@pytest.mark.parametrize(
    ("raised", "needle"),
    [
        (ValueError("Repo id must use alphanumeric chars"), "ValueError: Repo id must"),
        (KeyError("sha"), "KeyError"),
        (Panic("regex retry limit"), "Panic: regex retry limit"),
    ],
)
def test_a_background_pull_failing_with_a_foreign_exception_is_marked_failed(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch, raised: BaseException, needle: str
) -> None:
    from fastapi.testclient import TestClient

    from themis_clip.config import PluginConfig
    from themis_clip.models import hub as models_hub
    from themis_clip.server.app import create_app
    from themis_clip.server.settings import ServerSettings

    def failing_pull(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(models_hub, "pull", failing_pull)
    app = create_app(
        ServerSettings(
            plugin_config=PluginConfig.from_dict(
                {"model": {"path": str(hub.repos[IMMICH].folder)}}
            ),
            admin_token=TOKEN,
            warmup=False,
            allow_pull=True,
        )
    )
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as admin:
        for _ in range(2):
            r = admin.post("/admin/reload", json={"model": "someone/not-cached"})
            assert r.status_code == 202, r.text
            state = pull_state(admin, "someone/not-cached")
            assert state["state"] == "failed" and needle in state["error"], state
