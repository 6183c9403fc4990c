"""Moving an index to another model: the migrated index answers as one built with the new model,
a kill -9 mid-way resumes without embedding a committed item again, a rollback restores the old
answers exactly, and an item that cannot be re-embedded is named, never dropped silently."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers import encode, make_plugin, photo_like
from tests.migrating import _SLOW_MIGRATION, _config, _Counting, _model_id, build_library, kill_when
from themis_clip.cli import main
from themis_clip.collection import Collection, Query
from themis_clip.errors import IndexModelMismatchError
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow, Lexical
from themis_clip.index.where import parse_where
from themis_clip.migration import before_path, migrate_index, shadow_path

ITEMS = 200


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[Path, Path]:
    """A folder of 200 photos and its index made by model A: ``(folder, index)``."""
    return build_library(tmp_path_factory.mktemp("library"), ITEMS, tiny_model_dir, (40, 30))


def _copy(library: tuple[Path, Path], tmp_path: Path) -> Path:
    index = tmp_path / "photos.db"
    shutil.copy(library[1], index)
    return index


def _answers(index: Path, model: Path, probe: Path) -> list[list[tuple[str, float]]]:
    """Each query's ``(key, score)`` ranking of all items (a text and an image query)."""
    with Collection.open(index, _config(model), readonly=True) as collection:
        return [
            [(h.key, h.score) for h in collection.search(q, k=ITEMS + 5, cut="none")]
            for q in (Query(text="a photo of a dog"), Query(image=str(probe)))
        ]


