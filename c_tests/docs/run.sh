#!/bin/sh
# The docs test: every code block of README.md and docs/getting-started.md is
# extracted and checked against the package installed from this build tree,
# so that the docs cannot drift from the headers.
#
#   run.sh BUILD SRC WORK
#
# Per block, by its language (the word after the opening fence):
#   c, cpp   compiled with -Wall -Wextra -Werror (C11 / C++17) against the
#            installed orbite.h / orbite.hpp; a block with main() is linked
#            and run (it must exit 0), any other block is compiled only.
#   json     read by Python's json module (strict, duplicate keys refused);
#            "json config" blocks must also be accepted by orbite_engine_new.
#   cmake    placed in a project that defines `app` (from app.c; and `app_cpp`
#            from app.cpp when the block names it), configured against the
#            installed package, built, and its programs run.
#   sh       run with `sh -e` in a directory holding app.c and app.cpp, with
#            HOME set so that "$HOME/orbite" is the installed package and
#            LD_LIBRARY_PATH unset; unless the line before the block is
#            `<!-- docs-test: skip: REASON -->` (it then only says why).
#   text     not checked.
# Any other language, or a block without one, fails the test. app.c and
# app.cpp are the first complete C and C++ programs of getting-started.md.
#
# Then every C++ name the docs quote (README.md and docs/*.md) must exist in
# the installed orbite.hpp (and orbite/*.hpp, which it includes): `orbite::NAME...` in prose code spans and cpp
# blocks (orbite::orbite* are CMake targets), and `Type::member` in spans where Type is a type orbite.hpp
# defines in namespace orbite (`Batch::notes`, `Peer::transports()`). A
# span followed by "in Rust" or "(Rust)" names the Rust API and is not
# checked, nor are docs/architecture.md and docs/seed-traceability.md (they
# describe the Rust sources). Each name becomes a using-declaration (an
# enumerator: an expression) under #line DOC:LINE, and the compiler says
# which one is missing where.
set -eu
build="$1"; src="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work/blocks" "$work/run" "$work/home"
export HOME="$work/home"
unset LD_LIBRARY_PATH
prefix="$HOME/orbite"
cmake --install "$build" --prefix "$prefix" >/dev/null
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cflags="-I$prefix/include"
libs="-L$prefix/lib -lorbite -Wl,-rpath,$prefix/lib"

