#!/usr/bin/env bash
# The main job on the embedded defaults: set up .venv, then embed a generated gallery.
set -euo pipefail
EXTRAS="[server,photos]" source "$(dirname "$0")/_venv.sh"
exec .venv/bin/themis-clip demo "$@"
