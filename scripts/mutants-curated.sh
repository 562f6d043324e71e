#!/usr/bin/env bash
# The curated mutation check (`scripts/mutants.sh curated`): every guard
# listed in scripts/mutants-curated.txt must be caught by its test.
#
#   scripts/mutants-curated.sh [PATTERN]
#
# Each line of the list is `FILE @@ ORIGINAL @@ REPLACEMENT @@ TEST @@ WHAT`
# (`#` starts a comment). For each, in the list's order: ORIGINAL must occur
# exactly once in FILE ("names nothing" / "ambiguous" otherwise); it is
# replaced by REPLACEMENT (the subtle edit: a deleted clause, a widened
# bound, a wrong key), the mutant is built (`cargo test --no-run`; a build
# failure is "unviable": a mutant must compile), then
# `cargo test --locked --profile mutants TEST` must FAIL ("caught"); a run
# past MUTANTS_TIMEOUT seconds is killed with its processes and counted as
# caught, printed as "timeout". FILE is restored after each mutant, and on
# any exit or interrupt, and checked byte for byte against its copy.
#
# Before the first mutant every distinct TEST is built and run once
# unmutated: it must pass and run at least one test (a test that fails
# anyway would "catch" every mutant). The `mutants` cargo profile
# (Cargo.toml) keeps builds incremental, so each mutant rebuilds only this
# crate and relinks what TEST needs.
#
# PATTERN (optional, a grep -E regex) runs only the lines it matches;
# MUTANTS_LIST names another list (a developer's candidates).
# Exit 1 when any mutant survives, is unviable or names nothing, or a
# baseline fails; the log of every run is in target/mutants-curated/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
list="${MUTANTS_LIST:-scripts/mutants-curated.txt}"
pattern="${1:-}"
timeout_s="${MUTANTS_TIMEOUT:-300}"
out=target/mutants-curated
rm -rf "$out"
mkdir -p "$out/orig"
profile=(--locked --profile mutants)

# The file under mutation and its unmutated copy: restored on every exit.
cur_file=""
restore() {
  [ -n "$cur_file" ] || return 0
  cp "$out/orig/current" "$cur_file"
  if ! cmp -s "$out/orig/current" "$cur_file"; then
    echo "mutants: could not restore $cur_file (its unmutated copy: $out/orig/current)" >&2
    exit 3
  fi
  cur_file=""
}
trap 'restore' EXIT
trap 'restore; exit 130' INT TERM

# How many times ORIGINAL ($2) occurs in FILE ($1).
occurrences() {
  python3 -c 'import sys; print(open(sys.argv[1], encoding="utf-8").read().count(sys.argv[2]))' "$1" "$2"
}
# Writes FILE ($1) with its one ORIGINAL ($2) replaced by REPLACEMENT ($3).
apply() {
  python3 -c '
import sys
path, old, new = sys.argv[1:4]
text = open(path, encoding="utf-8").read()
assert text.count(old) == 1
open(path, "w", encoding="utf-8").write(text.replace(old, new, 1))' "$1" "$2" "$3"
}

# Splits TEST ($1) into its leading VAR=value words (envs: the
# environment of its runs, e.g. SIM_SEEDS=1-40 for a simulator's seeded
# run) and cargo's words (words).
split_test() {
  local all w
  read -ra all <<<"$1"
  envs=() words=()
  for w in "${all[@]}"; do
    if [ "${#words[@]}" -eq 0 ] && [[ "$w" =~ ^[A-Z_][A-Z0-9_]*= ]]; then envs+=("$w"); else words+=("$w"); fi
  done
}

