#!/usr/bin/env bash
# The curated mutation check (`scripts/mutants.sh curated`): every guard
# listed in scripts/mutants-curated.txt must be caught by its test.
#
#   scripts/mutants-curated.sh [PATTERN]
#
# Each line of the list is `FILE @@ ORIGINAL @@ REPLACEMENT @@ TEST @@ WHAT`
# (`#` starts a comment). For each: ORIGINAL must occur exactly once in FILE
# ("names nothing" / "ambiguous" otherwise); it is replaced by REPLACEMENT
# (the subtle edit: a deleted clause, a widened bound, a wrong key), the
# mutant is built (`cargo test --no-run`; a build failure is "unviable": a
# mutant must compile), then `cargo test --locked --profile mutants TEST`
# must FAIL ("caught"); a run past MUTANTS_TIMEOUT seconds is killed with
# its processes and counted as caught, printed as "timeout". FILE is
# restored after each mutant, and on any exit or interrupt, and checked byte
# for byte against its copy.
#
# Before the first mutant every distinct TEST is built and run once
# unmutated: it must pass and run at least one test (a test that fails
# anyway would "catch" every mutant). The builds go in one cargo command per
# feature set, and the TESTs of one test program in one run of it (one
# filter each; a TEST whose own filter matched no passed test in that run is
# run again alone before it is called broken). The `mutants` cargo profile
# (Cargo.toml) keeps builds incremental, so each mutant rebuilds only this
# crate and relinks what TEST needs.
#
# Baselines and mutants run in MUTANTS_LANES lanes at once (default: the
# number of cores, at most 4): lane 0 in this tree, each other lane in a
# copy of it under target/mutants-lanes/ (the working tree's files and
# target/mutants once the dependencies are built; removed at the end).
# Each lane builds only some variants of the crate (the library's own
# tests; the library that test programs link; per feature set), each
# variant in one lane only, so that none is compiled from scratch twice,
# and runs the mutants that need its variants, one at a time, in list
# order. A mutant builds and runs alone in its lane's tree, so the outcome
# of one never depends on another.
#
# PATTERN (optional, a grep -E regex) runs only the lines it matches;
# MUTANTS_LIST names another list (a developer's candidates).
# Exit 1 when any mutant survives, is unviable or names nothing, or a
# baseline fails; the log of every run is in target/mutants-curated/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
root="$PWD"
list="${MUTANTS_LIST:-scripts/mutants-curated.txt}"
pattern="${1:-}"
timeout_s="${MUTANTS_TIMEOUT:-300}"
lanes="${MUTANTS_LANES:-$(nproc)}"
[ "$lanes" -ge 1 ] 2>/dev/null || lanes=1
[ "$lanes" -le 4 ] || lanes=4
out="$root/target/mutants-curated"
lane_root="$root/target/mutants-lanes"
rm -rf "$out" "$lane_root"
mkdir -p "$out/orig" "$out/results"
profile=(--locked --profile mutants)

# The file under mutation and its unmutated copy ($orig): restored on every
# exit. Each lane (a subshell) has its own.
cur_file=""
orig="$out/orig/lane-0"
restore() {
  [ -n "$cur_file" ] || return 0
  cp "$orig" "$cur_file"
  if ! cmp -s "$orig" "$cur_file"; then
    echo "mutants: could not restore $cur_file (its unmutated copy: $orig)" >&2
    exit 3
  fi
  cur_file=""
}
lane_pids=()
stop_lanes() {
  local p
  for p in "${lane_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${lane_pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap 'restore; rm -rf "$lane_root"' EXIT
trap 'stop_lanes; restore; exit 130' INT TERM

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

# Splits TEST ($1) into its leading VAR=value words (envs: the environment
# of its runs, e.g. SIM_SEEDS=1-40 for a simulator's seeded run), cargo's
# words (words), and of those the words that pick what is built (build:
# `--lib`, `--test X`, `--features X`, ...), the test filter (filter: the
# one word that is no option, if any) and what follows `--` (rest).
split_test() {
  local all w i=0 n
  read -ra all <<<"$1"
  envs=() words=() build=() rest=() filter=""
  n=${#all[@]}
  while [ "$i" -lt "$n" ]; do
    w="${all[$i]}"
    i=$((i + 1))
    if [ "${#words[@]}" -eq 0 ] && [[ "$w" =~ ^[A-Z_][A-Z0-9_]*= ]]; then
      envs+=("$w")
      continue
    fi
    words+=("$w")
    case "$w" in
      --)
        rest=("${all[@]:$i}")
        words+=("${rest[@]}")
        break
        ;;
      --test | --features | --bin | --example | -p | --package | -F)
        build+=("$w" "${all[$i]}")
        words+=("${all[$i]}")
        i=$((i + 1))
        ;;
      -*) build+=("$w") ;;
      *) filter="$w" ;;
    esac
  done
}

