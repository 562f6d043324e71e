#!/usr/bin/env bash
# Makes (or reuses) the Python venv the ORBITE plugin's tests drive NIXL
# from: the pinned nixl wheels (the release in ../NIXL_RELEASE) and numpy,
# installed with --no-deps (no torch, no CUDA packages: the wheel's libnixl
# and its UCX plugin run without them). A venv whose pins match is reused
# as is, so a rerun costs nothing.
#
# Usage: venv.sh VENV_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:?usage: venv.sh VENV_DIR}"
release="$(tr -d '[:space:]' < "$here/../NIXL_RELEASE")"
numpy_pin="2.2.6"
pins="nixl-cu12==$release nixl==$release numpy==$numpy_pin"
stamp="$venv/.orbite-pins"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pins" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
# shellcheck disable=SC2086
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps $pins
"$venv/bin/python" -c "import nixl._api, numpy" 
echo "$pins" > "$stamp"
echo "nixl venv ready: $venv ($pins)"
