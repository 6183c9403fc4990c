"""The search page a photo-library user expects, in a real headless Chromium (issue 18).

One server and one browser for the module: the index holds a 40-scene gallery (indexed from a
folder by the CLI) plus items added over HTTP with metadata, two of them hostile (file names and
metadata carrying ``<script>`` and ``"onerror=``). Screenshots at desktop and phone widths go to
``$THEMIS_ARTIFACTS`` (default ``test-artifacts/``, not committed).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
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

ARTIFACTS = Path(os.environ.get("THEMIS_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
# axe-core, the accessibility engine, fetched once from the npm registry and verified.
AXE_VERSION = "4.14.1"
AXE_INTEGRITY = "sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ=="
XSS_ID = '<img src=x onerror="window.__xss=1">.jpg'
XSS_META = {"<script>window.__xss=2</script>": '"onerror="window.__xss=3" x="', "album": "b"}


def axe_source() -> str:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "themis-clip-tests"
    tgz = cache / f"axe-core-{AXE_VERSION}.tgz"
    if not tgz.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        url = f"https://registry.npmjs.org/axe-core/-/axe-core-{AXE_VERSION}.tgz"
        tgz.write_bytes(urllib.request.urlopen(url, timeout=60).read())
    data = tgz.read_bytes()
    digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    assert digest == AXE_INTEGRITY, "axe-core tarball does not match the registry's integrity"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.extractfile("package/axe.min.js")
        assert member is not None
        return member.read().decode()


def png_b64(color: tuple[int, int, int]) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (96, 96), color).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from themis_clip.demo.scenes import write_gallery

    tmp = tmp_path_factory.mktemp("page")
    write_gallery(tmp / "gallery", 40)
    index = tmp / "idx.db"
    exe = str(Path(sys.executable).parent / "themis-clip")
    subprocess.run(
        [exe, "index", str(tmp / "gallery"), "--index", str(index)], check=True, capture_output=True
    )
    with ServerProcess(["--index", str(index)]) as server:
        items = [
            {"id": f"album-{c}-{i}", "image": png_b64(rgb), "metadata": {"album": c, "n": i}}
            for i, (c, rgb) in enumerate(
                [("a", (220, 30, 30)), ("a", (30, 30, 220)), ("b", (30, 200, 30))]
            )
        ]
        items.append({"id": XSS_ID, "image": png_b64((200, 30, 40)), "metadata": XSS_META})
        r = httpx.post(f"{server.base}/index/items", json={"items": items}, timeout=60)
        assert r.status_code == 200, r.text
        yield server.base, tmp


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser()
    yield b
    b.close()


def open_page(browser: Browser, url: str) -> None:
    browser.navigate(url)
    browser.wait_for("document.getElementById('info').textContent.includes('items')")


def search(browser: Browser, text: str, *, weaker: bool = True) -> int:
    """Search ``text``; with ``weaker``, the whole ranking ("Show weaker matches" clicked where
    the page cut it), which the tests of other features look at."""
    browser.evaluate("document.getElementById('q').value = ''")
    browser.type_text("#q", text)
    browser.press_enter()
    done = "document.getElementById('status').textContent.includes('" + text + "')"
    browser.wait_for(done + " && !document.getElementById('results').hasAttribute('aria-busy')")
    if weaker and not browser.evaluate("document.getElementById('weaker').hidden"):
        browser.evaluate("document.getElementById('weaker').click()")
        browser.wait_for(
            "document.getElementById('weaker').hidden && "
            "!document.getElementById('results').hasAttribute('aria-busy') && " + done
        )
    return int(browser.evaluate("document.querySelectorAll('#results img.thumb').length"))


def all_thumbs_loaded(browser: Browser) -> None:
    browser.wait_for(
        "[...document.querySelectorAll('#results img.thumb')].every(i => i.complete && i.naturalWidth > 0)"
    )


def test_header_text_search_keyboard_and_load_more(
    site: tuple[str, Path], browser: Browser
) -> None:
    base, _ = site
    open_page(browser, base + "/")
    info = browser.evaluate("document.getElementById('info').textContent")
    assert "model themis-demo-shapes@" in info and "44 items" in info and "exact search" in info
    browser.evaluate("document.activeElement.blur()")
    browser.press("/", "Slash", 191)
    assert browser.evaluate("document.activeElement.id") == "q"  # '/' focuses the query
    assert browser.evaluate("document.getElementById('q').value") == ""  # and is not typed
    assert search(browser, "a red circle") == 24
    all_thumbs_loaded(browser)
    # Hidden parts stay hidden (no query image for a text query, no viewer, no error look).
    assert browser.evaluate(
        "getComputedStyle(document.getElementById('query-preview')).display === 'none'"
    )
    assert browser.evaluate("document.getElementById('status').className") == "status"
    assert browser.evaluate("!document.getElementById('more').hidden")
    browser.evaluate("document.getElementById('more').click()")
    browser.wait_for("document.querySelectorAll('#results img.thumb').length === 44")
    assert browser.evaluate("document.getElementById('more').hidden")  # everything shown


def test_file_picker_and_paste_search_by_image(site: tuple[str, Path], browser: Browser) -> None:
    base, tmp = site
    open_page(browser, base + "/")
    picked = sorted((tmp / "gallery").iterdir())[7]
    browser.set_files("#file", [str(picked)])
    browser.wait_for(
        "document.getElementById('status').textContent.includes('results for the picture')"
    )
    assert browser.evaluate("!document.getElementById('query-preview').hidden")
    browser.wait_for("document.getElementById('query-img').naturalWidth > 0")  # the query's preview
    first = browser.evaluate("document.querySelector('#results figcaption .name').textContent")
    assert first == picked.name  # the picked file is its own best match
    # Paste: a PNG on the clipboard, as Ctrl+V in the page delivers it.
    browser.evaluate(
        """(async () => {
          const blob = await (await fetch('/items/album-b-2/thumbnail')).blob();
          const data = new DataTransfer();
          data.items.add(new File([blob], 'pasted.jpg', {type: 'image/jpeg'}));
          document.dispatchEvent(new ClipboardEvent('paste', {clipboardData: data, bubbles: true}));
        })()"""
    )
    browser.wait_for(
        "document.getElementById('status').textContent.includes('results for the picture “pasted.jpg”')"
    )
    assert (
        browser.evaluate("document.querySelector('#results figcaption .name').textContent")
        == "album-b-2"
    )


def test_viewer_arrows_escape_and_more_like_this(site: tuple[str, Path], browser: Browser) -> None:
    base, _ = site
    open_page(browser, base + "/")
    search(browser, "a blue square")
    browser.evaluate("document.querySelectorAll('#results button.card')[2].click()")
    browser.wait_for("document.getElementById('viewer').open")
    browser.wait_for(
        "document.getElementById('v-img').complete && document.getElementById('v-img').naturalWidth > 0"
    )
    third = browser.evaluate(
        "document.querySelectorAll('#results figcaption .name')[2].textContent"
    )
    assert browser.evaluate("document.getElementById('v-title').textContent") == third
    assert browser.evaluate("document.getElementById('v-img').alt") == third
    assert browser.evaluate("document.getElementById('v-path').textContent").endswith(third)
    # The preview is the bounded endpoint, never the file by path.
    assert "/preview" in browser.evaluate("document.getElementById('v-img').src")
    browser.press("ArrowRight", "ArrowRight", 39)
    fourth = browser.evaluate(
        "document.querySelectorAll('#results figcaption .name')[3].textContent"
    )
    browser.wait_for(f"document.getElementById('v-title').textContent === {json.dumps(fourth)}")
    browser.press("ArrowLeft", "ArrowLeft", 37)
    browser.wait_for(f"document.getElementById('v-title').textContent === {json.dumps(third)}")
    browser.press("Escape", "Escape", 27)
    browser.wait_for("!document.getElementById('viewer').open")
    # More like this: found by the item's stored vector; the item itself is no answer (issue 26).
    browser.evaluate("document.querySelectorAll('#results button.card')[5].click()")
    browser.wait_for("document.getElementById('viewer').open")
    sixth = browser.evaluate("document.getElementById('v-title').textContent")
    browser.evaluate("document.getElementById('v-like').click()")
    browser.wait_for(
        "document.getElementById('status').textContent.includes('results for pictures like')"
    )
    assert not browser.evaluate("document.getElementById('viewer').open")
    names = browser.evaluate(
        "[...document.querySelectorAll('#results figcaption .name')].map(n => n.textContent)"
    )
    assert names and sixth not in names
    assert browser.evaluate("document.getElementById('q').value") == ""  # not the old text


def test_filters_narrow_results_and_zero_shot_labels(
    site: tuple[str, Path], browser: Browser
) -> None:
    base, _ = site
    open_page(browser, base + "/")
    browser.wait_for("!document.getElementById('filters-box').hidden")
    assert search(browser, "a green triangle") == 24
    browser.evaluate(
        """(() => {
          const select = [...document.querySelectorAll('#filters select')]
            .find(s => s.previousElementSibling.textContent.startsWith('album'));
          select.value = JSON.stringify('b');
          select.dispatchEvent(new Event('change'));
        })()"""
    )
    browser.wait_for("document.getElementById('status').textContent.startsWith('2 results')")
    names = browser.evaluate(
        "[...document.querySelectorAll('#results figcaption .name')].map(n => n.textContent)"
    )
    assert sorted(names) == sorted(["album-b-2", XSS_ID])
    # Zero-shot labels on the viewed item: per-label probabilities that sum to one (softmax).
    browser.evaluate("document.querySelector('#results button.card').click()")
    browser.wait_for(
        "document.getElementById('viewer').open && !document.getElementById('v-labels-form').hidden"
    )
    browser.type_text("#v-labels", "a green square, a red circle, a blue triangle")
    browser.evaluate("document.getElementById('v-labels-form').requestSubmit()")
    browser.wait_for("document.querySelectorAll('#v-probs li').length === 3")
    rows = browser.evaluate(
        "[...document.querySelectorAll('#v-probs li span')].map(s => s.textContent)"
    )
    total = sum(float(re.search(r"([\d.]+)%$", r).group(1)) for r in rows)  # type: ignore[union-attr]
    assert abs(total - 100) < 0.5, rows
    browser.press("Escape", "Escape", 27)
    browser.wait_for("!document.getElementById('viewer').open")


def test_hostile_names_and_metadata_stay_text(site: tuple[str, Path], browser: Browser) -> None:
    base, _ = site
    open_page(browser, base + "/")
    search(browser, "a red rectangle")
    browser.evaluate("document.getElementById('more').click()")
    browser.wait_for("document.querySelectorAll('#results img.thumb').length === 44")
    names = browser.evaluate(
        "[...document.querySelectorAll('#results figcaption .name')].map(n => n.textContent)"
    )
    assert XSS_ID in names  # shown literally
    index = names.index(XSS_ID)
    browser.evaluate(f"document.querySelectorAll('#results button.card')[{index}].click()")
    browser.wait_for("document.getElementById('viewer').open")
    keys = browser.evaluate("[...document.querySelectorAll('#v-meta th')].map(t => t.textContent)")
    values = browser.evaluate(
        "[...document.querySelectorAll('#v-meta td')].map(t => t.textContent)"
    )
    assert set(keys) == set(XSS_META) and set(values) == set(XSS_META.values())
    assert browser.evaluate("window.__xss === undefined")  # nothing ran
    assert browser.evaluate("document.querySelectorAll('script').length") == 1  # only app.js
    assert (
        browser.evaluate("document.querySelectorAll('[onerror], [onload], [onclick]').length") == 0
    )
    browser.press("Escape", "Escape", 27)


def test_csp_header_and_no_inline_code(site: tuple[str, Path]) -> None:
    base, _ = site
    page = httpx.get(base + "/")
    csp = page.headers["content-security-policy"]
    assert (
        "default-src 'none'" in csp and "script-src 'self'" in csp and "'unsafe-inline'" not in csp
    )
    assert "frame-ancestors 'none'" in csp and page.headers["x-content-type-options"] == "nosniff"
    html = page.text
    assert not re.search(r"\son[a-z]+\s*=", html, re.I)  # no inline event handlers
    assert re.findall(r"<script[^>]*>(.*?)</script>", html, re.S) == [""]  # no inline script
    assert "style=" not in html
    js = httpx.get(base + "/static/app.js").text
    assert "innerHTML" not in js and "insertAdjacentHTML" not in js and "eval(" not in js
    assert httpx.get(base + "/static/../pyproject.toml").status_code == 404


def test_accessibility_and_screenshots(site: tuple[str, Path], browser: Browser) -> None:
    base, _ = site
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    axe = axe_source()
    serious: list[str] = []
    for width, height, mobile, name in ((1280, 860, False, "desktop"), (390, 844, True, "phone")):
        browser.viewport(width, height, mobile=mobile)
        open_page(browser, base + "/?q=a%20red%20circle")
        browser.wait_for("!document.getElementById('weaker').hidden")  # the matches, cut
        all_thumbs_loaded(browser)
        browser.screenshot(ARTIFACTS / f"search-page-{name}.png")
        browser.evaluate(axe)  # DevTools evaluation is not subject to the page's CSP
        for state in ("results", "viewer"):
            if state == "viewer":
                browser.evaluate("document.querySelector('#results button.card').click()")
                browser.wait_for("document.getElementById('v-img').naturalWidth > 0")
                browser.screenshot(ARTIFACTS / f"search-page-{name}-viewer.png")
            report = browser.evaluate(
                "axe.run(document, {resultTypes: ['violations']}).then(r => r.violations"
                ".map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.length})))"
            )
            serious += [
                f"{name}/{state}: {v}" for v in report if v["impact"] in ("serious", "critical")
            ]
        browser.press("Escape", "Escape", 27)
    assert serious == [], serious
    assert (ARTIFACTS / "search-page-desktop.png").stat().st_size > 10_000


def test_empty_index_and_no_index_say_what_to_do(
    tmp_path: Path, browser: Browser, site: tuple[str, Path], tiny_model_dir: Path
) -> None:
    browser.viewport(1280, 860)
    # An index built by another model: the page says so, and how to re-index.
    _, built = site
    with ServerProcess(
        ["--index", str(built / "idx.db"), "--model", str(tiny_model_dir), "--no-warmup"]
    ) as server:
        info = httpx.get(server.base + "/index/info").json()
        assert info["comparable"] is False and info["model_id"] != info["server_model_id"]
        browser.navigate(server.base + "/")
        browser.wait_for("document.getElementById('status').textContent.includes('not comparable')")
        status = browser.evaluate("document.getElementById('status').textContent")
        assert "Re-index" in status and "themis-clip index DIR --index NEW_PATH" in status
        assert browser.evaluate("document.getElementById('status').className") == "status error"
    with ServerProcess(["--index", str(tmp_path / "empty.db"), "--no-warmup"]) as server:
        browser.navigate(server.base + "/")
        browser.wait_for(
            "document.getElementById('status').textContent.includes('The index is empty')"
        )
        assert "themis-clip index DIR" in browser.evaluate(
            "document.getElementById('status').textContent"
        )
    with ServerProcess(["--no-warmup"]) as server:
        browser.navigate(server.base + "/")
        browser.wait_for("document.getElementById('info').textContent.includes('no index')")
        status = browser.evaluate("document.getElementById('status').textContent")
        assert "--index PATH" in status


# -- issue 26: what a new user saw in the screenshots -----------------------------------------


def test_long_names_end_in_an_ellipsis_with_the_full_name_on_hover(
    site: tuple[str, Path], browser: Browser
) -> None:
    base, _ = site
    browser.viewport(1280, 860)
    open_page(browser, base + "/")
    search(browser, "a red circle")
    cut = browser.evaluate(
        """[...document.querySelectorAll('#results figcaption .name')].map(n => {
             const s = getComputedStyle(n);
             return {name: n.textContent, title: n.title, overflow: s.textOverflow,
                     wrap: s.whiteSpace, cut: n.scrollWidth > n.clientWidth,
                     lines: Math.round(n.getBoundingClientRect().height /
                                       parseFloat(s.lineHeight || '16'))};
           })"""
    )
    gallery = [c for c in cut if re.match(r"\d{3}-", c["name"])]
    assert gallery, cut
    for c in gallery:
        assert c["title"] == c["name"] and c["overflow"] == "ellipsis" and c["wrap"] == "nowrap"
    assert any(c["cut"] for c in gallery)  # the gallery's names are longer than a card


def test_image_search_clears_the_text_box(site: tuple[str, Path], browser: Browser) -> None:
    base, tmp = site
    open_page(browser, base + "/")
    search(browser, "a red circle")
    assert browser.evaluate("document.getElementById('q').value") == "a red circle"
    browser.set_files("#file", [str(sorted((tmp / "gallery").iterdir())[3])])
    browser.wait_for(
        "document.getElementById('status').textContent.includes('results for the picture')"
    )
    assert browser.evaluate("document.getElementById('q').value") == ""


def test_results_end_where_relevance_ends_and_sort_by_date(
    site: tuple[str, Path], browser: Browser
) -> None:
    base, _ = site
    cut = httpx.post(base + "/search", json={"text": "a red circle", "k": 24}).json()
    assert 0 < len(cut["results"]) < 24 and cut["cut"]["weaker"] > 0
    open_page(browser, base + "/")
    shown = search(browser, "a red circle", weaker=False)
    status = browser.evaluate("document.getElementById('status').textContent")
    assert shown == len(cut["results"]) and f"{shown} match" in status, status
    assert not browser.evaluate("document.getElementById('weaker').hidden")
    assert search(browser, "a red circle") == 24  # "Show weaker matches": the whole ranking
    search(browser, "quantum chromodynamics lecture notes", weaker=False)
    status = browser.evaluate("document.getElementById('status').textContent")
    assert "No photo matches" in status and "Show weaker matches" in status, status
    # the page asks the server to sort (by name here: the gallery carries no capture dates;
    # the server's date order is tested on its own)
    search(browser, "a red circle")
    browser.evaluate("document.getElementById('sort').value = 'name'")
    browser.evaluate("document.getElementById('sort').dispatchEvent(new Event('change'))")
    browser.wait_for("!document.getElementById('results').hasAttribute('aria-busy')")
    names = browser.evaluate(
        "[...document.querySelectorAll('#results .name')].map(n => n.textContent)"
    )
    assert names == sorted(names, key=str.lower) and names
    browser.evaluate("document.getElementById('sort').value = 'score'")


def test_irrelevant_queries_show_a_weak_matches_divider(
    site: tuple[str, Path], browser: Browser
) -> None:
    base, _ = site
    r = httpx.post(base + "/search", json={"text": "a red circle", "k": 24}).json()
    line = r["weak_below"]
    assert "random texts" in r["weak_basis"]
    strong = [h for h in r["results"] if h["score"] >= line]
    assert 0 < len(strong) < 24  # a fitting query has strong hits, then weak ones
    open_page(browser, base + "/")
    search(browser, "a red circle")
    position = browser.evaluate(
        "[...document.getElementById('results').children].findIndex("
        "li => li.classList.contains('weak-divider'))"
    )
    assert position == len(strong)  # the divider sits above the first weak hit
    assert " weak" in browser.evaluate("document.getElementById('status').textContent")
    divider = browser.evaluate("document.querySelector('.weak-divider').textContent")
    assert f"{line:.3f}" in divider and "random text" in divider
    search(browser, "quantum chromodynamics lecture notes")
    status = browser.evaluate("document.getElementById('status').textContent")
    first = browser.evaluate("document.getElementById('results').children[0].className")
    assert "no good match: every result is weak" in status and first == "weak-divider"


def test_labels_show_the_raw_cosine_beside_the_probability(
    site: tuple[str, Path], browser: Browser
) -> None:
    base, _ = site
    open_page(browser, base + "/")
    search(browser, "a red circle")
    browser.evaluate("document.querySelector('#results button.card').click()")
    browser.wait_for(
        "document.getElementById('viewer').open && !document.getElementById('v-labels-form').hidden"
    )
    browser.evaluate("document.getElementById('v-labels').value = ''")
    browser.type_text("#v-labels", "car, dog")
    browser.evaluate("document.getElementById('v-labels-form').requestSubmit()")
    browser.wait_for("document.querySelectorAll('#v-probs li').length === 2")
    cosines = browser.evaluate(
        "[...document.querySelectorAll('#v-probs li .cosine')].map(s => s.textContent)"
    )
    assert len(cosines) == 2 and all(re.fullmatch(r"cosine -?\d\.\d{3}", c) for c in cosines)
    note = browser.evaluate("document.getElementById('v-probs-note').textContent")
    assert "none fits" in note
    browser.press("Escape", "Escape", 27)
    browser.wait_for("!document.getElementById('viewer').open")


def test_an_empty_index_and_a_mismatch_say_so_once(
    tmp_path: Path, browser: Browser, site: tuple[str, Path], tiny_model_dir: Path
) -> None:
    browser.viewport(1280, 860)
    with ServerProcess(["--index", str(tmp_path / "empty.db"), "--no-warmup"]) as server:
        browser.navigate(server.base + "/")
        browser.wait_for("document.getElementById('info').textContent.includes('0 items')")
        browser.type_text("#q", "a red circle")
        browser.press_enter()
        browser.wait_for(
            "document.getElementById('status').textContent.includes('nothing to search yet')"
        )
        assert "Try other words" not in browser.evaluate(
            "document.getElementById('status').textContent"
        )
    _, built = site
    with ServerProcess(
        ["--index", str(built / "idx.db"), "--model", str(tiny_model_dir), "--no-warmup"]
    ) as server:
        browser.navigate(server.base + "/?q=a%20red%20circle")
        browser.wait_for("document.getElementById('status').className === 'status error'")
        browser.wait_for("document.getElementById('results').getAttribute('aria-busy') === null")
        status = browser.evaluate("document.getElementById('status').textContent")
        assert status.count("Re-index") == 1 and status.count("index DIR --index NEW_PATH") == 1


def test_docs_render_offline_under_the_pages_csp(site: tuple[str, Path], browser: Browser) -> None:
    base, _ = site
    r = httpx.get(base + "/docs")
    assert (
        r.headers["content-security-policy"]
        == httpx.get(base + "/").headers["content-security-policy"]
    )
    assert "cdn" not in r.text.lower() and "<script>" not in r.text  # no CDN, no inline code
    browser.viewport(1280, 860)
    browser.navigate(base + "/docs")
    browser.wait_for("document.querySelectorAll('.opblock').length > 10")
    paths = browser.evaluate(
        "[...document.querySelectorAll('.opblock-summary-path')].map(p => p.textContent)"
    )
    assert "/v1/embeddings" in paths and "/search" in paths
    assert browser.evaluate("document.querySelector('.info .title').textContent").startswith(
        "themis-clip"
    )


def names_shown(browser: Browser) -> list[str]:
    return browser.evaluate(  # type: ignore[no-any-return]
        "[...document.querySelectorAll('#results figcaption .name')].map(n => n.textContent)"
    )


def test_opens_on_the_library_newest_first_and_loads_more_by_cursor(
    site: tuple[str, Path], browser: Browser
) -> None:
    base, _ = site
    open_page(browser, base + "/")
    browser.wait_for("document.getElementById('status').textContent.includes('newest first (24')")
    first = names_shown(browser)
    api = httpx.post(base + "/search", json={"mode": "browse", "k": 44}, timeout=60).json()
    expected = [str(r["path"] or r["id"]).split("/")[-1] for r in api["results"]]
    assert first == expected[:24]
    # Folder files (with their file time) first, the items added over HTTP last, newest first.
    assert expected[-4:] == [XSS_ID.split("/")[-1], "album-b-2", "album-a-1", "album-a-0"]
    assert browser.evaluate("document.querySelector('#results .score').textContent") == ""
    browser.evaluate("document.getElementById('more').click()")
    browser.wait_for("document.querySelectorAll('#results img.thumb').length === 44")
    assert names_shown(browser) == expected  # the cursor's page continues exactly
    assert browser.evaluate("document.getElementById('more').hidden")  # nothing more


def test_more_like_this_but_and_hybrid_search(site: tuple[str, Path], browser: Browser) -> None:
    base, _ = site
    open_page(browser, base + "/")
    search(browser, "a blue square")
    browser.evaluate("document.querySelectorAll('#results button.card')[1].click()")
    browser.wait_for("document.getElementById('viewer').open")
    name = browser.evaluate("document.getElementById('v-title').textContent")
    key = browser.evaluate("state.hits[state.current].id")
    browser.type_text("#v-but", "a red circle")
    browser.evaluate("document.getElementById('v-but-form').requestSubmit()")
    browser.wait_for("document.getElementById('status').textContent.includes('but “a red circle”')")
    assert not browser.evaluate("document.getElementById('viewer').open")
    body = {"query": [{"item": key}, {"text": "a red circle"}], "k": 24}
    api = httpx.post(base + "/search", json=body, timeout=60).json()
    assert names_shown(browser) == [
        str(r["path"] or r["id"]).split("/")[-1] for r in api["results"]
    ]
    plain = httpx.post(base + "/search", json={"item": key, "k": 24}, timeout=60).json()
    assert [r["id"] for r in plain["results"]] != [r["id"] for r in api["results"]]
    assert name not in names_shown(browser)  # the item the query is made of is no answer
    # Hybrid: a file name's words find that item first, where the vector alone does not.
    vector_only = search(browser, "album-b-2")
    assert vector_only and names_shown(browser)[0] != "album-b-2"
    browser.evaluate("document.getElementById('hybrid').click()")
    browser.wait_for(
        "document.querySelector('#results figcaption .name').textContent === 'album-b-2'"
    )
    browser.evaluate("document.getElementById('hybrid').click()")


def test_a_migration_s_progress_shows_in_the_header_and_its_end_refreshes_the_model(
    tmp_path: Path, browser: Browser, site: tuple[str, Path], tiny_model_dir: Path
) -> None:
    import shutil

    from themis_clip.resources import demo_model_path

    _, built = site
    shutil.copytree(demo_model_path(), tmp_path / "models" / "a")
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "b")
    shutil.copy(built / "idx.db", tmp_path / "idx.db")
    admin = {"Authorization": "Bearer page-admin"}
    args = ["--index", str(tmp_path / "idx.db"), "--model", str(tmp_path / "models" / "a")]
    args += ["--model-root", str(tmp_path / "models"), "--no-warmup"]
    with ServerProcess(args, env={"THEMIS_ADMIN_TOKEN": "page-admin"}) as server:
        browser.navigate(server.base + "/")
        browser.wait_for("document.getElementById('info').textContent.includes('items')")
        assert browser.evaluate("document.getElementById('migration').hidden")
        body = {"path": "b", "cores": 1, "cut_over": "command"}
        r = httpx.post(f"{server.base}/admin/migrate", json=body, headers=admin, timeout=60)
        assert r.status_code == 202, r.text
        new_model = r.json()["model_id"]
        # seen without a reload (the page reads /stats now and then), in words
        browser.wait_for(
            "document.getElementById('migration').textContent.includes('ready; it switches')",
            timeout_s=60,
        )
        text = browser.evaluate("document.getElementById('migration').textContent")
        assert f"Moving the index to {new_model}" in text
        assert new_model not in browser.evaluate("document.getElementById('info').textContent")
        r = httpx.post(f"{server.base}/admin/migrate/cut-over", headers=admin, timeout=120)
        assert r.status_code == 200 and r.json()["state"] == "done", r.text
        browser.wait_for(
            "document.getElementById('migration').hidden && document.getElementById('info')"
            f".textContent.includes('{new_model}')",
            timeout_s=60,
        )
