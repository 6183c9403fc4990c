"""Scale-out on a local Ray instance: same embeddings as one process, resumable Parquet output."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ray = pytest.importorskip("ray")

from tests.helpers import photo_like  # noqa: E402
from themis_clip import OnnxClipPlugin, PluginConfig  # noqa: E402
from themis_clip.distributed import TextBatchEmbedder, embed_dataset, list_inputs, read_embeddings  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    for i in range(20):
        Image.fromarray(photo_like(40 + i, 30 + 2 * i, i)).save(
            folder / ("sub" if i % 3 else "") / f"{i:02d}.png"
        )
    (folder / "broken.jpg").write_bytes(b"not an image")
    return folder


def config(model: Path) -> dict[str, object]:
    return {"model": {"path": str(model)}, "max_batch_size": 8}


def test_matches_single_process_and_resumes(
    local_ray: None, photos: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    report = embed_dataset(str(photos), out, config(tiny_model_dir), actors=2, batch_size=8)
    assert (report.listed, report.skipped, report.embedded, report.failed) == (21, 0, 20, 1)
    rows = {p: v for p, _, v in read_embeddings(out)}
    single = OnnxClipPlugin()
    assert single.initialize(PluginConfig.from_dict(config(tiny_model_dir)))
    paths = sorted(rows)
    for path, result in zip(paths, single.generate_embedding_batch(paths), strict=True):
        assert result.ok and np.array_equal(rows[path], result.embedding), path
    import pyarrow.dataset as pads

    table = pads.dataset(str(out), format="parquet").to_table()
    broken = [r for r in table.to_pylist() if r["path"].endswith("broken.jpg")]
    assert len(broken) == 1 and not broken[0]["ok"] and "not a recognised" in broken[0]["error"]
    assert broken[0]["embedding"] is None and {r["model_id"] for r in table.to_pylist()} == {
        single.get_statistics()["model_id"]
    }
    # Re-running skips everything already recorded; new files are the only work.
    Image.fromarray(photo_like(33, 33, 99)).save(photos / "new.png")
    again = embed_dataset(str(photos), out, config(tiny_model_dir), actors=1, batch_size=8)
    assert (again.skipped, again.embedded, again.failed) == (21, 1, 0)
    assert len(pads.dataset(str(out), format="parquet").to_table()) == 22
    single.shutdown()


def test_listings_glob_csv_parquet(photos: Path, tmp_path: Path) -> None:
    everything = list_inputs(str(photos))
    assert len(everything) == 21 and all(Path(p).is_absolute() for p in everything)
    assert len(list_inputs(str(photos / "sub" / "*.png"))) == 13
    listing = tmp_path / "list.csv"
    with open(listing, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["path", "label"])
        writer.writerow([str(photos / "00.png"), "a"])
        writer.writerow([str((photos / "sub" / "01.png").relative_to(tmp_path)), "b"])
    assert list_inputs(str(listing)) == [
        str(photos / "00.png"),
        str(tmp_path / "photos" / "sub" / "01.png"),
    ]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"path": [str(photos / "00.png")]}), tmp_path / "list.parquet")
    assert list_inputs(str(tmp_path / "list.parquet")) == [str(photos / "00.png")]
    pq.write_table(pa.table({"file": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="no 'path' column"):
        list_inputs(str(tmp_path / "bad.parquet"))
    with pytest.raises(ValueError, match="no images found"):
        list_inputs(str(tmp_path / "nothing-*.png"))


def test_text_embedder_on_ray(local_ray: None, tiny_model_dir: Path) -> None:
    texts = [f"a {c} thing number {i}" for i, c in enumerate(["red", "green", "blue"] * 7)]
    ds = ray.data.from_items([{"text": t} for t in texts], override_num_blocks=4)
    out = ds.map_batches(
        TextBatchEmbedder,
        fn_constructor_kwargs={"config": config(tiny_model_dir)},
        batch_size=8,
        compute=ray.data.ActorPoolStrategy(size=2),
        batch_format="numpy",
    ).take_all()
    single = OnnxClipPlugin()
    assert single.initialize(PluginConfig.from_dict(config(tiny_model_dir)))
    expected = {
        t: r.embedding
        for t, r in zip(texts, single.generate_text_embedding_batch(texts), strict=True)
    }
    assert len(out) == len(texts)
    for row in out:
        assert row["ok"] and np.abs(row["embedding"] - expected[str(row["text"])]).max() < 1e-6
    single.shutdown()


def test_cli_embed_dataset_then_index_from_parquet(
    photos: Path, tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    exe = str(Path(sys.executable).parent / "themis-clip")
    out, index = tmp_path / "emb", str(tmp_path / "idx.db")
    run = subprocess.run(
        [
            exe,
            "embed-dataset",
            str(photos),
            str(out),
            "--actors",
            "2",
            "--model",
            str(tiny_model_dir),
            "--batch-size",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "21 listed, 0 already there, 20 embedded, 1 failed" in run.stdout
    loaded = subprocess.run(
        [
            exe,
            "index",
            str(out),
            "--from-parquet",
            "--index",
            index,
            "--model",
            str(tiny_model_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode == 0 and "20 embeddings loaded" in loaded.stdout, loaded.stderr
    found = subprocess.run(
        [
            exe,
            "search",
            "--image",
            str(photos / "00.png"),
            "-k",
            "1",
            "--index",
            index,
            "--model",
            str(tiny_model_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 0 and found.stdout.strip().endswith("00.png")
    # The folder indexer then sees those files as unchanged: nothing is re-embedded.
    again = subprocess.run(
        [exe, "index", str(photos), "--index", index, "--model", str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "0 added" in again.stdout and "20 unchanged" in again.stdout
    other = subprocess.run(
        [
            exe,
            "index",
            str(out),
            "--from-parquet",
            "--index",
            str(tmp_path / "o.db"),
            "--model",
            str(tiny_model_dir_b),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert other.returncode == 2 and "not of tiny-b" in other.stderr


def test_cli_ships_the_whole_configuration_to_the_actors(
    photos: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # A wrong expected_sha256 in the config must reach each actor and stop it loading (the
    # configuration used to be cut down to path, batch size and backend on the way).
    import json

    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model": {"path": str(tiny_model_dir), "expected_sha256": "0" * 64},
                "preprocess": {"decode_mode": "exact"},
            }
        )
    )
    exe = str(Path(sys.executable).parent / "themis-clip")
    run = subprocess.run(
        [exe, "embed-dataset", str(photos), str(tmp_path / "emb"), "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode != 0
    assert "SHA-256" in run.stderr, run.stderr[-3000:]
