"""Near-duplicates on both stores: planted re-encoded and resized copies are found exactly,
from the library, the CLI and HTTP.

The embedder here is a stand-in for a real model that keeps what duplicate detection relies
on: a re-encoded or resized copy embeds next to its original (a mean-free 8x8 colour
thumbnail, unit length), distinct photos do not."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from themis_clip.cli import main
from themis_clip.index.duplicates import find_duplicates
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow
from themis_clip.vocabulary import ModelIdentity

DIM = 192
STAMP = ModelIdentity.from_model_id("thumb@1", sha256="cd" * 32, dim=DIM)


def embed(data: bytes) -> np.ndarray:
    img = Image.open(io.BytesIO(data)).convert("RGB").resize((8, 8), Image.BOX)
    v = np.asarray(img, dtype=np.float32).reshape(-1)
    v -= v.mean()
    return v / np.linalg.norm(v)


def photo(seed: int) -> np.ndarray:
    """A smooth random picture (96x64), each seed its own."""
    coarse = np.random.default_rng(seed).integers(0, 256, (4, 6, 3), dtype=np.uint8)
    img = Image.fromarray(coarse).resize((96, 64), Image.BICUBIC)
    return np.asarray(img)


def jpeg(pixels: np.ndarray, quality: int = 90, scale: float = 1.0) -> bytes:
    img = Image.fromarray(pixels)
    if scale != 1.0:
        img = img.resize((int(img.width * scale), int(img.height * scale)), Image.LANCZOS)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality)
    return out.getvalue()


def planted() -> tuple[list[ItemRow], list[set[str]]]:
    """40 distinct photos; photos 3 and 17 get a re-encoded and a half-size copy each."""
    rows, groups = [], []
    for seed in range(40):
        pixels = photo(seed)
        rows.append(
            ItemRow(key=f"p{seed}", path=f"/photos/p{seed}.jpg", vector=embed(jpeg(pixels)))
        )
        if seed in (3, 17):
            rows.append(ItemRow(key=f"p{seed}-q40", vector=embed(jpeg(pixels, quality=40))))
            rows.append(ItemRow(key=f"p{seed}-half", vector=embed(jpeg(pixels, scale=0.5))))
            groups.append({f"p{seed}", f"p{seed}-q40", f"p{seed}-half"})
    return rows, groups


@pytest.mark.parametrize("exact_below", [0, 10_000], ids=["graph", "all-pairs"])
def test_planted_copies_are_found_exactly(location: str, exact_below: int) -> None:
    rows, want = planted()
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(rows, dim=DIM)
        groups = find_duplicates(index, exact_below=exact_below)
        assert [{item["key"] for item in g.items} for g in groups] != []
        assert sorted(({i["key"] for i in g.items} for g in groups), key=sorted) == sorted(
            want, key=sorted
        )
        for g in groups:
            keys = [i["key"] for i in g.items]
            vectors = np.stack([index.store.vector(k) for k in keys])
            sims = vectors @ vectors.T
            assert g.score == pytest.approx(float(sims.min()), abs=1e-5)  # the lowest pair
            assert 0.99 <= g.score < 1.0
        original = next(i for g in groups for i in g.items if i["key"] == "p3")
        assert original["path"] == "/photos/p3.jpg"
        # A threshold no pair reaches: no groups; one every pair reaches: everything, one group.
        assert find_duplicates(index, threshold=1.0, exact_below=exact_below) == []
        everything = find_duplicates(index, threshold=-1.0, exact_below=exact_below)
        assert len(everything) == 1 and len(everything[0].items) == len(rows)


@pytest.mark.parametrize("exact_below", [0, 10_000], ids=["graph", "all-pairs"])
def test_identical_files_meet_threshold_one(location: str, exact_below: int) -> None:
    """Byte-identical copies score 0.9999998 in float32, not 1: threshold 1 must still group
    them (a tryout found it did not), and nothing else."""
    rows, _ = planted()
    # A vector whose float32 self-similarity rounds below 1 (as a 512-d model's often does).
    same = np.random.default_rng(14).standard_normal(DIM).astype(np.float32)
    rows = [ItemRow(key="p5", vector=same) if r.key == "p5" else r for r in rows]
    rows += [ItemRow(key=f"p5-copy{i}", vector=same.copy()) for i in range(2)]
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(rows, dim=DIM)
        groups = find_duplicates(index, threshold=1.0, exact_below=exact_below)
        assert [{i["key"] for i in g.items} for g in groups] == [{"p5", "p5-copy0", "p5-copy1"}]


def test_cli_and_http(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fastapi.testclient import TestClient

    from themis_clip import PluginConfig
    from themis_clip.server.app import create_app
    from themis_clip.server.settings import ServerSettings

    location = str(tmp_path / "i.db")
    rows, want = planted()
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(rows, dim=DIM)
    assert main(["duplicates", "--index", location, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert sorted(({i["key"] for i in g["items"]} for g in printed), key=sorted) == sorted(
        want, key=sorted
    )
    assert all(set(g) == {"items", "score", "tier", "keeper"} for g in printed)
    assert main(["duplicates", "--index", location, "--threshold", "2"]) == 2
    config = PluginConfig.from_dict({"model": {"path": str(tiny_model_dir)}})
    app = create_app(ServerSettings(plugin_config=config, index_path=location))
    with TestClient(app) as client:
        got = client.get("/duplicates").json()
        assert sorted(({i["key"] for i in g["items"]} for g in got["groups"]), key=sorted) == (
            sorted(want, key=sorted)
        )
        assert got["groups"][0]["items"][0]["thumbnail"].startswith("/items/")
        assert client.get("/duplicates?threshold=1").json()["groups"] == []
        assert client.get("/duplicates?threshold=5").status_code == 422


def test_http_runs_one_pass_per_index_version(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass over a large library costs seconds of every core: asking again (or many
    clients asking) reuses it until the index changes."""
    from fastapi.testclient import TestClient

    from themis_clip import PluginConfig
    from themis_clip.server.app import create_app
    from themis_clip.server.routes import duplicates as route
    from themis_clip.server.settings import ServerSettings

    passes: list[float] = []
    real = route.find_duplicates

    def counted(index: VectorIndex, *, threshold: float, **options: object) -> list[object]:
        passes.append(threshold)
        return real(index, threshold=threshold, **options)  # type: ignore[arg-type,return-value]

    monkeypatch.setattr(route, "find_duplicates", counted)
    location = str(tmp_path / "i.db")
    rows, want = planted()
    with VectorIndex(location) as index:
        index.bind_model(STAMP)
        index.store.upsert(rows, dim=DIM)
    config = PluginConfig.from_dict({"model": {"path": str(tiny_model_dir)}})
    app = create_app(ServerSettings(plugin_config=config, index_path=location))
    with TestClient(app) as client:
        first = [client.get("/duplicates").json() for _ in range(3)]
        assert first[0] == first[1] == first[2] and len(first[0]["groups"]) == len(want)
        assert len(passes) == 1
        client.get("/duplicates?threshold=0.5")
        assert len(passes) == 2  # another threshold is another pass
        with VectorIndex(location) as index:  # the index changes: the answer is recomputed
            index.store.upsert(
                [ItemRow(key=f"{rows[9].key}-copy", vector=rows[9].vector.copy())], dim=DIM
            )
        again = client.get("/duplicates").json()
        assert len(passes) == 3 and len(again["groups"]) == len(want) + 1