# Runs `cargo test` with the words given ($@) in a process group of its
# own, in the environment $envs, output to $log; kills the group past
# $timeout_s. Sets rc (124: timeout).
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

# How many tests of the log $1 passed whose names contain FILTER ($2; any
# test when it is empty).
passed_matching() {
  python3 -c '
import re, sys
log, flt = sys.argv[1:3]
names = re.findall(r"^test (\S+) \.\.\. ok$", open(log, errors="replace").read(), re.M)
print(sum(1 for n in names if flt in n))' "$1" "$2"
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
[ "$bad" -eq 0 ] || { echo "mutants: the list is broken: no mutant run"; exit 1; }
step "mutants: $total curated mutants; baseline: each test unmutated"

# Each mutant's lane. A lane builds only the variants of the crate its
# mutants need (the library's own tests, or the library for test programs,
# per feature set), so that no variant is compiled from scratch in two
# trees: the variants go to the lanes by how many mutants need each, the
# largest first, each to the lane with the fewest mutants so far.
if [ "$lanes" -gt "$total" ]; then lanes=$total; fi
declare -A variant_count=() lane_of_variant=()
variant_of=()
for ((i = 0; i < total; i++)); do
  split_test "${tests[$i]}"
  v="lib"
  [[ " ${build[*]} " == *" --lib "* ]] || v="programs"
  set -- "${build[@]}"
  while [ $# -gt 0 ]; do
    case "$1" in --features | -F) v+=" $1 $2"; shift 2 ;; *) shift ;; esac
  done
  variant_of[$i]="$v"
  variant_count[$v]=$((${variant_count[$v]:-0} + 1))
done
load=()
for ((k = 0; k < lanes; k++)); do load[$k]=0; done
# The library's own tests are lane 0's: it builds them with the
# dependencies, before the other lanes' trees are copied.
if [ -n "${variant_count[lib]:-}" ]; then
  lane_of_variant[lib]=0
  load[0]=${variant_count[lib]}
fi
while IFS=$'\t' read -r c v; do
  [ "$v" != lib ] || continue
  best=0
  for ((k = 1; k < lanes; k++)); do [ "${load[$k]}" -lt "${load[$best]}" ] && best=$k; done
  lane_of_variant[$v]=$best
  load[$best]=$((${load[$best]} + c))
