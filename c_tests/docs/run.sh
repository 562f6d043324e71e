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
#   json     read by orbite::json::parse (strict); "json config" blocks must
#            also be accepted by orbite_engine_new.
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

# The JSON checker: strict syntax; "config" also makes an engine of it.
cat >"$work/json_check.cpp" <<'EOF'
#include <orbite.hpp>
#include <fstream>
#include <iostream>
#include <sstream>
int main(int argc, char **argv) {
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  auto doc = orbite::json::try_parse(text.str());
  if (!doc) { std::cerr << doc.error().describe() << "\n"; return 1; }
  if (argc > 2) {
    auto e = orbite::Engine::try_create(text.str());
    if (!e) { std::cerr << e.error().describe() << "\n"; return 1; }
  }
  return 0;
}
EOF
c++ -std=c++17 -Wall -Wextra -Werror $cflags -o "$work/json_check" "$work/json_check.cpp" $libs

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
      if ! "$work/json_check" "$b" $flags >"$work/block$n.log" 2>&1; then fail "rejected"; cat "$work/block$n.log"; continue; fi
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
echo "docs test: $checked blocks checked, $skipped skipped, $failed failed"
[ "$failed" -eq 0 ]
