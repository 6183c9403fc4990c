"""Models by name, pulled with the real ``huggingface_hub`` from a Hub stand-in on loopback.

Every case runs ``themis-clip`` as a subprocess with ``HF_ENDPOINT`` pointing at
:class:`tests.hub_server.FakeHub` and ``HF_HUB_CACHE`` in the test's folder; the repos are tiny
models in each layout we load (immich, transformers.js, fastembed, ours; ``tests/hubtools.py``,
``conftest.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.hub_server import FakeHub
from tests.hubtools import EXE, IMMICH, TOKEN, cache_files, run, serve, vectors

# Each test starts real processes (a `themis-clip serve`, a Hub stand-in): the slower set.
pytestmark = pytest.mark.slow


def test_pull_by_catalogue_name_and_repo_id_equals_the_directory(
    env: dict[str, str], hub: FakeHub, repos: dict[str, Path], photos: Path, tmp_path: Path
) -> None:
    by_name = vectors(env, "ViT-B-32__openai", photos)
    assert by_name == vectors(env, str(repos["immich"]), photos)  # bit for bit
    before = hub.total()
    assert vectors(env, IMMICH, photos) == by_name  # the same cache entry: no request
    assert hub.total() == before
    fetched = {k.removeprefix(IMMICH + "/") for k in hub.downloads}
    assert fetched == {
        "config.json",
        "visual/model.onnx",
        "visual/preprocess_cfg.json",
        "textual/model.onnx",
        "textual/tokenizer.json",
    }  # no ARM NN, RKNN or fp16 variants
    record = next(Path(env["HF_HUB_CACHE"]).glob("models--immich-app--*/themis/*.json"))
    data = json.loads(record.read_text())
    assert data["commit"] == hub.repos[IMMICH].commit and len(data["verified"]) == 5

    # Done-when: index a folder by name, then search it.
    db = tmp_path / "idx.db"
    out = run(env, "index", str(photos), "--model", "ViT-B-32__openai", "--index", str(db))
    assert out.returncode == 0, out.stderr
    out = run(
        env,
        "search",
        "red",
        "--model",
        IMMICH,
        "--index",
        str(db),
        "--json",
        "--cut",
        "none",
        offline=True,
    )
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)) == 3  # the index accepts the model by its other name


@pytest.mark.parametrize(
    ("name", "directory", "expect"),
    [
        ("clip-vit-base-patch32__xenova", "xenova", "onnx/vision_model.onnx"),
        ("Xenova/clip-vit-base-patch32", "xenova", "onnx/text_model.onnx"),
        ("someone/tiny-themis@v1", "ours", "manifest.json"),
    ],
)
def test_other_layouts_by_name(
    env: dict[str, str],
    hub: FakeHub,
    repos: dict[str, Path],
    photos: Path,
    name: str,
    directory: str,
    expect: str,
) -> None:
    assert vectors(env, name, photos) == vectors(env, str(repos[directory]), photos)
    got = {k.split("/", 2)[2] for k in hub.downloads}
    assert expect in got
    assert not any("_q4" in k or "_fp16" in k or "_int8" in k for k in got)


def test_transformers_js_precision_pulls_only_that_variant(
    env: dict[str, str], hub: FakeHub, photos: Path
) -> None:
    out = run(env, "models", "pull", "clip-vit-base-patch32__xenova", "--precision", "int8")
    assert out.returncode == 0, out.stderr
    got = {k.split("/", 2)[2] for k in hub.downloads}
    assert {"onnx/vision_model_int8.onnx", "onnx/text_model_int8.onnx"} <= got
    assert "onnx/vision_model.onnx" not in got


def test_fastembed_pair_by_name(
    env: dict[str, str], hub: FakeHub, repos: dict[str, Path], photos: Path
) -> None:
    rows = vectors(env, "clip-ViT-B-32__fastembed", photos)
    alone = run(env, "embed", str(photos), "--model", str(repos["fe_vision"] / "model.onnx"))
    assert alone.returncode == 0, alone.stderr
    assert rows[:3] == [json.loads(line)["embedding"] for line in alone.stdout.splitlines()]
    assert any(k.startswith("Qdrant/clip-ViT-B-32-text/") for k in hub.downloads)


def test_connection_dropped_mid_file_resumes(
    env: dict[str, str], hub: FakeHub, repos: dict[str, Path], photos: Path
) -> None:
    hub.drop_once.add((IMMICH, "visual/model.onnx"))
    assert vectors(env, "ViT-B-32__openai", photos) == vectors(env, str(repos["immich"]), photos)
    assert hub.downloads[f"{IMMICH}/visual/model.onnx"] == 2  # cut once, then resumed
    assert (IMMICH, "visual/model.onnx") not in hub.drop_once


def test_a_flipped_byte_is_refused_and_stays_refused_offline(
    env: dict[str, str], hub: FakeHub, repos: dict[str, Path], photos: Path
) -> None:
    hub.flip.add((IMMICH, "visual/model.onnx"))
    out = run(env, "embed", str(photos), "--model", "ViT-B-32__openai")
    assert out.returncode == 2
    assert "visual/model.onnx" in out.stderr and "corrupt" in out.stderr
    good = hashlib.sha256((repos["immich"] / "visual" / "model.onnx").read_bytes()).hexdigest()
    assert good in out.stderr  # the listed digest, and the one we got
    assert out.stderr.count("SHA-256") + out.stderr.count("has ") >= 2
    assert not any(
        f.endswith(good) or ("snapshots" in f and f.endswith("visual/model.onnx"))
        for f in cache_files(env)
    )  # the corrupt blob is gone
    offline = run(env, "embed", str(photos), "--model", "ViT-B-32__openai", offline=True)
    assert offline.returncode == 2 and "not cached" in offline.stderr
    hub.flip.clear()  # a clean pull afterwards works
    assert vectors(env, "ViT-B-32__openai", photos) == vectors(env, str(repos["immich"]), photos)


def test_cached_and_offline_makes_no_request(
    env: dict[str, str], hub: FakeHub, photos: Path
) -> None:
    online = vectors(env, "ViT-B-32__openai", photos)
    before = hub.total()
    assert vectors(env, "ViT-B-32__openai", photos, offline=True) == online
    assert hub.total() == before


def test_a_cached_file_changed_later_is_refused(
    env: dict[str, str], hub: FakeHub, photos: Path
) -> None:
    vectors(env, "ViT-B-32__openai", photos)
    blob = next(
        p for p in Path(env["HF_HUB_CACHE"]).rglob("visual/model.onnx") if "snapshots" in str(p)
    ).resolve()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    out = run(env, "embed", str(photos), "--model", "ViT-B-32__openai", offline=True)
    assert out.returncode == 2 and "SHA-256 mismatch" in out.stderr
    out = run(env, "models", "verify", "ViT-B-32__openai")
    assert out.returncode == 2 and "visual/model.onnx" in out.stderr


@pytest.mark.parametrize(
    ("model", "gated", "needle"),
    [
        ("ViT-B-32__openai", None, "models pull ViT-B-32__openai"),  # uncached + offline
        ("ViT-B-32_openai", None, "did you mean ViT-B-32__openai"),
        (f"{IMMICH}@no-such-branch", None, "no revision 'no-such-branch'"),
        ("nobody/nothing-here", None, "no repository nobody/nothing-here"),
        ("someone/odd-layout", None, "holds no model layout"),
        ("someone/gated", 401, "gated or private (HTTP 401)"),
        ("someone/gated", 403, "gated or private (HTTP 403)"),
    ],
)
def test_clear_errors_exit_2(
    env: dict[str, str],
    hub: FakeHub,
    tmp_path: Path,
    photos: Path,
    model: str,
    gated: int | None,
    needle: str,
) -> None:
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "weights.h5").write_bytes(b"h5" * 1000)
    (odd / "README.md").write_text("a repo of something else")
    hub.add("someone/odd-layout", odd)
    hub.add("someone/gated", odd, gated=gated)
    out = run(env, "embed", str(photos), "--model", model, offline=model == "ViT-B-32__openai")
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr, out.stderr


def test_two_concurrent_pulls_download_once(env: dict[str, str], hub: FakeHub) -> None:
    hub.block.clear()  # hold every file body until both processes are in
    args = [EXE, "models", "pull", "ViT-B-32__openai"]
    slow = dict(env, HF_HUB_DOWNLOAD_TIMEOUT="120")  # a held body is not a dead connection
    procs = [
        subprocess.Popen(args, env=slow, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        # Both have listed the repo (the step before the repo lock) while the first one's
        # download is held: the second can only wait for it.
        deadline = time.monotonic() + 90
        while hub.requests["GET info"] < 2 or hub.requests["HEAD resolve"] < 1:
            assert time.monotonic() < deadline, "the two pulls never both listed the repo"
            assert all(p.poll() is None for p in procs), "a pull ended early"
            time.sleep(0.05)
    finally:
        hub.block.set()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "Traceback" not in err
    assert hub.downloads[f"{IMMICH}/visual/model.onnx"] == 1
    assert max(hub.downloads.values()) == 1


# -- the server: /v1/models and /admin/reload by name -------------------------------------------


def test_reload_by_name_cached_and_pulled_under_load(env: dict[str, str], hub: FakeHub) -> None:
    assert run(env, "models", "pull", "someone/tiny-themis").returncode == 0  # cached beforehand
    with serve(env, "--model", "ViT-B-32__openai", "--allow-pull") as server:
        base = server.base
        card = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]
        assert card["source"]["catalogue_name"] == "ViT-B-32__openai"
        assert card["source"]["repo"] == IMMICH
        assert card["source"]["commit"] == hub.repos[IMMICH].commit
        assert httpx.get(f"{base}/v1/models/ViT-B-32__openai", timeout=30).status_code == 200

        stop = threading.Event()
        failures: list[str] = []
        served: list[int] = [0]

        def client() -> None:
            with httpx.Client(base_url=base, timeout=60) as c:
                while not stop.is_set():
                    r = c.post("/v1/embeddings", json={"input": "a red circle"})
                    served[0] += 1
                    if r.status_code != 200:
                        failures.append(f"{r.status_code} {r.text[:200]}")

        auth = {"Authorization": f"Bearer {TOKEN}"}
        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            with httpx.Client(base_url=base, timeout=120, headers=auth) as admin:
                r = admin.post(
                    "/admin/reload",
                    json={"model": "someone/tiny-themis", "allow_embedding_space_change": True},
                )
                assert r.status_code == 200 and r.json()["reloaded"], r.text
                source = admin.get("/v1/models").json()["data"][0]["source"]
                assert source["repo"] == "someone/tiny-themis"

                # Uncached: 202, pulled in the background while the old model serves.
                hub.block.clear()
                before = admin.get("/v1/models").json()["data"][0]["id"]
                r = admin.post(
                    "/admin/reload",
                    json={
                        "model": "clip-vit-base-patch32__xenova",
                        "allow_embedding_space_change": True,
                    },
                )
                assert r.status_code == 202, r.text
                deadline = time.monotonic() + 60
                while not hub.requests["GET resolve"]:
                    assert time.monotonic() < deadline, "the background pull never started"
                    time.sleep(0.05)
                mid = served[0]
                deadline = time.monotonic() + 60
                while served[0] < mid + 20:  # requests answered by the old model meanwhile
                    assert time.monotonic() < deadline and not failures, failures[:3]
                    time.sleep(0.05)
                assert admin.get("/v1/models").json()["data"][0]["id"] == before
                hub.block.set()
                deadline = time.monotonic() + 120
                while True:
                    pulls = admin.get("/admin/stats").json()["pulls"]
                    state = pulls["clip-vit-base-patch32__xenova"]
                    if state["state"] != "pulling":
                        break
                    assert time.monotonic() < deadline, "the pull never finished"
                    time.sleep(0.1)
                assert state["state"] == "reloaded", state
                card = admin.get("/v1/models").json()["data"][0]
                assert card["source"]["repo"] == "Xenova/clip-vit-base-patch32"
        finally:
            hub.block.set()
            stop.set()
            for t in threads:
                t.join()
        assert not failures, failures[:3]
        assert served[0] > 40


def test_reload_by_name_without_allow_pull_loads_cached_models_only(
    env: dict[str, str], hub: FakeHub
) -> None:
    with serve(env, "--model", "someone/tiny-themis") as server:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=server.base, timeout=60, headers=auth) as admin:
            r = admin.post("/admin/reload", json={"model": "ViT-B-32__openai"})
            assert r.status_code == 409 and "--allow-pull" in r.text, r.text
            assert not hub.requests["GET resolve"] or all(
                not k.startswith(IMMICH) for k in hub.downloads
            )
            r = admin.post("/admin/reload", json={"model": "ViT-B32__openai"})
            assert r.status_code == 404 and "did you mean" in r.text
            r = admin.post("/admin/reload", json={"model": "x/y", "path": "a"})
            assert r.status_code == 422


# -- a PyTorch checkpoint: exported on pull (the export extra) ---------------------------------


@pytest.fixture(scope="module")
def checkpoint(repos: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from themis_clip.export.hf import create_random_checkpoint

    out = tmp_path_factory.mktemp("pt") / "clip-vit-base-patch32"
    return create_random_checkpoint(out, repos["ours"] / "tokenizer.json", seed=4)


@pytest.mark.slow
def test_a_pytorch_checkpoint_is_exported_on_pull(
    env: dict[str, str], hub: FakeHub, checkpoint: Path, photos: Path, tmp_path: Path
) -> None:
    hub.add("openai/clip-vit-base-patch32", checkpoint)
    by_name = vectors(env, "openai/clip-vit-base-patch32", photos)
    exported = tmp_path / "exported"
    out = run(env, "export", str(checkpoint), str(exported))
    assert out.returncode == 0, out.stderr
    assert by_name == vectors(env, str(exported), photos)
    before = hub.total()
    assert vectors(env, "clip-vit-base-patch32", photos, offline=True) == by_name
    assert hub.total() == before


def test_a_pytorch_checkpoint_without_the_export_extra(
    env: dict[str, str], hub: FakeHub, repos: dict[str, Path], tmp_path: Path, photos: Path
) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "clip"}))
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 4096)
    hub.add("openai/clip-vit-base-patch32", checkpoint)
    no_torch = tmp_path / "no-torch" / "torch"
    no_torch.mkdir(parents=True)
    (no_torch / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    e = dict(env, PYTHONPATH=f"{no_torch.parent}{os.pathsep}{env.get('PYTHONPATH', '')}")
    out = run(e, "embed", str(photos), "--model", "clip-vit-base-patch32")
    assert out.returncode == 2
    assert "pip install 'themis-onnx-clip[export]'" in out.stderr
    assert "clip-vit-base-patch32__xenova" in out.stderr  # the ready ONNX alternative
    assert not hub.downloads  # refused before downloading the weights


def test_a_flipped_byte_in_a_small_file_is_refused(
    env: dict[str, str], hub: FakeHub, photos: Path
) -> None:
    hub.flip.add((IMMICH, "visual/preprocess_cfg.json"))  # not LFS: checked by its git blob id
    out = run(env, "models", "pull", "ViT-B-32__openai")
    assert out.returncode == 2
    assert "visual/preprocess_cfg.json is corrupt" in out.stderr and "git blob" in out.stderr


def test_models_info_list_and_rm(env: dict[str, str], hub: FakeHub) -> None:
    assert run(env, "models", "pull", "ViT-B-32__openai").returncode == 0
    info = json.loads(run(env, "models", "info", IMMICH, "--json").stdout)
    assert info["name"] == "ViT-B-32__openai" and info["cached"] is True
    assert info["commit"] == hub.repos[IMMICH].commit and info["layout"] == "immich"
    data = (hub.repos[IMMICH].folder / "visual" / "model.onnx").read_bytes()
    files = {f["path"]: f["sha256"] for f in info["files"]}
    assert files["visual/model.onnx"] == hashlib.sha256(data).hexdigest()
    assert Path(info["path"], "visual", "model.onnx").is_file()
    listed = run(env, "models", "list", "--family", "clip").stdout.splitlines()
    assert any(line.startswith("* ViT-B-32__openai ") for line in listed)
    assert not any(line.startswith("* ViT-B-16__openai ") for line in listed)
    assert run(env, "models", "verify", "ViT-B-32__openai").returncode == 0
    assert run(env, "models", "rm", "ViT-B-32__openai").returncode == 0
    assert json.loads(run(env, "models", "info", IMMICH, "--json").stdout)["cached"] is False
    gone = run(env, "models", "verify", "ViT-B-32__openai")
    assert gone.returncode == 2 and "not in the cache" in gone.stderr


def test_a_repo_another_tool_cached_is_checked_not_downloaded_again(
    env: dict[str, str], hub: FakeHub, photos: Path, repos: dict[str, Path]
) -> None:
    code = "import huggingface_hub as h; h.snapshot_download('immich-app/ViT-B-32__openai')"
    subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, timeout=120
    )  # as transformers
    fetched = dict(hub.downloads)
    assert fetched[f"{IMMICH}/visual/model.onnx"] == 1
    assert vectors(env, "ViT-B-32__openai", photos) == vectors(env, str(repos["immich"]), photos)
    assert hub.downloads == fetched  # listed and verified, not fetched again


def test_a_copied_cache_loads_offline_elsewhere(
    env: dict[str, str], hub: FakeHub, photos: Path, tmp_path: Path
) -> None:
    online = vectors(env, "clip-ViT-B-32__fastembed", photos)  # two repos: vision + text
    other = tmp_path / "other-machine-cache"
    shutil.copytree(env["HF_HUB_CACHE"], other, symlinks=True)
    shutil.rmtree(env["HF_HUB_CACHE"])
    before = hub.total()
    moved = dict(env, HF_HUB_CACHE=str(other))
    assert vectors(moved, "clip-ViT-B-32__fastembed", photos, offline=True) == online
    assert hub.total() == before


def test_reload_by_name_refuses_odd_strings(env: dict[str, str], hub: FakeHub) -> None:
    from fastapi.testclient import TestClient

    from themis_clip.config import PluginConfig
    from themis_clip.server.app import create_app
    from themis_clip.server.settings import ServerSettings

    app = create_app(
        ServerSettings(
            plugin_config=PluginConfig.from_dict(
                {"model": {"path": str(hub.repos[IMMICH].folder)}}
            ),
            admin_token=TOKEN,
            warmup=False,
        )
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(app) as c:
        for model, status in (
            ("\x00", 422),
            ("\ud83d", 400),  # the JSON parser refuses a lone surrogate first
            ("a/b@../../x", 404),
            ("/etc", 422),  # a local path goes in "path", inside the model root
            ("x" * 301, 422),
        ):
            text = json.dumps({"model": model}).encode("utf-8", "surrogatepass")
            r = c.post(
                "/admin/reload", content=text, headers={**auth, "content-type": "application/json"}
            )
            assert r.status_code == status, (model, r.text)
            assert set(r.json()["error"]) == {"type", "message"}
