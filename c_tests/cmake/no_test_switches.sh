#!/bin/sh
# The library as shipped carries none of the simulators' bug switches (the
# cores' `mutations`, compiled only for tests and with cargo's `sim`
# feature): no symbol of it, dynamic or not, names one.
#
#   no_test_switches.sh LIB         checks LIB (liborbite.so or .a)
#   no_test_switches.sh --self WORK the check flags a library that has one
set -eu
pattern='[Mm]utations|mutated!|::sim::'

# Stops unless nm reads symbols from $1 (a stripped library proves nothing).
readable() {
  [ -n "$(nm --defined-only "$1" 2>/dev/null | head -n 1)" ] || {
    echo "no_test_switches: nm reads no symbols from $1"
    exit 2
  }
}

# Prints the symbols of $1 that name a switch.
switches() {
  { nm -D --defined-only "$1" 2>/dev/null; nm -C --defined-only "$1"; } | grep -E "$pattern" || true
}

if [ "$1" = --self ]; then
  work="$2"
  rm -rf "$work"; mkdir -p "$work"
  printf 'int orbite_live(void) { return 1; }\n' >"$work/clean.c"
  printf 'int orbite_live(void) { return 1; }\nint sim_Mutations_default(void) { return 0; }\n' >"$work/dirty.c"
  cc -shared -fPIC -o "$work/libclean.so" "$work/clean.c"
  cc -shared -fPIC -o "$work/libdirty.so" "$work/dirty.c"
  readable "$work/libclean.so"
  readable "$work/libdirty.so"
  [ -z "$(switches "$work/libclean.so")" ] || { echo "no_test_switches: flagged a clean library"; exit 1; }
  [ -n "$(switches "$work/libdirty.so")" ] || { echo "no_test_switches: missed a switch's symbol"; exit 1; }
  echo "no_test_switches: the check flags a switch's symbol and passes a clean library"
  exit 0
fi

readable "$1"
found="$(switches "$1")"
if [ -n "$found" ]; then
  echo "no_test_switches: $1 carries test switches (build it without the sim feature):"
  printf '%s\n' "$found"
  exit 1
fi
echo "no_test_switches: $1 carries no test switch"