# Runs `cargo test` with TEST's words ($@) in a process group of its own,
# output to $log; kills the group past $timeout_s. Sets rc (124: timeout).
run_test() {
  setsid env "${envs[@]}" cargo test "${profile[@]}" "$@" >"$log" 2>&1 &
  local pid=$! t=0
  while kill -0 "$pid" 2>/dev/null && [ "$t" -lt "$timeout_s" ]; do
    sleep 1
    t=$((t + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rc=124
  else
    set +e
    wait "$pid"
    rc=$?
    set -e
  fi
}

# The list, with each line's number.
files=() origs=() repls=() tests=() whats=() nums=()
bad=0
n=0
while IFS= read -r line || [ -n "$line" ]; do
  n=$((n + 1))
  case "$line" in '' | '#'*) continue ;; esac
  if [ -n "$pattern" ] && ! grep -Eq -- "$pattern" <<<"$line"; then continue; fi
  rest="$line" fields=()
  while [[ "$rest" == *' @@ '* ]]; do
    fields+=("${rest%%' @@ '*}")
    rest="${rest#*' @@ '}"
  done
  fields+=("$rest")
  if [ "${#fields[@]}" -ne 5 ]; then
    echo "mutants: $list:$n: ${#fields[@]} fields, not 5 (FILE @@ ORIGINAL @@ REPLACEMENT @@ TEST @@ WHAT)"
    bad=1
    continue
  fi
  if [ ! -f "${fields[0]}" ]; then
    echo "mutants: $list:$n: names nothing: no file ${fields[0]}"
    bad=1
    continue
  fi
  case "$(occurrences "${fields[0]}" "${fields[1]}")" in
    1) ;;
    0)
      echo "mutants: $list:$n: names nothing: '${fields[1]}' is not in ${fields[0]}"
      bad=1
      continue
      ;;
    *)
      echo "mutants: $list:$n: ambiguous: '${fields[1]}' occurs more than once in ${fields[0]}"
      bad=1
      continue
      ;;
  esac
  files+=("${fields[0]}") origs+=("${fields[1]}") repls+=("${fields[2]}")
  tests+=("${fields[3]}") whats+=("${fields[4]}") nums+=("$n")
done <"$list"
total=${#files[@]}
[ "$total" -gt 0 ] || { echo "mutants: no line of $list to run"; exit 1; }
step "mutants: $total curated mutants; baseline: each test unmutated"

# The baseline: each distinct TEST builds and passes, running >= 1 test.
declare -A seen=()
for ((i = 0; i < total; i++)); do
  t="${tests[$i]}"
  [ -z "${seen[$t]:-}" ] || continue
  seen[$t]=1
  log="$out/baseline-${nums[$i]}.log"
  start=$SECONDS
  split_test "$t"
  if ! env "${envs[@]}" cargo test "${profile[@]}" --no-run "${words[@]}" >"$log.build" 2>&1; then
    echo "mutants: '$t' (line ${nums[$i]}) does not build unmutated: $log.build"
    tail -n 30 "$log.build"
    bad=1
    continue
  fi
  run_test "${words[@]}"
  ran=$({ grep -Eo 'test result: ok\. [0-9]+ passed' "$log" || true; } | awk '{ s += $4 } END { print s + 0 }')
  if [ "$rc" -ne 0 ] || [ "$ran" -eq 0 ]; then
    echo "mutants: baseline of '$t' (line ${nums[$i]}) fails or runs no test (rc $rc, $ran passed): $log"
    tail -n 30 "$log"
    bad=1
  else
    printf 'mutants: baseline %-60s %3d passed %4ds\n' "$t" "$ran" $((SECONDS - start))
  fi
done
[ "$bad" -eq 0 ] || { echo "mutants: the list or a baseline is broken: no mutant run"; exit 1; }

step "mutants: applying each"
caught=0 failed=0
for ((i = 0; i < total; i++)); do
  f="${files[$i]}" t="${tests[$i]}"
  tag="line ${nums[$i]}: $f: ${whats[$i]}"
  cp "$f" "$out/orig/current"
  cur_file="$f"
  apply "$f" "${origs[$i]}" "${repls[$i]}"
  split_test "$t"
  log="$out/mutant-${nums[$i]}.log"
  start=$SECONDS
  set +e
  env "${envs[@]}" cargo test "${profile[@]}" --no-run "${words[@]}" >"$log.build" 2>&1
  built=$?
  set -e
  build_s=$((SECONDS - start))
  if [ "$built" -ne 0 ]; then
    restore
    printf 'UNVIABLE  build %4ds            %s\n' "$build_s" "$tag"
    grep -m 5 -A 5 '^error' "$log.build" || tail -n 20 "$log.build"
    failed=$((failed + 1))
    continue
  fi
  start=$SECONDS
  run_test "${words[@]}"
  test_s=$((SECONDS - start))
  restore
  if [ "$rc" -eq 124 ]; then
    printf 'TIMEOUT   build %4ds test %4ds  %s (counted as caught)\n' "$build_s" "$test_s" "$tag"
    caught=$((caught + 1))
  elif [ "$rc" -ne 0 ]; then
    printf 'caught    build %4ds test %4ds  %s\n' "$build_s" "$test_s" "$tag"
    caught=$((caught + 1))
  else
    printf 'SURVIVED  build %4ds test %4ds  %s\n' "$build_s" "$test_s" "$tag"
    echo "          ${origs[$i]}  ->  ${repls[$i]}"
    echo "          cargo test ${profile[*]} $t passed: $log"
    failed=$((failed + 1))
  fi
done
step "mutants: $caught of $total caught; $failed survived or unviable"
[ "$failed" -eq 0 ] || exit 1
echo "mutants: every curated guard was caught"