def test_tiers_keepers_and_the_list_of_copies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One threshold mixed identical files, re-encodes and burst shots, and named no keeper
    (immich #31487): each group is now labelled, and the copies can be listed for a script."""
    from PIL import Image

    from themis_clip import ModelConfig, PluginConfig, demo_model_path
    from themis_clip.collection import Collection
    from themis_clip.demo.scenes import Scene, render_scene
    from themis_clip.preprocess.image import same_pixels

    def exif(second: int) -> bytes:
        out = Image.Exif()
        out.get_ifd(0x8769)[0x9003] = f"2024:06:01 12:{second // 60:02d}:{second % 60:02d}"
        return out.tobytes()

    photos = tmp_path / "photos"
    photos.mkdir()
    a = render_scene(Scene(shape="circle", colour="red", position="left", seed=1), size=224)
    b = render_scene(Scene(shape="square", colour="blue", position="right", seed=2), size=224)
    c = render_scene(Scene(shape="triangle", colour="green", seed=3), size=224)
    a.save(photos / "a.jpg", quality=95, exif=exif(0))
    (photos / "a-copy.jpg").write_bytes((photos / "a.jpg").read_bytes())  # identical
    b.save(photos / "b.png")
    b.save(photos / "b-resaved.png", pnginfo=_text_chunk())  # other bytes, same pixels
    c.save(photos / "c.jpg", quality=95, exif=exif(0))
    c.resize((112, 112)).save(photos / "c-small.jpg", quality=60, exif=exif(0))  # resized
    shifted = Image.new("RGB", c.size, c.getpixel((0, 0)))
    shifted.paste(c.crop((2, 0, 224, 224)), (0, 0))
    shifted.save(photos / "c-burst.jpg", quality=95, exif=exif(2))  # 2 s later: a burst
    shifted.save(photos / "c-later.jpg", quality=95, exif=exif(3000))  # 50 min later: not one
    config = PluginConfig(model=ModelConfig(path=str(demo_model_path())))
    with Collection.open(tmp_path / "i.db", config) as collection:
        collection.index_folder(photos)
        groups = find_duplicates(collection.index, threshold=0.95, same_pixels=same_pixels)
    names = {frozenset(Path(i["path"]).name for i in g.items): g for g in groups}
    tiers = {tuple(sorted(k)): str(g.tier) for k, g in names.items()}
    assert tiers[("a-copy.jpg", "a.jpg")] == "identical", tiers
    assert tiers[("b-resaved.png", "b.png")] == "same-pixels", tiers
    c_group = next(g for k, g in names.items() if "c.jpg" in k)
    assert {Path(i["path"]).name for i in c_group.items} >= {"c.jpg", "c-small.jpg", "c-burst.jpg"}
    assert "c-later.jpg" not in {Path(i["path"]).name for i in c_group.items}
    assert str(c_group.tier) == "similar"
    assert c_group.keeper is not None and Path(c_group.keeper.key).name in ("c.jpg", "c-burst.jpg")
    assert "pixels" in c_group.keeper.reason  # c-small has fewer
    assert (
        main(["duplicates", "--index", str(tmp_path / "i.db"), "--threshold", "0.95", "--print0"])
        == 0
    )
    listed = capsys.readouterr().out.split("\0")[:-1]
    keepers = {g.keeper.key for g in groups if g.keeper}
    assert listed and not keepers & set(listed)
    assert len(listed) == sum(len(g.items) - 1 for g in groups)


def _text_chunk() -> object:
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "saved again")
    return info


