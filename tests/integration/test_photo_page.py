"""The page's photo features in a real headless Chromium (issue 27): date-range and camera
filters built from the index's metadata, and the "Duplicates" view."""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.cdp import Browser, chromium
from tests.helpers import ServerProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        chromium() is None and not os.environ.get("CI"),
        reason="chromium not installed (CI installs it)",
    ),
]

# What a folder index stores beside EXIF: the folder, and facts of one file (no picker for those)
FILE = {"size": 123456, "mtime": "2023-07-20T09:00:00+00:00", "width": 4000, "height": 3000}
META = {
    # 23:30 at -02:00 is 01:30 UTC on the 15th: outside a "14 July" range, as an instant.
    "p1": {
        "taken": "2023-07-14T23:30:00-02:00",
        "camera": {"make": "NIKON", "model": "Z 6"},
        "folder": "2023/Summer_holiday_in_Brittany_with_the_whole_family_and_the_dog",
        **FILE,
    },
    "p2": {
        "taken": "2023-07-14T10:00:00+02:00",
        "camera": {"make": "Canon", "model": "R5"},
        "folder": "2023/Summer_holiday_in_Brittany_with_the_whole_family_and_the_dog",
        **FILE,
        "size": 654321,
    },
    "p3": {
        "taken": "2022-01-01T08:00:00",
        "camera": {"make": "Canon", "model": "R6"},
        "folder": "2022",
        **FILE,
        "size": 42,
    },
}


def jpeg_b64(path: Path, quality: int) -> str:
    out = io.BytesIO()
    Image.open(path).convert("RGB").save(out, "JPEG", quality=quality)
    return base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from themis_clip.demo.scenes import write_gallery

    tmp = tmp_path_factory.mktemp("photo-page")
    write_gallery(tmp / "gallery", 4)
    scenes = sorted((tmp / "gallery").iterdir())
    items = [
        {"id": key, "image": jpeg_b64(scenes[i], 90), "metadata": meta}
        for i, (key, meta) in enumerate(META.items())
    ]
    items += [  # one scene twice, encoded differently: a near-duplicate pair
        {"id": "dup-a", "image": jpeg_b64(scenes[3], 95)},
        {"id": "dup-b", "image": jpeg_b64(scenes[3], 60)},
    ]
    with ServerProcess(["--index", str(tmp / "idx.db"), "--new-index"]) as server:
        r = httpx.post(f"{server.base}/index/items", json={"items": items}, timeout=60)
        assert r.status_code == 200, r.text
        yield server.base


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser()
    yield b
    b.close()


def names(browser: Browser) -> list[str]:
    return sorted(
        browser.evaluate(
            "[...document.querySelectorAll('#results figcaption .name')].map(n => n.textContent)"
        )
    )


def choose(browser: Browser, element: str, value: str) -> None:
    browser.evaluate(
        f"(() => {{ const e = document.getElementById('{element}'); e.value = '{value}';"
        " e.dispatchEvent(new Event('change')); })()"
    )


def test_date_range_and_camera_filters(site: str, browser: Browser) -> None:
    browser.navigate(site + "/?q=a%20photo&cut=none")  # every result: the filters narrow them
    browser.wait_for("!document.getElementById('photo-filters').hidden")
    browser.wait_for("document.querySelectorAll('#results img.thumb').length === 5")
    cameras = browser.evaluate(
        "[...document.querySelectorAll('#camera option')].map(o => o.textContent)"
    )
    assert cameras == ["any", "Canon (2)", "NIKON (1)"]  # the index's makes, most common first
    assert browser.evaluate("document.getElementById('taken-from').min") == "2022-01-01"
    choose(browser, "taken-from", "2023-07-14")
    choose(browser, "taken-to", "2023-07-14")
    browser.wait_for("document.getElementById('status').textContent.startsWith('1 result ')")
    assert names(browser) == ["p2"]  # p1 is the 15th in UTC
    choose(browser, "taken-to", "2023-07-15")
    browser.wait_for("document.getElementById('status').textContent.startsWith('2 results')")
    assert names(browser) == ["p1", "p2"]
    choose(browser, "camera", "Canon")
    browser.wait_for("document.getElementById('status').textContent.startsWith('1 result ')")
    assert names(browser) == ["p2"]
    choose(browser, "taken-from", "")
    choose(browser, "taken-to", "")
    browser.wait_for("document.getElementById('status').textContent.startsWith('2 results')")
    assert names(browser) == ["p2", "p3"]
    assert browser.evaluate("document.getElementById('filter-count').textContent") == "(1 active)"


