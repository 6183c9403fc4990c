"""Regenerate the README's screenshot: the search page over the demo gallery, as a user sees it.

Builds the demo gallery, indexes it with ``themis-clip index``, starts ``themis-clip serve`` on it,
searches "a red circle" in headless Chromium (Debian's ``chromium``, driven by ``tests/cdp.py``)
and saves the page once every thumbnail has loaded (as a 256-colour PNG).

    .venv/bin/python scripts/screenshot.py                 # writes docs/search-page.png
    .venv/bin/python scripts/screenshot.py --out shot.png --query "a green ring"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test suite's Chromium driver and server helper

from PIL import Image  # noqa: E402

from tests.cdp import Browser, chromium  # noqa: E402
from tests.helpers import ServerProcess  # noqa: E402
from themis_clip.demo.scenes import write_gallery  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "search-page.png")
    parser.add_argument("--query", default="a red circle")
    parser.add_argument("--count", type=int, default=40, help="gallery images")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=860)
    args = parser.parse_args(argv)
    if chromium() is None:
        print("screenshot: chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    exe = str(Path(sys.executable).parent / "themis-clip")
    with tempfile.TemporaryDirectory(prefix="themis-shot-") as tmp:
        gallery = Path(tmp) / "demo-gallery"
        write_gallery(gallery, args.count)
        index = Path(tmp) / "demo-index.db"
        subprocess.run(
            [exe, "index", str(gallery), "--index", str(index)], check=True, capture_output=True
        )
        with ServerProcess(["--index", str(index)]) as server:
            browser = Browser()
            try:
                browser.viewport(args.width, args.height)
                browser.navigate(server.base + "/")
                browser.wait_for("document.getElementById('info').textContent.includes('items')")
                browser.type_text("#q", args.query)
                browser.press_enter()
                browser.wait_for(
                    "document.getElementById('status').textContent.includes("
                    + json.dumps(f"for “{args.query}”")
                    + ")"
                )
                browser.wait_for(
                    "[...document.querySelectorAll('#results img.thumb')]"
                    ".every(i => i.complete && i.naturalWidth > 0)"
                    " && document.querySelectorAll('#results img.thumb').length > 0"
                )
                browser.evaluate("document.activeElement && document.activeElement.blur()")
                args.out.parent.mkdir(parents=True, exist_ok=True)
                browser.screenshot(args.out)
            finally:
                browser.close()
    # 256 colours keep the UI exact and the file a fifth of the size (the scenes' noise).
    with Image.open(args.out) as shot:
        small = shot.convert("RGB").quantize(256, dither=Image.Dither.NONE)
    small.save(args.out, optimize=True)
    print(f"screenshot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
