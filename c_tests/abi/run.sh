#!/bin/sh
# The ABI and API check fails on each kind of break and passes on what
# keeps compatibility (scripts/abi_check.py; docs/versioning.md). Each case
# edits a copy of the headers, Cargo.toml or CHANGELOG.md, never the tree.
#   run.sh SRC WORK [CACHE]   (CACHE: compiled header sets kept between runs)
set -eu
src="$1"; work="$2"; cache="${3:-$2/cache}"
rm -rf "$work"; mkdir -p "$work"
check="$src/scripts/abi_check.py"
version="$(sed -n 's/^version = "\([0-9.]*\)"$/\1/p' "$src/Cargo.toml" | head -n 1)"
abi="$(sed -n 's/^abi-version = \([0-9]*\)$/\1/p' "$src/Cargo.toml")"

# A baseline made of the current headers, released as the current version.
mkdir -p "$work/baseline"
cp -r "$src/include" "$work/baseline/include"
echo "$version $abi" >"$work/baseline/VERSION"
printf '# Changelog\n\n## [Unreleased]\n\n## [%s] - 2026-01-01\n\n- Released.\n' "$version" >"$work/CHANGELOG.md"

# case NAME EXPECT(pass|fail) MESSAGE-THE-FAILURE-MUST-GIVE ONLY: runs the
# check over $work/case (include/, Cargo.toml, CHANGELOG.md).
case_() {
  name="$1"; expect="$2"; message="$3"; only="$4"
  rc=0
  python3 "$check" check --baseline "$work/baseline" --include "$work/case/include" \
    --manifest "$work/case/Cargo.toml" --changelog "$work/case/CHANGELOG.md" --cache "$cache" \
    ${only:+--only "$only"} >"$work/$name.log" 2>&1 || rc=$?
  if [ "$expect" = pass ] && [ "$rc" -ne 0 ]; then
    echo "abi check: case $name should pass, exit $rc:"; cat "$work/$name.log"; exit 1
  fi
  if [ "$expect" = fail ]; then
    if [ "$rc" -ne 1 ] || ! grep -q -- "$message" "$work/$name.log"; then
      echo "abi check: case $name should fail with '$message', exit $rc:"; cat "$work/$name.log"; exit 1
    fi
  fi
  echo "case $name: $expect, as it should"
}
fresh() {
  rm -rf "$work/case"; mkdir -p "$work/case"
  cp -r "$src/include" "$work/case/include"
  cp "$src/Cargo.toml" "$work/case/Cargo.toml"
  cp "$work/CHANGELOG.md" "$work/case/CHANGELOG.md"
}
h="$work/case/include/orbite.h"

fresh
case_ unchanged pass "" ""

fresh
sed -i '/^orbite_status orbite_batch_cancel(/d' "$h"
case_ c_function_removed fail "C ABI changed incompatibly" c

fresh
sed -i '/typedef struct orbite_submit_options {/,/} orbite_submit_options;/s/uint32_t timeout_ms;/uint64_t timeout_ms;/' "$h"
grep -q 'uint64_t timeout_ms;' "$h"
case_ c_struct_changed fail "C ABI changed incompatibly" c

fresh
sed -i 's/^#define ORBITE_TRANSPORT_TCP 1$/#define ORBITE_TRANSPORT_TCP 7/' "$h"
grep -q '^#define ORBITE_TRANSPORT_TCP 7$' "$h"
case_ c_constant_changed fail "constants lost or changed: ORBITE_TRANSPORT_TCP 1" c

fresh
echo 'orbite_status orbite_abi_check_added(uint32_t value);' >>"$h"
case_ c_added_without_changelog fail "CHANGELOG.md has no entry" c
sed -i 's/^## \[Unreleased\]$/## [Unreleased]\n\n- Added orbite_abi_check_added./' "$work/case/CHANGELOG.md"
case_ c_added_with_changelog pass "" c

# A break with the ABI version and the package version moved, and said.
fresh
sed -i '/^orbite_status orbite_batch_cancel(/d' "$h"
next_abi=$((abi + 1))
sed -i "s/^abi-version = $abi\$/abi-version = $next_abi/" "$work/case/Cargo.toml"
major="${version%%.*}"; rest="${version#*.}"; minor="${rest%%.*}"
if [ "$major" -eq 0 ]; then next="0.$((minor + 1)).0"; else next="$((major + 1)).0.0"; fi
sed -i "0,/^version = \"$version\"\$/s//version = \"$next\"/" "$work/case/Cargo.toml"
sed -i "s/^## \[Unreleased\]\$/## [Unreleased]\n\n## [$next] - 2026-02-01\n\n- Removed orbite_batch_cancel./" "$work/case/CHANGELOG.md"
case_ c_break_released pass "" c
# The same break with only the package version moved: the SONAME must move too.
sed -i "s/^abi-version = $next_abi\$/abi-version = $abi/" "$work/case/Cargo.toml"
case_ c_break_same_soname fail "abi-version in Cargo.toml is still $abi" c

# The C++ layer: a member function taken away.
fresh
batch="$work/case/include/orbite/batch.hpp"
grep -q 'cancel_request' "$batch"
python3 - "$batch" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
# Drop the definition of Batch::cancel_request (its signature line up to the
# closing brace at the same indentation).
out, skip, indent = [], False, None
for line in text.splitlines(keepends=True):
    if not skip and re.search(r"\bcancel_request\(std::size_t", line) and "{" in line:
        skip, indent = True, len(line) - len(line.lstrip())
        continue
    if skip:
        if line.strip() == "}" and len(line) - len(line.lstrip()) == indent:
            skip = False
        continue
    out.append(line)
open(path, "w").write("".join(out))
PY
! grep -q 'cancel_request(std::size_t' "$batch"
case_ cpp_method_removed fail "C++ layer changed incompatibly" cpp
echo "abi check self-test: ok"
