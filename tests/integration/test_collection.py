"""The use-case layer: a library user indexes a folder and searches it with the CLI's behaviour
(EXIF by default, query parts, hybrid), on both stores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers import photo_like
from themis_clip import ModelConfig, PluginConfig
from themis_clip.collection import Collection, Query
from themis_clip.errors import InputError, ModelError
from themis_clip.index.where import parse_where


def _photos(folder: Path) -> Path:
    (folder / "2019").mkdir(parents=True)
    (folder / "2023").mkdir()
    for i in range(3):
        old, new = (
            Image.fromarray(photo_like(48, 32, i)),
            Image.fromarray(photo_like(48, 32, 9 + i)),
        )
        for image, year in ((old, "2019"), (new, "2023")):
            exif = Image.Exif()
            exif.get_ifd(0x8769)[0x9003] = f"{year}:07:14 18:03:11"  # DateTimeOriginal
            image.save(folder / year / f"{i}.jpg", exif=exif)
    return folder


def test_a_library_user_gets_exif_dates_and_the_clis_queries(
    tiny_model_dir: Path, tmp_path: Path, location: str
) -> None:
    photos = _photos(tmp_path / "photos")
    config = PluginConfig(model=ModelConfig(path=str(tiny_model_dir)))
    with Collection.open(location, config) as collection:
        report = collection.index_folder(photos)
        assert report.added == 6 and not report.failed
        # images decoded ahead count against the plugin's one budget, of the user's size
        stats = collection.plugin.pixel_budget.stats()
        assert stats["capacity"] == config.preprocess.pixel_budget and stats["peak"] > 0
        taken_2023 = parse_where({"taken": {"$gte": "2023-01-01"}})
        hits = collection.search("a photo", k=10, where=taken_2023, cut="none")
        assert sorted(Path(h.path or "").parent.name for h in hits) == ["2023"] * 3
        # an image query finds its own file first; a subtracted part changes the vector
        probe = photos / "2019" / "1.jpg"
        assert collection.search(Query(image=str(probe)), k=1)[0].path == str(probe.resolve())
        plain = collection.query_vector(Query(text="a photo"))
        shifted = collection.query_vector(Query(text="a photo", subtract=[str(probe)]))
        assert np.isclose(np.linalg.norm(shifted), 1.0) and not np.allclose(plain, shifted)
        # the cut rule /search has: only a query made of texts is cut at the texts' line
        minus_image = collection.search(Query(text="a photo", subtract=[str(probe)]), k=6)
        assert minus_image.cut is not None and minus_image.cut.reason == "not cut (cut: none)"
        assert len(minus_image) == 6
        with pytest.raises(InputError, match="no image file missing/x.jpg"):
            collection.query_vector(Query(text="a photo", add=["missing/x.jpg"]))
        with pytest.raises(InputError, match="is a folder, not an image file"):
            collection.query_vector(Query(text="a photo", subtract=[str(photos / "2019")]))
        assert collection.search("2023", k=3, hybrid=True)  # fused ranks: not cut
        with pytest.raises(InputError, match="hybrid"):
            collection.search(Query(image=str(probe)), hybrid=True)
        again = collection.index_folder(photos)
        assert again.added == 0 and again.unchanged == 6


def test_a_model_that_cannot_open_is_one_error(tmp_path: Path) -> None:
    config = PluginConfig(model=ModelConfig(path=str(tmp_path / "nothing")))
    with Collection.open(tmp_path / "i.db", config) as collection, pytest.raises(ModelError):
        collection.index_folder(_photos(tmp_path / "photos"))
    with pytest.raises(InputError, match="empty"):
        Query(text="  ")