def test_duplicates_view_shows_groups_side_by_side(site: str, browser: Browser) -> None:
    browser.navigate(site + "/")
    browser.wait_for("document.getElementById('info').textContent.includes('items')")
    browser.evaluate("document.getElementById('dups-open').click()")
    browser.wait_for("document.getElementById('dups-status').textContent.includes('group')")
    groups = browser.evaluate(
        "[...document.querySelectorAll('#dups-groups li')].map(g =>"
        " [...g.querySelectorAll('figcaption')].map(c => c.textContent))"
    )
    assert ["dup-a", "dup-b"] in [sorted(g) for g in groups]
    browser.wait_for(
        "[...document.querySelectorAll('#dups-groups img')].every(i => i.complete && i.naturalWidth > 0)"
    )
    label = browser.evaluate("document.querySelector('.dup-score').textContent")
    assert label.startswith("Resized or re-encoded · 2 copies") and "keep the marked" in label
    assert browser.evaluate("document.querySelectorAll('#dups-groups figure.keeper').length") >= 1
    # the view opens below the results: it is scrolled into sight, not left off-screen
    assert browser.evaluate(
        "document.getElementById('dups').getBoundingClientRect().top < innerHeight"
    )
    browser.evaluate("document.getElementById('dups-close').click()")
    assert browser.evaluate("document.getElementById('dups').hidden")


def test_the_pickers_are_folder_date_and_camera(site: str, browser: Browser) -> None:
    # Every metadata key was a dropdown: one option per size, time or pixel width.
    browser.viewport(1280, 860)
    browser.navigate(site + "/?q=a%20photo&cut=none")
    browser.wait_for("document.querySelectorAll('#results img.thumb').length === 5")
    pickers = browser.evaluate(
        "[...document.querySelectorAll('#filters label')].map(l =>"
        " [l.querySelector('span').textContent,"
        " [...l.querySelectorAll('option')].map(o => o.textContent)])"
    )
    assert pickers == [
        [
            "Folder",
            [
                "all folders",
                "2023/Summer_holiday_in_Brittany_with_the_whole_family_and_the_dog (2)",
                "2022 (1)",
            ],
        ]
    ]
    browser.evaluate(
        "(() => { const s = document.querySelector('#filters select');"
        " s.value = JSON.stringify('2022'); s.dispatchEvent(new Event('change')); })()"
    )
    browser.wait_for("document.getElementById('status').textContent.startsWith('1 result ')")
    assert names(browser) == ["p3"]
    assert browser.evaluate("document.getElementById('filter-count').textContent") == "(1 active)"


def test_a_phone_sees_filters_and_the_viewer_whole(site: str, browser: Browser) -> None:
    # At 390 px a filter ran past the screen edge and the viewer's keys broke mid-word.
    browser.viewport(390, 844, mobile=True)
    try:
        browser.navigate(site + "/?q=a%20photo&cut=none")
        browser.wait_for("document.querySelectorAll('#results img.thumb').length === 5")
        browser.evaluate("document.getElementById('filters-box').open = true")
        # (a page wider than the phone is zoomed out: innerWidth grows, the client width not)
        overflow = browser.evaluate(
            "[...document.querySelectorAll('#filters-box select, #filters-box input, #form *')]"
            ".filter(e => e.getBoundingClientRect().right > 390.5).map(e => e.id || e.tagName)"
        )
        assert overflow == [], overflow
        width = "document.documentElement"
        assert browser.evaluate(f"{width}.scrollWidth <= {width}.clientWidth")
        browser.evaluate(  # p1: the one with the most metadata
            "[...document.querySelectorAll('#results figure')].find(f =>"
            " f.querySelector('.name').textContent === 'p1').querySelector('button').click()"
        )
        browser.wait_for("document.getElementById('viewer').open")
        assert browser.evaluate("document.querySelectorAll('#v-meta th').length") >= 6
        broken = browser.evaluate(
            "[...document.querySelectorAll('#v-meta th')].filter(th => {"
            " const r = document.createRange(); r.selectNodeContents(th);"
            " return r.getClientRects().length > 1; }).map(th => th.textContent)"
        )
        assert broken == [], broken  # each key on one line
        browser.press("Escape", "Escape", 27)
    finally:
        browser.viewport(1280, 860)


def test_hybrid_results_say_their_numbers_are_ranks(site: str, browser: Browser) -> None:
    # Fused scores (about 0.016) read as "nothing matches", with no word of explanation.
    browser.viewport(1280, 860)
    browser.navigate(site + "/")
    browser.wait_for("document.getElementById('info').textContent.includes('items')")
    browser.evaluate("document.getElementById('hybrid').checked = true")
    browser.evaluate(
        "(() => { document.getElementById('q').value = 'a photo';"
        " document.getElementById('form').requestSubmit(); })()"
    )
    browser.wait_for("document.getElementById('status').textContent.includes('ranked by')")
    scores = browser.evaluate(
        "[...document.querySelectorAll('#results .score')].map(s => s.textContent)"
    )
    assert scores[:3] == ["#1", "#2", "#3"], scores
    status = browser.evaluate("document.getElementById('status').textContent")
    assert "the numbers are ranks" in status
    browser.evaluate("document.querySelector('#results button.card').click()")
    browser.wait_for("document.getElementById('viewer').open")
    assert browser.evaluate("document.getElementById('v-score').textContent").startswith("rank 1 ")
    browser.press("Escape", "Escape", 27)
