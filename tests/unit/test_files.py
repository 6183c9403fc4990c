"""The one folder walker: NAS and system junk skipped, --exclude globs, links inside the root
only, loops and second ways to a folder walked once."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from themis_clip.files import walk_images


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_nas_and_system_junk_is_skipped_and_counted(tmp_path: Path) -> None:
    photo = _touch(tmp_path / "2023" / "beach.jpg")
    junk = [
        "2023/@eaDir/beach.jpg/SYNOPHOTO_THUMB_XL.jpg",  # Synology thumbnails
        "2023/._beach.jpg",  # macOS AppleDouble
        "#recycle/old.jpg",
        "#snapshot/daily/beach.jpg",
        "$RECYCLE.BIN/S-1-5/x.jpg",
        "System Volume Information/x.jpg",
        "DCIM/.thumbnails/1.jpg",
        "DCIM/.trashed-1700000000-IMG_1.jpg",
        ".hidden/x.jpg",
        "2023/Thumbs.db",
        "2023/.DS_Store",
    ]
    for rel in junk:
        _touch(tmp_path / rel)
    skipped: Counter[str] = Counter()
    assert walk_images(tmp_path, skipped=skipped) == [photo]
    assert skipped["@eaDir"] == 1 and skipped["._*"] == 1 and skipped[".trashed-*"] == 1
    assert skipped["#recycle"] == skipped["#snapshot"] == skipped["$RECYCLE.BIN"] == 1
    assert skipped["hidden folder"] == 1 and skipped[".thumbnails"] == 1


def test_exclude_globs_match_names_and_relative_paths(tmp_path: Path) -> None:
    keep = _touch(tmp_path / "2023" / "beach.jpg")
    _touch(tmp_path / "2023" / "screenshots" / "s.png")
    _touch(tmp_path / "2023" / "beach.edited.jpg")
    _touch(tmp_path / "private" / "x.jpg")
    skipped: Counter[str] = Counter()
    found = walk_images(
        tmp_path, exclude=["screenshots", "*.edited.*", "private/*"], skipped=skipped
    )
    assert found == [keep]
    assert sum(skipped.values()) == 3 and skipped["--exclude screenshots"] == 1


@pytest.mark.skipif(os.name != "posix", reason="symlinks")
def test_links_are_followed_inside_the_root_only_and_loops_end(tmp_path: Path) -> None:
    root, outside = tmp_path / "photos", tmp_path / "elsewhere"
    inner = _touch(root / "a" / "1.jpg")
    _touch(outside / "secret.jpg")
    (root / "albums").mkdir()
    (root / "albums" / "best").symlink_to(root / "a")  # a second way to a/
    (root / "a" / "loop").symlink_to(root)  # a loop
    (root / "out").symlink_to(outside)  # leads out of the root
    (root / "file-out.jpg").symlink_to(outside / "secret.jpg")
    (root / "b").mkdir()
    linked_in = root / "b" / "1-link.jpg"
    linked_in.symlink_to(inner)
    skipped: Counter[str] = Counter()
    assert walk_images(root, skipped=skipped) == [inner, linked_in]
    assert skipped["link out of the folder"] == 2 and skipped["folder linked twice"] == 2


def test_junk_names_match_in_any_case(tmp_path: Path) -> None:
    keep = _touch(tmp_path / "a.jpg")
    for rel in ("$Recycle.Bin/x.jpg", "@EADIR/y.jpg", "#Recycle/z.jpg", "THUMBS.DB"):
        _touch(tmp_path / rel)
    skipped: Counter[str] = Counter()
    assert walk_images(tmp_path, skipped=skipped) == [keep]
    assert skipped["$RECYCLE.BIN"] == skipped["@eaDir"] == skipped["#recycle"] == 1


def test_every_raw_of_a_stem_is_recorded_beside_its_still(tmp_path: Path) -> None:
    # A second RAW of the same name (a camera writing CR2 and DNG) was neither embedded nor
    # recorded: a script acting on the item missed it.
    from themis_clip.files import companion_paths, pair_companions

    names = ("IMG_1.jpg", "IMG_1.dng", "IMG_1.CR2", "IMG_2.dng")
    paths = [tmp_path / n for n in names]
    kept, extra = pair_companions(paths)
    assert kept == [tmp_path / "IMG_1.jpg", tmp_path / "IMG_2.dng"]
    meta = extra[tmp_path / "IMG_1.jpg"]
    assert meta == {"raw": "IMG_1.CR2", "raws": ["IMG_1.CR2", "IMG_1.dng"]}
    assert companion_paths(tmp_path / "IMG_1.jpg", meta) == [
        tmp_path / "IMG_1.CR2",
        tmp_path / "IMG_1.dng",
    ]