def test_a_migrated_index_answers_as_one_built_with_the_new_model_and_rolls_back_exactly(
    library: tuple[Path, Path],
    tiny_model_dir: Path,
    tiny_model_dir_b: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    photos, _ = library
    index = _copy(library, tmp_path)
    probe = photos / "017.png"
    old = _answers(index, tiny_model_dir, probe)

    argv = ["migrate", "--index", str(index), "--to", str(tiny_model_dir_b), "--threads", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"migrated {ITEMS} of {ITEMS} items" in out and f"{ITEMS} embedded now" in out

    # the independent reference: a fresh index of the same folder made by model B
    reference = tmp_path / "reference.db"
    with Collection.open(reference, _config(tiny_model_dir_b)) as collection:
        collection.index_folder(photos)
    migrated = _answers(index, tiny_model_dir_b, probe)
    for got, want in zip(migrated, _answers(reference, tiny_model_dir_b, probe), strict=True):
        assert [k for k, _ in got] == [k for k, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)
    with (
        Collection.open(index, _config(tiny_model_dir)) as collection,
        pytest.raises(IndexModelMismatchError),
    ):
        collection.search("a photo", k=3)
    assert before_path(index, _model_id(tiny_model_dir_b)).is_file()

    assert main(["migrate", "--index", str(index), "--rollback"]) == 0
    assert _answers(index, tiny_model_dir, probe) == old  # exactly: the very same file
    assert not before_path(index, _model_id(tiny_model_dir_b)).exists()
    capsys.readouterr()

    # the replaced index became the shadow again: migrating once more embeds nothing
    assert main(argv) == 0
    assert "0 embedded now" in capsys.readouterr().out
    assert _answers(index, tiny_model_dir_b, probe) == migrated

    # and back again: the read-only searches between left SQLite's side files beside the
    # index and the kept one; a rollback neither counts them as kept indexes nor refuses
    assert main(["migrate", "--index", str(index), "--rollback"]) == 0
    assert _answers(index, tiny_model_dir, probe) == old
    assert sorted(p.name for p in tmp_path.glob("photos.db.before-*")) == []
    capsys.readouterr()
    assert main(["migrate", "--index", str(index), "--rollback"]) == 2
    assert "nothing to roll back" in capsys.readouterr().err


def test_one_migration_of_an_index_to_a_model_at_a_time(
    library: tuple[Path, Path], tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    from themis_clip.errors import SearchIndexError
    from themis_clip.files import file_lock

    index = _copy(library, tmp_path)
    plugin = make_plugin(tiny_model_dir_b)
    try:
        identity = plugin.model_identity
        assert identity is not None
        shadow = shadow_path(index, identity.model_id)
        with (
            file_lock(Path(f"{shadow}.lock")),  # another migrator (a server's) at work
            pytest.raises(SearchIndexError, match="another migration of this index"),
        ):
            migrate_index(index, plugin, identity)
        report = migrate_index(index, plugin, identity)  # once it is gone, this one runs
        assert report.before is not None and report.embedded == ITEMS
        assert not Path(f"{shadow}.lock").exists()
    finally:
        plugin.shutdown()


def _committed(shadow: Path) -> set[str]:
    """The keys committed to ``shadow`` (none while it is being created)."""
    with closing(sqlite3.connect(f"file:{shadow}?mode=ro", uri=True)) as db:
        try:
            return {key for (key,) in db.execute("SELECT key FROM items")}
        except sqlite3.OperationalError:  # no schema yet
            return set()


@pytest.mark.slow
def test_a_migration_killed_mid_way_resumes_without_embedding_a_committed_item_again(
    library: tuple[Path, Path], tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    index = _copy(library, tmp_path)
    counting = _Counting(tiny_model_dir_b)
    identity = counting.plugin.model_identity
    assert identity is not None
    shadow = shadow_path(index, identity.model_id)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_SLOW_MIGRATION),
            "migrate",
            "--index",
            str(index),
            "--to",
            str(tiny_model_dir_b),
            "--threads",
            "1",
            "--batch-size",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    kill_when(proc, lambda: shadow.is_file() and len(_committed(shadow)) >= 40)
    committed = _committed(shadow)
    assert 40 <= len(committed) < ITEMS
    assert not before_path(index, identity.model_id).exists()  # not cut over

    try:
        report = migrate_index(index, counting, identity, chunk=16)
    finally:
        counting.plugin.shutdown()
    assert not set(counting.seen) & committed  # nothing committed is embedded twice
    assert len(counting.seen) == len(set(counting.seen)) == ITEMS - len(committed)
    assert report.embedded == ITEMS - len(committed) and report.before is not None
    with VectorIndex(index, readonly=True) as migrated:
        assert migrated.store.count() == ITEMS
        assert migrated.stamp == identity


def test_an_item_that_cannot_be_re_embedded_is_named_and_stops_the_cut_over(
    library: tuple[Path, Path],
    tiny_model_dir: Path,
    tiny_model_dir_b: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    photos, _ = library
    index = _copy(library, tmp_path)
    folder = tmp_path / "photos"
    shutil.copytree(photos, folder)
    # the index's items point at the original folder: give this test its own files
    with closing(sqlite3.connect(index)) as db, db:
        db.execute("UPDATE items SET path = replace(path, ?, ?)", (str(photos), str(folder)))
    gone = folder / "005.png"
    gone.unlink()
    picture = encode(Image.fromarray(photo_like(64, 48, 3)), "JPEG")
    with VectorIndex(index) as live:
        stamp = live.stamp
        assert stamp is not None
        vector = live.store.vectors_by_id([1], stamp.dim)[0]
        live.store.upsert(
            [
                ItemRow(key="uploaded-with-preview", vector=vector, thumbnail=picture),
                ItemRow(key="uploaded-bare", vector=vector),
            ],
            dim=stamp.dim,
        )

    argv = ["migrate", "--index", str(index), "--to", str(tiny_model_dir_b), "--threads", "1"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    gone_key = next(line for line in out.splitlines() if "005.png" in line)
    assert "is gone" in gone_key
    assert "cannot re-embed uploaded-bare: added without a file or a preview" in out
    assert "from their stored preview (no file, lower quality): uploaded-with-preview" in out
    assert "not cut over: 2 item(s)" in out
    with VectorIndex(index, readonly=True) as live:
        assert live.stamp == stamp  # still the old model's index, every item in it
        assert live.store.count() == ITEMS + 2

    assert main([*argv, "--drop-missing"]) == 1  # cut over; still says what was left out
    out = capsys.readouterr().out
    assert "0 embedded now" in out and "cannot re-embed uploaded-bare" in out
    assert f"migrated {ITEMS} of {ITEMS + 2} items" in out and "live:" in out
    with VectorIndex(index, readonly=True) as migrated:
        assert migrated.store.count() == ITEMS
        assert migrated.store.get("uploaded-with-preview") is not None
        assert migrated.store.get("uploaded-bare") is None
    with VectorIndex(before_path(index, _model_id(tiny_model_dir_b)), readonly=True) as old:
        assert old.store.get("uploaded-bare") is not None  # the old index still holds it


def _reading(*texts: str) -> dict[str, object]:
    box = [[10.0, 20.0], [110.0, 20.0], [110.0, 50.0], [10.0, 50.0]]
    lines = [{"text": t, "box": box, "confidence": 0.9} for t in texts]
    return {"width": 40, "height": 30, "gated": False, "lines": lines}


def _text_answers(location: str) -> tuple[list[str], list[str]]:
    """``search "bucks" --mode lexical`` and the ``$has_text`` items, as keys."""
    with VectorIndex(location, readonly=True) as index:
        store = index.store
        assert isinstance(store, Lexical)
        hits = store.items_by_id(store.lexical("bucks", 50, None))
        with_text = store.items_by_id(sorted(store.ids_where(parse_where({"$has_text": True}))))
        return sorted(h.key for h in hits.values()), sorted(h.key for h in with_text.values())


def test_ocr_readings_move_with_the_items_without_being_read_again(
    location: str,
    tiny_model_dir: Path,
    tiny_model_dir_b: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(12):
        Image.fromarray(photo_like(40, 30, i)).save(photos / f"{i:02d}.png")
    with Collection.open(location, _config(tiny_model_dir)) as collection:
        collection.index_folder(photos)
    keys = sorted(str(p) for p in photos.iterdir())
    with VectorIndex(location) as live:
        assert isinstance(live.store, Lexical)
        readings = {
            keys[0]: _reading("STARBUCKS COFFEE"),
            keys[1]: _reading("Total 12.50"),
            keys[2]: _reading(),  # read, nothing found: not read again either
        }
        assert live.store.set_ocr(readings) == 3
    before = _text_answers(location)
    assert before == ([keys[0]], keys[:2])

    argv = ["migrate", "--index", location, "--to", str(tiny_model_dir_b), "--threads", "1"]
    assert main([*argv, "--no-cut-over"]) == 0  # the shadow, its readings copied with it
    with VectorIndex(location) as live:  # a picture read while the migration waits
        assert isinstance(live.store, Lexical)
        readings[keys[3]] = _reading("BUCKS FIZZ")
        assert live.store.set_ocr({keys[3]: readings[keys[3]]}) == 1
    before = _text_answers(location)
    assert before == ([keys[0], keys[3]], [*keys[:2], keys[3]])
    assert main(argv) == 0
    assert "migrated 12 of 12 items" in capsys.readouterr().out
    assert _text_answers(location) == before
    with VectorIndex(location, readonly=True) as migrated:
        assert isinstance(migrated.store, Lexical)
        ids = {k: i for i, k in migrated.store.keys_by_id().items()}
        got = migrated.store.ocr_readings(list(ids.values()))
        assert {migrated.store.keys_by_id()[i]: r for i, r in got.items()} == readings
