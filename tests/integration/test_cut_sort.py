"""Results that end where relevance ends, and in date order: the cut and the sort on a labelled
gallery of the demo model's world, through the library and the CLI, on both stores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from themis_clip import ModelConfig, PluginConfig, demo_model_path
from themis_clip.collection import Collection, Query
from themis_clip.demo.scenes import write_gallery
from themis_clip.errors import InputError
from themis_clip.index.relevance import Cut, WeakLine, cut_ranked

EXE = str(Path(sys.executable).parent / "themis-clip")


def test_the_cut_rules_restated() -> None:
    line = WeakLine(score=0.5, texts=64, images=100)
    # below the line nothing is a match, and the answer says so
    nothing = cut_ranked([0.45, 0.4], Cut(), line)
    assert nothing.kept == 0 and "no photo matches" in nothing.reason
    # a wide gap above the line ends the matches there
    gap = cut_ranked([0.80, 0.79, 0.78, 0.62, 0.61, 0.60, 0.59, 0.3], Cut(), line)
    assert gap.kept == 3 and "gap of 0.160 after match 3" in gap.reason
    # evenly spaced scores: everything above the line
    even = cut_ranked([0.70, 0.68, 0.66, 0.64, 0.62, 0.4], Cut(), line)
    assert even.kept == 5 and even.at == 0.5
    assert cut_ranked([0.9, 0.1], Cut(auto=False), line).kept == 2
    assert cut_ranked([0.9, 0.3, 0.1], Cut.parse("0.25"), None).kept == 2
    assert cut_ranked([0.9, 0.1], Cut(), None).kept == 2  # no line measured: nothing cut
    with pytest.raises(InputError):
        Cut.parse("sometimes")


@pytest.fixture(scope="module")
def gallery(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    root = tmp_path_factory.mktemp("cut")
    scenes = write_gallery(root / "g", 120, seed=3)
    for i, (path, _) in enumerate(scenes):  # capture times: one a day, in file order
        exif = Image.Exif()
        exif.get_ifd(0x8769)[0x9003] = f"2024:01:{1 + i % 28:02d} 10:{i // 28:02d}:00"
        Image.open(path).save(path, quality=92, exif=exif.tobytes())
    return root, {str(p.resolve()): s for p, s in scenes}


def test_auto_cut_keeps_the_matches_and_sort_orders_them(
    gallery: tuple[Path, dict[str, object]], location: str
) -> None:
    root, truth = gallery
    config = PluginConfig(model=ModelConfig(path=str(demo_model_path())))
    with Collection.open(location, config) as photos:
        photos.index_folder(root / "g")
        wide = photos.search("a red circle", k=40, cut="none")
        cut = photos.search("a red circle", k=40)
        right = [h for h in wide if truth[h.path or ""].colour == "red"]  # type: ignore[attr-defined]
        assert len(cut) < len(wide) and cut.weaker == len(wide) - len(cut)
        assert cut.cut is not None and cut.cut.reason
        kept_right = sum(truth[h.path or ""].colour == "red" for h in cut)  # type: ignore[attr-defined]
        assert kept_right / len(cut) > len(right) / len(wide)  # the cut raises precision
        assert [h.key for h in cut] == [h.key for h in wide[: len(cut)]]
        # an image query is not cut by default
        probe = next(iter(truth))
        assert len(photos.search(Query(image=probe), k=15)) == 15
        by_date = photos.search("a red circle", k=40, sort="taken")
        taken = [str((h.metadata or {})["taken"]) for h in by_date]
        assert taken == sorted(taken) and {h.key for h in by_date} == {h.key for h in cut}
        newest = photos.search("a red circle", k=40, sort="-taken")
        assert [h.key for h in newest] == [h.key for h in reversed(by_date.hits)]
        with pytest.raises(InputError, match="sort"):
            photos.search("x", sort="colour")


def test_the_cli_says_where_it_cut(gallery: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    root, _ = gallery
    index = str(tmp_path / "i.db")
    assert (
        subprocess.run(
            [EXE, "index", str(root / "g"), "--index", index], capture_output=True
        ).returncode
        == 0
    )
    out = subprocess.run(
        [EXE, "search", "a red circle", "--index", index, "-k", "40", "--sort=-taken"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "weaker left out, cut" in out.stderr and "--cut none" in out.stderr, out.stderr
    shown = [line for line in out.stdout.splitlines() if line.strip()]
    wide = subprocess.run(
        [EXE, "search", "a red circle", "--index", index, "-k", "40", "--cut", "none"],
        capture_output=True,
        text=True,
    )
    assert len(shown) < len(wide.stdout.splitlines()) == 40
    bad = subprocess.run(
        [EXE, "search", "x", "--index", index, "--cut", "often"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "auto, none or a score" in bad.stderr


def test_a_filter_with_no_query_in_date_order_pages_stably(
    gallery: tuple[Path, dict[str, object]], location: str, tmp_path: Path
) -> None:
    from themis_clip.collection import browse
    from themis_clip.index.query import QueryMode, search_page
    from themis_clip.index.search import VectorIndex
    from themis_clip.index.where import parse_where

    root, _ = gallery
    config = PluginConfig(model=ModelConfig(path=str(demo_model_path())))
    with Collection.open(location, config) as photos:
        photos.index_folder(root / "g")
    january = parse_where({"taken": {"$lt": "2024-01-15"}})
    with VectorIndex(location) as index:
        oldest = browse(index, k=200, where=january, sort="taken")
        taken = [str((h.metadata or {})["taken"]) for h in oldest]
        assert taken == sorted(taken) and all(t < "2024-01-15" for t in taken) and taken
        newest = browse(index, k=200, where=january)
        assert [h.key for h in newest] == [h.key for h in reversed(oldest.hits)]
        names = [Path(h.path or "").name for h in browse(index, k=200, where=january, sort="name")]
        assert names == sorted(names)
        pages, cursor = [], None  # pages of 7 in oldest-first order equal the whole list
        while True:
            page = search_page(
                index,
                mode=QueryMode.BROWSE,
                k=7,
                identity={},
                where=january,
                order="taken",
                cursor=cursor,
            )
            pages += [h.key for h in page.hits]
            cursor = page.next
            if cursor is None:
                break
        assert pages == [h.key for h in oldest]
        with pytest.raises(InputError, match="cursor"):  # a cursor of another order is refused
            search_page(
                index,
                mode=QueryMode.BROWSE,
                k=7,
                identity={},
                where=january,
                order="name",
                cursor=search_page(
                    index, mode=QueryMode.BROWSE, k=7, identity={}, where=january, order="taken"
                ).next,
            )
    out = subprocess.run(
        [
            EXE,
            "search",
            "--index",
            location,
            "--where",
            '{"taken": {"$lt": "2024-01-03"}}',
            "--sort",
            "taken",
            "--json",
            "-k",
            "50",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    import json

    got = [h["metadata"]["taken"] for h in json.loads(out.stdout)]
    assert got == sorted(got) and got


def test_found_in_the_tryout(gallery: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    """--sort mtime with a query crashed on ISO file times; later pages of an auto-cut query
    went on below the line; a filter and an order with no query were refused over HTTP."""
    from fastapi.testclient import TestClient

    from themis_clip.server.app import create_app
    from themis_clip.server.settings import ServerSettings

    root, _ = gallery
    location = str(tmp_path / "i.db")
    config = PluginConfig(model=ModelConfig(path=str(demo_model_path())))
    with Collection.open(location, config) as photos:
        photos.index_folder(root / "g")
        newest = photos.search("a red circle", k=20, cut="none", sort="mtime")
        assert len(newest) == 20
    with TestClient(create_app(ServerSettings(plugin_config=config, index_path=location))) as c:
        first = c.post("/search", json={"text": "a red circle", "k": 2}).json()
        line = first["weak_below"]
        cursor, scores = first["next"], [h["score"] for h in first["results"]]
        while cursor is not None:
            page = c.post("/search", json={"text": "a red circle", "k": 2, "cursor": cursor}).json()
            scores += [h["score"] for h in page["results"]]
            cursor = page["next"]
        assert scores and min(scores) >= line
        browse = c.post("/search", json={"where": {"taken": {"$lt": "2024-01-03"}}, "sort": "name"})
        assert browse.status_code == 200, browse.text
        names = [Path(h["path"]).name for h in browse.json()["results"]]
        assert names == sorted(names) and names


def test_a_sorted_search_is_sorted_across_its_pages(
    gallery: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    # Each page used to be sorted alone: page two could hold photos older than page one's.
    from fastapi.testclient import TestClient

    from themis_clip.server.app import create_app
    from themis_clip.server.settings import ServerSettings

    root, _ = gallery
    location = str(tmp_path / "i.db")
    config = PluginConfig(model=ModelConfig(path=str(demo_model_path())))
    with Collection.open(location, config) as photos:
        photos.index_folder(root / "g")
    with TestClient(create_app(ServerSettings(plugin_config=config, index_path=location))) as c:
        for sort in ("taken", "-taken"):
            body = {"text": "a red circle", "k": 25, "cut": "none", "sort": sort}
            keys: list[str] = []
            taken: list[str] = []
            cursor = None
            while True:
                page = c.post("/search", json={**body, "cursor": cursor}).json()
                keys += [h["id"] for h in page["results"]]
                taken += [h["metadata"]["taken"] for h in page["results"]]
                cursor = page["next"]
                if cursor is None:
                    break
            assert len(keys) == len(set(keys)) == 120  # every match once, none repeated
            assert taken == sorted(taken, reverse=sort == "-taken")
        wrong = c.post("/search", json={**body, "sort": "name", "cursor": page["next"] or "x"})
        assert wrong.status_code == 422