def test_an_undated_copy_does_not_chain_shots_taken_days_apart(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    base = rng.normal(size=DIM).astype(np.float32)
    base /= np.linalg.norm(base)
    meta = [{"taken": "2022-06-01T10:00:00"}, {"taken": "2022-06-05T10:00:00"}, None]
    rows = [
        ItemRow(key=k, vector=base + 1e-4 * rng.normal(size=DIM).astype(np.float32), metadata=m)
        for k, m in zip(("monday", "friday", "whatsapp"), meta, strict=True)
    ]
    with VectorIndex(str(tmp_path / "i.db")) as index:
        index.bind_model(STAMP)
        index.store.upsert(rows, dim=DIM)
        groups = find_duplicates(index, threshold=0.99)
    assert all({"monday", "friday"} - {i["key"] for i in g.items} for g in groups), groups
    assert main(["duplicates", "--index", str(tmp_path / "i.db"), "--window-s=nan"]) == 2


def test_print0_lists_a_non_keepers_raw_and_live_video_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only the embedded JPEG or HEIC was listed: deleting by the list left its RAW and its
    # video behind. A companion the keeper shares (two stills of one stem) stays off the list.
    rng = np.random.default_rng(7)
    base = rng.normal(size=DIM).astype(np.float32)
    big, small = tmp_path / "big", tmp_path / "small"
    meta = {
        big / "IMG_1.jpg": {"width": 4000, "height": 3000, "raw": "IMG_1.dng"},
        small / "IMG_1.jpg": {
            "width": 800,
            "height": 600,
            "raw": "IMG_1.cr2",
            "raws": ["IMG_1.cr2", "IMG_1.dng"],
            "live_video": "IMG_1.MOV",
        },
        big / "IMG_1.jpeg": {"width": 10, "height": 10, "raw": "IMG_1.dng"},  # shares it
    }
    rows = [
        ItemRow(
            key=str(p),
            path=str(p),
            vector=base + 1e-4 * rng.normal(size=DIM).astype(np.float32),
            metadata=m,
        )
        for p, m in meta.items()
    ]
    with VectorIndex(str(tmp_path / "i.db")) as index:
        index.bind_model(STAMP)
        index.store.upsert(rows, dim=DIM)
    assert main(["duplicates", "--index", str(tmp_path / "i.db"), "--print0"]) == 0
    listed = capsys.readouterr().out.split("\0")[:-1]
    assert sorted(listed) == sorted(
        str(p)
        for p in (
            small / "IMG_1.jpg",
            small / "IMG_1.cr2",
            small / "IMG_1.dng",
            small / "IMG_1.MOV",
            big / "IMG_1.jpeg",
        )
    )
