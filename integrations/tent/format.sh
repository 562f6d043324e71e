#!/usr/bin/env bash
# Checks the files of integrations/tent that go into TENT's tree as TENT's
# CI would: clang-format 20 with TENT's style (Mooncake's .clang-format at
# the pinned commit: Google, 4 spaces, 80 columns, includes not sorted), and
# the Apache-2.0 header TENT's files carry. clang-format comes from PyPI's
# clang-format wheel, pinned, in a venv made once and reused while the pin
# matches. With --fix the files are formatted in place instead.
#
#   integrations/tent/format.sh [--fix] [VENV_DIR]   (default VENV_DIR: build-test/clang-format-venv)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
fix=0
if [ "${1:-}" = --fix ]; then
  fix=1
  shift
fi
venv="${1:-$here/../../build-test/clang-format-venv}"
pin="clang-format==20.1.8"
stamp="$venv/.orbite-pins"
if ! { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pin" ] && [ -x "$venv/bin/clang-format" ]; }; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$pin"
  echo "$pin" > "$stamp"
fi
# TENT's .clang-format (Mooncake 3b5a594), key for key.
style='{BasedOnStyle: Google, IndentWidth: 4, TabWidth: 4, UseTab: Never, ColumnLimit: 80, SortIncludes: false}'
cd "$here"
sources=(include/tent/transport/orbite/orbite_transport.h
         src/transport/orbite/orbite_transport.cpp
         src/transport/orbite/orbite_workers.h
         src/transport/orbite/orbite_workers.cpp
         tests/orbite_transport_test.cpp)
if [ "$fix" = 1 ]; then
  "$venv/bin/clang-format" -i --style="$style" "${sources[@]}"
else
  "$venv/bin/clang-format" --dry-run --Werror --style="$style" "${sources[@]}"
fi
# The license header, as TENT's files carry it (a comment of // or #).
bad=0
for f in "${sources[@]}" src/transport/orbite/CMakeLists.txt; do
  if ! head -n 3 "$f" | grep -q 'Licensed under the Apache License, Version 2.0'; then
    echo "format.sh: $f has no Apache-2.0 header" >&2
    bad=1
  fi
done
[ "$bad" = 0 ]
echo "integrations/tent: TENT's files formatted ($("$venv/bin/clang-format" --version | head -n 1)), headers present"