done < <(for v in "${!variant_count[@]}"; do printf '%s\t%s\n' "${variant_count[$v]}" "$v"; done | sort -k1,1nr -k2)
lane_of=()
for ((i = 0; i < total; i++)); do lane_of[$i]=${lane_of_variant[${variant_of[$i]}]}; done
# Fewer variants than lanes: the lanes left have nothing to do.
if [ "${#variant_count[@]}" -lt "$lanes" ]; then lanes=${#variant_count[@]}; fi

# The lanes' trees: lane 0 is this one; the others copies of it, made once
# the dependencies are built here (so that they are built once).
tree_of=("$root")
if [ "$lanes" -gt 1 ]; then
  log="$out/dependencies.log"
  start=$SECONDS
  if ! cargo test "${profile[@]}" --no-run --lib >"$log" 2>&1; then
    echo "mutants: the library's tests do not build unmutated: $log"
    tail -n 30 "$log"
    exit 1
  fi
  printf 'mutants: dependencies and the library built in %ds; %d lanes: %s mutants\n' \
    $((SECONDS - start)) "$lanes" "${load[*]}"
  for ((k = 1; k < lanes; k++)); do
    d="$lane_root/$k"
    tree_of[$k]="$d"
    mkdir -p "$d/target"
    git ls-files -z --cached --others --exclude-standard | python3 -c '
import os, shutil, sys
dest = sys.argv[1]
for p in sys.stdin.buffer.read().split(b"\0"):
    if p and os.path.isfile(p):
        t = os.path.join(dest.encode(), p)
        os.makedirs(os.path.dirname(t), exist_ok=True)
        shutil.copy2(p, t)' "$d"
    cp -a target/mutants "$d/target/mutants"
  done
fi

# The baseline of lane $1 (in its tree): every distinct TEST of its mutants
# builds (one cargo command per environment and feature set) and passes,
# running at least one test (the TESTs of one test program run in one run
# of it, one filter each). Writes $out/baseline-lane-K: ok or broken.
baseline_lane() {
  local k=$1 i t key gkey features targets j w members
  local -A build_words=() group_tests=() group_env=() seen=()
  cd "${tree_of[$k]}"
  bad=0
  for ((i = 0; i < total; i++)); do
    [ "${lane_of[$i]}" -eq "$k" ] || continue
    t="${tests[$i]}"
    [ -z "${seen[$t]:-}" ] || continue
    seen[$t]=1
    split_test "$t"
    features="" targets=""
    set -- "${build[@]}"
    while [ $# -gt 0 ]; do
      case "$1" in
        --features | -F) features+=" $1 $2"; shift 2 ;;
        --test | --bin | --example | -p | --package) targets+=" $1 $2"; shift 2 ;;
        *) targets+=" $1"; shift ;;
      esac
    done
    # What VAR=value words a TEST names is for its runs, not its build.
    key="features:$features"
    build_words[$key]="${build_words[$key]:-}$targets"
    gkey="${envs[*]:-}|${build[*]}|${rest[*]:-}"
    group_tests[$gkey]="${group_tests[$gkey]:-}$i "
    group_env[$gkey]="$t"
  done
  for key in "${!build_words[@]}"; do
    envs=()
    read -ra fw <<<"${key#features:}"
    read -ra tw <<<"${build_words[$key]}"
    # Each target once.
    local uniq=() have=" "
    for ((j = 0; j < ${#tw[@]}; j++)); do
      w="${tw[$j]}"
      case "$w" in
        --test | --bin | --example | -p | --package) w="$w ${tw[$((j + 1))]}"; j=$((j + 1)) ;;
      esac
      [[ "$have" == *" $w "* ]] && continue
      have+="$w "
      read -ra ws <<<"$w"
      uniq+=("${ws[@]}")
    done
    log="$out/baseline-build-lane$k-$(echo "$key" | tr -c 'A-Za-z0-9_-' '_').log"
    start=$SECONDS
    if ! env "${envs[@]}" cargo test "${profile[@]}" --no-run "${fw[@]}" "${uniq[@]}" >"$log" 2>&1; then
      echo "mutants: the baseline does not build (${fw[*]:-} ${uniq[*]}): $log"
      tail -n 30 "$log"
      echo broken >"$out/baseline-lane-$k"
      return 0
    fi
    printf 'mutants: lane %d built %-60s %4ds\n' "$k" "${fw[*]:-} ${uniq[*]}" $((SECONDS - start)) | cut -c1-110
  done
  for gkey in "${!group_tests[@]}"; do
    read -ra members <<<"${group_tests[$gkey]}"
    local filters=() glog group_rc ran
    for i in "${members[@]}"; do
      split_test "${tests[$i]}"
      filters+=("$filter")
    done
    split_test "${group_env[$gkey]}"
    glog="$out/baseline-group-${nums[${members[0]}]}.log"
    log="$glog"
    start=$SECONDS
    if [[ " ${filters[*]} " == *"  "* ]] || [ -z "${filters[0]}" ]; then
      # A TEST naming no filter runs the whole program.
      run_test "${build[@]}" -- "${rest[@]}"
    else
      run_test "${build[@]}" -- "${rest[@]}" "${filters[@]}"
    fi
    group_rc=$rc
    for i in "${members[@]}"; do
      split_test "${tests[$i]}"
      ran=$(passed_matching "$glog" "$filter")
      if [ "$group_rc" -ne 0 ] || [ "$ran" -eq 0 ]; then
        # Failed, or ran nothing, among the others: its own run decides.
        log="$out/baseline-${nums[$i]}.log"
        run_test "${words[@]}"
        ran=$(passed_matching "$log" "$filter")
        if [ "$rc" -ne 0 ] || [ "$ran" -eq 0 ]; then
          echo "mutants: baseline of '${tests[$i]}' (line ${nums[$i]}) fails or runs no test (rc $rc, $ran passed): $log"
          tail -n 30 "$log"
          bad=1
        fi
      fi
    done
    split_test "${group_env[$gkey]}"
    printf 'mutants: lane %d baseline %-52s %3d TESTs %4ds\n' "$k" "${envs[*]:-} ${build[*]} ${rest[*]:-}" "${#members[@]}" $((SECONDS - start))
  done
  if [ "$bad" -eq 0 ]; then echo ok >"$out/baseline-lane-$k"; else echo broken >"$out/baseline-lane-$k"; fi
}
# Lane $1: its baseline, then (when that holds) its mutants one at a time
# in its tree; writes each outcome to $out/results/N and prints its line.
# A lane does not wait for the others' baselines: its mutants rely on its
# own TESTs only, and any broken baseline fails the whole run below.
lane() {
  local k=$1 i f t tag build_s test_s built
  baseline_lane "$k"
  [ "$(cat "$out/baseline-lane-$k" 2>/dev/null)" = ok ] || return 0
  step "mutants: lane $k's baseline holds; applying its mutants"
  cd "${tree_of[$k]}"
  orig="$out/orig/lane-$k"
  cur_file=""
  trap 'restore' EXIT
  trap 'restore; exit 130' INT TERM
  for ((i = 0; i < total; i++)); do
    [ "${lane_of[$i]}" -eq "$k" ] || continue
    f="${files[$i]}" t="${tests[$i]}"
    tag="line ${nums[$i]}: $f: ${whats[$i]}"
    cp "$f" "$orig"
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
      {
        printf 'UNVIABLE  build %4ds            %s\n' "$build_s" "$tag"
        grep -m 5 -A 5 '^error' "$log.build" || tail -n 20 "$log.build"
      } >"$out/results/$i.txt"
      echo unviable >"$out/results/$i.outcome"
      cat "$out/results/$i.txt"
      continue
    fi
    start=$SECONDS
    run_test "${words[@]}"
    test_s=$((SECONDS - start))
    restore
    if [ "$rc" -eq 124 ]; then
      printf 'TIMEOUT   build %4ds test %4ds  %s (counted as caught)\n' "$build_s" "$test_s" "$tag" >"$out/results/$i.txt"
      echo caught >"$out/results/$i.outcome"
    elif [ "$rc" -ne 0 ]; then
      printf 'caught    build %4ds test %4ds  %s\n' "$build_s" "$test_s" "$tag" >"$out/results/$i.txt"
      echo caught >"$out/results/$i.outcome"
    else
      {
        printf 'SURVIVED  build %4ds test %4ds  %s\n' "$build_s" "$test_s" "$tag"
        echo "          ${origs[$i]}  ->  ${repls[$i]}"
        echo "          cargo test ${profile[*]} $t passed: $log"
      } >"$out/results/$i.txt"
      echo survived >"$out/results/$i.outcome"
    fi
    cat "$out/results/$i.txt"
  done
}
# Every lane in the background (lane 0 too), so that an interrupt reaches
# this shell's trap at once and is passed on to each lane.
for ((k = 0; k < lanes; k++)); do
  lane "$k" &
  lane_pids+=($!)
done
lane_rc=0
for p in "${lane_pids[@]}"; do wait "$p" || lane_rc=$?; done
lane_pids=()
[ "$lane_rc" -eq 0 ] || { echo "mutants: a lane failed (exit $lane_rc)"; exit 1; }
for ((k = 0; k < lanes; k++)); do
  [ "$(cat "$out/baseline-lane-$k" 2>/dev/null)" = ok ] ||
    { echo "mutants: the baseline of lane $k is broken (above): its mutants did not run"; exit 1; }
done

# The outcome of each, in the list's order.
caught=0 failed=0
for ((i = 0; i < total; i++)); do
  case "$(cat "$out/results/$i.outcome" 2>/dev/null || echo missing)" in
    caught) caught=$((caught + 1)) ;;
    missing)
      echo "mutants: line ${nums[$i]} has no outcome"
      failed=$((failed + 1))
      ;;
    *)
      sed -n 1p "$out/results/$i.txt"
      failed=$((failed + 1))
      ;;
  esac
done
step "mutants: $caught of $total caught; $failed survived or unviable"
[ "$failed" -eq 0 ] || exit 1
echo "mutants: every curated guard was caught"