# The installed sizes README.md states come from this build: for each
# installed file its bullet names, the first "N MB" of the bullet (the
# default build's) must be within 10 % of the file's size here.
size_check() {
  file="$1"
  stated="$(awk -v f="- \`$file\`" '
    index($0, f) == 1 { on = 1 }
    on && /^- / && index($0, f) != 1 { exit }
    on { text = text " " $0 }
    END { if (match(text, /[0-9]+(\.[0-9]+)? MB/)) print substr(text, RSTART, RLENGTH - 3) }
  ' "$src/README.md")"
  [ -n "$stated" ] || { echo "FAIL README.md: no size stated for $file"; return 1; }
  actual="$(stat -c %s "$prefix/$file")"
  python3 - "$file" "$stated" "$actual" <<'PY' || return 1
import sys
name, stated, actual = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]) / 1e6
if abs(actual - stated) > 0.1 * actual:
    sys.exit(f"FAIL README.md: {name} is {actual:.1f} MB installed, README.md says {stated:g} MB")
print(f"ok   README.md: {name} {actual:.1f} MB installed, {stated:g} MB stated")
PY
}
sizes_ok=0
for f in lib/liborbite.so.1 lib/liborbite.a bin/orbite-bench bin/orbite-doctor; do size_check "$f" || sizes_ok=1; done

# Extract: blocks/N.LANG and one manifest line per block:
# N|FILE|LINE|LANG|FLAGS|SKIP-REASON
for doc in README.md docs/getting-started.md; do
  awk -v doc="$doc" -v out="$work/blocks" '
    function flush_manifest() {
      printf "%d|%s|%d|%s|%s|%s\n", n, doc, start, lang, flags, skip >> (out "/manifest")
    }
    BEGIN { n = 0; while ((getline line < (out "/count")) > 0) n = line; close(out "/count") }
    !inblock && /^```/ {
      inblock = 1; n++; start = NR
      info = substr($0, 4); sub(/^ +/, "", info)
      lang = info; sub(/ .*/, "", lang)
      flags = info; if (index(flags, " ")) { sub(/^[^ ]* +/, "", flags) } else { flags = "" }
      skip = ""
      if (prev ~ /^<!-- docs-test: skip: .* -->$/) { skip = prev; sub(/^<!-- docs-test: skip: /, "", skip); sub(/ -->$/, "", skip) }
      file = out "/" n "." (lang == "" ? "none" : lang)
      printf "" > file
      next
    }
    inblock && /^```[ ]*$/ { inblock = 0; close(file); flush_manifest(); prev = ""; next }
    inblock { print >> file; next }
    { if ($0 != "") prev = $0 }
    END { print n > (out "/count"); if (inblock) { print "unterminated block at " doc ":" start > "/dev/stderr"; exit 1 } }
  ' "$src/$doc"
done

# app.c / app.cpp: the first complete programs of getting-started.md.
while IFS='|' read -r n file line lang flags skip <&3; do
  [ "$file" = docs/getting-started.md ] || continue
  grep -q 'int main(' "$work/blocks/$n.$lang" 2>/dev/null || continue
  case "$lang" in
    c) [ -f "$work/run/app.c" ] || cp "$work/blocks/$n.c" "$work/run/app.c" ;;
    cpp) [ -f "$work/run/app.cpp" ] || cp "$work/blocks/$n.cpp" "$work/run/app.cpp" ;;
  esac
done 3<"$work/blocks/manifest"
test -f "$work/run/app.c" && test -f "$work/run/app.cpp"

# The JSON checker: strict syntax (Python's json module, duplicate keys
# refused); "config" also makes an engine of it (orbite_engine_new).
cat >"$work/json_check.py" <<'EOF'
import json, sys
def once(pairs):
    keys = [k for k, _ in pairs]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise ValueError("duplicate key %r" % dup)
    return dict(pairs)
with open(sys.argv[1]) as f:
    json.load(f, object_pairs_hook=once)
EOF
cat >"$work/config_check.c" <<'EOF'
#include <orbite.h>
#include <stdio.h>
int main(int argc, char **argv) {
  static char text[1 << 16];
  FILE *f = argc > 1 ? fopen(argv[1], "rb") : NULL;
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  text[n] = 0;
  orbite_engine *e = NULL;
  orbite_status s = orbite_engine_new(text, &e);
  if (s != ORBITE_STATUS_OK) {
    fprintf(stderr, "%s: %s\n", orbite_status_name(s), orbite_last_error());
    return 1;
  }
  orbite_engine_free(e);
  return 0;
}
EOF
cc -std=c11 -Wall -Wextra -Werror $cflags -o "$work/config_check" "$work/config_check.c" $libs
json_check() { python3 "$work/json_check.py" "$1" && { [ -z "$2" ] || "$work/config_check" "$1"; }; }

failed=0; checked=0; skipped=0
fail() { echo "FAIL $where: $1"; failed=$((failed + 1)); }
while IFS='|' read -r n file line lang flags skip <&3; do
  where="$file:$line ($lang)"
  b="$work/blocks/$n.$lang"
  if [ -n "$skip" ]; then
    echo "skip $where: $skip"; skipped=$((skipped + 1)); continue
  fi
  case "$lang" in
    c | cpp)
      if [ "$lang" = c ]; then cc="cc -std=c11"; ext=c; else cc="c++ -std=c++17"; ext=cpp; fi
      cp "$b" "$work/block$n.$ext"
      if grep -q 'int main(' "$b"; then
        if ! $cc -Wall -Wextra -Werror $cflags -o "$work/block$n" "$work/block$n.$ext" $libs 2>"$work/block$n.log"; then
          fail "does not compile"; cat "$work/block$n.log"; continue
        fi
        if ! (cd "$work/run" && timeout 120 "$work/block$n") >"$work/block$n.log" 2>&1; then
          fail "the program failed"; cat "$work/block$n.log"; continue
        fi
        echo "ok   $where: compiled and ran: $(tail -n 1 "$work/block$n.log")"
      else
        if ! $cc -Wall -Wextra -Werror $cflags -c -o "$work/block$n.o" "$work/block$n.$ext" 2>"$work/block$n.log"; then
          fail "does not compile"; cat "$work/block$n.log"; continue
        fi
        echo "ok   $where: compiled"
      fi
      ;;
    json)
      if ! json_check "$b" "$flags" >"$work/block$n.log" 2>&1; then fail "rejected"; cat "$work/block$n.log"; continue; fi
      echo "ok   $where: read${flags:+ and accepted as an engine config}"
      ;;
    cmake)
      d="$work/cmake$n"; mkdir -p "$d"
      cp "$work/run/app.c" "$work/run/app.cpp" "$d/"
      {
        echo "cmake_minimum_required(VERSION 3.16)"
        echo "project(docs_block C CXX)"
        echo "add_executable(app app.c)"
        if grep -q app_cpp "$b"; then echo "add_executable(app_cpp app.cpp)"; fi
        cat "$b"
      } >"$d/CMakeLists.txt"
      if ! { cmake -S "$d" -B "$d/build" -DCMAKE_PREFIX_PATH="$prefix" && cmake --build "$d/build"; } >"$d.log" 2>&1; then
        fail "does not configure or build"; cat "$d.log"; continue
      fi
      for p in app app_cpp; do
        if [ -x "$d/build/$p" ] && ! (cd "$d" && timeout 120 "$d/build/$p") >>"$d.log" 2>&1; then fail "$p failed"; cat "$d.log"; continue 2; fi
      done
      echo "ok   $where: built and ran"
      ;;
    sh)
      if ! (cd "$work/run" && timeout 300 sh -e "$b") >"$work/block$n.log" 2>&1; then fail "failed"; cat "$work/block$n.log"; continue; fi
      echo "ok   $where: ran"
      ;;
    text)
      echo "skip $where: text"; skipped=$((skipped + 1)); continue
      ;;
    *)
      fail "blocks need a language this test knows (c, cpp, json, cmake, sh, text)"; continue
      ;;
  esac
  checked=$((checked + 1))
done 3<"$work/blocks/manifest" </dev/null

# The C++ names the docs quote.
names="$work/names.cpp"
# orbite.hpp and the headers it includes, read as one text.
cat "$prefix/include/orbite.hpp" "$prefix/include/orbite/"*.hpp >"$work/orbite-all.hpp"
{
  echo "#include <orbite.hpp>"
  d=0
  for doc in README.md $(cd "$src" && ls docs/*.md); do
    d=$((d + 1))
    case "$doc" in docs/architecture.md | docs/seed-traceability.md) continue ;; esac
    awk -v doc="$doc" -v d="$d" -v hpp="$work/orbite-all.hpp" '
      # What orbite.hpp defines: its namespaces, and per namespace its
      # types (enums and class templates apart).
      function scan_header(   line, ns, prevline, m, name) {
        ns = ""
        while ((getline line < hpp) > 0) {
          if (line ~ /^namespace [A-Za-z_]+ \{/) {
            split(line, m, " "); ns = (ns == "" ? m[2] : ns "::" m[2]); namespaces[ns] = 1
          } else if (line ~ /^\}  \/\/ namespace /) {
            sub(/(::)?[A-Za-z_]+$/, "", ns)
          } else if (match(line, /^(class|struct|enum class|using) (\[\[nodiscard\]\] )?[A-Za-z_][A-Za-z0-9_]*/)) {
            name = substr(line, 1, RLENGTH); sub(/.* /, "", name)
            types[ns "::" name] = 1
            if (line ~ /^enum class/) enums[ns "::" name] = 1
            if (prevline ~ /^template <./) templates[ns "::" name] = 1
          }
          prevline = line
        }
        close(hpp)
      }
      # One probe per quoted path, at the line that quotes it.
      function probe(path, line,   parts, n, i, ns, rest, t, k) {
        n = split(path, parts, "::")
        ns = ""; k = 0
        for (i = 1; i <= n; i++) {
          t = (ns == "" ? parts[i] : ns "::" parts[i])
          if (!(t in namespaces)) break
          ns = t; k = i
        }
        # orbite::orbite, orbite::orbite_static, orbite::orbite_cpp: the CMake targets.
        if (ns == "" || k == n || path ~ /^orbite::orbite/) return
        printf "#line %d \"%s\"\n", line, doc
        if (k == n - 1) { printf "namespace probe%d_%d { using %s; }\n", d, ++probes, path; return }
        t = ns
        for (i = k + 1; i < n; i++) t = t "::" parts[i]
        if (!(t in types)) {
          # A nested type or a member of a member: the enclosing name must exist.
          printf "namespace probe%d_%d { using %s; }\n", d, ++probes, t; return
        }
        if (t in enums) { printf "static_assert(sizeof(%s) > 0, \"\");\n", path; probes++; return }
        if (t in templates) t = t "<int>"
        printf "struct probe%d_%d : %s { using %s::%s; };\n", d, ++probes, t, t, parts[n]
      }
      BEGIN { scan_header() }
      { text[NR] = $0 }
      END {
        inblock = 0
        for (l = 1; l <= NR; l++) {
          line = text[l]
          if (line ~ /^```/) { inblock = !inblock; cpp = (line ~ /^```cpp/); continue }
          if (inblock) {
            if (!cpp) continue
            rest = line
            while (match(rest, /orbite::[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*/)) {
              probe(substr(rest, RSTART, RLENGTH), l); rest = substr(rest, RSTART + RLENGTH)
            }
            continue
          }
          rest = line
          while (match(rest, /`[^`]+`/)) {
            span = substr(rest, RSTART + 1, RLENGTH - 2)
            after = substr(rest, RSTART + RLENGTH) " " text[l + 1]
            rest = substr(rest, RSTART + RLENGTH)
            if (after ~ /^[ ]*(in Rust|\(Rust\))/) continue
            if (!match(span, /^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)+/)) continue
            path = substr(span, RSTART, RLENGTH)
            if (path !~ /^orbite::/) {
              first = path; sub(/::.*/, "", first)
              if (!(("orbite::" first) in types)) continue
              path = "orbite::" path
            }
            probe(path, l)
          }
        }
      }
    ' "$src/$doc"
  done
} >"$names"
quoted=$(grep -c '^#line' "$names" || true)
if c++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror $cflags "$names" 2>"$work/names.log"; then
  echo "ok   C++ names quoted in the docs: all $quoted exist in orbite.hpp"
else
  where="C++ names quoted in the docs"
  fail "missing from orbite.hpp:"; grep -E 'error' "$work/names.log" | head -20
fi

echo "docs test: $checked blocks checked, $skipped skipped, $failed failed"
[ "$sizes_ok" -eq 0 ] || echo "docs test: README.md states installed sizes this build does not have"
[ "$failed" -eq 0 ] && [ "$sizes_ok" -eq 0 ]
