"""The search page against ``serve --keys``, in a real headless Chromium (issue 28.1).

On a 401 the page asks for a key, keeps it for the tab (sessionStorage: never in a URL or a
cookie), sends it on every call and shows thumbnails and previews from blob: URLs fetched with
it (an ``<img src>`` cannot carry a bearer header). Before, the page had no way to send a key.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.cdp import Browser, chromium
from tests.helpers import ServerProcess, encode, new_key, photo_like

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        chromium() is None and not os.environ.get("CI"),
        reason="chromium not installed (CI installs it)",
    ),
]


@pytest.fixture(scope="module")
def served(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("page-keys")
    keys = tmp / "keys.json"
    made = {scope: new_key(keys, scope, f"{scope}-key") for scope in ("search", "write", "metrics")}
    args = ["--model", str(tiny_model_dir), "--index", str(tmp / "idx.db"), "--no-warmup"]
    with ServerProcess([*args, "--keys", str(keys)]) as server:
        items = []
        for i in range(6):
            png = encode(Image.fromarray(photo_like(64, 48, i)), "PNG")
            items.append({"id": f"photo-{i}.png", "image": base64.b64encode(png).decode()})
        r = httpx.post(
            f"{server.base}/index/items",
            json={"items": items},
            headers={"Authorization": f"Bearer {made['write']}"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        yield server.base, made


@pytest.fixture
def browser() -> Iterator[Browser]:
    b = Browser()
    yield b
    b.close()


def _give_key(browser: Browser, key: str) -> None:
    browser.wait_for("document.getElementById('key-dialog')?.open === true")
    browser.type_text("#key-input", key)
    browser.evaluate("document.getElementById('key-submit').click()")


def test_the_page_asks_for_a_key_and_uses_it_everywhere(
    served: tuple[str, dict[str, str]], browser: Browser
) -> None:
    base, key = served[0], served[1]["search"]
    browser.navigate(base + "/")
    _give_key(browser, "tck_not-a-key")  # refused: asked again, saying so
    browser.wait_for(
        "document.getElementById('key-note')?.textContent.includes('refused') && "
        "document.getElementById('key-dialog').open"
    )
    _give_key(browser, key)
    browser.wait_for("document.getElementById('info').textContent.includes('6 items')")
    assert browser.evaluate("sessionStorage.getItem('themis-clip-key')") == key
    assert browser.evaluate("document.cookie") == ""

    browser.type_text("#q", "a photo")
    browser.press_enter()
    browser.wait_for(
        "!document.getElementById('weaker').hidden || "
        "document.querySelectorAll('#results img.thumb').length === 6"
    )
    browser.evaluate("document.getElementById('weaker').click()")  # every result
    browser.wait_for("document.querySelectorAll('#results img.thumb').length === 6")
    browser.wait_for(  # thumbnails fetched with the key, shown from blob: URLs
        "[...document.querySelectorAll('#results img.thumb')].every("
        "i => i.src.startsWith('blob:') && i.complete && i.naturalWidth > 0)"
    )
    browser.evaluate("document.querySelector('#results .card').click()")
    browser.wait_for(
        "(i => i.src.startsWith('blob:') && i.complete && i.naturalWidth > 0)"
        "(document.getElementById('v-img'))"
    )
    urls = browser.evaluate(
        "JSON.stringify([location.href, ...performance.getEntriesByType('resource')"
        ".map(e => e.name)])"
    )
    assert key not in urls and key[4:] not in urls  # never in a URL
    assert "/thumbnail" in urls and "/preview" in urls

    # The key is kept for the tab: a reload asks nothing and works at once.
    browser.navigate(base + "/?q=a+photo&cut=none")
    browser.wait_for("document.querySelectorAll('#results img.thumb').length === 6")
    assert not browser.evaluate("Boolean(document.getElementById('key-dialog'))")


def test_a_key_without_the_scope_is_explained_not_reasked(
    served: tuple[str, dict[str, str]], browser: Browser
) -> None:
    base, keys = served
    browser.navigate(base + "/")
    _give_key(browser, keys["metrics"])  # a real key, but not for searching: 403
    browser.wait_for("document.getElementById('status').textContent.includes('search')")
    status = browser.evaluate("document.getElementById('status').textContent")
    assert "lacks the 'search' scope" in status, status
    assert not browser.evaluate("Boolean(document.getElementById('key-dialog'))")
