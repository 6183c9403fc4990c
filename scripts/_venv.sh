# Shared by the set-up scripts: create .venv (if missing) and install the project with EXTRAS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${EXTRAS:-}" 2>&1 \
  | grep -v "^WARNING: Location" || true
