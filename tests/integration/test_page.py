"""The search page in a real headless Chromium, driven over the DevTools protocol."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cdp import Browser, chromium
from tests.helpers import ServerProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        chromium() is None and not os.environ.get("CI"),
        reason="chromium not installed (CI installs it)",
    ),
]


def test_typing_a_query_shows_result_thumbnails(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).parent / "themis-clip")
    from themis_clip.demo.scenes import write_gallery

    write_gallery(tmp_path / "gallery", 12)
    index = str(tmp_path / "idx.db")
    subprocess.run(
        [exe, "index", str(tmp_path / "gallery"), "--index", index], check=True, capture_output=True
    )
    server = ServerProcess(["--index", index])
    base = server.base
    browser = None
    try:
        browser = Browser()
        browser.navigate(base + "/")
        browser.type_text("#q", "a red circle")
        browser.press_enter()
        # The page opens on the library (browse), 12 thumbnails already: wait for the search's
        # answer ("Searching “a red circle”…" is shown while it runs: not yet).
        browser.wait_for(
            "/match(es)? for “a red circle”/.test(document.getElementById('status').textContent)"
        )
        count = browser.wait_for("document.querySelectorAll('img.thumb').length")
        assert 1 <= count < 12  # the matches: where relevance ends, the page cuts
        # Every thumbnail really loaded from the server (decoded, non-empty).
        browser.wait_for(
            "[...document.querySelectorAll('img.thumb')].every(i => i.complete && i.naturalWidth > 0)"
        )
        status = browser.evaluate("document.getElementById('status').textContent")
        assert status.startswith(f"{count} match"), status
        assert "q=a%20red%20circle" in browser.evaluate("location.search")
        captions = browser.evaluate(
            "[...document.querySelectorAll('figcaption')].map(f => f.textContent)"
        )
        assert all(c.split()[1].endswith(".jpg") for c in captions)
        browser.screenshot(tmp_path / "page.png")
        assert (tmp_path / "page.png").stat().st_size > 10_000
    finally:
        if browser is not None:
            browser.close()
        server.__exit__()
