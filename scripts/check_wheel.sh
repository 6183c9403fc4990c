#!/usr/bin/env bash
# Release check: build the sdist and the wheel, `twine check` them, install the wheel (with the
# server extra, never torch) into a fresh virtual environment outside the source tree, and use it
# as a user would: `themis-clip demo`, a search of the demo's index, and the search page served
# from the installed package. A package-data file missing from the wheel fails here.
#
#   bash scripts/check_wheel.sh            # uses .venv (scripts/test.sh creates it)
#   PYTHON=/path/to/python bash scripts/check_wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/themis-wheel.XXXXXX")
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== build sdist and wheel"
"$PY" -m build --sdist --wheel --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; exit 1; }
"$PY" -m twine check --strict "$WORK"/dist/*
WHEEL=$(ls "$WORK"/dist/*.whl)
SDIST=$(ls "$WORK"/dist/*.tar.gz)
VERSION=$("$PY" -c "import ast, sys; t = ast.parse(open('src/themis_clip/_version.py').read()); \
print(next(n.value.value for n in t.body if isinstance(n, ast.Assign)))")
case "$WHEEL" in *"-$VERSION-"*) ;; *) echo "wheel $WHEEL is not version $VERSION"; exit 1 ;; esac
tar tzf "$SDIST" >"$WORK/sdist.txt"
for f in LICENSE README.md; do
  grep -qx "[^/]*/$f" "$WORK/sdist.txt" || { echo "sdist lacks $f"; exit 1; }
done

echo "== install $(basename "$WHEEL")[server] into a fresh venv"
"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin"
"$V/python" -m pip install --quiet --disable-pip-version-check "$WHEEL[server]" 2>&1 \
  | grep -v "^WARNING: Location" || true
cd "$WORK"  # nothing of the source tree on the path from here on
"$V/python" - <<'EOF'
import importlib.util
import sys
from importlib.metadata import version
from pathlib import Path

import themis_clip

where = Path(themis_clip.__file__).resolve()
assert Path(sys.prefix).resolve() in where.parents, f"imported from {where}, not the venv"
assert version("themis-onnx-clip") == themis_clip.__version__, "two versions"
assert importlib.util.find_spec("torch") is None, "the wheel pulled in torch"
model = themis_clip.demo_model_path()
assert (model / "manifest.json").is_file(), f"no demo model at {model}"
print(f"themis_clip {themis_clip.__version__} from {where.parent}")
EOF
test "$("$V/themis-clip" --version)" = "themis-clip $VERSION"

echo "== themis-clip demo and a search, from the installed wheel"
"$V/themis-clip" demo --count 24 --gallery "$WORK/demo/gallery" | tee "$WORK/demo.log"
grep -q "24 added" "$WORK/demo.log" || { echo "demo did not index 24 images"; exit 1; }
"$V/themis-clip" search "a red circle" --index "$WORK/demo/gallery/demo-index.db" -k 3 --cut none --json \
  >"$WORK/search.json"
"$V/python" - "$WORK/search.json" <<'EOF'
import json
import sys

hits = json.load(open(sys.argv[1]))
hits = hits["results"] if isinstance(hits, dict) else hits
assert len(hits) == 3, hits
assert "red-circle" in str(hits[0].get("path")), hits[0]
print("search:", ", ".join(str(h.get("path") or h.get("id")).rsplit("/", 1)[-1] for h in hits))
EOF

echo "== the search page, served from the installed package"
"$V/themis-clip" serve --port 0 --index "$WORK/demo/gallery/demo-index.db" 2>"$WORK/serve.log" &
SERVER_PID=$!
BASE=
for _ in $(seq 1 600); do
  BASE=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$WORK/serve.log" | head -1)
  if [ -n "$BASE" ] && curl -sf "$BASE/readyz" >/dev/null 2>&1; then break; fi
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/serve.log"; exit 1; }
  sleep 0.1
done
curl -sf "$BASE/readyz" >/dev/null || { echo "server never ready"; cat "$WORK/serve.log"; exit 1; }
curl -sf "$BASE/" >"$WORK/page.html"
grep -q '/static/app.js' "$WORK/page.html"
curl -sf "$BASE/static/app.js" >/dev/null
curl -sf "$BASE/static/app.css" >/dev/null
curl -sf "$BASE/search" -H 'Content-Type: application/json' -d '{"text": "a red circle", "k": 2, "cut": "none"}' \
  | "$V/python" -c "import json, sys; assert len(json.load(sys.stdin)['results']) == 2"
kill "$SERVER_PID"
wait "$SERVER_PID" || true
SERVER_PID=
echo "wheel check passed: $(basename "$WHEEL"), $(basename "$SDIST")"
